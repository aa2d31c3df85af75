"""TBA's replay store and staleness-aware sampler (reference spec section 2), framework-free.

The store keeps finished trajectories grouped per prompt: the prompt's shared data once, and per trajectory
only its response tokens (int32), the searcher's per-token log-probs (float32), its reward, the weight version
that generated it (``version``: the oldest policy version that contributed tokens, in the caller's unit; the
verl adapter counts optimizer updates) and a few small fields the adapter packs as bytes. Staleness of a
trajectory at trainer version v is ``v - version``.

Sampling (``ReplaySampler.sample_groups``) follows the reference code (``buffer_utils.get_batch``). For each of
the B group slots, a coin with probability ``recency_prob`` (m) picks the branch:
- recency: the next prompt of a cycle over the prompts that received trajectories from the freshest
  ``recency_window`` versions (without replacement; when every fresh prompt was drawn the cycle refills with
  them), then K of its fresh trajectories uniformly;
- replay: the next prompt of a cycle over every stored prompt (uniform order, without replacement, refilled
  when exhausted), then K of its trajectories with probability softmax(reward_inv_temp * reward)
  (reward_inv_temp = 0 is uniform, the paper's GSM8K setting).
A prompt appears at most once per batch unless fewer distinct prompts can be drawn than B (counted in
``SampleReport.repeated``). K draws are without replacement unless the prompt holds fewer than K.
Trajectories staler than ``max_staleness`` can never be drawn again, so they leave the store.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import math
import os
import random
from dataclasses import dataclass, field
from typing import Any, Hashable

import numpy as np
import torch

from tba_ext.core.settings import ReplaySettings

FORMAT_VERSION = 2
FILE_FORMAT = "tba-ext-replay"
# Python object overhead the store pays per trajectory on top of its bytes (object, hash, index entries),
# measured by benchmarks/replay.py; used only for the byte capacity.
OVERHEAD_BYTES_PER_TRAJECTORY = 450  # benchmarks/replay.py: ~440 B beyond blob and prompt share


class Trajectory:
    """One stored trajectory. Its arrays live in one bytes blob: response tokens (int32), then the searcher's
    per-token log-probs (float32, optional), then the adapter's packed extras; the dedup key is a 16-byte hash
    of the response, so the tokens are never held twice."""

    __slots__ = ("prompt_key", "blob", "n_response", "n_logprobs", "reward", "version", "order", "draws", "digest")

    def __init__(self, prompt_key: Hashable, response, reward: float, version: int,
                 rollout_logprobs=None, extras: bytes = b"", draws: int = 0):
        tokens = np.ascontiguousarray(response, dtype=np.int32).tobytes()
        logprobs = b"" if rollout_logprobs is None else np.ascontiguousarray(rollout_logprobs, np.float32).tobytes()
        self.prompt_key = prompt_key  # identity of the prompt across generations (e.g. a hash of its tokens)
        self.blob = tokens + logprobs + extras
        self.n_response = len(tokens) // 4
        self.n_logprobs = None if rollout_logprobs is None else len(logprobs) // 4
        self.reward = reward
        self.version = version  # weight version that generated it (verl: min_global_steps)
        self.order = 0  # admission order: ties within a version are broken by it
        self.draws = draws  # times sampled for training
        self.digest = hashlib.blake2b(tokens, digest_size=16).digest()

    @property
    def response(self) -> np.ndarray:
        return np.frombuffer(self.blob, np.int32, self.n_response)

    @property
    def rollout_logprobs(self) -> np.ndarray | None:
        if self.n_logprobs is None:
            return None
        return np.frombuffer(self.blob, np.float32, self.n_logprobs, offset=4 * self.n_response)

    @property
    def extras(self) -> bytes:
        return self.blob[4 * (self.n_response + (self.n_logprobs or 0)):]

    @property
    def nbytes(self) -> int:
        return len(self.blob) + OVERHEAD_BYTES_PER_TRAJECTORY


def _age(t: Trajectory) -> tuple[int, int]:
    return t.version, t.order


@dataclass
class PromptEntry:
    """One prompt's trajectories, sorted oldest first by (version, order), and its shared payload."""

    payload: Any = None
    items: list[Trajectory] = field(default_factory=list)
    by_digest: dict[bytes, Trajectory] = field(default_factory=dict)
    _rewards: np.ndarray | None = None

    def rewards(self) -> np.ndarray:
        if self._rewards is None:
            self._rewards = np.fromiter((t.reward for t in self.items), dtype=float, count=len(self.items))
        return self._rewards

    def newer_than(self, version: int) -> int:
        """Index of the first trajectory with ``version >= version`` (the fresh tail starts there)."""
        return bisect.bisect_left(self.items, version, key=lambda t: t.version)


