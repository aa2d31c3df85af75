"""TBA's replay buffer inside verl's V1 trainer: ``trainer.v1.sampler.custom_sampler``.

    trainer.v1.sampler.custom_sampler.path=pkg://tba_ext.adapters.sampler
    trainer.v1.sampler.custom_sampler.name=TBAReplaySampler
    +trainer.v1.sampler.sampler_kwargs.recency_prob=0.95  (any ReplaySettings field)

verl deletes every trajectory it trains on (trainer_base.py:511). Each ``sample`` call therefore:
1. waits, with verl's own machinery, until enough freshly generated groups are finished (a batch; or
   ``min_fresh_groups``, 0 for free-running searchers: no wait while the store can serve);
2. moves finished groups out of TransferQueue into the ``TrajectoryStore`` in compact form (``rows``): the
   oldest B (verl's order) by default, every finished one when ``min_fresh_groups`` is set;
3. draws B groups of K = ``rollout.n`` with ``ReplaySampler`` and writes them back under fresh
   ``{uid}_{session}_{idx}`` keys, one new uid per group (the training forward sees the current policy);
   ``rollout_log_probs`` stay the searcher's, for TBA's importance ratio, and the trajectories' stored reference
   log-probs are served for the trainer's reference pass (``cached_reference`` / ``keep_reference``, kept per
   reference version; ``tba_ext.adapters.reference``).
Versions and staleness are counted in optimizer updates: a trajectory generated with the weights of global
step g carries version g x ``updates_per_version`` (set by the tba_* trainer modes: k in separate_async), and
the trainer's version at a sample is the updates applied before it, local updates included (``local_update``,
set by the trainer before each of the k samples of a separate_async step).
Where every finished group enters the store (``min_fresh_groups`` set: the decoupled configs), no update is
served before it holds ``min_buffer_groups`` distinct prompts (the initial buffer), asking the searchers for
more prompts (``request_prompts``, set by the decoupled trainer) while those queued cannot fill it.
With ``staleness_mix`` the store keys each generation of a prompt (verl's uid) apart, so its groups, and the
initial buffer's count, are generations, however often the dataset repeats a prompt; and it keeps identical
responses (no dedup), so a group is served as it was generated.
If the store cannot serve a batch yet (empty, or everything staler than ``max_staleness``) it waits for
generation, and stops the run after ``wait_timeout_s``. Validation batches bypass the store.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections import defaultdict

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.utils.transferqueue_utils import KVBatchMeta

from tba_ext.adapters.rows import as_numpy, build_row, load_prompt, pop_searcher_reference, split_row
from tba_ext.core.hold import hold_point
from tba_ext.core.journal import Journal, read_journal
from tba_ext.core.ledger import LedgerError, unbalanced
from tba_ext.core.replay import (
    ReferenceLogProbs,
    ReplaySampler,
    Trajectory,
    TrajectoryStore,
    journal_fields,
    journaled_trajectory,
    load_checked,
    save_atomic,
    staleness_summary,
)
from tba_ext.core.settings import SAMPLER_KWARGS, parse_replay_settings
from tba_ext.core.steps import trainer_version

logger = logging.getLogger(__name__)


def row_dicts(td) -> list[dict]:
    """Split a TransferQueue TensorDict into per-trajectory dicts (the inverse of verl's
    ``list_of_dict_to_tensordict``, which is how the agent loop wrote them)."""
    n = td.batch_size[0]
    columns = {}
    for key in td.keys():
        value = td.get(key)
        if isinstance(value, torch.Tensor):
            columns[key] = [t.clone() for t in value.unbind(0)]
        elif hasattr(value, "tolist") and getattr(value, "shape", None):
            columns[key] = list(value.tolist())
        else:
            data = getattr(value, "data", value)
            columns[key] = list(data) if isinstance(data, list) and len(data) == n else [data] * n
    return [{key: col[i] for key, col in columns.items()} for i in range(n)]


def prompt_uid(key: str) -> str:
    """The prompt uid in a TransferQueue row key (verl's agent loop writes ``<uid>_<sample index>``)."""
    return key.split("_")[0]


def prompt_identity(row: dict) -> str:
    """Stable identity of a prompt across generations (verl's uid is new each time a prompt is drawn)."""
    return hashlib.sha1(np.asarray(row["prompts"], dtype=np.int64).tobytes()).hexdigest()[:16]


class ReplayWaitTimeoutError(RuntimeError):
    pass


class NonFiniteRewardError(RuntimeError):
    pass


class TBAReplaySampler(ReplayBufferAsync):
    """A verl ``ReplayBuffer`` that keeps, replays and persists trajectories by TBA's sampling rule."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.poll_interval = 0.2  # verl's 2 s default quantises generation time on small runs
        kwargs_node = kwargs.get("sampler_kwargs") or {}
        if not isinstance(kwargs_node, dict):
            kwargs_node = OmegaConf.to_container(kwargs_node, resolve=True)
        self.settings = parse_replay_settings(kwargs_node, SAMPLER_KWARGS)
        self.store = TrajectoryStore(
            self.settings.per_prompt_capacity,
            self.settings.capacity,
            self.settings.capacity_bytes,
            dedup=not self.settings.staleness_mix,  # a mixed batch serves each group as it was generated
        )
        self.sampler = ReplaySampler(self.store, self.settings)
        # K drawn per group: the tba_* trainer modes set it to rollout.n; otherwise the largest group seen
        self.group_size = 0
        self.largest_group = 0
        self.restored_trajectories: int | None = None  # reported once, at the first step after a resume
        self.journal_replayed: int | None = None  # the same, for the trajectories the journal gave back
        self.unknown_version = 0
        self.updates_per_version = 1  # optimizer updates per verl global step (weight version)
        self.local_updates = 1  # samples per global step (k in separate_async), each followed by its updates
        self.local_update = 0  # which of them the next sample serves (from 0), set by the trainer
        self.initial_buffer_filled = False
        self.request_prompts = None  # the decoupled trainer's "generate n more prompts", for the initial buffer
        self.served: dict = {}  # the last training sample: key -> (trajectory, response mask), for the reference
        self.journal: Journal | None = None  # what was read since the last checkpoint (set by the trainer)
        self._ledger_problem = None  # the last imbalance logged

    # -- ingestion -------------------------------------------------------------------------------------
    def _ingest(self, partition_id: str, prompt_uids: set[str]) -> dict:
        keys = [k for k in self.partitions[partition_id] if prompt_uid(k) in prompt_uids]
        if not keys:
            if prompt_uids:
                tq.kv_clear(partition_id=partition_id, keys=list(prompt_uids))
            return {"ingested": 0, "rejected": 0, "ingested_prompts": 0}
        tags = [self.partitions[partition_id][k] for k in keys]
        rows = row_dicts(tq.kv_batch_get(keys=keys, partition_id=partition_id))
        tq.kv_clear(partition_id=partition_id, keys=[*prompt_uids, *keys])
        sizes = defaultdict(int)
        prompts = set()
        before = self.store.stats.rejected_nonfinite
        arrived, journaled = [], []
        for key, tag, row in zip(keys, tags, rows):
            sizes[prompt_uid(key)] += 1
            ledger_id = self.store.ledger.new_id()  # read from the searchers: from here on it is accounted for
            version = tag.get("min_global_steps")
            if version is None:  # a searcher that served it had no weight version: staleness unknowable
                self.unknown_version += 1
                self.store.ledger.dropped(ledger_id, "unknown_version")
                journaled.append([ledger_id, "unknown_version"])
                continue
            version *= self.updates_per_version
            searcher_reference = pop_searcher_reference(row)
            prompt_fields, response, logprobs, reward, extras = split_row(row, tag)
            prompt_key = prompt_identity(row)
            if self.settings.staleness_mix:
                # a mixed batch draws generations: a prompt drawn again (a later epoch) is a group of its own
                prompt_key = f"{prompt_key}/{key.split('_')[0]}"  # verl's uid of this generation
            prompts.add(prompt_key)
            traj = Trajectory(prompt_key, response, reward, version, logprobs, extras)
            traj.ledger_id = ledger_id
            if searcher_reference is not None:  # the searchers' reference is the initial one: version 0
                traj.reference = ReferenceLogProbs(searcher_reference, as_numpy(row["response_mask"]), version=0)
            arrived.append((traj, prompt_fields))
            journaled.append([ledger_id, None, prompt_key, prompt_fields, *journal_fields(traj)])
        self.largest_group = max(self.largest_group, max(sizes.values()))
        if self.journal is not None:  # durable before the store (and so any update) sees it
            self.journal.append({"entries": journaled, "largest_group": self.largest_group}, len(journaled))
        self.store.admit_batch(arrived)  # in content order, so the searchers' timing cannot change a batch
        self._check_nonfinite()
        return {
            "ingested": len(keys),
            "rejected": self.store.stats.rejected_nonfinite - before,
            "ingested_prompts": len(prompts),
        }

    def _check_nonfinite(self) -> None:
        stats = self.store.stats
        if stats.seen and stats.rejected_nonfinite / stats.seen > self.settings.max_nonfinite_frac:
            raise NonFiniteRewardError(
                f"{stats.rejected_nonfinite} of {stats.seen} rewards were NaN/inf (more than "
                f"{SAMPLER_KWARGS}max_nonfinite_frac={self.settings.max_nonfinite_frac}); check the reward function"
            )

    # -- sampling --------------------------------------------------------------------------------------
    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        if partition_id != "train":
            return super().sample(global_steps, partition_id, batch_size)
        # the policy being trained has had every update of the earlier steps and of this step's earlier samples
        current_version = trainer_version(global_steps, self.local_update, self.updates_per_version, self.local_updates)
        threshold = self.settings.min_fresh_groups
        free_running = threshold is not None  # every finished group enters the store at each sample
        need = threshold if free_running else batch_size
        min_buffer = self.settings.min_buffer_groups or batch_size
        if not free_running:  # lockstep: each update waits for the B groups generated for it, no initial buffer
            self.initial_buffer_filled = True
        deadline = time.monotonic() + self.settings.wait_timeout_s
        metrics, ingest = {}, {"ingested": 0, "rejected": 0, "ingested_prompts": 0}
        next_progress = 0.0
        short_of_prompts = False  # this update waited for the store to hold B distinct prompts again
        start, ingest_s, draw_s = time.perf_counter(), 0.0, 0.0  # where the trainer's data wait goes
        while True:
            sampleable, evictions = self._wait_for_fresh(global_steps, partition_id, need, deadline)
            metrics.update(evictions)
            ingest_start = time.perf_counter()
            read = self._ingest_finished(partition_id, sampleable, batch_size, free_running)
            for key, value in read.items():
                ingest[key] += value
            ingest_s += time.perf_counter() - ingest_start
            if read["ingested"] and self.journal is not None:
                hold_point("trajectories_journaled", global_steps)
            if not self.initial_buffer_filled and self.store.num_prompts >= min_buffer:
                self.initial_buffer_filled = True
            if self.initial_buffer_filled:
                k = self.group_size or self.largest_group
                # where every finished group enters the store, the batch waits for B distinct prompts: the
                # staleness cap can leave fewer (searchers slowed, restarted, or outrun by the trainer)
                draw_start = time.perf_counter()
                report = self.sampler.sample_groups(batch_size, k, current_version, distinct=free_running)
                draw_s += time.perf_counter() - draw_start
                if not report.missing:
                    break
                short_of_prompts = short_of_prompts or (free_running and len(self.store) > 0)
                wanted, what = batch_size, "replay store short of a batch of distinct prompts:"
            else:  # the initial buffer: no update before it holds enough distinct prompts
                wanted, what = min_buffer, f"initial replay buffer ({SAMPLER_KWARGS}min_buffer_groups):"
            self._request_prompts(partition_id, wanted)
            if free_running and time.monotonic() >= next_progress:
                print(f"tba-ext: {what} {self.store.num_prompts}/{wanted} prompts", flush=True)
                next_progress = time.monotonic() + 10.0
            # nothing sampleable yet (empty store, initial buffer not full, all of it past max_staleness, or
            # fewer distinct prompts than a batch where the searchers run free)
            if time.monotonic() > deadline:
                raise self._wait_timeout_error(batch_size, min_buffer, free_running)
            need = 1
            time.sleep(self.poll_interval)
        serve_start = time.perf_counter()
        keys, tags = self._serve(report, partition_id, update=current_version + 1)
        metrics.update(self._metrics(report, current_version, ingest))
        metrics["replay/short_of_prompts"] = float(short_of_prompts)
        metrics.update(self._timing_metrics(start, serve_start, ingest_s, draw_s))
        return KVBatchMeta(partition_id=partition_id, keys=keys, tags=tags), metrics

    def _ingest_finished(self, partition_id: str, sampleable, batch_size: int, free_running: bool) -> dict:
        """Move the finished groups this update takes out of TransferQueue into the store; ``_ingest``'s counts."""
        # by default oldest first, at most a batch per update (verl's order): groups generated ahead of
        # training wait in TransferQueue, so generation ahead (colocate_async) makes the fresh data as stale
        # for TB as it is for verl's own samplers. Free-running searchers (min_fresh_groups set) produce at
        # their own pace: everything finished enters the store, as the reference's sync delivers it
        take = (
            set(sampleable)
            if free_running
            else set(self._select_prompt_uids(partition_id, set(sampleable), batch_size)[0])
        )
        return self._ingest(partition_id, take)

    def _wait_timeout_error(self, batch_size: int, min_buffer: int, free_running: bool) -> ReplayWaitTimeoutError:
        """The error that stops a run whose store could not serve a batch within ``wait_timeout_s``."""
        return ReplayWaitTimeoutError(
            f"the replay store could not serve {batch_size} groups for {self.settings.wait_timeout_s:.0f} s "
            f"({len(self.store)} trajectories of {self.store.num_prompts} prompts stored, initial buffer "
            f"{min_buffer} prompts, max_staleness={self.settings.max_staleness}"
            f"{f'; a batch needs {batch_size} distinct prompts' if free_running else ''}); "
            "are the searchers alive? "
            f"Raise {SAMPLER_KWARGS}wait_timeout_s to wait longer"
        )

    def _serve(self, report, partition_id: str, update: int) -> tuple[list[str], list[dict]]:
        """Write the drawn groups back to TransferQueue under fresh keys, one new uid per group, and remember
        each served row for the reference pass; the ledger records them as used by optimizer update ``update``
        (the first of the step's when a step makes several). The keys and tags written."""
        keys, tags, rows = [], [], []
        self.served = {}
        for group in report.groups:
            uid = uuid.uuid4().hex
            prompt_fields = load_prompt(group.payload)
            for idx, traj in enumerate(group.trajectories):
                row, tag = build_row(prompt_fields, traj.response, traj.rollout_logprobs, traj.reward, traj.extras, uid)
                keys.append(f"{uid}_{idx}_0")
                tags.append(tag)
                rows.append(row)
                self.served[keys[-1]] = (traj, row["response_mask"])
            self.store.ledger.trained([traj.ledger_id for traj in group.trajectories], update)
        tq.kv_batch_put(keys=keys, partition_id=partition_id, fields=list_of_dict_to_tensordict(rows), tags=tags)
        return keys, tags

    @staticmethod
    def _timing_metrics(start: float, serve_start: float, ingest_s: float, draw_s: float) -> dict:
        """Where one sample's time went, from its start to now."""
        end = time.perf_counter()
        return {
            "replay/ingest_s": ingest_s,  # finished groups out of TransferQueue into the store
            "replay/draw_s": draw_s,  # the sampling rule
            "replay/serve_s": end - serve_start,  # the drawn rows rebuilt and written back to TransferQueue
            # the rest: TransferQueue's metadata polls, and waiting for generation or the initial buffer
            "replay/wait_s": serve_start - start - ingest_s - draw_s,
        }

    # -- reference log-probs, kept with the trajectories (TrajectoryStore.reference_version) ---------------
    def cached_reference(self, keys: list[str]) -> dict[str, torch.Tensor]:
        """The served rows among ``keys`` whose reference log-probs the store holds for the current reference."""
        version, found = self.store.reference_version, {}
        for key in keys:
            traj, mask = self.served.get(key, (None, None))
            values = None if traj is None else traj.reference_logprobs(version, mask.numpy())
            if values is not None:
                found[key] = torch.from_numpy(values)
        return found

    def keep_reference(self, keys: list[str], values: list[torch.Tensor]) -> int:
        """Store the reference log-probs just computed for served rows (other keys, e.g. padding, are skipped)."""
        kept = 0
        for key, value in zip(keys, values):
            traj, mask = self.served.get(key, (None, None))
            if traj is not None:
                self.store.set_reference(traj, value.float().numpy(), mask.numpy())
                kept += 1
        return kept

    def reference_changed(self) -> None:
        """The reference policy moved: every stored reference log-prob is stale."""
        self.store.reference_version += 1

    def _request_prompts(self, partition_id: str, wanted: int) -> None:
        """Ask for the distinct prompts the store lacks for ``wanted`` beyond those queued or generating (the
        searchers' queue is topped up once per update, and this update waits for them)."""
        if self.request_prompts is None:
            return
        inflight = len(self.pending_keys[partition_id]) + len(self.running_keys[partition_id])
        missing = wanted - self.store.num_prompts - inflight
        if missing > 0:
            self.request_prompts(missing)

    def _wait_for_fresh(self, global_steps: int, partition_id: str, need: int, deadline: float):
        """Poll until ``need`` fresh groups are finished, or until nothing more is being generated and the
        store can serve the batch alone (the trainer then trains on replay instead of waiting forever), or
        the deadline. Failed groups are evicted and refilled exactly as verl's async buffer does."""
        eviction_metrics: dict = {}
        while True:
            self._sync_metadata_from_transfer_queue()
            reasons = self._terminal_eviction_reasons(global_steps, partition_id)
            self._ledger_verl_evictions(partition_id, reasons)
            evicted, _, _, metrics = self._evict_terminal_groups(global_steps, partition_id, reasons)
            if evicted:
                eviction_metrics.update(metrics)
                if self.refill_fn is not None:
                    self.refill_fn(len(evicted))
                continue
            sampleable = self._sampleable_terminal_keys(partition_id, reasons)
            inflight = len(self.pending_keys[partition_id]) + len(self.running_keys[partition_id])
            if (
                len(sampleable) >= need
                or (inflight == 0 and (sampleable or len(self.store)))
                or time.monotonic() > deadline
            ):
                return sampleable, eviction_metrics
            time.sleep(self.poll_interval)

    def _ledger_verl_evictions(self, partition_id: str, reasons) -> None:
        """The finished trajectories of groups verl's buffer is about to evict (its own staleness cap, DAPO's filter,
        failed groups) enter the ledger as dropped: the store never reads them."""
        stale, filtered, failed, _ = reasons
        if not (stale or filtered or failed):  # the usual poll: nothing to evict, no pass over the partition
            return
        for key in self.partitions[partition_id]:
            uid = prompt_uid(key)
            # the sets may overlap: one reason per trajectory, in this order
            reason = (
                "verl_stale"
                if uid in stale
                else "verl_filter_groups"
                if uid in filtered
                else "verl_failed_group"
                if uid in failed
                else None
            )
            if reason:
                self.store.ledger.dropped(self.store.ledger.new_id(), reason)

    def _metrics(self, report, current_version: int, ingest: dict) -> dict:
        """Per-update metrics, O(B K): the store's figures are running totals."""
        groups = report.groups
        summary = staleness_summary(groups, current_version)
        stats = self.store.stats
        metrics = {
            "replay/fraction": summary.pop("replay_fraction"),
            **{f"replay/{key}": value for key, value in summary.items()},
            "replay/store_trajectories": len(self.store),
            "replay/store_prompts": self.store.num_prompts,
            "replay/store_mb": self.store.nbytes / 2**20,
            "replay/reward_sampled_mean": float(np.mean([t.reward for g in groups for t in g.trajectories])),
            "replay/reward_stored_mean": self.store.reward_mean,
            "replay/repeated_prompts": report.repeated,
            "replay/recency_fallback_groups": report.fallback,  # recency slots given the next-freshest prompt
            "replay/distinct_prompt_frac": len({g.prompt_key for g in groups}) / max(len(groups), 1),
            "replay/unseen_group_frac": report.unseen / max(len(groups), 1),  # consumed for the first time
            "replay/fresh_prompts_undrawn": len(self.sampler.undrawn_fresh),
            "replay/dedup_hits": stats.dedup_hits,
            "replay/evictions": stats.evicted,
            "replay/evicted_stale": stats.evicted_stale,
            "replay/evicted_replayed": stats.evicted_replayed,
            "replay/rejected_nonfinite": stats.rejected_nonfinite,
            "replay/ingested": ingest["ingested"],
            "replay/ingested_prompts": ingest["ingested_prompts"],  # distinct prompts among them
            "replay/rejected_unknown_version": self.unknown_version,
        }
        if self.local_updates > 1:  # per local update of the step (verl aggregates the k samples' metrics)
            label = f"replay/local_update_{self.local_update + 1}"
            metrics[f"{label}/staleness_min"] = summary["staleness_min"]
            metrics[f"{label}/staleness_max"] = summary["staleness_max"]
            metrics[f"{label}/distinct_prompt_frac_min"] = metrics["replay/distinct_prompt_frac"]
        metrics.update(self._ledger_metrics())
        if self.restored_trajectories is not None:
            metrics["replay/restored_trajectories"] = self.restored_trajectories
            self.restored_trajectories = None
        if self.journal_replayed is not None:
            metrics["replay/journal_replayed"] = self.journal_replayed
            self.journal_replayed = None
        return metrics

    def _ledger_metrics(self) -> dict:
        """The trajectory ledger's books (``ledger/*``); an imbalance, which no code path should make, is logged
        as an error and shown as ``ledger/unbalanced`` = 1."""
        counts = self.store.ledger.counts()
        problem = unbalanced(counts, len(self.store))
        if problem and problem != self._ledger_problem:
            logger.error("tba-ext: the trajectory ledger does not balance: %s", problem)
        self._ledger_problem = problem
        return {f"ledger/{name}": value for name, value in counts.items()} | {"ledger/unbalanced": float(bool(problem))}

    # -- persistence (called by the tba_* trainer modes next to verl's checkpoint) ----------------------
    def save_store(self, path: str) -> None:
        save_atomic(
            {
                "sampler": self.sampler.state_dict(),
                "largest_group": self.largest_group,
                "updates_per_version": self.updates_per_version,
            },
            path,
        )

    def start_journal(self, path: str) -> None:
        """Journal what is read from here on into ``path`` (emptied: the checkpoint just saved holds the rest)."""
        if self.journal is not None:
            self.journal.close()
        open(path, "wb").close()
        self.journal = Journal(path)

    def replay_journal(self, path: str) -> None:
        """Admit what the journal at ``path`` holds (read after its checkpoint, which was just restored) in the order
        it was read, book a record a crash cut as ``dropped/crash``, and go on appending to it."""
        records, cut = read_journal(path)
        ledger, replayed = self.store.ledger, 0
        for record in records:
            arrived = []
            for ledger_id, dropped, *fields in record["entries"]:
                if ledger.new_id() != ledger_id:
                    raise ValueError(
                        f"{path} does not continue the ledger of the checkpoint beside it (id {ledger_id})"
                    )
                if dropped is not None:
                    ledger.dropped(ledger_id, dropped)
                    self.unknown_version += dropped == "unknown_version"
                    continue
                prompt_key, prompt_fields, *stored = fields
                traj = journaled_trajectory(prompt_key, *stored)
                traj.ledger_id = ledger_id
                arrived.append((traj, prompt_fields))
            self.store.admit_batch(arrived)
            self.largest_group = max(self.largest_group, record["largest_group"])
            replayed += len(record["entries"])
        for _ in range(cut or 0):
            ledger.dropped(ledger.new_id(), "crash")
        self.journal = Journal(path)
        self.journal_replayed = replayed
        lost = "" if not cut else f"; {cut} in a record a crash cut, booked as dropped/crash"
        lost = lost if cut is not None else "; a record a crash cut before its header was whole (its count is lost)"
        print(f"tba-ext: replayed {replayed} trajectories read after the checkpoint from {path}{lost}", flush=True)

    def load_store(self, path: str) -> None:
        state = load_checked(path)
        saved = state.get("updates_per_version", 1)
        if saved != self.updates_per_version:
            raise ValueError(
                f"{path} counts {saved} optimizer updates per global step, this run "
                f"{self.updates_per_version}: resume with the same data.train_batch_size, "
                "ppo_mini_batch_size and ppo_epochs, or start without this checkpoint"
            )
        # into a fresh store and sampler, taken only once the whole state read: a refused file leaves nothing
        store = TrajectoryStore(self.store.per_prompt_capacity, self.store.capacity, dedup=self.store.dedup)
        sampler = ReplaySampler(store, self.settings)
        try:
            sampler.load_state_dict(state["sampler"])
            largest_group = int(state["largest_group"])
        except (KeyError, TypeError, IndexError, AttributeError, LedgerError) as exc:
            raise ValueError(f"{path} is not a replay store this tba-ext reads ({type(exc).__name__}: {exc})") from exc
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        self.store, self.sampler, self.largest_group = store, sampler, largest_group
        saved = (self.store.per_prompt_capacity, self.store.capacity, self.store.capacity_bytes)
        evicted = self.store.resize(
            self.settings.per_prompt_capacity, self.settings.capacity, self.settings.capacity_bytes
        )
        if evicted or saved != (self.store.per_prompt_capacity, self.store.capacity, self.store.capacity_bytes):
            print(
                f"tba-ext: the restored replay store takes this run's capacities ({SAMPLER_KWARGS}"
                f"per_prompt_capacity / capacity / capacity_bytes: {saved} -> {self.store.per_prompt_capacity}, "
                f"{self.store.capacity}, {self.store.capacity_bytes}); {evicted} trajectories evicted",
                flush=True,
            )
        self.restored_trajectories = len(self.store)
        print(f"tba-ext: restored {len(self.store)} replay trajectories from {path}", flush=True)
