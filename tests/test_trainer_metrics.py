"""The trainer's searcher metrics from the servers' counters, including servers that have none (verl's vLLM)."""

import pytest

from tba_ext.adapters.trainer_metrics import searcher_rates


def counters(generated, busy, batches=0):
    return {"generated": generated, "busy_seconds": busy, "batches": batches}


def test_searcher_rates_between_two_reads():
    before = [counters(10, 1.0, 2), counters(4, 0.5, 1)]
    now = [counters(30, 2.5, 7), counters(8, 0.5, 1)]
    m = searcher_rates(before, now, wall=2.0)
    assert m["tba/searcher_0/generated_per_s"] == 10.0 and m["tba/searcher_1/generated_per_s"] == 2.0
    assert m["tba/searcher_0/rows_per_batch"] == 4.0  # 20 rows in 5 batches
    assert "tba/searcher_1/rows_per_batch" not in m  # no batch counted between the reads: not measured
    assert m["tba/searcher_0/idle_ratio"] == pytest.approx(0.25) and m["tba/searcher_1/idle_ratio"] == 1.0
    assert m["tba/trajectories_generated_per_s"] == 12.0
    assert m["tba/searcher_idle_ratio"] == pytest.approx(0.625)


def test_dead_restarted_and_counterless_searchers_are_not_measured():
    before = [counters(10, 1.0), None, counters(50, 9.0), {}]
    now = [counters(12, 1.5), counters(3, 0.1), counters(2, 0.1), {}]  # 1 was dead, 2 restarted, 3 is vLLM
    m = searcher_rates(before, now, wall=1.0)
    assert set(m) == {
        "tba/searcher_0/idle_ratio",
        "tba/searcher_0/generated_per_s",
        "tba/searcher_idle_ratio",
        "tba/trajectories_generated_per_s",
    }
    assert m["tba/trajectories_generated_per_s"] == 2.0
    assert searcher_rates([{}], [{}], wall=1.0) == {}  # vLLM only: the trainer falls back to the store's intake