@dataclass
class StoreStats:
    added: int = 0
    dedup_hits: int = 0
    evicted: int = 0
    evicted_stale: int = 0
    evicted_replayed: int = 0
    rejected_nonfinite: int = 0
    seen: int = 0


@dataclass
class SampledGroup:
    prompt_key: Hashable
    trajectories: list[Trajectory]
    branch: str  # "recency" or "replay"
    payload: Any = None  # the prompt's shared payload (kept even if the drawn trajectories leave the store)


@dataclass
class SampleReport:
    groups: list[SampledGroup]
    repeated: int = 0  # slots filled by a prompt already in the batch (fewer distinct prompts than B)
    missing: int = 0  # slots left empty: nothing sampleable (the caller waits and samples again)
    unseen: int = 0  # groups none of whose trajectories was drawn before (data the trainer sees the first time)


class TrajectoryStore:
    """Per-prompt buffers, FIFO by (version, admission), under a per-prompt and a global capacity.

    Three operations: ``admit`` (dedup by response tokens, newest copy wins), ``select`` (what a sampler
    reads: ``prompt``, ``fresh_prompts``, ``prompt_keys``) and ``evict`` (one trajectory, or everything older
    than a version). Over capacity, the oldest trajectory of the prompt (per-prompt cap) or of the oldest
    version in the store (global caps, in trajectories and in bytes) leaves first.
    """

    def __init__(self, per_prompt_capacity: int, capacity: int, capacity_bytes: int | None = None):
        if per_prompt_capacity <= 0 or capacity <= 0 or (capacity_bytes is not None and capacity_bytes <= 0):
            raise ValueError("per_prompt_capacity, capacity and capacity_bytes must be > 0")
        self.per_prompt_capacity = per_prompt_capacity
        self.capacity = capacity
        self.capacity_bytes = capacity_bytes
        self.stats = StoreStats()
        self._prompts: dict[Hashable, PromptEntry] = {}
        self._versions: list[int] = []  # sorted versions present: the oldest is evicted first
        self._order = 0
        self._size = 0
        self._bytes = 0
        self._reward_sum = 0.0
        self._version_prompts: dict[int, dict] = {}  # version -> {prompt_key: count}: the recency index
        self.new_prompt_listeners: list = []  # called with a prompt key when it enters the store
        self.fresh_listeners: list = []  # called with the prompt key on every admission

    # -- admit ---------------------------------------------------------------------------------------------
    def admit(self, traj: Trajectory, prompt_payload: Any = None) -> bool:
        """Insert one trajectory (``prompt_payload`` is kept once per prompt); False if its reward is not
        finite."""
        self.stats.seen += 1
        if not math.isfinite(traj.reward):
            self.stats.rejected_nonfinite += 1
            return False
        entry = self._prompts.get(traj.prompt_key)
        if entry is None:
            entry = self._prompts[traj.prompt_key] = PromptEntry(payload=prompt_payload)
            for listener in self.new_prompt_listeners:
                listener(traj.prompt_key)
        old = entry.by_digest.get(traj.digest)
        if old is not None:  # same tokens seen before: the newest copy wins
            self.stats.dedup_hits += 1
            self._remove(entry, old)
            self._prompts[traj.prompt_key] = entry  # it may have been its prompt's last trajectory
        self._order += 1
        traj.order = self._order
        bisect.insort(entry.items, traj, key=_age)
        entry.by_digest[traj.digest] = traj
        entry._rewards = None
        self._size += 1
        self._bytes += traj.nbytes
        self._reward_sum += traj.reward
        counts = self._version_prompts.get(traj.version)
        if counts is None:
            counts = self._version_prompts[traj.version] = {}
            bisect.insort(self._versions, traj.version)
        counts[traj.prompt_key] = counts.get(traj.prompt_key, 0) + 1
        self.stats.added += 1
        for listener in self.fresh_listeners:
            listener(traj.prompt_key)
        while len(entry.items) > self.per_prompt_capacity:
            self.evict(entry.items[0])
        while self._size > self.capacity or (self.capacity_bytes is not None and self._bytes > self.capacity_bytes):
            self._evict_oldest()
        return True

    # -- select --------------------------------------------------------------------------------------------
    def prompt(self, prompt_key) -> PromptEntry | None:
        return self._prompts.get(prompt_key)

    def prompt_keys(self) -> list:
        return list(self._prompts)

    def fresh_prompts(self, since_version: int) -> list:
        """Prompts holding trajectories of version >= ``since_version``."""
        keys: dict = {}
        for v in range(since_version, self.newest_version() + 1) if self._version_prompts else ():
            keys.update(self._version_prompts.get(v, {}))
        return list(keys)

    def newest_version(self) -> int | None:
        return self._versions[-1] if self._versions else None

    def trajectories(self, prompt_key) -> list[Trajectory]:
        entry = self._prompts.get(prompt_key)
        return list(entry.items) if entry else []

    def __len__(self) -> int:
        return self._size

    @property
    def num_prompts(self) -> int:
        return len(self._prompts)

    @property
    def nbytes(self) -> int:
        return self._bytes

    @property
    def reward_mean(self) -> float:
        return self._reward_sum / self._size if self._size else 0.0

    # -- evict ---------------------------------------------------------------------------------------------
    def evict(self, traj: Trajectory) -> None:
        """Remove one trajectory (no-op if it already left)."""
        entry = self._prompts.get(traj.prompt_key)
        if entry is not None and entry.by_digest.get(traj.digest) is traj:
            self._remove(entry, traj)
            self.stats.evicted += 1

    def evict_older_than(self, version: int) -> int:
        """Remove every trajectory with ``version`` below the given one; returns how many left."""
        removed = 0
        while self._versions and self._versions[0] < version:
            self._evict_oldest()
            removed += 1
        return removed

    def _evict_oldest(self) -> None:
        """The oldest version's first prompt (in admission order) loses its oldest trajectory, which is of that
        version: each prompt's items are sorted by version."""
        prompt_key = next(iter(self._version_prompts[self._versions[0]]))
        entry = self._prompts[prompt_key]
        self._remove(entry, entry.items[0])
        self.stats.evicted += 1

    def _remove(self, entry: PromptEntry, traj: Trajectory) -> None:
        i = bisect.bisect_left(entry.items, _age(traj), key=_age)
        del entry.items[i]
        del entry.by_digest[traj.digest]
        entry._rewards = None
        self._size -= 1
        self._bytes -= traj.nbytes
        self._reward_sum -= traj.reward
        counts = self._version_prompts[traj.version]
        counts[traj.prompt_key] -= 1
        if not counts[traj.prompt_key]:
            del counts[traj.prompt_key]
            if not counts:
                del self._version_prompts[traj.version]
                del self._versions[bisect.bisect_left(self._versions, traj.version)]
        if not entry.items:
            del self._prompts[traj.prompt_key]

    # -- persistence ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        trajectories = sorted((t for e in self._prompts.values() for t in e.items), key=lambda t: t.order)
        return {
            "format_version": FORMAT_VERSION,
            "per_prompt_capacity": self.per_prompt_capacity,
            "capacity": self.capacity,
            "capacity_bytes": self.capacity_bytes,
            "order": self._order,
            "stats": vars(self.stats).copy(),
            # dict orders decide which prompt of the oldest version is evicted first: kept as they are
            "prompts": [(key, entry.payload) for key, entry in self._prompts.items()],
            "version_prompts": [(v, list(keys)) for v, keys in self._version_prompts.items()],
            "trajectories": [(t.prompt_key, t.response, t.reward, t.version, t.rollout_logprobs, t.extras,
                              t.order, t.draws) for t in trajectories],
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"replay store format {state.get('format_version')} is not {FORMAT_VERSION}")
        listeners = self.new_prompt_listeners, self.fresh_listeners
        self.__init__(state["per_prompt_capacity"], state["capacity"], state.get("capacity_bytes"))
        self.new_prompt_listeners, self.fresh_listeners = listeners
        self._prompts = {key: PromptEntry(payload=payload) for key, payload in state["prompts"]}
        counts: dict = {}
        for prompt_key, response, reward, version, logprobs, extras, order, draws in state["trajectories"]:
            traj = Trajectory(prompt_key, response, reward, version, logprobs, extras, draws=draws)
            traj.order = order
            entry = self._prompts[prompt_key]
            bisect.insort(entry.items, traj, key=_age)
            entry.by_digest[traj.digest] = traj
            self._size += 1
            self._bytes += traj.nbytes
            self._reward_sum += traj.reward
            counts[(version, prompt_key)] = counts.get((version, prompt_key), 0) + 1
        self._version_prompts = {v: {key: counts[(v, key)] for key in keys} for v, keys in state["version_prompts"]}
        self._versions = sorted(self._version_prompts)
        self._order = state["order"]
        self.stats = StoreStats(**state["stats"])


