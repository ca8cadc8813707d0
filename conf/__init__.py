"""tuneup's built-in Hydra configs (``pkg://tuneup.conf``): config.yaml and one folder per group.

Importing this package registers what the configs refer to (tuneup.trainer.config.register): the
``tuneup.searchpath`` resolver and the internal config nodes, so any Hydra app that reads
these configs composes them as the ``tuneup`` command does.
"""

from tuneup.trainer.config import register

register()
