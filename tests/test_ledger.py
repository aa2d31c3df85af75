"""The trajectory ledger on the real store and sampler (no verl): every trajectory ends in one place under every
eviction rule, the books survive a save and a load, and a trajectory that leaves without a record is caught."""

import random

import numpy as np
import pytest

from tba_ext.core.ledger import PLACES, LedgerError, TrajectoryLedger, unbalanced
from tba_ext.core.replay import ReplaySampler, Trajectory, TrajectoryStore
from tba_ext.core.settings import ReplaySettings


def churn(store: TrajectoryStore, sampler: ReplaySampler, updates: int, seed: int = 0, first: int = 1) -> dict:
    """Updates ``first``.. of a run with every eviction rule and drop reason at work: 8 prompts, duplicates, NaN
    rewards, per-prompt and global caps, a staleness cap and max_replays. Returns each id's updates, as served."""
    rng = random.Random(seed)
    served: dict[int, list[int]] = {}
    for update in range(first, first + updates):
        for _ in range(rng.randrange(4, 12)):
            prompt = f"p{rng.randrange(8)}"
            response = [rng.randrange(3) for _ in range(rng.randrange(1, 4))]  # short: duplicates happen
            reward = float("nan") if rng.random() < 0.05 else float(rng.random() < 0.5)
            store.admit(Trajectory(prompt, response, reward, version=update - 1))
        report = sampler.sample_groups(3, 2, current_version=update - 1)
        for group in report.groups:
            ids = [t.ledger_id for t in group.trajectories]
            store.ledger.trained(ids, update)
            for i in ids:
                served.setdefault(i, []).append(update)
    return served


def small_store() -> tuple[TrajectoryStore, ReplaySampler]:
    store = TrajectoryStore(per_prompt_capacity=4, capacity=22)
    settings = ReplaySettings(recency_prob=0.5, max_staleness=2, max_replays=3, max_nonfinite_frac=1.0, seed=1)
    return store, ReplaySampler(store, settings)


def test_every_trajectory_ends_in_one_place_under_every_rule_and_its_updates_are_recorded():
    store, sampler = small_store()
    served = churn(store, sampler, updates=60)
    store.ledger.check(store.stored_ledger_ids())
    counts = store.ledger.counts()
    assert counts == store.ledger.recount()  # the running counters equal a count of the records
    assert unbalanced(counts, len(store)) is None
    assert counts["ids"] == store.stats.seen == sum(counts[name] for name in PLACES)
    assert counts["dropped/nonfinite_reward"] == store.stats.rejected_nonfinite > 0
    evicted = {name: counts[name] for name in PLACES if name.startswith("evicted/")}
    assert sum(evicted.values()) == store.stats.evicted + store.stats.dedup_hits  # a replaced copy: "duplicate"
    assert counts["evicted/staleness"] == store.stats.evicted_stale > 0
    assert counts["evicted/max_replays"] == store.stats.evicted_replayed > 0
    for rule in ("per_prompt_capacity", "capacity", "duplicate"):
        assert evicted[f"evicted/{rule}"] > 0, rule
    assert counts["stored"] == len(store) and counts["unaccounted"] == 0
    assert counts["uses"] == sum(len(u) for u in served.values()) and counts["trained_ids"] == len(served)
    some = next(iter(served))
    assert store.ledger.updates_of(some) == served[some]


def test_the_byte_cap_is_its_own_rule():
    store = TrajectoryStore(per_prompt_capacity=100, capacity=1000, capacity_bytes=3000)
    for i in range(40):
        store.admit(Trajectory(f"p{i}", np.arange(100) + i, 1.0, version=i))
    counts = store.ledger.counts()
    assert counts["evicted/capacity_bytes"] == store.stats.evicted > 0 and counts["evicted/capacity"] == 0
    store.ledger.check(store.stored_ledger_ids())


