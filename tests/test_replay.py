"""The replay store and sampler, framework-free: frequencies, dedup, eviction, staleness cap, persistence."""

import math
import random

import numpy as np
import pytest

from tba_ext.core.replay import (
    ReferenceLogProbs,
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
                store.admit(Trajectory(f"p{p}", [v, p, j], reward(p, j), v), prompt_payload={"p": p})


def sample(sampler, batch_size, k, version):
    report = sampler.sample_groups(batch_size, k, version)
    assert not report.missing
    return report.groups


def within(observed, expected, n, sigmas=5):
    """|observed - expected| within `sigmas` binomial standard errors."""
    return abs(observed - expected) <= sigmas * math.sqrt(expected * (1 - expected) / n) + 1e-9


def test_recency_vs_replay_branch_frequency():
    store = TrajectoryStore(100, 10_000)
    fill(store, prompts=40)
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.7, seed=1))
    groups = [g for _ in range(400) for g in sample(sampler, 8, 4, 2)]
    frac = np.mean([g.branch == "recency" for g in groups])
    assert within(frac, 0.7, len(groups))
    # recency groups only hold the freshest version; replay groups draw from all versions
    assert all(t.version == 2 for g in groups if g.branch == "recency" for t in g.trajectories)
    replay_versions = [t.version for g in groups if g.branch == "replay" for t in g.trajectories]
    for v in (0, 1, 2):
        assert within(np.mean(np.array(replay_versions) == v), 1 / 3, len(replay_versions))


def test_prompts_are_drawn_without_replacement_and_cycle_across_batches():
    """Replay branch (m = 0): 40 prompts, batches of 8: every 5 batches draw each prompt exactly once (the
    reference cycles over all cids without replacement), in an order that changes between cycles."""
    store = TrajectoryStore(100, 10_000)
    fill(store, prompts=40, reward=lambda p, j: float(p))  # prompt rewards differ: the choice stays uniform
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.0, reward_inv_temp=2.0, seed=2))
    cycles = []
    for _ in range(6):
        drawn = [g.prompt_key for _ in range(5) for g in sample(sampler, 8, 2, 2)]
        assert sorted(drawn) == sorted(f"p{p}" for p in range(40))
        cycles.append(drawn)
    assert len({tuple(c) for c in cycles}) == 6


def test_every_fresh_group_is_drawn_before_any_repeats():
    """m = 1: each version brings 8 new prompts; a batch of 8 draws exactly those, once each. With fewer
    fresh prompts than the batch, the rest are the next-freshest prompts; only a store holding fewer distinct
    prompts than the batch repeats one, and the repeats are counted."""
    store = TrajectoryStore(100, 10_000)
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=1.0, seed=3))
    for version in range(5):
        fresh = {f"v{version}p{p}" for p in range(8)}
        for key in sorted(fresh):
            for j in range(4):
                store.admit(Trajectory(key, [version, j], 1.0, version))
        assert sampler.undrawn_fresh == fresh
        report = sampler.sample_groups(8, 4, version)
        assert sorted(g.prompt_key for g in report.groups) == sorted(fresh) and report.repeated == 0
        assert report.unseen == 8  # all 8 groups trained on for the first time
        assert not sampler.undrawn_fresh
    report = sampler.sample_groups(12, 4, 4)
    keys = [g.prompt_key for g in report.groups]
    assert report.repeated == 0 and len(set(keys)) == 12 and report.fallback == 4
    assert set(keys) >= {f"v4p{p}" for p in range(8)}  # the window first, then version 3
    assert sum(k.startswith("v3") for k in keys) == 4
    assert all(t.version == 3 for g in report.groups if g.prompt_key.startswith("v3") for t in g.trajectories)
    report = sampler.sample_groups(45, 4, 4)  # 40 prompts stored: 5 slots must repeat
    assert report.repeated == 5 and len({g.prompt_key for g in report.groups}) == 40


