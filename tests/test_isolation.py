"""The test suite's own isolation: what one test sets through monkeypatch is gone for the next one."""

import os

import datasets
import pytest

PROBE = "TBA_EXT_ISOLATION_PROBE"


def test_a_variable_set_around_a_multiprocess_dataset_map(monkeypatch):
    monkeypatch.setenv(PROBE, "set")
    environ = os.environ
    rows = datasets.Dataset.from_dict({"x": [1, 2]}).map(lambda row: {"y": row["x"] + 1}, num_proc=1)
    assert rows["y"] == [2, 3]
    if os.environ is environ:
        pytest.skip("this datasets release no longer rebinds os.environ in map(num_proc=...)")


def test_the_next_test_does_not_see_it():
    assert PROBE not in os.environ, "a monkeypatched variable outlived its test (see conftest.one_os_environ)"
