"""TBA's replay store and staleness-aware sampler (reference spec section 2), framework-free.

The store keeps finished trajectories grouped per prompt. Each carries its reward and the weight version
that generated it (``version``: the oldest policy version that contributed tokens). Staleness of a
trajectory at trainer version v is ``v - version``.

Sampling (``ReplaySampler.sample_groups``), for each of B group slots independently:
- with probability ``recency_prob`` (m): a prompt among those with trajectories from the freshest
  ``recency_window`` versions, and K of those fresh trajectories;
- otherwise: a prompt from the whole store with probability
  ``reward_mix * softmax(inv_temp * prompt_reward) + (1 - reward_mix) * uniform``, and K of its trajectories
  weighted the same way per trajectory (inv_temp = 0 is uniform, the paper's GSM8K setting);
- K draws are without replacement unless the prompt holds fewer than K unique trajectories;
- trajectories staler than ``max_staleness`` are never sampled.
"""

from __future__ import annotations

import bisect
import heapq
import io
import math
import random
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np
import torch

from tba_ext.core.settings import ReplaySettings

FORMAT_VERSION = 1
FILE_FORMAT = "tba-ext-replay"


@dataclass(slots=True)
class Trajectory:
    prompt_key: Hashable  # identity of the prompt across generations (e.g. a hash of its token ids)
    response_key: Hashable  # exact response tokens (e.g. their int32 bytes): the dedup key
    reward: float
    version: int  # weight version that generated it (verl: min_global_steps)
    insert_order: int = 0
    payload: Any = None  # whatever the adapter needs to re-insert it (verl: the TransferQueue row)


@dataclass
class StoreStats:
    added: int = 0
    dedup_hits: int = 0
    evicted: int = 0
    rejected_nonfinite: int = 0
    seen: int = 0


@dataclass
class SampledGroup:
    prompt_key: Hashable
    trajectories: list[Trajectory]
    branch: str  # "recency" or "replay"


