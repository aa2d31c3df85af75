"""The reference policy of the tba_* trainer modes: its log-probs, its updates and its checkpoint.

- Log-probs once per trajectory: the replay store keeps each trajectory's reference log-probs
  (``tba.ref_cache``), so the reference forward runs only on rows without them: fresh data, and data from before
  the latest reference update (``TrajectoryStore.reference_version``). An EMA reference (``tba.ref_ema`` with
  ``ref_reset_every=1``) changes every update, so every row is recomputed every update, as without the cache.
- Where that forward runs: with the fused update and the reference model in the actor's processes (the hybrid
  worker, or verl's reference worker group fused into the same Ray actors), inside the update's own worker call,
  just before its forward + backward (``tba.ref_in_update``): one call per update, nothing to wait for between
  two calls, and no devices held for a reference group that is idle once the store holds a trajectory's values.
  Otherwise verl's own reference call on those rows, before the update.
- Updates: ref <- ref_ema * ref + (1 - ref_ema) * policy every ``tba.ref_reset_every`` optimizer updates, shard by
  shard inside the workers (the actor's processes, or the reference's own worker group).
- Checkpoint: once the reference has moved, each rank's shard is saved beside verl's checkpoint and restored on
  resume.
The ``_``-prefixed functions run inside verl's workers (``__ray_call__``).
"""

from __future__ import annotations

import logging
import os
import sys
import time

import ray
import torch
import transfer_queue as tq
from tensordict import NonTensorStack, TensorDict
from verl.utils import tensordict_utils as tu
from verl.utils.transferqueue_utils import KVBatchMeta
from verl.workers.utils.padding import response_from_nested

from tba_ext.core import tb
from tba_ext.core.sealed import check_sealed, read_sealed, write_sealed
from tba_ext.core.wire import (
    KEY_FIELD,
    MICRO_BATCH_KEY,
    PARTITION_KEY,
    REFERENCE_IN_UPDATE_METRIC,
    SEARCHER_REFERENCE,
    TODO_FIELD,
)

logger = logging.getLogger(__name__)

REFERENCE_DIR = "tba_reference"  # the reference's shards, one file per rank, once a reset or the EMA moved it
# the update's own settings, which the reference forward must not inherit (it sets its own or verl's defaults)
_UPDATE_ONLY = (
    "force_group_size",
    "micro_batch_size_per_gpu",
    "calculate_entropy",
    "compute_loss",
    "distillation_use_topk",
    "distillation_only",
)


def data_parallel_size(wg, role: str) -> int:
    """How many data-parallel shards verl's dispatch splits ``role``'s calls on worker group ``wg`` into (its
    dispatch info maps each rank to its data-parallel rank; verl queries it once and keeps it)."""
    if role not in wg._dispatch_info:
        wg._dispatch_info[role] = wg._query_dispatch_info(role)
    return max(wg._dispatch_info[role]) + 1


def _local_tensors(module) -> dict:
    """This rank's part of every parameter and buffer (an FSDP2 DTensor's local shard), sharing storage."""
    return {
        name: (t.to_local() if hasattr(t, "to_local") else t).data
        for name, t in module.state_dict(keep_vars=True).items()
    }


def _engine_module(worker, role: str):
    """The model of ``role`` ("actor" or "ref") in this Ray actor: held by the verl worker itself, or by one of
    the workers verl fuses into a ``WorkerDict`` when roles share a resource pool (``worker_dict``)."""
    for candidate in (worker, *getattr(worker, "worker_dict", {}).values()):
        if getattr(candidate, role, None) is not None:
            return getattr(candidate, role).engine.module
    raise RuntimeError(f"no {role} model in this worker")


def _actor_shards(worker) -> dict:
    """Runs inside an actor worker: its shard of the policy's weights, on CPU, for the reference's rank."""
    return {name: t.detach().cpu() for name, t in _local_tensors(_engine_module(worker, "actor")).items()}


