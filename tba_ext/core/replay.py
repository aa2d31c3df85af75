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

import io
import math
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np
import torch

from tba_ext.core.settings import ReplaySettings

FORMAT_VERSION = 1
FILE_FORMAT = "tba-ext-replay"


@dataclass
class Trajectory:
    prompt_key: Hashable  # identity of the prompt across generations (e.g. a hash of its token ids)
    response_key: tuple  # exact response token ids: the dedup key
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
    """Per-prompt FIFO-by-version buffers with a global capacity, deduplicated by response tokens."""

    def __init__(self, per_prompt_capacity: int, capacity: int):
        if per_prompt_capacity <= 0 or capacity <= 0:
            raise ValueError("tba.replay.per_prompt_capacity and tba.replay.capacity must be > 0")
        self.per_prompt_capacity = per_prompt_capacity
        self.capacity = capacity
        self.prompts: "OrderedDict[Hashable, dict[tuple, Trajectory]]" = OrderedDict()
        self.stats = StoreStats()
        self._order = 0

    def __len__(self) -> int:
        return sum(len(v) for v in self.prompts.values())

    def add(self, traj: Trajectory) -> bool:
        """Insert one trajectory; returns False if refused (non-finite reward)."""
        self.stats.seen += 1
        if not math.isfinite(traj.reward):
            self.stats.rejected_nonfinite += 1
            return False
        bucket = self.prompts.setdefault(traj.prompt_key, {})
        if traj.response_key in bucket:  # same tokens seen before: the newest copy wins
            self.stats.dedup_hits += 1
            del bucket[traj.response_key]
        self._order += 1
        traj.insert_order = self._order
        bucket[traj.response_key] = traj
        self.stats.added += 1
        while len(bucket) > self.per_prompt_capacity:
            self._evict_from(traj.prompt_key)
        while len(self) > self.capacity:
            oldest_prompt = min(self.prompts, key=lambda p: self._oldest(p).insert_order)
            self._evict_from(oldest_prompt)
        return True

    def _oldest(self, prompt_key) -> Trajectory:
        return min(self.prompts[prompt_key].values(), key=lambda t: (t.version, t.insert_order))

    def _evict_from(self, prompt_key) -> None:
        bucket = self.prompts[prompt_key]
        del bucket[self._oldest(prompt_key).response_key]
        self.stats.evicted += 1
        if not bucket:
            del self.prompts[prompt_key]

    def newest_version(self) -> int | None:
        versions = [t.version for b in self.prompts.values() for t in b.values()]
        return max(versions) if versions else None

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
            "trajectories": [
                (t.prompt_key, t.response_key, t.reward, t.version, t.insert_order, t.payload)
                for bucket in self.prompts.values()
                for t in bucket.values()
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"replay store format {state.get('format_version')} is not {FORMAT_VERSION}")
        self.per_prompt_capacity, self.capacity = state["per_prompt_capacity"], state["capacity"]
        self._order = state["order"]
        self.stats = StoreStats(**state["stats"])
        self.prompts = OrderedDict()
        for prompt_key, response_key, reward, version, order, payload in state["trajectories"]:
            self.prompts.setdefault(prompt_key, {})[response_key] = Trajectory(
                prompt_key, response_key, reward, version, order, payload
            )


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
    """Draws B groups of K trajectories from a ``TrajectoryStore`` by TBA's recency/reward/uniform rule."""

    def __init__(self, store: TrajectoryStore, settings: ReplaySettings):
        self.store = store
        self.settings = settings
        self.rng = np.random.default_rng(settings.seed)

    def eligible(self, traj: Trajectory, current_version: int) -> bool:
        cap = self.settings.max_staleness
        return cap is None or current_version - traj.version <= cap

    def _pick_k(self, trajs: list[Trajectory], k: int, weights: np.ndarray | None) -> list[Trajectory]:
        replace = len(trajs) < k
        idx = self.rng.choice(len(trajs), size=k, replace=replace, p=weights)
        return [trajs[i] for i in idx]

    def sample_groups(self, batch_size: int, k: int, current_version: int) -> list[SampledGroup]:
        s = self.settings
        pools = {
            p: [t for t in self.store.trajectories(p) if self.eligible(t, current_version)]
            for p in list(self.store.prompts)
        }
        pools = {p: ts for p, ts in pools.items() if ts}
        if not pools:
            raise RuntimeError("the replay store holds no sampleable trajectories (all staler than "
                               "tba.replay.max_staleness?)")
        newest = max(t.version for ts in pools.values() for t in ts)
        fresh = {p: [t for t in ts if t.version > newest - s.recency_window] for p, ts in pools.items()}
        fresh = {p: ts for p, ts in fresh.items() if ts}
        fresh_keys, all_keys = list(fresh), list(pools)
        prompt_rewards = np.array([np.mean([t.reward for t in pools[p]]) for p in all_keys])
        prompt_probs = _mixed_probs(prompt_rewards, s.reward_inv_temp, s.reward_mix)
        groups = []
        for _ in range(batch_size):
            if self.rng.random() < s.recency_prob:
                p = fresh_keys[self.rng.integers(len(fresh_keys))]
                groups.append(SampledGroup(p, self._pick_k(fresh[p], k, None), "recency"))
            else:
                p = all_keys[self.rng.choice(len(all_keys), p=prompt_probs)]
                rewards = np.array([t.reward for t in pools[p]])
                weights = _mixed_probs(rewards, s.reward_inv_temp, s.reward_mix)
                groups.append(SampledGroup(p, self._pick_k(pools[p], k, weights), "replay"))
        return groups

    def state_dict(self) -> dict:
        return {"store": self.store.state_dict(), "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.store.load_state_dict(state["store"])
        self.rng.bit_generator.state = state["rng"]


def staleness_summary(groups: list[SampledGroup], current_version: int) -> dict[str, float]:
    stale = np.array([current_version - t.version for g in groups for t in g.trajectories], dtype=float)
    replayed = np.array([g.branch == "replay" for g in groups], dtype=float)
    return {
        "staleness_mean": float(stale.mean()) if stale.size else 0.0,
        "staleness_max": float(stale.max()) if stale.size else 0.0,
        "replay_fraction": float(replayed.mean()) if replayed.size else 0.0,
    }

