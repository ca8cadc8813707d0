"""How a joblib (loky) worker process that ran a job ends: as the command does (tuneup/process_exit.py)."""

from __future__ import annotations

from joblib.externals.loky import ProcessPoolExecutor


def job(folder: str) -> int:
    """A job in a worker: what a job leaves for its process's exit (an ``atexit`` handler that
    writes a file, a line printed without a flush) and an object only the interpreter's
    teardown frees, which says so in a file."""
    import atexit
    import os

    from tuneup.process_exit import end_worker_as_command

    end_worker_as_command()

    marker = os.path.join(folder, "teardown")

    class FreedByTeardown:
        def __del__(self, mkdir=os.mkdir, path=marker):
            mkdir(path)  # bound now: the teardown may have emptied the os module by then

    global LEFT
    LEFT = FreedByTeardown()  # a module's global: freed when the teardown empties the module

    def write(path):
        with open(path, "w") as f:
            f.write("complete")

    atexit.register(write, os.path.join(folder, "atexit"))
    print("the job's last line, not flushed")  # stdout is a file here: block-buffered
    return os.getpid()


def test_a_joblib_worker_ends_without_teardown_and_loses_nothing(tmp_path, capfd):
    """The executor shut down (as at the command's exit): its worker runs the job's atexit
    handler (the file complete), flushes the job's unflushed line to the command's stdout,
    exits 0, and skips the interpreter's teardown that the command would wait on."""
    executor = ProcessPoolExecutor(max_workers=1)
    pid = executor.submit(job, str(tmp_path)).result()
    (worker,) = executor._processes.values()
    executor.shutdown(wait=True)
    assert worker.pid == pid and worker.exitcode == 0
    assert (tmp_path / "atexit").read_text() == "complete"
    assert "the job's last line, not flushed" in capfd.readouterr().out
    assert not (tmp_path / "teardown").exists()
