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


def loader(cfg):
    """A DataLoader with a worker process, in the job's process as a run starts it
    (trainer/environment.py ``standard_start_method``): the batches it loads."""
    import torch
    from torch.utils.data import DataLoader

    from tuneup.trainer.environment import standard_start_method

    standard_start_method()
    return [batch.tolist() for batch in DataLoader(torch.arange(4), batch_size=2, num_workers=1)]
