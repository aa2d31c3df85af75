"""The replay store and sampler, framework-free: frequencies, dedup, eviction, staleness cap, persistence."""

import math

import numpy as np
import pytest

from tba_ext.core.replay import (
    ReplaySampler,
    Trajectory,
    TrajectoryStore,
    load_checked,
    save_atomic,
    staleness_summary,
)
from tba_ext.core.settings import ReplaySettings, parse_replay_settings


def fill(store, prompts=4, per_prompt=6, versions=(0, 1, 2), reward=lambda p, j: float(j % 2)):
    for v in versions:
        for p in range(prompts):
            for j in range(per_prompt):
                store.add(Trajectory(f"p{p}", (v, p, j), reward(p, j), v, payload={"v": v}))


def within(observed, expected, n, sigmas=5):
    """|observed - expected| within `sigmas` binomial standard errors."""
    return abs(observed - expected) <= sigmas * math.sqrt(expected * (1 - expected) / n) + 1e-9


def test_recency_vs_replay_branch_frequency():
    store = TrajectoryStore(100, 10_000)
    fill(store)
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.7, seed=1))
    groups = [g for _ in range(400) for g in sampler.sample_groups(8, 4, current_version=2)]
    frac = np.mean([g.branch == "recency" for g in groups])
    assert within(frac, 0.7, len(groups))
    # recency groups only hold the freshest version; replay groups draw from all versions
    assert all(t.version == 2 for g in groups if g.branch == "recency" for t in g.trajectories)
    replay_versions = [t.version for g in groups if g.branch == "replay" for t in g.trajectories]
    for v in (0, 1, 2):
        assert within(np.mean(np.array(replay_versions) == v), 1 / 3, len(replay_versions))


def test_uniform_prompt_choice_when_inv_temp_is_zero():
    store = TrajectoryStore(100, 10_000)
    fill(store, prompts=5, reward=lambda p, j: float(p))  # prompts differ in reward
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.0, reward_inv_temp=0.0, seed=2))
    picks = [g.prompt_key for _ in range(500) for g in sampler.sample_groups(4, 2, 2)]
    for p in range(5):
        assert within(picks.count(f"p{p}") / len(picks), 0.2, len(picks))


def test_softmax_uniform_mixture_of_prompts():
    store = TrajectoryStore(100, 10_000)
    fill(store, prompts=3, versions=(0,), reward=lambda p, j: float(p))  # prompt rewards 0, 1, 2
    mix, inv_temp = 0.6, 1.5
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.0, reward_inv_temp=inv_temp, reward_mix=mix, seed=3))
    picks = [g.prompt_key for _ in range(1000) for g in sampler.sample_groups(4, 2, 0)]
    soft = np.exp(inv_temp * np.arange(3))
    expected = mix * soft / soft.sum() + (1 - mix) / 3
    for p in range(3):
        assert within(picks.count(f"p{p}") / len(picks), expected[p], len(picks))


def test_k_draws_without_replacement_unless_too_few():
    store = TrajectoryStore(100, 10_000)
    for j in range(6):
        store.add(Trajectory("big", (j,), 1.0, 0))
    for j in range(2):
        store.add(Trajectory("small", (j,), 1.0, 0))
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.0, seed=4))
    counts = {}
    for _ in range(300):
        for g in sampler.sample_groups(2, 4, 0):
            keys = [t.response_key for t in g.trajectories]
            if g.prompt_key == "big":
                assert len(set(keys)) == 4  # 6 unique stored: no repeats
            else:
                assert set(keys) <= {(0,), (1,)}  # only 2 unique: replacement is required
            for key in keys:
                counts[(g.prompt_key, key)] = counts.get((g.prompt_key, key), 0) + 1
    big = [counts[("big", (j,))] for j in range(6)]
    assert max(big) / min(big) < 1.3  # uniform within a prompt at inv_temp = 0