def _update_reference(worker, source: dict | None, keep: float) -> int:
    """Runs inside a worker holding the reference: ref <- keep * ref + (1 - keep) * policy, shard by shard
    (keep = 0 copies). ``source``: the policy's shards of the same rank, or None for the actor in this process."""
    target = _local_tensors(_engine_module(worker, "ref"))
    source = source if source is not None else _local_tensors(_engine_module(worker, "actor"))
    if set(target) != set(source):
        raise RuntimeError(f"reference and policy weights differ in names: {sorted(set(target) ^ set(source))[:5]}")
    with torch.no_grad():
        for name, dst in target.items():
            src = source[name].to(device=dst.device, dtype=dst.dtype)
            if src.shape != dst.shape:
                raise RuntimeError(
                    f"reference shard {name} is {tuple(dst.shape)}, the policy's {tuple(src.shape)}: "
                    "the reference must be sharded like the actor"
                )
            if keep and dst.is_floating_point():
                dst.mul_(keep).add_(src, alpha=1.0 - keep)
            else:
                dst.copy_(src)
    return len(target)


def install_reference_in_update(worker, ref_in_actor: bool) -> int:
    """Runs inside an actor worker (``__ray_call__``): every update of its actor first computes the reference
    log-probs of the rows the trainer marked (``TODO_FIELD``), with the reference model of this process (the
    actor itself with its LoRA adapter off when ``ref_in_actor``). Returns how many actors were wrapped."""
    candidates = (worker, *getattr(worker, "worker_dict", {}).values())
    reference = next((c.ref for c in candidates if getattr(c, "ref", None) is not None), None)
    wrapped = 0
    for candidate in candidates:
        actor = getattr(candidate, "actor", None)
        if actor is None or not hasattr(actor, "train_mini_batch"):
            continue
        ref = actor if ref_in_actor else reference
        if ref is None:
            raise RuntimeError("tba-ext: tba.ref_in_update needs the reference model in the actor's processes")

        def train_mini_batch(data, _train=actor.train_mini_batch, _ref=ref, _worker=candidate):
            start = time.perf_counter()
            _reference_into_batch(_worker, _ref, data, ref_in_actor)  # ends in a host read: the time is the work's
            seconds = time.perf_counter() - start
            output = _train(data=data)
            if output is not None:  # the rank that reports the update's metrics reports the reference's share
                metrics = dict(tu.get(output, "metrics"))
                metrics[REFERENCE_IN_UPDATE_METRIC] = [seconds]
                tu.assign_non_tensor(output, metrics=metrics)
            return output

        actor.train_mini_batch = train_mini_batch  # the instance's, which verl's update_actor calls
        wrapped += 1
    if not wrapped:
        raise RuntimeError("tba-ext: tba.ref_in_update found no verl actor in this worker")
    return wrapped


def _reference_into_batch(worker, reference, data: TensorDict, ref_in_actor: bool) -> None:
    """The reference forward on this rank's marked rows of an update batch: their ``ref_log_prob`` replaced in
    ``data`` (which the update then trains on) and stored in TransferQueue (which the trainer's store reads). The
    trainer marks as many rows on every rank (the forward's collectives need every rank to run it alike)."""
    todo = data.get(TODO_FIELD, None)
    if todo is None or not bool(todo.any()):
        return
    rows = todo.nonzero().squeeze(-1).tolist()
    part = tu.index_select_tensor_dict(data, rows)
    for key in _UPDATE_ONLY:
        tu.pop(part, key=key, default=None)
    micro = tu.get_non_tensor_data(data=data, key=MICRO_BATCH_KEY, default=None)
    settings = {"calculate_entropy": False, "compute_loss": False}
    if micro is not None:
        settings["micro_batch_size_per_gpu"] = int(micro)
    if ref_in_actor:
        settings["no_lora_adapter"] = True
    tu.assign_non_tensor(part, **settings)
    output = reference.infer_batch(part)
    if output is None:  # a model-parallel rank without outputs (sequence parallelism is refused at start-up)
        raise RuntimeError("tba-ext: the reference forward returned no log-probs on this rank")
    values = [v.to(torch.float32) for v in response_from_nested(output["log_probs"], part["response_mask"]).unbind()]
    data["ref_log_prob"] = replace_rows(data["ref_log_prob"], rows, values)
    collects = worker.query_collect_info("actor") if hasattr(worker, "query_collect_info") else True
    if collects:  # one writer per data-parallel shard
        keys = data[KEY_FIELD]
        keys = keys.tolist() if hasattr(keys, "tolist") else list(keys)
        tq.kv_batch_put(
            keys=[keys[row] for row in rows],
            partition_id=tu.get_non_tensor_data(data=data, key=PARTITION_KEY, default=None),
            fields=TensorDict(
                {
                    "ref_log_prob": torch.nested.as_nested_tensor([v.cpu() for v in values], layout=torch.jagged),
                    TODO_FIELD: torch.zeros(len(rows), dtype=torch.int8),  # done: the trainer checks it
                },
                batch_size=len(rows),
            ),
        )


