"""The hold points fault tests stop a run at (tba_ext.core.hold): parsing, one hold per point, release."""

import json
import threading
import time

import pytest

from tba_ext.core.hold import HOLD_AT_ENV, HOLD_DIR_ENV, armed, held_points, hold_point, marker, reached, release


def test_the_spec_lists_point_at_step_pairs_and_refuses_anything_else():
    assert held_points("checkpoint_saved@2, generate_begin@5,") == [("checkpoint_saved", 2), ("generate_begin", 5)]
    for bad in ("checkpoint_saved", "@2", "step_begin@two"):
        with pytest.raises(ValueError, match=HOLD_AT_ENV):
            held_points(bad)


def test_a_listed_point_holds_the_first_pass_at_or_after_its_step_until_released(tmp_path, monkeypatch):
    monkeypatch.delenv(HOLD_AT_ENV, raising=False)
    assert not armed()
    monkeypatch.setenv(HOLD_AT_ENV, "step_begin@3")
    monkeypatch.setenv(HOLD_DIR_ENV, str(tmp_path))
    assert armed()
    hold_point("step_begin", 2)  # before its step, and other points: no hold
    hold_point("checkpoint_saved", 5)
    assert list(tmp_path.iterdir()) == []
    passed = threading.Event()
    worker = threading.Thread(target=lambda: (hold_point("step_begin", 4), passed.set()))
    worker.start()
    reached_path = marker(str(tmp_path), "step_begin", 3, "reached")
    deadline = time.monotonic() + 30
    while not reached(str(tmp_path), "step_begin", 3) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert json.loads(open(reached_path).read())["step"] == 4
    assert not passed.wait(0.3)  # held until the release
    release(str(tmp_path), "step_begin", 3)
    worker.join(30)
    assert passed.is_set()
    (tmp_path / "step_begin@3.release").unlink()
    hold_point("step_begin", 5)  # held once: a later pass (or another process) goes on


def test_a_hold_without_its_folder_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(HOLD_AT_ENV, "step_begin@1")
    monkeypatch.delenv(HOLD_DIR_ENV, raising=False)
    with pytest.raises(ValueError, match=HOLD_DIR_ENV):
        hold_point("step_begin", 1)
