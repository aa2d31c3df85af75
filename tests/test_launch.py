"""The launcher around verl's ``main_ppo`` (``tba_ext.tools.launch.run_verl``), with a stand-in for main_ppo."""

import sys

import pytest
from omegaconf import OmegaConf

from tba_ext.tools import launch


def test_a_launch_whose_ray_node_misses_its_start_deadline_is_made_again_and_other_failures_are_not(
    tmp_path, monkeypatch
):
    """Ray raises RAY_START_TIMEOUT when a new node has not registered with its GCS within 30 s, before any of the
    run starts: the launcher starts it again (up to RAY_START_ATTEMPTS in all). A stand-in for main_ppo fails that
    way on its first ``fail_first`` launches."""
    count = tmp_path / "launches"

    def stand_in(fail_first: int, message: str) -> str:
        return (
            f"import pathlib, sys; p = pathlib.Path({str(count)!r}); n = int(p.read_text() or 0) + 1 "
            f"if p.exists() else 1; p.write_text(str(n)); print({message!r} if n <= {fail_first} else 'ok'); "
            f"sys.exit(1 if n <= {fail_first} else 0)"
        )

    cfg = OmegaConf.create({"trainer": {"total_training_steps": 1}})
    monkeypatch.setattr(launch, "_checked_config", lambda name, overrides, extra: (cfg, {}, True))
    script = {"code": ""}
    monkeypatch.setattr(launch, "_verl_command", lambda *args: [sys.executable, "-c", script["code"]])
    startup = f"Exception: {launch.RAY_START_TIMEOUT}. This could happen because ..."

    script["code"] = stand_in(2, startup)  # two missed deadlines, then a run
    assert launch.run_verl("cpu_tba", [], log_path=str(tmp_path / "a.log")) == 0
    assert int(count.read_text()) == 3 and (tmp_path / "a.log").read_text().count(launch.RAY_START_TIMEOUT) == 2

    count.unlink()
    script["code"] = stand_in(launch.RAY_START_ATTEMPTS, startup)  # it never starts: the last failure is raised
    with pytest.raises(RuntimeError, match="verl exited with code 1"):
        launch.run_verl("cpu_tba", [])
    assert int(count.read_text()) == launch.RAY_START_ATTEMPTS

    count.unlink()
    script["code"] = stand_in(1, "ValueError: a real failure")  # any other failure: one launch, raised
    with pytest.raises(RuntimeError, match="verl exited with code 1"):
        launch.run_verl("cpu_tba", [])
    assert count.read_text() == "1"