def test_dedup_newest_wins_and_counts():
    store = TrajectoryStore(100, 10_000)
    store.add(Trajectory("p", (1, 2), 0.0, version=0, payload="old"))
    store.add(Trajectory("p", (1, 2), 1.0, version=3, payload="new"))
    (t,) = store.trajectories("p")
    assert (t.version, t.payload, t.reward) == (3, "new", 1.0)
    assert store.stats.dedup_hits == 1 and len(store) == 1


def test_capacity_evicts_oldest_version_first():
    store = TrajectoryStore(per_prompt_capacity=3, capacity=5)
    for v in (5, 1, 3, 4):  # inserted out of version order
        store.add(Trajectory("a", (v,), 0.0, v))
    assert sorted(t.version for t in store.trajectories("a")) == [3, 4, 5]  # version 1 went first
    for v in (6, 7, 8):
        store.add(Trajectory("b", (v,), 0.0, v))
    assert len(store) == 5  # global cap: the oldest-inserted prompt loses its oldest trajectory
    assert sorted(t.version for t in store.trajectories("a")) == [4, 5]
    assert store.stats.evicted == 2


def test_nonfinite_rewards_never_enter():
    store = TrajectoryStore(10, 100)
    assert not store.add(Trajectory("p", (1,), float("nan"), 0))
    assert not store.add(Trajectory("p", (2,), float("inf"), 0))
    assert store.add(Trajectory("p", (3,), 1.0, 0))
    assert len(store) == 1 and store.stats.rejected_nonfinite == 2


def test_staleness_cap_is_never_exceeded():
    store = TrajectoryStore(100, 10_000)
    fill(store, versions=(0, 3, 6, 9))
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.2, max_staleness=4, seed=5))
    groups = [g for _ in range(200) for g in sampler.sample_groups(4, 3, current_version=10)]
    stale = [10 - t.version for g in groups for t in g.trajectories]
    assert max(stale) <= 4 and min(stale) == 1
    assert staleness_summary(groups, 10)["staleness_max"] <= 4


def test_save_restore_round_trip_is_byte_identical(tmp_path):
    store = TrajectoryStore(100, 10_000)
    fill(store)
    sampler = ReplaySampler(store, ReplaySettings(seed=6))
    sampler.sample_groups(3, 2, 2)  # advance the random state
    first = tmp_path / "a.pt"
    save_atomic(sampler.state_dict(), str(first))
    restored = ReplaySampler(TrajectoryStore(1, 1), ReplaySettings(seed=99))
    restored.load_state_dict(load_checked(str(first)))
    second = tmp_path / "b.pt"
    save_atomic(restored.state_dict(), str(second))
    assert first.read_bytes() == second.read_bytes()
    # the random state continues where it was
    a = [t.response_key for g in sampler.sample_groups(4, 2, 2) for t in g.trajectories]
    b = [t.response_key for g in restored.sample_groups(4, 2, 2) for t in g.trajectories]
    assert a == b


def test_corrupt_checkpoint_is_refused_with_its_path(tmp_path):
    good = tmp_path / "good.pt"
    save_atomic({"trajectories": []}, str(good))
    before = good.read_bytes()
    bad = tmp_path / "bad.pt"
    bad.write_bytes(before[: len(before) // 2])
    with pytest.raises(ValueError, match=str(bad)):
        load_checked(str(bad))
    assert good.read_bytes() == before


@pytest.mark.parametrize("key,value", [("recency_prob", 1.5), ("recency_prob", -0.1), ("capacity", 0),
                                       ("per_prompt_capacity", -1), ("max_staleness", -2)])
def test_out_of_range_knobs_name_the_key(key, value):
    with pytest.raises(ValueError, match=f"trainer.v1.sampler.sampler_kwargs.{key}"):
        parse_replay_settings({key: value}, "trainer.v1.sampler.sampler_kwargs.")


def test_unknown_knob_is_refused():
    with pytest.raises(ValueError, match="sampler_kwargs.recency_probability"):
        parse_replay_settings({"recency_probability": 0.5}, "trainer.v1.sampler.sampler_kwargs.")
