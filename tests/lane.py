"""Whether the test running in this process is marked ``cold`` (set by tests/conftest.py's
``pytest_runtest_protocol``, read by its ``python()``). A module of its own: pytest imports
tests/conftest.py as ``conftest`` and the tests import it as ``tests.conftest``, two modules
with two copies of any flag kept there; both import this one."""

#: True while a test marked ``cold`` runs (its setup, body and teardown).
cold = False