def save_atomic(state: dict, path: str) -> None:
    """Write ``state`` with torch.save to a temporary file, fsync, then rename over ``path``: a crash at
    any point leaves either the old file or the new one, never a torn file."""
    buffer = io.BytesIO()
    # protocol 5 writes bytes raw (torch's default protocol 2 re-encodes them, ~1.5x the size)
    torch.save({"format": FILE_FORMAT, "format_version": FORMAT_VERSION, "state": state}, buffer, pickle_protocol=5)
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


class PromptCycle:
    """Prompt keys drawn without replacement in a random order, refilled by the caller when exhausted:
    the reference's cycling over cids. ``add`` puts a key at a uniformly random place among those left."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.pending: list = []
        self.members: set = set()

    def add(self, key) -> None:
        if key in self.members:
            return
        self.members.add(key)
        self.pending.append(key)
        i = self.rng.randrange(len(self.pending))
        self.pending[i], self.pending[-1] = self.pending[-1], self.pending[i]

    def pop(self):
        key = self.pending.pop()
        self.members.discard(key)
        return key

    def refill(self, keys: list) -> None:
        keys = [k for k in keys if k not in self.members]
        self.rng.shuffle(keys)
        self.pending[:0] = keys  # after whatever is still pending (popped from the end)
        self.members.update(keys)

    def state(self) -> list:
        return list(self.pending)

    def load(self, pending: list) -> None:
        self.pending = list(pending)
        self.members = set(self.pending)


class ReplaySampler:
    """Draws B groups of K trajectories from a ``TrajectoryStore`` by TBA's recency/replay rule.

    Uses Python's ``random.Random`` for scalar draws (an order of magnitude cheaper than numpy's) and numpy
    for the softmax-weighted K; both states are part of ``state_dict`` so a resumed run continues the same
    random sequence.
    """

    def __init__(self, store: TrajectoryStore, settings: ReplaySettings):
        self.store = store
        self.settings = settings
        self.rng = random.Random(settings.seed)
        self.np_rng = np.random.default_rng(settings.seed)
        self.recency = PromptCycle(self.rng)
        self.replay = PromptCycle(self.rng)
        # prompts that received trajectories and have not been drawn since: what "every fresh group is
        # trained on before any group repeats" is measured by
        self.undrawn_fresh: set = set()
        store.new_prompt_listeners.append(self.replay.add)
        store.fresh_listeners.append(self._on_admit)

    def _on_admit(self, prompt_key) -> None:
        self.recency.add(prompt_key)
        self.undrawn_fresh.add(prompt_key)

    def _fresh_from(self) -> int:
        return self.store.newest_version() - self.settings.recency_window + 1

    def _recency_pool(self, key, fresh_from: int) -> list[Trajectory]:
        entry = self.store.prompt(key)
        return entry.items[entry.newer_than(fresh_from):] if entry else []

    def _replay_pool(self, key) -> list[Trajectory]:
        entry = self.store.prompt(key)
        return entry.items if entry else []

    def _draw(self, cycle: PromptCycle, refill, pool_of, in_batch: set):
        """The next prompt of ``cycle`` not yet in the batch and with trajectories to draw, refilling the
        cycle once when it runs out. Returns (key, pool) or (None, None)."""
        skipped = []
        refilled = False
        try:
            while True:
                if not cycle.pending:
                    if refilled:
                        return None, None
                    cycle.refill([key for key in refill() if key not in in_batch])
                    refilled = True
                    continue
                key = cycle.pop()
                if key in in_batch:
                    skipped.append(key)
                    continue
                pool = pool_of(key)
                if pool:
                    return key, pool
                # left the store or the recency window: it re-enters with its next admission or refill
        finally:
            for key in skipped:
                cycle.add(key)

    def _pick_k(self, pool: list[Trajectory], k: int, softmax: bool, rewards=None) -> list[Trajectory]:
        """K of ``pool``, uniformly or by softmax(inv_temp * reward); without replacement unless the pool holds
        fewer than K."""
        if not softmax:
            return self.rng.sample(pool, k) if len(pool) >= k else self.rng.choices(pool, k=k)
        logits = self.settings.reward_inv_temp * rewards
        if len(pool) < k:
            probs = np.exp(logits - logits.max())
            return self.rng.choices(pool, weights=probs.tolist(), k=k)
        # Gumbel top-k: K draws without replacement with probabilities softmax(logits)
        keys = logits + self.np_rng.gumbel(size=len(pool))
        return [pool[i] for i in np.argpartition(-keys, k - 1)[:k]]

    def sample_groups(self, batch_size: int, k: int, current_version: int) -> SampleReport:
        s = self.settings
        if s.max_staleness is not None:
            self.store.stats.evicted_stale += self.store.evict_older_than(current_version - s.max_staleness)
        report = SampleReport(groups=[])
        if not len(self.store):
            report.missing = batch_size
            return report
        fresh_from = self._fresh_from()
        softmax = s.reward_inv_temp != 0
        in_batch: set = set()
        exhausted = {True: False, False: False}  # a branch with nothing new to draw in this batch
        for _ in range(batch_size):
            recency = self.rng.random() < s.recency_prob
            key = pool = None
            if exhausted[recency]:
                pass
            elif recency:
                key, pool = self._draw(self.recency, lambda: self.store.fresh_prompts(fresh_from),
                                       lambda p: self._recency_pool(p, fresh_from), in_batch)
            else:
                key, pool = self._draw(self.replay, self.store.prompt_keys, self._replay_pool, in_batch)
            exhausted[recency] = key is None
            if key is None and in_batch:  # every drawable prompt is in the batch already: repeat one
                key = self.rng.choice(sorted(in_batch, key=str))
                pool = (self._recency_pool(key, fresh_from) if recency else []) or self._replay_pool(key)
                report.repeated += 1
            if not pool:
                report.missing += 1
                continue
            in_batch.add(key)
            self.undrawn_fresh.discard(key)
            rewards = self.store.prompt(key).rewards()[-len(pool):] if softmax and not recency else None
            picked = self._pick_k(pool, k, softmax and not recency, rewards)
            report.groups.append(SampledGroup(key, picked, "recency" if recency else "replay",
                                              self.store.prompt(key).payload))
        if not report.missing:  # a batch with holes is not used: the caller waits and samples again
            report.unseen = sum(all(t.draws == 0 for t in g.trajectories) for g in report.groups)
            self._count_draws(report.groups)
        return report

    def _count_draws(self, groups: list[SampledGroup]) -> None:
        cap = self.settings.max_replays
        for group in groups:
            for traj in group.trajectories:
                traj.draws += 1
                if cap is not None and traj.draws >= cap:
                    self.store.evict(traj)
                    self.store.stats.evicted_replayed += 1

    def state_dict(self) -> dict:
        return {"store": self.store.state_dict(), "rng": self.rng.getstate(),
                "np_rng": self.np_rng.bit_generator.state, "recency": self.recency.state(),
                "replay": self.replay.state(), "undrawn_fresh": sorted(self.undrawn_fresh, key=str)}

    def load_state_dict(self, state: dict) -> None:
        self.store.load_state_dict(state["store"])
        self.rng.setstate(state["rng"])
        self.np_rng.bit_generator.state = state["np_rng"]
        self.recency.load(state["recency"])
        self.replay.load(state["replay"])
        self.undrawn_fresh = set(state["undrawn_fresh"])


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