@pytest.mark.parametrize("n_newest", [1, 3, 8, 32])
def test_a_sparse_newest_version_still_gives_b_distinct_prompts(n_newest):
    """Right after a sync the newest weight version is present for a few prompts only (issue 25's case: B = 32,
    K = 16, m = 0.95, recency_window = 2, 64 groups of version 2 and n of version 4, trainer at version 4): the
    batch holds 32 distinct prompts, the n newest among them, the rest the freshest of the others."""
    store = TrajectoryStore(100, 100_000)
    for p in range(64):
        for j in range(16):
            store.admit(Trajectory(f"old{p}", [p, j], float(j % 2), 2))
    for p in range(n_newest):
        for j in range(16):
            store.admit(Trajectory(f"new{p}", [100 + p, j], float(j % 2), 4))
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.95, recency_window=2, seed=5))
    for _ in range(20):
        report = sampler.sample_groups(32, 16, 4)
        keys = [g.prompt_key for g in report.groups]
        assert not report.missing and report.repeated == 0 and len(set(keys)) == 32, keys
        assert all(len({id(t) for t in g.trajectories}) == 16 for g in report.groups)  # K without replacement
    # the recency window is the trainer's: data of version 4 is within 2 updates of update 4, version 2 is not
    first = ReplaySampler(store, ReplaySettings(recency_prob=1.0, recency_window=2, seed=6)).sample_groups(32, 16, 4)
    assert {g.prompt_key for g in first.groups} >= {f"new{p}" for p in range(n_newest)}
    assert first.fallback == 32 - n_newest


def test_a_store_drained_below_b_prompts_serves_no_distinct_batch_until_refilled():
    """Free-running searchers outrun by the trainer: the staleness cap leaves 2 prompts where a batch needs 8.
    Asked for distinct prompts (the decoupled trainer), the sampler serves nothing and draws nothing (no draw
    counted, no random number used) instead of 8 groups of 2 prompts; once the searchers deliver 6 more it serves 8
    distinct ones. Without ``distinct`` (lockstep) the same store repeats prompts, counted."""
    store = TrajectoryStore(100, 10_000)
    settings = ReplaySettings(recency_prob=0.95, recency_window=4, max_staleness=8, seed=7)
    fill(store, prompts=8, per_prompt=4, versions=(0,))
    fill(store, prompts=2, per_prompt=4, versions=(6,))
    sampler = ReplaySampler(store, settings)
    rng_state = sampler.rng.getstate()
    report = sampler.sample_groups(8, 4, current_version=11, distinct=True)  # versions below 3 leave the store
    assert store.num_prompts == 2 and report.missing == 6 and not report.groups
    assert sampler.rng.getstate() == rng_state
    assert all(t.draws == 0 for key in store.prompt_keys() for t in store.trajectories(key))
    fill(store, prompts=8, per_prompt=4, versions=(10,))
    report = sampler.sample_groups(8, 4, current_version=11, distinct=True)
    assert not report.missing and report.repeated == 0 and len({g.prompt_key for g in report.groups}) == 8
    lockstep = TrajectoryStore(100, 10_000)
    fill(lockstep, prompts=2, per_prompt=4, versions=(0,))
    report = ReplaySampler(lockstep, settings).sample_groups(8, 4, current_version=0)
    assert not report.missing and report.repeated == 6


def test_replay_branch_weights_trajectories_within_a_prompt_by_softmax():
    """Reference rule: a uniform prompt, then softmax(inv_temp * reward) over that prompt's trajectories."""
    inv_temp = 1.5
    store = TrajectoryStore(100, 10_000)
    for p in range(3):
        for j in range(4):
            store.admit(Trajectory(f"p{p}", [p, j], float(j + p), 0))
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.0, reward_inv_temp=inv_temp, seed=4))
    picks = [(g.prompt_key, g.trajectories[0].reward) for _ in range(3000) for g in sample(sampler, 3, 1, 0)]
    n = len(picks)
    for p in range(3):
        assert sum(key == f"p{p}" for key, _ in picks) == n // 3  # cycling: exactly uniform over prompts
        rewards = np.arange(4) + p
        soft = np.exp(inv_temp * rewards) / np.exp(inv_temp * rewards).sum()
        chosen = [r for key, r in picks if key == f"p{p}"]
        for r, expected in zip(rewards, soft):
            assert within(chosen.count(float(r)) / len(chosen), expected, len(chosen))


