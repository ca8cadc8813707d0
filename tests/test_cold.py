"""The cold lane: a test marked ``cold`` runs its commands as users do, from a fresh
interpreter, inside the normal ``pytest`` run; the others keep the warm zygote."""

from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import python


@pytest.mark.cold
def test_a_cold_test_starts_python_as_a_fresh_interpreter():
    assert python() == [sys.executable]


@pytest.mark.skipif(
    bool(os.environ.get("TUNEUP_TEST_COLD")),
    reason="TUNEUP_TEST_COLD=1: no zygote, every command is cold",
)
def test_a_test_not_marked_cold_after_one_that_is_starts_python_warm():
    command = python()
    assert command != [sys.executable]
    assert command[1].endswith("warm.py")  # tests/warm.py's client