class TrajectoryStore:
    """Per-prompt FIFO-by-version buffers with a global capacity, deduplicated by response tokens.

    Eviction always removes the trajectory with the oldest (version, insertion) among those over capacity:
    per prompt when its buffer exceeds ``per_prompt_capacity``, globally when the store exceeds ``capacity``.
    Both use heaps with lazy deletion, so insert is O(log n) whatever the store size.
    """

    def __init__(self, per_prompt_capacity: int, capacity: int):
        if per_prompt_capacity <= 0 or capacity <= 0:
            raise ValueError("per_prompt_capacity and capacity must be > 0")
        self.per_prompt_capacity = per_prompt_capacity
        self.capacity = capacity
        self.prompts: "OrderedDict[Hashable, dict]" = OrderedDict()
        self.stats = StoreStats()
        self._order = 0
        self._size = 0
        self.mutations = 0  # bumped on every insert/eviction: samplers cache derived tables until it moves
        self._global_heap: list = []  # (version, order, prompt_key, response_key)
        self._prompt_heaps: dict = {}
        # indexes that keep sampling cheap at 1e6 trajectories
        self.prompt_keys: list = []  # dense list for O(1) uniform choice
        self._prompt_pos: dict = {}
        self.reward_sum: dict = {}
        self._version_prompts: dict[int, dict] = {}  # version -> {prompt_key: count}

    def _on_insert(self, traj: Trajectory) -> None:
        if traj.prompt_key not in self._prompt_pos:
            self._prompt_pos[traj.prompt_key] = len(self.prompt_keys)
            self.prompt_keys.append(traj.prompt_key)
        self.reward_sum[traj.prompt_key] = self.reward_sum.get(traj.prompt_key, 0.0) + traj.reward
        counts = self._version_prompts.setdefault(traj.version, {})
        counts[traj.prompt_key] = counts.get(traj.prompt_key, 0) + 1

    def _on_remove(self, traj: Trajectory) -> None:
        self.reward_sum[traj.prompt_key] -= traj.reward
        counts = self._version_prompts[traj.version]
        counts[traj.prompt_key] -= 1
        if not counts[traj.prompt_key]:
            del counts[traj.prompt_key]
            if not counts:
                del self._version_prompts[traj.version]
        if traj.prompt_key not in self.prompts:  # last trajectory of the prompt: swap-remove it
            pos = self._prompt_pos.pop(traj.prompt_key)
            last = self.prompt_keys.pop()
            if last != traj.prompt_key:
                self.prompt_keys[pos] = last
                self._prompt_pos[last] = pos
            del self.reward_sum[traj.prompt_key]

    def fresh_prompts(self, window: int) -> list:
        """Prompts holding trajectories from the newest ``window`` versions."""
        if not self._version_prompts:
            return []
        newest = max(self._version_prompts)
        keys: dict = {}
        for v in range(newest - window + 1, newest + 1):
            keys.update(self._version_prompts.get(v, {}))
        return list(keys)

    def __len__(self) -> int:
        return self._size

    def add(self, traj: Trajectory) -> bool:
        """Insert one trajectory; returns False if refused (non-finite reward)."""
        self.stats.seen += 1
        if not math.isfinite(traj.reward):
            self.stats.rejected_nonfinite += 1
            return False
        bucket = self.prompts.setdefault(traj.prompt_key, {})
        if traj.response_key in bucket:  # same tokens seen before: the newest copy wins
            self.stats.dedup_hits += 1
            old = bucket.pop(traj.response_key)
            self._size -= 1
            self._on_remove(old)
        self._order += 1
        self.mutations += 1
        traj.insert_order = self._order
        bucket[traj.response_key] = traj
        self._size += 1
        self._on_insert(traj)
        entry = (traj.version, traj.insert_order, traj.prompt_key, traj.response_key)
        heapq.heappush(self._global_heap, entry)
        heapq.heappush(self._prompt_heaps.setdefault(traj.prompt_key, []), entry)
        self.stats.added += 1
        while len(bucket) > self.per_prompt_capacity:
            self._evict_oldest(self._prompt_heaps[traj.prompt_key])
        while self._size > self.capacity:
            self._evict_oldest(self._global_heap)
        return True

    def _live(self, entry) -> bool:
        _, order, prompt_key, response_key = entry
        t = self.prompts.get(prompt_key, {}).get(response_key)
        return t is not None and t.insert_order == order

    def _evict_oldest(self, heap: list) -> None:
        while heap:
            entry = heapq.heappop(heap)
            if self._live(entry):
                _, _, prompt_key, response_key = entry
                bucket = self.prompts[prompt_key]
                old = bucket.pop(response_key)
                self._size -= 1
                self.mutations += 1
                self.stats.evicted += 1
                if not bucket:
                    del self.prompts[prompt_key]
                    self._prompt_heaps.pop(prompt_key, None)
                self._on_remove(old)
                return

    def newest_version(self) -> int | None:
        return max(self._version_prompts) if self._version_prompts else None

    def trajectories(self, prompt_key) -> list[Trajectory]:
        return list(self.prompts.get(prompt_key, {}).values())

    # -- persistence --------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "format_version": FORMAT_VERSION,
            "per_prompt_capacity": self.per_prompt_capacity,
            "capacity": self.capacity,
            "order": self._order,
            "stats": vars(self.stats).copy(),
            "trajectories": sorted(
                ((t.prompt_key, t.response_key, t.reward, t.version, t.insert_order, t.payload)
                 for bucket in self.prompts.values() for t in bucket.values()),
                key=lambda row: row[4],
            ),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"replay store format {state.get('format_version')} is not {FORMAT_VERSION}")
        self.__init__(state["per_prompt_capacity"], state["capacity"])
        for prompt_key, response_key, reward, version, order, payload in state["trajectories"]:
            traj = Trajectory(prompt_key, response_key, reward, version, order, payload)
            self.prompts.setdefault(prompt_key, {})[response_key] = traj
            self._on_insert(traj)
            entry = (version, order, prompt_key, response_key)
            self._global_heap.append(entry)
            self._prompt_heaps.setdefault(prompt_key, []).append(entry)
            self._size += 1
        heapq.heapify(self._global_heap)
        for heap in self._prompt_heaps.values():
            heapq.heapify(heap)
        self._order = state["order"]
        self.stats = StoreStats(**state["stats"])