def test_k_draws_without_replacement_unless_too_few():
    store = TrajectoryStore(100, 10_000)
    for j in range(6):
        store.admit(Trajectory("big", [j], 1.0, 0))
    for j in range(2):
        store.admit(Trajectory("small", [j], 1.0, 0))
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.0, seed=4))
    counts = {}
    for _ in range(300):
        for g in sample(sampler, 2, 4, 0):
            keys = [tuple(t.response) for t in g.trajectories]
            if g.prompt_key == "big":
                assert len(set(keys)) == 4  # 6 unique stored: no repeats
            else:
                assert set(keys) <= {(0,), (1,)}  # only 2 unique: replacement is required
            for key in keys:
                counts[(g.prompt_key, key)] = counts.get((g.prompt_key, key), 0) + 1
    big = [counts[("big", (j,))] for j in range(6)]
    assert max(big) / min(big) < 1.3  # uniform within a prompt at inv_temp = 0


def test_one_ingest_gives_the_same_store_and_draws_whatever_order_its_rows_came_in():
    # a prompt with fewer distinct responses than K (one of them a duplicate, as searchers produce): which one
    # the draw repeats follows the store's order, and that order must not come from the rows' finishing times
    rows = [(f"p{p}", [p, j % 3], float(j % 2)) for p in range(3) for j in range(4)] + [("p0", [0, 1], 1.0)]
    draws = set()
    for perm_seed in range(6):
        shuffled = [(Trajectory(key, response, reward, 5), {"p": key}) for key, response, reward in rows]
        random.Random(perm_seed).shuffle(shuffled)
        store = TrajectoryStore(100, 10_000)
        assert store.admit_batch(shuffled) == len(rows)
        sampler = ReplaySampler(store, ReplaySettings(recency_prob=1.0, seed=3))
        groups = sample(sampler, 3, 4, 5)
        draws.add(tuple((g.prompt_key, tuple(tuple(t.response) for t in g.trajectories)) for g in groups))
    assert len(draws) == 1


def test_trajectory_keeps_tokens_logprobs_and_extras_exactly():
    t = Trajectory("p", np.array([5, 2**31 - 1, 0]), 1.0, 3, rollout_logprobs=[-0.5, -1e-9, -30.0], extras=b"\x00x")
    assert t.response.tolist() == [5, 2**31 - 1, 0] and t.response.dtype == np.int32
    assert t.rollout_logprobs.tolist() == np.float32([-0.5, -1e-9, -30.0]).tolist()
    assert t.extras == b"\x00x"
    assert Trajectory("p", [1], 0.0, 0).rollout_logprobs is None


def test_reference_logprobs_in_16_bits_keep_the_masked_sum_exact():
    rng = np.random.default_rng(0)
    values = np.float32(-rng.exponential(3.0, 1024) - 1e-3)  # a 1024-token response's reference log-probs
    mask = np.ones(1024, dtype=bool)
    mask[[5, 700, 1023]] = False  # tool-masked tokens, the last among them
    exact = values[mask].sum(dtype=np.float64)
    half_only = np.float16(values).astype(np.float32)[mask].sum(dtype=np.float64)
    assert abs(half_only - exact) > 1e-3  # float16 alone would move l_ref by this much: the test can fail
    ref = ReferenceLogProbs(values, mask, version=2)
    served = ref.values(mask)
    assert abs(served[mask].sum(dtype=np.float64) - exact) < 1e-3 * 2**-10  # exact to float32's rounding
    assert ref.nbytes == 2 * 1024 and ref.last == 1022  # the last unmasked token carries the correction
    others = np.arange(1024) != 1022
    np.testing.assert_allclose(served[others], values[others], rtol=2**-11, atol=0)
    with pytest.raises(ValueError, match="finite"):
        ReferenceLogProbs(np.array([-1.0, -np.inf]), None)


def test_stored_reference_logprobs_serve_only_their_reference_version_and_persist(tmp_path):
    store = TrajectoryStore(10, 100)
    traj = Trajectory("p", [1, 2, 3], 1.0, 0)
    store.admit(traj, prompt_payload={})
    before = store.nbytes
    store.set_reference(traj, [-1.0, -2.5, -0.25])
    assert store.nbytes == before + 6  # counted against capacity_bytes
    assert traj.reference_logprobs(0).tolist() == [-1.0, -2.5, -0.25]
    saved = store.state_dict()
    store.reference_version += 1  # the reference moved: what is stored is of the old one
    assert traj.reference_logprobs(store.reference_version) is None
    restored = TrajectoryStore(10, 100)
    restored.load_state_dict(saved)
    (back,) = restored.trajectories("p")
    assert restored.reference_version == 0 and back.reference_logprobs(0).tolist() == [-1.0, -2.5, -0.25]
    assert restored.nbytes == before + 6


