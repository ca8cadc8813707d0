"""A Hydra task function for tests that launch real jobs through a launcher: which process
the job ran in and whether torch was imported there before the job started."""

import os
import sys


def probe(cfg):
    return os.getpid(), "torch" in sys.modules


def frozen(cfg):
    """The job's process and how many objects its collector leaves out (``gc.freeze``)."""
    import gc

    return os.getpid(), gc.get_freeze_count()