def save_atomic(state: dict, path: str) -> None:
    """Write ``state`` with torch.save to a temporary file, fsync, then rename over ``path``: a crash at
    any point leaves either the old file or the new one, never a torn file."""
    buffer = io.BytesIO()
    torch.save({"format": FILE_FORMAT, "format_version": FORMAT_VERSION, "state": state}, buffer)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(buffer.getvalue())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checked(path: str) -> dict:
    """Load a saved store; a damaged file is refused with its path and nothing else is touched."""
    try:
        state = torch.load(path, weights_only=False)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"replay store checkpoint {path} is corrupt or unreadable: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != FILE_FORMAT:
        raise ValueError(f"replay store checkpoint {path} is not a tba-ext replay store")
    if state.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"replay store checkpoint {path} has format version {state.get('format_version')}, "
                         f"this tba-ext reads {FORMAT_VERSION}")
    return state["state"]


def _mixed_probs(rewards: np.ndarray, inv_temp: float, reward_mix: float) -> np.ndarray:
    """reward_mix * softmax(inv_temp * r) + (1 - reward_mix) * uniform."""
    n = len(rewards)
    logits = inv_temp * rewards
    soft = np.exp(logits - logits.max())
    soft /= soft.sum()
    return reward_mix * soft + (1.0 - reward_mix) / n


