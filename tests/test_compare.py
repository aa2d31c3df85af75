"""`tba-ext compare`, shortened: both algorithms on the same model/data/seed, one report with both curves."""

import json

import pytest

from tba_ext.compare import compare

pytestmark = pytest.mark.e2e


def test_compare_short_writes_one_report_with_both_runs(tmp_path):
    compare(str(tmp_path / "cmp"), short=True, seeds=[0], staleness=[1])
    run = tmp_path / "cmp"
    results = json.loads((run / "results.json").read_text())
    assert {r["algorithm"] for r in results} == {"TBA", "Dr. GRPO"}
    before = {r["accuracy_before"] for r in results}
    assert len(before) == 1  # identical starting model and held-out data for both
    assert all(r["mean_staleness"] is not None and r["mean_staleness"] > 0 for r in results)
    report = (run / "report.md").read_text()
    assert "TBA" in report and "Dr. GRPO" in report
    assert (run / "curves_vs_step.png").stat().st_size > 10_000
    assert (run / "reward_vs_time.png").stat().st_size > 5_000