def test_dedup_newest_wins_and_counts():
    store = TrajectoryStore(100, 10_000)
    store.admit(Trajectory("p", [1, 2], 0.0, version=0, extras=b"old"))
    store.admit(Trajectory("p", [1, 2], 1.0, version=3, extras=b"new"))
    store.admit(Trajectory("p", [1, 2, 0], 1.0, version=3))  # a different response
    first, second = store.trajectories("p")
    assert (first.version, first.extras, first.reward) == (3, b"new", 1.0)
    assert store.stats.dedup_hits == 1 and len(store) == 2


def test_capacity_evicts_oldest_version_first():
    store = TrajectoryStore(per_prompt_capacity=3, capacity=5)
    for v in (5, 1, 3, 4):  # inserted out of version order
        store.admit(Trajectory("a", [v], 0.0, v))
    assert sorted(t.version for t in store.trajectories("a")) == [3, 4, 5]  # version 1 went first
    for v in (6, 7, 8):
        store.admit(Trajectory("b", [v], 0.0, v))
    assert len(store) == 5  # global cap: the oldest version in the store goes first
    assert sorted(t.version for t in store.trajectories("a")) == [4, 5]
    assert store.stats.evicted == 2


def test_byte_capacity_holds_and_counts_what_is_stored():
    one = Trajectory("x", np.zeros(100), 0.0, 0, rollout_logprobs=np.zeros(100)).nbytes
    store = TrajectoryStore(per_prompt_capacity=100, capacity=10**6, capacity_bytes=10 * one)
    for v in range(25):
        store.admit(Trajectory(f"p{v % 3}", np.full(100, v), 0.0, v, rollout_logprobs=np.zeros(100)))
        assert store.nbytes <= 10 * one
    assert len(store) == 10 and sorted(t.version for p in range(3) for t in store.trajectories(f"p{p}")) == list(
        range(15, 25)
    )


def test_nonfinite_rewards_never_enter():
    store = TrajectoryStore(10, 100)
    assert not store.admit(Trajectory("p", [1], float("nan"), 0))
    assert not store.admit(Trajectory("p", [2], float("inf"), 0))
    assert store.admit(Trajectory("p", [3], 1.0, 0))
    assert len(store) == 1 and store.stats.rejected_nonfinite == 2


def test_staleness_cap_is_never_exceeded():
    store = TrajectoryStore(100, 10_000)
    fill(store, versions=(0, 3, 6, 9))
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.2, max_staleness=4, seed=5))
    groups = [g for _ in range(200) for g in sample(sampler, 4, 3, 10)]
    stale = [10 - t.version for g in groups for t in g.trajectories]
    assert max(stale) <= 4 and min(stale) == 1
    assert staleness_summary(groups, 10)["staleness_max"] <= 4
    # they can never be drawn again, so they left the store
    assert {t.version for p in range(4) for t in store.trajectories(f"p{p}")} == {6, 9}
    assert store.stats.evicted_stale == 2 * 4 * 6


def test_an_empty_or_fully_stale_store_reports_missing_groups_instead_of_raising():
    store = TrajectoryStore(100, 10_000)
    sampler = ReplaySampler(store, ReplaySettings(max_staleness=2, seed=5))
    assert sampler.sample_groups(4, 2, 0).missing == 4
    fill(store, versions=(0,))
    assert sampler.sample_groups(4, 2, 10).missing == 4 and len(store) == 0


def test_max_replays_caps_how_often_a_trajectory_is_drawn():
    store = TrajectoryStore(100, 10_000)
    fill(store, prompts=4, per_prompt=4, versions=(0,))
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.5, max_replays=3, seed=6))
    draws = {}
    for _ in range(40):
        report = sampler.sample_groups(2, 2, 0)
        if report.missing:
            break
        for t in {id(t): t for g in report.groups for t in g.trajectories}.values():
            draws[tuple(t.response)] = t.draws
    assert max(draws.values()) <= 3 and len(draws) == 16
    assert len(store) == 0 and store.stats.evicted_replayed == 16