def replace_rows(nested: torch.Tensor, rows: list[int], values: list[torch.Tensor]) -> torch.Tensor:
    """A jagged field with ``rows`` replaced by ``values``, on the field's device and in its dtype (verl's
    ``infer_batch`` returns its outputs on the CPU; the update's batch may live on the accelerator)."""
    merged = list(nested.unbind())
    for row, value in zip(rows, values):
        merged[row] = value.to(device=merged[row].device, dtype=merged[row].dtype)
    return torch.nested.as_nested_tensor(merged, layout=torch.jagged)


def _rank() -> tuple[int, int]:
    dist = torch.distributed
    return (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)


def _save_reference_shard(worker, folder: str) -> None:
    """Runs inside a worker holding the reference: its shard, as this rank's file of ``folder``."""
    rank, world = _rank()
    tensors = {name: t.detach().cpu().clone() for name, t in _local_tensors(_engine_module(worker, "ref")).items()}
    os.makedirs(folder, exist_ok=True)
    write_sealed(os.path.join(folder, f"rank_{rank}.pt"), {"world_size": world, "tensors": tensors})


def check_reference_folder(folder: str, world: int) -> None:
    """A saved reference holds one shard per rank of this run (``rank_<r>.pt``, r < world), checked before any rank
    loads its own: a checkpoint of another world size is refused whole, never loaded into some ranks only."""
    names = [f for f in os.listdir(folder) if f.startswith("rank_") and f.endswith(".pt")]
    saved = sorted(int(f[len("rank_") : -len(".pt")]) for f in names if f[len("rank_") : -len(".pt")].isdigit())
    if saved != list(range(world)):
        raise RuntimeError(
            f"{folder} holds reference shards of ranks {saved}, this run's reference has {world} rank(s): resume "
            "with the trainer.n_gpus_per_node x trainer.nnodes the checkpoint was saved with"
        )
    for rank in saved:  # every shard intact before any rank loads its own
        check_sealed(os.path.join(folder, f"rank_{rank}.pt"), f"reference shard {folder}/rank_{rank}.pt")


def _load_reference_shard(worker, folder: str) -> int:
    """Runs inside a worker holding the reference: copies this rank's saved shard into it."""
    rank, world = _rank()
    saved = read_sealed(os.path.join(folder, f"rank_{rank}.pt"), f"reference shard {folder}/rank_{rank}.pt")
    if saved["world_size"] != world:
        raise RuntimeError(
            f"{folder} holds a reference sharded over {saved['world_size']} ranks, this run has "
            f"{world}: resume with the same trainer.n_gpus_per_node x trainer.nnodes"
        )
    return _update_reference(worker, saved["tensors"], 0.0)


