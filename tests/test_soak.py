"""benchmarks/soak.py: its fault schedule and step bookkeeping (unit lane), and a short soak through two faults
(e2e): a searcher's death and a damaged replay store refused at the resume, the run finishing its plan with every
step once and the trajectory ledger balanced at every step."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from soak import KINDS, effective_history, fault_schedule, main


def test_the_schedule_is_seeded_distinct_in_range_and_has_every_kind():
    schedule = fault_schedule(10, 150, seed=0)
    assert schedule == fault_schedule(10, 150, seed=0) and schedule != fault_schedule(10, 150, seed=1)
    steps = [s for s, _ in schedule]
    assert len(set(steps)) == 10 and steps == sorted(steps) and 3 <= min(steps) and max(steps) < 149
    assert {k for _, k in schedule} == set(KINDS)


def test_the_effective_history_keeps_each_segment_up_to_the_next_resume():
    segments = [
        {"index": 0, "resumed_from_step": 0, "steps_seen": {1: 0, 2: 0, 3: 0, 4: 0}},
        {"index": 1, "resumed_from_step": 2, "probe": True},  # the refused resume: no steps
        {"index": 2, "resumed_from_step": 2, "steps_seen": {3: 0, 4: 0, 5: 0}},
        {"index": 3, "resumed_from_step": 5, "steps_seen": {6: 0}},
    ]
    history, redone = effective_history(segments)
    assert history == [1, 2, 3, 4, 5, 6] and redone == {0: [3, 4], 2: []}
    segments[2]["resumed_from_step"] = 1  # resumed from step 1 but logged from 3 on: step 2 is missing
    assert effective_history(segments)[0] == [1, 3, 4, 5, 6]
    segments[2]["steps_seen"] = {2: 0, 3: 0, 4: 0, 5: 0}
    segments[3]["resumed_from_step"] = 3  # segment 2 redone after 3; segment 3 logged only 6: 4 and 5 missing
    assert effective_history(segments) == ([1, 2, 3, 6], {0: [2, 3, 4], 2: [4, 5]})
    # a crash that took the last step's metrics line with it: the next resume's checkpoint proves the step ran
    lost_line = [
        {"index": 0, "resumed_from_step": 0, "steps_seen": {1: 0, 2: 0, 3: 0}},
        {"index": 1, "resumed_from_step": 4, "steps_seen": {5: 0, 6: 0}},
    ]
    assert effective_history(lost_line) == ([1, 2, 3, 4, 5, 6], {0: []})


@pytest.mark.e2e
def test_a_short_soak_survives_a_searcher_death_and_a_damaged_store_losing_no_step(tmp_path):
    result = main(
        [
            "--updates",
            "16",
            "--save-every",
            "2",
            "--schedule",
            "3:kill_searcher,5:corrupt_store",
            "--max-minutes",
            "20",
            "--run-dir",
            str(tmp_path / "run"),
            "--out",
            str(tmp_path / "soak.json"),
        ]
    )
    assert result["updates_completed"] == 16 and result["faults_survived"] == 2
    assert result["duplicate_steps"] == 0 and result["skipped_steps"] == 0 and result["history_in_order"]
    corrupt = next(f for f in result["faults"] if f["kind"] == "corrupt_store")
    assert corrupt["refused"] and corrupt["fell_back_to_step"] == corrupt["corrupted_checkpoint_step"] - 2 >= 2
    assert result["ledger_balanced_every_step"] and result["ledger_final"]["unaccounted"] == 0
    assert result["ledger_final"]["uses"] > 0 and len(result["trajectories_lost_to_crashes"]) == 1
    assert (tmp_path / "soak.png").stat().st_size > 10_000