def test_save_restore_round_trip_is_byte_identical(tmp_path):
    store = TrajectoryStore(5, 40)
    fill(store)
    sampler = ReplaySampler(store, ReplaySettings(recency_prob=0.5, reward_inv_temp=1.0, seed=6))
    sampler.sample_groups(3, 2, 2)  # advance the random state and the prompt cycles
    first = tmp_path / "a.pt"
    save_atomic(sampler.state_dict(), str(first))
    restored = ReplaySampler(TrajectoryStore(1, 1), ReplaySettings(recency_prob=0.5, reward_inv_temp=1.0, seed=99))
    restored.load_state_dict(load_checked(str(first)))
    second = tmp_path / "b.pt"
    save_atomic(restored.state_dict(), str(second))
    assert first.read_bytes() == second.read_bytes()
    # the random state continues where it was
    for version in range(2, 7):
        a = [tuple(t.response) for g in sample(sampler, 4, 2, version) for t in g.trajectories]
        b = [tuple(t.response) for g in sample(restored, 4, 2, version) for t in g.trajectories]
        assert a == b
        # and both keep admitting and evicting alike (dedup hits, per-prompt and global caps)
        for s in (sampler, restored):
            fill(s.store, prompts=5, per_prompt=3, versions=(version,), reward=lambda p, j: float(p + j))
            fill(s.store, prompts=2, per_prompt=3, versions=(version,))
        assert [(t.version, t.order) for p in range(5) for t in sampler.store.trajectories(f"p{p}")] == [
            (t.version, t.order) for p in range(5) for t in restored.store.trajectories(f"p{p}")
        ]


