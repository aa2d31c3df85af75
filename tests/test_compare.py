"""`tba-ext compare`: the staleness axis per method (composed, no run), the interval, and a shortened e2e run of
all three methods on the same model/data/seed."""

import json

import pytest
from omegaconf import OmegaConf

from tba_ext.compare import compare, interval95
from tba_ext.core.settings import check_replay_run, check_tb_run
from tba_ext.launch import compose
from tba_ext.recipe import METHODS, method_overrides


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("staleness", [0, 4])
def test_staleness_bounds_every_source_of_off_policy_data(method, staleness):
    cfg = OmegaConf.to_container(compose(METHODS[method][0], ["run_dir=/nonexistent",
                                                              *method_overrides(method, staleness, 0.95)]),
                                 resolve=True)
    check_tb_run(cfg)
    v1 = cfg["trainer"]["v1"]
    replay = check_replay_run(cfg)
    if staleness == 0:  # on-policy for every method: sync trainer, and fresh groups only
        assert v1["trainer_mode"] in ("sync", "tba_sync")
        assert replay is None or (replay.recency_prob == 1.0 and replay.max_staleness == 0)
    else:
        assert v1["trainer_mode"].endswith("colocate_async")
        assert v1["colocate_async"]["num_warmup_batches"] == staleness
        assert replay is None or (replay.recency_prob == 0.95 and replay.max_staleness == staleness)
    assert (replay is not None) == METHODS[method][2]


def test_interval95_is_the_t_interval():
    mean, sd, half = interval95([1.0, 2.0, 3.0])
    assert (mean, sd) == (2.0, 1.0)
    assert half == pytest.approx(4.302652729911275 / 3 ** 0.5)  # t(0.975, 2 dof) * sd / sqrt(n)
    assert interval95([0.5]) == (0.5, 0.0, 0.0)


@pytest.mark.e2e
def test_compare_short_runs_every_method_from_one_start_and_summarises(tmp_path):
    results = tmp_path / "compare.json"
    compare(str(tmp_path / "cmp"), short=True, seeds=[0], staleness=[1], results_path=str(results))
    saved = json.loads(results.read_text())
    runs = saved["runs"]
    assert {r["method"] for r in runs} == set(METHODS)
    assert len({(r["accuracy_before"], r["sampled_before"]) for r in runs}) == 1  # identical start for all
    assert all(r["mean_staleness"] is not None and r["mean_staleness"] > 0 for r in runs)
    for r in runs:
        summary = saved["summary"][r["method"]]["1"]
        assert summary["n_seeds"] == 1
        assert summary["gain_mean"] == pytest.approx(r["accuracy_after"] - r["accuracy_before"])
    run = tmp_path / "cmp"
    assert "Dr. GRPO" in (run / "report.md").read_text()
    assert (run / "accuracy_vs_updates.png").stat().st_size > 10_000
    assert (run / "accuracy_vs_time.png").stat().st_size > 10_000
