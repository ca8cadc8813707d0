"""Asynchronous checkpoint saves (``checkpoint.async=true``): training goes on while the
checkpoint is written.

A save takes a copy of the checkpoint's tensors in host memory first (torch's
``DefaultStager``, the stager of DCP's ``async_save``: every storage copied once, shared
storages kept shared, pinned memory on CUDA, the buffers reused from one save to the next),
then writes the copy in one background thread with the same protocol as a synchronous save:
a single file through :func:`~.checkpoint_write.atomic_save` (temporary file, fsync, rename,
checksum), a sharded directory through DCP's ``async_save`` into the temporary directory,
then each rank's checksums gathered, the manifest and the rename (:mod:`.sharded`). The rename
happens after every byte is written and fsynced, so a process killed during a background
write leaves what a killed synchronous save leaves: the previous checkpoints and a temporary
that the next run removes.

At most one save is in flight (:meth:`BackgroundWriter.wait` before the next one is staged:
one copy of the state in host memory, and the staging buffers are free to reuse); the end of
training, a stop signal and an exception wait for it too, and a background write that failed
raises its error there (:meth:`BackgroundWriter.wait`). Work that must follow a complete
checkpoint (pruning) is queued behind it (:meth:`BackgroundWriter.then`).

Lightning's ``AsyncCheckpointIO`` is not used: it clones the tensors on their device (GPU
memory, storages no longer shared), queues any number of saves, and has no place for work
after a write; torch's stager and one thread of our own do what is needed.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch


class BackgroundWriter:
    """One checkpoint write at a time in a background thread, staged (copied) before it starts.

    ``waited_s``: the time training waited for a previous write to finish; ``staged_s``: the
    time it spent copying the state; ``written_s``: the time the background writes took.
    """

    def __init__(self) -> None:
        self.executor: ThreadPoolExecutor | None = None  # made on first use, freed by close()
        self.pending: list[Future] = []
        self.stager = None  # torch's DefaultStager, made on first use
        self.group = None  # the gloo process group of DCP's background collectives
        self.waited_s = self.staged_s = self.written_s = 0.0

    def staging(self):
        """torch's stager: copies to host memory, pinned where CUDA is there to pin it."""
        if self.stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            self.stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=torch.cuda.is_available(),
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=False,
                )
            )
        return self.stager

    def snapshot(self, state):
        """A copy of ``state`` that training can no longer change: tensors in host memory,
        the rest deep-copied. Waits for the write in flight first (it may be reading the
        staging buffers this copy reuses)."""
        self.wait()
        started = time.perf_counter()
        copy = self.staging().stage(state)
        self.staged_s += time.perf_counter() - started
        return copy

    def process_group(self, timeout=None):
        """A gloo group of all ranks for DCP's collectives in the background: the default
        group stays the training's alone (two threads issuing collectives on one group can
        pair them wrongly). Collective: every rank calls it, the first time in the same save."""
        if self.group is None:
            import torch.distributed as dist

            self.group = dist.new_group(backend="gloo", timeout=timeout)
        return self.group

    def submit(self, fn, *args) -> None:
        """Run ``fn(*args)`` in the background, after everything submitted before."""

        def timed():
            started = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.written_s += time.perf_counter() - started

        if self.executor is None:
            self.executor = ThreadPoolExecutor(1, thread_name_prefix="tuneup-checkpoint")
        self.pending.append(self.executor.submit(timed))

    def then(self, fn, *args) -> None:
        """Run ``fn(*args)`` once the writes submitted so far are done (now, if none is)."""
        if self.pending:
            self.submit(fn, *args)
        else:
            fn(*args)

    def wait(self) -> None:
        """Block until everything submitted is done; raise the first error one of them had."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        started = time.perf_counter()
        errors = [f.exception() for f in pending]  # waits for each, in order
        self.waited_s += time.perf_counter() - started
        for error in errors:
            if error is not None:
                raise error

    def close(self) -> None:
        """Wait for the writes (raising a failed one's error), then free the thread and buffers."""
        try:
            self.wait()
        finally:
            if self.executor is not None:
                self.executor.shutdown(wait=True)
                self.executor = None
            if self.stager is not None:
                self.stager.close()
                self.stager = None
