"""The answer on disk, drawn from what the stages decided: autotune.json (a record: a dict),
then autotune.md and autotune.png from that record alone, and the recipe preset.

==================  ======================================================================
record              autotune.json of the throughput objective (the speed walk's search)
markdown, figure    its autotune.md and autotune.png
study_record        autotune.json of the time-to-target search
study_markdown,     its autotune.md and autotune.png
study_figure
stages_markdown     autotune.md's "Stages" section (``autotune.stages``: both stages run)
recipe              conf/experiment/recipe.yaml: the answer as an experiment preset
inputs              what a record is drawn from: :class:`SpeedAnswer` (the speed stage's
                    search once it ran), :class:`StudyAnswer` (the time-to-target search's)
==================  ======================================================================
"""

from tuneup.autotune.report.inputs import SpeedAnswer, StudyAnswer

__all__ = ["SpeedAnswer", "StudyAnswer"]
