"""Before the tests: the controller writes pytest's rewritten test modules before the workers
collect (tests/rewritten.py): files pytest's own import takes, a stale one written again; the
garbage collector, off while a process imports and collects, is on again for the tests."""

import gc

from _pytest.assertion import rewrite

from tests import rewritten


def test_test_modules_and_conftests_are_written_as_pytest_reads_them(tmp_path, pytestconfig):
    (tmp_path / "test_one.py").write_text("def test_it():\n    assert 1 + 1 == 2\n")
    (tmp_path / "conftest.py").write_text("X = 1\n")
    (tmp_path / "helper.py").write_text("Y = 2\n")  # not a test module: imported unrewritten
    assert rewritten.write([tmp_path], pytestconfig) == 2
    cache = rewrite.get_cache_dir(tmp_path / "test_one.py")
    assert sorted(p.name.split(".")[0] for p in cache.iterdir()) == ["conftest", "test_one"]
    pyc = cache / f"test_one{rewrite.PYC_TAIL}"
    code = rewrite._read_pyc(tmp_path / "test_one.py", pyc)
    assert "@pytest_ar" in code.co_names  # its asserts rewritten: pytest's helpers imported

    assert rewritten.write([tmp_path], pytestconfig) == 0  # up to date: read, not written
    (tmp_path / "test_one.py").write_text("def test_it():\n    assert 2 + 2 == 4\n")
    assert rewritten.write([tmp_path / "test_one.py"], pytestconfig) == 1
    assert rewrite._read_pyc(tmp_path / "test_one.py", pyc) is not None


def test_the_tests_run_with_the_garbage_collector_on():
    assert gc.isenabled()  # tests/conftest.py: off from its import to the collection's end