class ReplaySampler:
    """Draws B groups of K trajectories from a ``TrajectoryStore`` by TBA's recency/reward/uniform rule.

    Uses Python's ``random.Random`` (scalar draws are an order of magnitude cheaper than numpy's); its
    state is part of ``state_dict`` so a resumed run continues the same random sequence.
    """

    def __init__(self, store: TrajectoryStore, settings: ReplaySettings):
        self.store = store
        self.settings = settings
        self.rng = random.Random(settings.seed)
        self.np_rng = np.random.default_rng(settings.seed)  # vector draws (weighted K without replacement)
        # pools, weights and the prompt CDF derived from the store, valid while the store and the current
        # version are unchanged (a training step inserts, so each step rebuilds them once)
        self._cache: dict = {}
        self._cache_key = None

    def eligible(self, traj: Trajectory, current_version: int) -> bool:
        cap = self.settings.max_staleness
        return cap is None or current_version - traj.version <= cap

    def _eligible_of(self, prompt_key, current_version: int, fresh_from: int | None) -> list[Trajectory]:
        cached = self._cache.get((prompt_key, fresh_from))
        if cached is not None:
            return cached
        pool = self._filter(prompt_key, current_version, fresh_from)
        self._cache[(prompt_key, fresh_from)] = pool
        return pool

    def _filter(self, prompt_key, current_version: int, fresh_from: int | None) -> list[Trajectory]:
        trajs = self.store.prompts.get(prompt_key, {}).values()
        if self.settings.max_staleness is None and fresh_from is None:
            return list(trajs)
        return [t for t in trajs if self.eligible(t, current_version) and (fresh_from is None or t.version >= fresh_from)]

    def _reward_weighted(self) -> bool:
        return self.settings.reward_inv_temp != 0 and self.settings.reward_mix != 0

    def _pick_k(self, pool: list[Trajectory], k: int, weights: np.ndarray | None) -> list[Trajectory]:
        """K of ``pool``: without replacement unless it holds fewer than K (then with replacement)."""
        if weights is None:
            return self.rng.sample(pool, k) if len(pool) >= k else self.rng.choices(pool, k=k)
        if len(pool) < k:
            return self.rng.choices(pool, weights=weights.tolist(), k=k)
        # weighted sampling without replacement (Efraimidis-Spirakis): the K largest u^(1/w)
        keys = self.np_rng.random(len(pool)) ** (1.0 / weights)
        return [pool[i] for i in np.argpartition(-keys, k - 1)[:k]]

    def _trajectory_weights(self, prompt_key, pool: list[Trajectory]) -> np.ndarray:
        cached = self._cache.get((prompt_key, "weights"))
        if cached is None:
            rewards = np.fromiter((t.reward for t in pool), dtype=float, count=len(pool))
            cached = _mixed_probs(rewards, self.settings.reward_inv_temp, self.settings.reward_mix)
            self._cache[(prompt_key, "weights")] = cached
        return cached

    def _prompt_cdf(self, keys: list) -> list[float] | None:
        """Cumulative prompt weights for the replay branch, or None for uniform."""
        if not self._reward_weighted():
            return None
        means = np.array([self.store.reward_sum[p] / len(self.store.prompts[p]) for p in keys])
        return np.cumsum(_mixed_probs(means, self.settings.reward_inv_temp, self.settings.reward_mix)).tolist()

    def _draw(self, keys: list, cdf: list[float] | None, current_version: int, fresh_from: int | None):
        """A prompt (uniform, or by ``cdf``) with eligible trajectories; a few redraws, then an exact scan
        (reached only when a staleness cap empties most prompts)."""
        for _ in range(32):
            if cdf is None:
                key = keys[self.rng.randrange(len(keys))]
            else:
                key = keys[min(bisect.bisect_right(cdf, self.rng.random() * cdf[-1]), len(keys) - 1)]
            pool = self._eligible_of(key, current_version, fresh_from)
            if pool:
                return key, pool
        pools = [(p, self._eligible_of(p, current_version, fresh_from)) for p in keys]
        live = [i for i, (_, pool) in enumerate(pools) if pool]
        if not live:
            return None, []
        if cdf is None:
            return pools[live[self.rng.randrange(len(live))]]
        probs = np.diff([0.0, *cdf])
        return pools[self.rng.choices(live, weights=[probs[i] for i in live], k=1)[0]]

    def sample_groups(self, batch_size: int, k: int, current_version: int) -> list[SampledGroup]:
        s = self.settings
        if not len(self.store):
            raise RuntimeError("the replay store is empty")
        fresh_from = self.store.newest_version() - s.recency_window + 1
        fresh_keys = self.store.fresh_prompts(s.recency_window)
        all_keys = self.store.prompt_keys
        if self._cache_key != (self.store.mutations, current_version):
            self._cache = {"cdf": self._prompt_cdf(all_keys)}
            self._cache_key = (self.store.mutations, current_version)
        cdf = self._cache["cdf"]
        groups = []
        for _ in range(batch_size):
            recency = self.rng.random() < s.recency_prob
            if recency:
                prompt, pool = self._draw(fresh_keys, None, current_version, fresh_from)
            else:
                prompt, pool = self._draw(all_keys, cdf, current_version, None)
            if prompt is None:
                raise RuntimeError("the replay store holds no sampleable trajectories (all staler than "
                                   "max_staleness?)")
            weights = self._trajectory_weights(prompt, pool) if not recency and self._reward_weighted() else None
            groups.append(SampledGroup(prompt, self._pick_k(pool, k, weights), "recency" if recency else "replay"))
        return groups

    def state_dict(self) -> dict:
        return {"store": self.store.state_dict(), "rng": self.rng.getstate(),
                "np_rng": self.np_rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.store.load_state_dict(state["store"])
        self.rng.setstate(state["rng"])
        self.np_rng.bit_generator.state = state["np_rng"]


def staleness_summary(groups: list[SampledGroup], current_version: int, hist_bins: int = 4) -> dict[str, float]:
    """Replay fraction and staleness of a sampled batch: mean, max, and the share at each staleness
    0..hist_bins-1 plus ``hist_bins``-or-more (keys ``staleness_hist/<s>`` and ``staleness_hist/<n>+``)."""
    stale = np.array([current_version - t.version for g in groups for t in g.trajectories], dtype=float)
    replayed = np.array([g.branch == "replay" for g in groups], dtype=float)
    summary = {
        "staleness_mean": float(stale.mean()) if stale.size else 0.0,
        "staleness_max": float(stale.max()) if stale.size else 0.0,
        "replay_fraction": float(replayed.mean()) if replayed.size else 0.0,
    }
    for s in range(hist_bins):
        summary[f"staleness_hist/{s}"] = float((stale == s).mean()) if stale.size else 0.0
    summary[f"staleness_hist/{hist_bins}+"] = float((stale >= hist_bins).mean()) if stale.size else 0.0
    return summary

