"""A mistyped key next to a required setting (``path: ???`` of data=textfile and data=shards):
the hint names the options that have it, and no ``+`` it does not need."""

from __future__ import annotations

import pytest

from tuneup.trainer.hints import override_hints


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # data.path on data=digits: not "did you mean data.path=...?", the key as typed
        (["data=digits", "data.path=in.txt"], "data.path is not a setting of data=digits (its "
         "settings are: batch_size, channels, image_size, preprocess, seed, test_fraction, "
         "val_fraction); it is one of data=shards, data=textfile"),
        (["data=digits", "data.pat=in.txt"], "did you mean data.path=in.txt (with data=shards or "
         "data=textfile)? (data=digits has no pat)"),
        # the chosen option has the key, still to be given: no + before it
        (["data=textfile", "data.pat=in.txt"], "did you mean data.path=in.txt? (data.pat is not a "
         "setting; +data.pat=in.txt would be refused: nothing reads it)"),
    ],
)  # fmt: skip
def test_a_mistyped_key_beside_a_required_one(argv, expected):
    assert override_hints(argv) == [expected]