def test_a_trajectory_that_leaves_the_store_without_a_record_unbalances_the_books(monkeypatch):
    store, sampler = small_store()
    churn(store, sampler, updates=10)
    ledger = store.ledger
    real = ledger.evicted
    planted = []

    def silent_for_one(trajectory_id, rule):  # the planted bug: one staleness eviction is never written down
        if rule == "staleness" and not planted:
            planted.append(trajectory_id)
            return
        real(trajectory_id, rule)

    monkeypatch.setattr(ledger, "evicted", silent_for_one)
    churn(store, sampler, updates=30, seed=1, first=11)
    assert planted
    assert "the ledger calls" in unbalanced(ledger.counts(), len(store))
    with pytest.raises(LedgerError, match="the store lost 1 trajectories without an eviction"):
        ledger.check(store.stored_ledger_ids())


def test_a_trajectory_read_but_never_stored_or_dropped_is_unaccounted():
    ledger = TrajectoryLedger()
    kept, lost = ledger.new_id(), ledger.new_id()
    ledger.stored(kept)
    assert unbalanced(ledger.counts(), 1) == "1 trajectories read but never stored or dropped"
    with pytest.raises(LedgerError, match=rf"never stored or dropped: \[{lost}\]"):
        ledger.check([kept])
    ledger.dropped(lost, "unknown_version")
    ledger.check([kept])


def test_impossible_moves_are_refused():
    ledger = TrajectoryLedger()
    a = ledger.new_id()
    with pytest.raises(LedgerError, match="is unaccounted, cannot become evicted/capacity"):
        ledger.evicted(a, "capacity")
    with pytest.raises(LedgerError, match="trained on while unaccounted"):
        ledger.trained([a], 1)
    ledger.stored(a)
    ledger.evicted(a, "capacity")
    with pytest.raises(LedgerError, match="is evicted/capacity, cannot become evicted/staleness"):
        ledger.evicted(a, "staleness")
    with pytest.raises(LedgerError, match="never issued"):
        ledger.stored(7)


def test_the_books_survive_a_save_and_load():
    store, sampler = small_store()
    churn(store, sampler, updates=20)
    state = sampler.state_dict()
    restored_store, restored = small_store()
    restored.load_state_dict(state)
    assert restored_store.ledger.counts() == store.ledger.counts() == restored_store.ledger.recount()
    restored_store.ledger.check(restored_store.stored_ledger_ids())
    churn(restored_store, restored, updates=5, seed=2, first=21)  # ids go on from where the saved run stopped
    restored_store.ledger.check(restored_store.stored_ledger_ids())
    assert len(restored_store.ledger) > len(store.ledger)


def test_a_ledger_saved_with_other_place_numbers_is_read_by_name_and_an_unknown_place_refused():
    ledger = TrajectoryLedger()
    for _ in range(3):
        ledger.stored(ledger.new_id())
    ledger.evicted(1, "staleness")
    state = ledger.state_dict()
    order = ["stored", "unaccounted", "evicted/staleness"]  # another version's numbering of the same places
    state["places"] = order
    state["place"] = bytes(order.index(ledger.place(i)) for i in range(3))
    read = TrajectoryLedger()
    read.load_state_dict(state)
    assert [read.place(i) for i in range(3)] == ["stored", "evicted/staleness", "stored"]
    state["places"] = ["unaccounted", "stored", "evicted/somewhere"]
    with pytest.raises(LedgerError, match=r"places \['evicted/somewhere'\] this tba-ext does not know"):
        TrajectoryLedger().load_state_dict(state)


def test_the_ledger_command_reads_a_saved_store_and_says_whether_it_balances(tmp_path, capsys):
    from tba_ext.cli import main
    from tba_ext.core.replay import save_atomic

    store, sampler = small_store()
    served = churn(store, sampler, updates=12)
    path = tmp_path / "tba_replay.pt"
    save_atomic({"sampler": sampler.state_dict(), "largest_group": 2, "updates_per_version": 1}, str(path))
    some = next(iter(served))
    assert main(["ledger", str(path), "--id", str(some)]) == 0
    out = capsys.readouterr().out
    assert "balanced: yes" in out and f"trained at updates {served[some]}" in out
    assert out.splitlines()[0].split() == ["ids", str(store.ledger.counts()["ids"])]
    state = sampler.state_dict()
    state["store"]["trajectories"] = state["store"]["trajectories"][1:]  # one trajectory gone without a record
    save_atomic({"sampler": state, "largest_group": 2, "updates_per_version": 1}, str(path))
    assert main(["ledger", str(path)]) == 1
    assert "balanced: NO: the ledger calls" in capsys.readouterr().out