class ReferenceMixin:
    """The reference's part of ``TBATrainerMixin`` (verl's V1 trainer hooks ``_compute_ref_log_prob`` and
    the trainer's own ``step`` / checkpoint calls)."""

    # times the reference has moved since verl loaded it (the searchers' copy is the initial model: their
    # log-probs are the reference's only while this is 0)
    reference_version = 0
    ref_in_update = False  # the reference forward runs inside the update's call (set by reference_placement)

    def reference_placement(self) -> str:
        """Decides where the reference forward of rows without stored log-probs runs, once the workers exist;
        installs it in the actor workers when that is the update's own call. Returns the start-up line."""
        tba, actor = self.tba, self.config.actor_rollout_ref.actor
        if not (self.use_reference_policy and tba.ref_cache and self.fused):
            return ""
        same_processes = self.ref_in_actor or [w._actor_id for w in self.ref_policy_wg.workers] == [
            w._actor_id for w in self.actor_rollout_wg.workers
        ]
        why_not = next(
            (
                why
                for failed, why in (
                    (not tba.ref_in_update, "tba.ref_in_update=false"),
                    (tba.ref_cache_check, "tba.ref_cache_check recomputes stored rows in verl's reference call"),
                    (
                        int(actor.get("ulysses_sequence_parallel_size", 1) or 1) > 1,
                        "sequence parallelism leaves the reference's log-probs on one rank of each group",
                    ),
                    (not same_processes, "the reference worker group runs in processes of its own"),
                )
                if failed
            ),
            None,
        )
        if why_not:
            return f"reference log-probs of rows without stored ones: a separate reference call ({why_not})"
        workers = self.actor_rollout_wg.workers
        ray.get([w.__ray_call__.remote(install_reference_in_update, self.ref_in_actor) for w in workers])
        self.ref_in_update = True
        return "reference log-probs of rows without stored ones: computed inside the update's own call"

    def _compute_ref_log_prob(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's reference pass on the rows whose reference log-probs are not known (topped up to a multiple of
        the reference's data-parallel size), the known ones written beside them: the replay store's, or without
        the replay sampler the searchers' own (``rows.SEARCHER_REFERENCE``) while the reference is the initial
        model."""
        buffer = self.replay_buffer
        if not self.tba.ref_cache:
            return super()._compute_ref_log_prob(batch, metrics)
        if hasattr(buffer, "cached_reference"):
            cached = buffer.cached_reference(batch.keys)
        else:
            cached = _searcher_reference(batch) if self.reference_version == 0 else {}
        if self.ref_in_update:
            return self._mark_reference_for_update(batch, cached, metrics)
        check = self.tba.ref_cache_check and bool(cached)
        rows = [i for i, key in enumerate(batch.keys) if check or key not in cached]
        computed_keys: list[str] = []
        if rows:
            ranks = self._reference_dp_size()
            missing = set(rows)
            rows += [i for i in range(len(batch)) if i not in missing][: -len(rows) % ranks]
            rows.sort()
            computed_keys = [batch.keys[i] for i in rows]
            computed = KVBatchMeta(
                partition_id=batch.partition_id,
                keys=computed_keys,
                tags=[batch.tags[i] for i in rows],
                extra_info={**batch.extra_info, **self._reference_micro_batch(len(rows) // ranks)},
            )
            super()._compute_ref_log_prob(computed, metrics)
            values = tq.kv_batch_get(
                keys=computed_keys, partition_id=batch.partition_id, select_fields=["ref_log_prob"]
            )["ref_log_prob"].unbind()
            if check:
                metrics.update(_cache_differences(cached, dict(zip(computed_keys, values))))
            new = [(key, value) for key, value in zip(computed_keys, values) if key not in cached]
            if hasattr(buffer, "keep_reference"):
                buffer.keep_reference([key for key, _ in new], [value for _, value in new])
        done = set(computed_keys)
        stored = [key for key in batch.keys if key in cached and key not in done]
        if stored:
            nested = torch.nested.as_nested_tensor([cached[key] for key in stored], layout=torch.jagged)
            tq.kv_batch_put(
                keys=stored,
                partition_id=batch.partition_id,
                fields=TensorDict({"ref_log_prob": nested}, batch_size=len(stored)),
            )
        metrics["tba/ref_cached_frac"] = len(cached) / max(len(batch), 1)
        metrics["tba/ref_computed_frac"] = len(rows) / max(len(batch), 1)
        return batch

    def _mark_reference_for_update(self, batch: KVBatchMeta, cached: dict, metrics: dict) -> KVBatchMeta:
        """``tba.ref_in_update``: the stored reference log-probs written now, the rows without them marked for the
        update's own call (placeholders until it replaces them). verl hands data-parallel rank r the r-th slice
        of the batch; every rank gets as many marked rows, topped up with stored ones."""
        ranks = data_parallel_size(self.actor_rollout_wg, "actor")
        todo = rows_to_mark([key not in cached for key in batch.keys], ranks)
        need = len(todo) // ranks
        marked = torch.zeros(len(batch), dtype=torch.int8)
        marked[todo] = 1
        placeholders = [
            cached[key] if key in cached else torch.zeros(tag["response_len"], dtype=torch.float32)
            for key, tag in zip(batch.keys, batch.tags)
        ]
        fields = TensorDict(
            {
                "ref_log_prob": torch.nested.as_nested_tensor(placeholders, layout=torch.jagged),
                TODO_FIELD: marked,
                KEY_FIELD: NonTensorStack(*batch.keys),
            },
            batch_size=len(batch),
        )
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
        # for the update's call (verl's batch meta is rebuilt in between, so _update_actor adds them)
        self._reference_pass_info = {
            PARTITION_KEY: batch.partition_id,
            MICRO_BATCH_KEY: self._reference_micro_batch(need).get("micro_batch_size_per_gpu") if need else None,
        }
        self._reference_due = [batch.keys[i] for i in todo if batch.keys[i] not in cached]
        metrics["tba/ref_cached_frac"] = len(cached) / max(len(batch), 1)
        metrics["tba/ref_computed_frac"] = len(todo) / max(len(batch), 1)
        self._calls["units"] += len(todo)  # a forward each, inside the update's call
        return batch

    def _keep_reference_from_update(self, batch: KVBatchMeta) -> None:
        """After an update that computed reference log-probs: those of rows without stored ones into the store."""
        keys, self._reference_due = getattr(self, "_reference_due", []), []
        if keys and hasattr(self.replay_buffer, "keep_reference"):
            done = tq.kv_batch_get(
                keys=keys, partition_id=batch.partition_id, select_fields=["ref_log_prob", TODO_FIELD]
            )
            if bool(done[TODO_FIELD].any()):  # a placeholder kept as if it were the reference's log-probs
                raise RuntimeError("tba-ext: the update's call did not store the reference log-probs it computed")
            self.replay_buffer.keep_reference(keys, list(done["ref_log_prob"].unbind()))

    def _reference_micro_batch(self, rows_per_rank: int) -> dict:
        """verl's static micro-batching needs each rank's rows to be a multiple of the micro-batch: the largest
        micro-batch up to the configured one that divides this pass's rows (dynamic batch size: as configured)."""
        role = self.config.actor_rollout_ref.rollout if self.ref_in_actor else self.config.actor_rollout_ref.ref
        micro = role.get("log_prob_micro_batch_size_per_gpu")
        if role.get("log_prob_use_dynamic_bsz", False) or not micro:
            return {}
        return {
            "micro_batch_size_per_gpu": max(
                d for d in range(1, min(micro, rows_per_rank) + 1) if rows_per_rank % d == 0
            )
        }

    def _reference_dp_size(self) -> int:
        if self.ref_in_actor:
            return data_parallel_size(self.actor_rollout_wg, "actor")
        return data_parallel_size(self.ref_policy_wg, "ref")

    def _reference_moved(self, global_steps: int) -> bool:
        """Whether a reference update has run by the end of ``global_steps``: the reference is no longer the
        model verl loads it from, so checkpoints carry it."""
        every = self.tba.ref_reset_every
        return bool(self.use_reference_policy and tb.multiples_passed(0, global_steps * self.updates_per_step, every))

    def _update_reference(self) -> None:
        """After an ``update_actor`` call: ref <- a ref + (1 - a) policy (a = ref_ema) if the call's updates reach a
        multiple of ``ref_reset_every`` (the start-up checks keep a multiple from falling inside a call's
        mini-batches), and the stored reference log-probs marked stale at the same point, so the next update
        trains against the moved reference. In separate_async that is each of the step's k local updates."""
        per_call = self.updates_per_step // self.parameter_sync_step
        done = tb.first_update(self.global_steps, self.updates_per_step) - 1
        done += (getattr(self, "local_trigger_step", 0) + 1) * per_call
        due = tb.multiples_passed(done - per_call, done, self.tba.ref_reset_every)
        if not due or not self.use_reference_policy:
            return
        keep = self.tba.ref_ema
        actors, refs = self.actor_rollout_wg.workers, self.ref_policy_wg.workers
        if [w._actor_id for w in refs] == [w._actor_id for w in actors]:
            # the reference shares the actor's processes: the hybrid worker, or its own worker group fused into
            # the same Ray actors (verl does this when both use the global pool, as hybrid_engine=False does)
            ray.get([w.__ray_call__.remote(_update_reference, None, keep) for w in refs])
        else:  # other processes: rank r from actor rank r, worker to worker through Ray's object store
            if len(refs) != len(actors):
                raise RuntimeError(f"{len(refs)} reference workers for {len(actors)} actor workers")
            shards = [w.__ray_call__.remote(_actor_shards) for w in actors]
            ray.get([w.__ray_call__.remote(_update_reference, s, keep) for w, s in zip(refs, shards)])
        self.reference_version += 1
        if hasattr(self.replay_buffer, "reference_changed"):  # the stored reference log-probs are now stale
            self.replay_buffer.reference_changed()
        logger.info("tba: reference updated from the policy after update %d (keep %.3g)", done, keep)

    def _save_reference(self, folder: str) -> None:
        """Each rank's reference shard into ``folder``, once the reference is no longer verl's initial model."""
        if self._reference_moved(self.global_steps):
            target = os.path.join(os.path.abspath(folder), REFERENCE_DIR)
            ray.get([w.__ray_call__.remote(_save_reference_shard, target) for w in self.ref_policy_wg.workers])

    def _restore_reference(self, folder: str) -> None:
        if not self.use_reference_policy:
            return
        if self._reference_moved(self.global_steps):  # resumed after a reset: no longer the initial model
            updates = self.global_steps * self.updates_per_step
            self.reference_version = tb.multiples_passed(0, updates, self.tba.ref_reset_every)
        reference = os.path.join(folder, REFERENCE_DIR)
        if os.path.isdir(reference):
            check_reference_folder(reference, len(self.ref_policy_wg.workers))
            ray.get([w.__ray_call__.remote(_load_reference_shard, reference) for w in self.ref_policy_wg.workers])
            print(f"tba-ext: restored the reference policy from {reference}", flush=True)
        elif self._reference_moved(self.global_steps):
            print(
                f"tba-ext: WARNING: {folder} holds no reference policy ({REFERENCE_DIR}/) although "
                f"tba.ref_reset_every={self.tba.ref_reset_every} has moved it by step {self.global_steps}: "
                "the resumed run's KL anchor is the initial model",
                file=sys.stderr,
                flush=True,
            )
            if hasattr(self.replay_buffer, "reference_changed"):  # stored log-probs are of the lost reference
                self.replay_buffer.reference_changed()


def rows_to_mark(missing: list[bool], ranks: int) -> list[int]:
    """The rows whose reference forward runs inside the update: every row ``missing`` its log-probs, and on each
    data-parallel rank (verl hands rank r the r-th contiguous slice) as many stored rows as bring it level with
    the rank missing most, so every rank runs the same forward (its collectives must match)."""
    if len(missing) % ranks:
        raise RuntimeError(f"tba-ext: {len(missing)} rows cannot be split over {ranks} data-parallel ranks")
    per_rank = len(missing) // ranks
    slices = [range(r * per_rank, (r + 1) * per_rank) for r in range(ranks)]
    need = max(sum(missing[i] for i in rows) for rows in slices)
    marked = []
    for rows in slices:
        own = [i for i in rows if missing[i]]
        marked += sorted(own + [i for i in rows if not missing[i]][: need - len(own)])
    return marked


def _searcher_reference(batch: KVBatchMeta) -> dict[str, torch.Tensor]:
    """The rows of ``batch`` whose searcher sent the reference's log-probs with the response (verl's padding
    rows copy another row's fields, so they and any row whose log-probs do not match its length are left out)."""
    extras = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])[
        "extra_fields"
    ]
    extras = extras.tolist() if hasattr(extras, "tolist") else list(extras)
    found = {}
    for key, tag, extra in zip(batch.keys, batch.tags, extras):
        values = extra.get(SEARCHER_REFERENCE) if isinstance(extra, dict) else None
        if values is not None and not tag.get("is_padding", False) and len(values) == tag.get("response_len"):
            found[key] = torch.tensor(values, dtype=torch.float32)
    return found


def _cache_differences(cached: dict, computed: dict) -> dict:
    """How far the stored reference log-probs are from the reference pass on the same rows."""
    both = [key for key in cached if key in computed]
    sums = [abs(float(cached[k].double().sum() - computed[k].double().sum())) for k in both]
    tokens = [float((cached[k] - computed[k].float()).abs().max()) for k in both]
    return {
        "tba/ref_cache_max_sum_diff": max(sums, default=0.0),
        "tba/ref_cache_max_token_diff": max(tokens, default=0.0),
        "tba/ref_cache_checked_rows": len(both),
    }
