"""The test processes' cache of parsed config files (tests/parsed_configs.py) parses each text
once and still composes what is on disk: a test's own config folder, edited between two
compositions, is read as it is now."""

import tuneup
from tests import parsed_configs

MINE = "# @package _global_\ntrainer:\n  max_epochs: {}\n"


def test_an_unchanged_file_is_parsed_once_and_an_edited_one_again(tmp_path):
    (tmp_path / "experiment").mkdir()
    mine = tmp_path / "experiment" / "mine.yaml"
    mine.write_text(MINE.format(3))
    assert tuneup.compose(["experiment=mine"], config_dir=tmp_path).trainer.max_epochs == 3
    parsed = len(parsed_configs._PARSED)

    again = tuneup.compose(["experiment=mine"], config_dir=tmp_path)
    assert again.trainer.max_epochs == 3
    assert len(parsed_configs._PARSED) == parsed  # every file's text was parsed before

    mine.write_text(MINE.format(4))  # the same size: only its text tells the edit
    edited = tuneup.compose(["experiment=mine"], config_dir=tmp_path)
    assert edited.trainer.max_epochs == 4
    assert len(parsed_configs._PARSED) == parsed + 1  # that file alone, parsed again