def test_corrupt_checkpoint_is_refused_with_its_path(tmp_path):
    good = tmp_path / "good.pt"
    save_atomic({"trajectories": []}, str(good))
    before = good.read_bytes()
    bad = tmp_path / "bad.pt"
    bad.write_bytes(before[: len(before) // 2])
    with pytest.raises(ValueError, match=str(bad)):
        load_checked(str(bad))
    assert good.read_bytes() == before


@pytest.mark.parametrize(
    "key,value",
    [
        ("recency_prob", 1.5),
        ("recency_prob", -0.1),
        ("capacity", 0),
        ("per_prompt_capacity", -1),
        ("max_staleness", -2),
        ("max_replays", 0),
        ("capacity_bytes", 0),
        ("samples_per_prompt", 1),
        ("wait_timeout_s", 0),
    ],
)
def test_out_of_range_knobs_name_the_key(key, value):
    with pytest.raises(ValueError, match=f"trainer.v1.sampler.sampler_kwargs.{key}"):
        parse_replay_settings({key: value}, "trainer.v1.sampler.sampler_kwargs.")


@pytest.mark.parametrize(
    "knobs, named",
    [
        ({"staleness_mix": []}, "staleness_mix"),
        ({"staleness_mix": [1, -4]}, "staleness_mix"),
        ({"staleness_mix": [1, "4"]}, "staleness_mix must be a list of ints or null"),
        ({"staleness_mix": [1, 4, 10, 32], "max_staleness": 10}, "max_staleness must be >= the largest"),
        ({"staleness_mix": [1, 4], "max_replays": 2}, "max_replays must be 1 or null"),
    ],
)
def test_a_staleness_mix_the_store_cannot_serve_is_refused_naming_the_key(knobs, named):
    with pytest.raises(ValueError, match=f"trainer.v1.sampler.sampler_kwargs.{named}"):
        parse_replay_settings(knobs, "trainer.v1.sampler.sampler_kwargs.")


def test_a_mixed_staleness_batch_serves_each_level_evenly_and_each_group_once():
    """tba-prime's mixed batch, levels {1, 4, 10, 32}, fed as compare's mixed arm feeds it: an initial buffer of
    (1 + mean level) batches at version 0, then one fresh batch per update. From update 32 on every batch holds
    B / 4 groups at each level exactly (before that the top level takes the oldest groups, staleness = the
    update); no trajectory is served twice, none goes stale unserved, and B distinct prompts per batch. The store
    keeps identical responses (each group served as generated: half of each group here repeats the other half)."""
    levels, batch, k = [1, 4, 10, 32], 32, 4
    store = TrajectoryStore(100, 100_000, dedup=False)
    sampler = ReplaySampler(store, ReplaySettings(staleness_mix=levels, max_staleness=32, seed=3))

    def generate(version, prompts):
        for p in range(prompts):
            for j in range(k):
                store.admit(Trajectory(f"v{version}p{p}", [version, p, j % 2], float(j % 2), version))

    generate(0, math.ceil((1 + sum(levels) / len(levels)) * batch))
    served = set()
    for update in range(100):
        if update:
            generate(update, batch)
        report = sampler.sample_groups(batch, k, update)
        assert not report.missing and len({g.prompt_key for g in report.groups}) == batch
        assert all(g.branch == "mix" and len({t.order for t in g.trajectories}) == k for g in report.groups)
        staleness = sorted(update - min(t.version for t in g.trajectories) for g in report.groups)
        if update >= 32:
            assert staleness == sorted(levels * (batch // len(levels))), update
        elif update >= 10:
            assert staleness == sorted([1, 4, 10, update] * (batch // len(levels))), update
        for g in report.groups:
            for t in g.trajectories:
                assert (t.prompt_key, t.order) not in served  # each group once
                served.add((t.prompt_key, t.order))
                assert store.prompt(t.prompt_key) is None  # it left the store with its draw
    assert store.stats.evicted_stale == 0 and store.stats.evicted_replayed == len(served)
    assert store.stats.dedup_hits == 0
    # a store holding fewer than B prompts serves nothing: the caller waits for generation
    small = TrajectoryStore(100, 1000)
    for p in range(3):
        small.admit(Trajectory(f"p{p}", [p], 1.0, 0))
    report = ReplaySampler(small, ReplaySettings(staleness_mix=levels)).sample_groups(4, 1, 5)
    assert report.missing == 1 and not report.groups and len(small) == 3


def test_a_store_without_dedup_keeps_identical_responses_through_eviction_and_a_restore(tmp_path):
    store = TrajectoryStore(100, 1000, dedup=False)
    copies = [Trajectory("p", [7, 7], 1.0, 0) for _ in range(3)]
    for traj in copies:
        store.admit(traj)
    assert len(store) == 3 and store.stats.dedup_hits == 0
    assert store.evict(copies[1], "max_replays") and not store.evict(copies[1], "max_replays")
    save_atomic({"store": store.state_dict()}, str(tmp_path / "store.pt"))
    restored = TrajectoryStore(100, 1000, dedup=False)
    restored.load_state_dict(load_checked(str(tmp_path / "store.pt"))["store"])
    assert [t.order for t in restored.trajectories("p")] == [copies[0].order, copies[2].order]
    assert all(restored.evict(t, "max_replays") for t in restored.trajectories("p")) and len(restored) == 0


def test_unknown_knob_is_refused():
    with pytest.raises(ValueError, match="sampler_kwargs.recency_probability"):
        parse_replay_settings({"recency_probability": 0.5}, "trainer.v1.sampler.sampler_kwargs.")


def test_removed_reward_mix_says_what_replaced_it():
    with pytest.raises(ValueError, match="sampler_kwargs.reward_mix: .*within a prompt"):
        parse_replay_settings({"reward_mix": 0.5}, "trainer.v1.sampler.sampler_kwargs.")


def test_resize_takes_new_capacities_evicting_oldest_first():
    store = TrajectoryStore(100, 10_000)
    fill(store, prompts=4, per_prompt=6, versions=(0, 1, 2))  # 72 trajectories, 18 per prompt
    assert store.resize(10, 10_000, None) == 32  # each prompt keeps its 10 newest
    assert all(len(store.trajectories(f"p{p}")) == 10 for p in range(4))
    assert min(t.version for p in range(4) for t in store.trajectories(f"p{p}")) == 1
    assert store.resize(10, 20, None) == 20 and len(store) == 20
    assert {t.version for p in range(4) for t in store.trajectories(f"p{p}")} == {2}
    assert store.resize(100, 1_000, None) == 0
