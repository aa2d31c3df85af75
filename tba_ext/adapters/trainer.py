"""TBA trainer modes for verl's V1 trainer: ``trainer.v1.trainer_mode=tba_sync`` / ``tba_colocate_async`` /
``tba_separate_async``.

Each runs verl's own ``sync`` / ``colocate_async`` / ``separate_async`` trainer and adds the per-step work of TBA:
- start-up checks of the TB settings (``tba_ext.core.settings``), failing before any worker starts;
- the fused TB update (``tba_ext.adapters.fused``): whole prompt groups per data-parallel rank, no old-log-prob
  pass, the group index handed to the loss; verl's three-call path where it cannot run (Megatron);
- counts of the trainer's worker calls and forward units per update;
- the beta schedule, written into verl's KL coefficient, which the tb estimators also read as beta;
- TB metrics in verl's stream (tb/beta, tb/log_z, tb/kl, tb/zero_reward_variance_frac, ...);
- the reference-policy update every ``tba.ref_reset_every`` updates (TBA' reset, or an EMA with ``tba.ref_ema``),
  with the reference beside the actor or in its own worker group (FSDP engines);
- asynchrony metrics (trainer/searcher idle ratios, weight-sync time, throughput);
- saving/restoring the replay store, and the reference once it has moved, with verl's checkpoints.
Schedules and staleness count optimizer updates: a global step is ``updates_per_step`` of them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import sys
import time

import ray
import torch
import transfer_queue as tq
from omegaconf import OmegaConf, open_dict
from tensordict import NonTensorStack, TensorDict

from verl.trainer.ppo.v1.trainer_base import PPOTrainer, register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.ray_utils import auto_await
from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions, log_seqlen_unbalance
from verl.workers.utils.padding import response_to_nested

from tba_ext.adapters import fused, losses
from tba_ext.core import tb
from tba_ext.core.settings import (
    check_tba_run,
    dataloader_fetch,
    fused_update_plan,
    prompts_to_queue,
    step_folder,
    updates_per_step,
)

logger = logging.getLogger(__name__)

REPLAY_FILE = "tba_replay.pt"
REFERENCE_DIR = "tba_reference"  # the reference's shards, one file per rank, once a reset or the EMA moved it


def _local_tensors(module) -> dict:
    """This rank's part of every parameter and buffer (an FSDP2 DTensor's local shard), sharing storage."""
    return {name: (t.to_local() if hasattr(t, "to_local") else t).data
            for name, t in module.state_dict(keep_vars=True).items()}


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
                raise RuntimeError(f"reference shard {name} is {tuple(dst.shape)}, the policy's {tuple(src.shape)}: "
                                   "the reference must be sharded like the actor")
            if keep and dst.is_floating_point():
                dst.mul_(keep).add_(src, alpha=1.0 - keep)
            else:
                dst.copy_(src)
    return len(target)


def _rank() -> tuple[int, int]:
    dist = torch.distributed
    return (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)


def _save_reference_shard(worker, folder: str) -> None:
    """Runs inside a worker holding the reference: its shard, as this rank's file of ``folder``."""
    rank, world = _rank()
    tensors = {name: t.detach().cpu().clone() for name, t in _local_tensors(_engine_module(worker, "ref")).items()}
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".rank_{rank}.pt.tmp")
    torch.save({"world_size": world, "tensors": tensors}, tmp)
    os.replace(tmp, os.path.join(folder, f"rank_{rank}.pt"))


def _load_reference_shard(worker, folder: str) -> int:
    """Runs inside a worker holding the reference: copies this rank's saved shard into it."""
    rank, world = _rank()
    saved = torch.load(os.path.join(folder, f"rank_{rank}.pt"), weights_only=True)
    if saved["world_size"] != world:
        raise RuntimeError(f"{folder} holds a reference sharded over {saved['world_size']} ranks, this run has "
                           f"{world}: resume with the same trainer.n_gpus_per_node x trainer.nnodes")
    return _update_reference(worker, saved["tensors"], 0.0)


def _as_list(values) -> list:
    """TransferQueue returns non-tensor fields as NonTensorStack (``tolist``) or an already-listed sequence."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


class TBATrainerMixin:
    base_mode: str = ""

    def __init__(self, config):
        plain = OmegaConf.to_container(config, resolve=True)
        self.tba, self.replay_settings = check_tba_run(plain)
        self.updates_per_step = updates_per_step(plain)
        self.fused, why = fused_update_plan(plain, self.tba)
        if plain["algorithm"].get("adv_estimator") in losses.ESTIMATOR_NAMES:
            print("tba-ext: " + ("fused TB update: one forward + backward per micro-batch, log Z from it, no "
                                 "old-log-prob pass" if self.fused else f"three-call TB update ({why})"), flush=True)
        # verl branches on trainer_mode == "sync" etc.; run as the base mode we extend
        with open_dict(config):
            config.trainer.v1.trainer_mode = self.base_mode
        self._beta_init = float(config.algorithm.kl_ctrl.kl_coef)
        super().__init__(config)
        if self.replay_settings is not None:  # the trainer draws K = rollout.n of each prompt's samples
            self.replay_buffer.group_size = int(config.actor_rollout_ref.rollout.n)
            self.replay_buffer.updates_per_version = self.updates_per_step  # staleness counted in updates
            self.replay_buffer.local_updates = self.parameter_sync_step
            if self.base_mode == "separate_async":  # searchers independent of the trainer: fill the initial buffer
                self.replay_buffer.request_prompts = self._add_prompts_to_generate

    def on_init_end(self):
        if self.fused:  # the actor workers' loss becomes the fused TB loss (same actor config)
            ray.get([w.__ray_call__.remote(fused.install_fused_loss) for w in self.actor_rollout_wg.workers])
        self._count_trainer_calls()
        super().on_init_end()

    # -- what the trainer's workers compute per update: calls and forward units (a forward 1, fwd+bwd 3) ------
    TRAINER_CALLS = {"compute_log_prob": 1, "compute_ref_log_prob": 1, "update_actor": 3}

    def _count_trainer_calls(self):
        self._calls = {"calls": 0, "units": 0}
        groups = {id(wg): wg for wg in (self.actor_rollout_wg, getattr(self, "ref_policy_wg", None)) if wg}
        for wg in groups.values():
            for name, unit in self.TRAINER_CALLS.items():
                if hasattr(wg, name):
                    setattr(wg, name, self._counted(name, getattr(wg, name), unit))

    def _counted(self, name: str, method, unit: int):
        @functools.wraps(method)
        def counted(batch, *args, **kwargs):
            epochs = int(batch.extra_info.get("epochs", 1)) if unit == 3 else 1
            self._calls["calls"] += 1
            self._calls["units"] += unit * epochs * len(batch)
            output = method(batch, *args, **kwargs)
            if name == "update_actor":  # per-mini-batch metrics, before verl averages them
                self._last_actor_metrics = dict(output["metrics"])
            return output
        return counted

    def _trainer_call_metrics(self, trained_rows: int) -> dict:
        calls, self._calls = self._calls, {"calls": 0, "units": 0}
        return {"tba/trainer_calls_per_update": calls["calls"] / self.updates_per_step,
                "tba/trainer_forward_units_per_trajectory": calls["units"] / max(trained_rows, 1)}

    def on_sample_begin(self):
        if self.replay_settings is not None:  # which of the step's k samples is served next: its staleness
            self.replay_buffer.local_update = self.local_trigger_step
        super().on_sample_begin()

    def _fetch_one_gen_batch(self):
        """Prompts for the searchers; with the replay sampler's samples_per_prompt S > rollout.n, each asks for
        S samples (verl's per-prompt ``__rollout_n__``) while verl's batch arithmetic keeps n = K."""
        batch = super()._fetch_one_gen_batch()
        s = self.replay_settings.samples_per_prompt if self.replay_settings is not None else None
        if s is not None and s > self.config.actor_rollout_ref.rollout.n:
            batch["__rollout_n__"] = NonTensorStack(*[s] * batch.batch_size[0])
        return batch

    # -- beta schedule: one number drives verl's KL coefficient and the estimator's 1/beta ---------------
    def current_beta(self) -> float:
        b = self.tba.beta
        update = tb.first_update(self.global_steps, self.updates_per_step)
        return tb.beta_at_step(update, self._beta_init, b.final, b.anneal_steps)

    def on_step_begin(self):
        beta = self.current_beta()
        with open_dict(self.config):
            self.config.algorithm.kl_ctrl.kl_coef = beta
        if getattr(self, "kl_ctrl_in_reward", None) is not None:
            self.kl_ctrl_in_reward.value = beta
        super().on_step_begin()

    # -- the fused update: whole groups per rank, no old-log-prob pass, the loss computed on the workers ------
    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """Fused: verl's token balancing across data-parallel ranks, over whole prompt groups (each rank's slice,
        and every mini-batch and micro-batch in it, holds all rollout.n members of its groups)."""
        if not self.fused:
            return super()._balance_batch(batch, metrics, logging_prefix, keep_minibatch)
        wg = self.actor_rollout_wg
        if "actor" not in wg._dispatch_info:
            wg._dispatch_info["actor"] = wg._query_dispatch_info("actor")
        dp_size = max(wg._dispatch_info["actor"]) + 1
        uids = _as_list(tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                        select_fields=["uid"])["uid"])
        members: dict = {}
        for row, (uid, tag) in enumerate(zip(uids, batch.tags)):
            if tag.get("is_padding", False):
                raise RuntimeError("tba-ext fused update: verl padded the batch; prompts per update must be a "
                                   "multiple of the data-parallel size (data.train_batch_size)")
            members.setdefault(uid, []).append(row)
        groups = list(members.values())
        n = int(self.config.actor_rollout_ref.rollout.n)
        if any(len(g) != n for g in groups) or len(groups) % dp_size:
            raise RuntimeError(f"tba-ext fused update: {len(groups)} groups of sizes {sorted({len(g) for g in groups})}"
                               f" cannot be split whole over {dp_size} ranks in groups of rollout.n={n}")
        seqlen = torch.tensor([tag["seq_len"] for tag in batch.tags], dtype=torch.int64)
        workload = calculate_workload(seqlen).tolist()
        parts = get_seqlen_balanced_partitions([sum(workload[r] for r in g) for g in groups], k_partitions=dp_size,
                                               equal_size=True)
        order = [row for part in parts for group in sorted(part) for row in groups[group]]
        batch.reorder(order)
        metrics.update(log_seqlen_unbalance(seqlen_list=seqlen.tolist(), prefix=logging_prefix, partitions=[
            [row for group in part for row in groups[group]] for part in parts]))
        return batch

    def _compute_old_log_prob(self, batch, metrics: dict):
        if self.fused:  # TB has no ratio against pi_old and takes log Z from the training forward
            return batch
        return super()._compute_old_log_prob(batch, metrics)

    def _fused_advantage(self, batch, metrics: dict):
        """Fused: the driver writes each row's group index (the loss groups by it) and, for verl's data metrics,
        the reward part of the advantage, r - mean_group r (the KL part is known only to the forward: tb/*)."""
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["rm_scores", "uid", "response_mask"])
        response_mask = data["response_mask"]
        padded = data.to_padded_tensor()
        reward = (padded["rm_scores"] * padded["response_mask"]).sum(-1)
        uids = _as_list(padded["uid"])
        groups = tb.group_ids(uids)
        metrics["tb/zero_reward_variance_frac"] = tb.zero_variance_fraction(reward.numpy(), uids)
        metrics["tb/beta"] = self.current_beta()
        centred = (reward - tb.group_mean(reward, groups)).unsqueeze(-1) * padded["response_mask"].to(reward.dtype)
        nested = response_to_nested(centred, response_mask)
        fields = TensorDict({fused.GROUP_FIELD: groups, "advantages": nested, "returns": nested.clone()},
                            batch_size=len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)

    def _update_actor(self, batch, metrics: dict):
        if not self.fused:
            return super()._update_actor(batch, metrics)
        n = int(self.config.actor_rollout_ref.rollout.n)
        actor = self.config.actor_rollout_ref.actor
        batch.extra_info.update({fused.BETA_KEY: self.current_beta(), fused.MODE_KEY: actor.policy_loss.loss_mode,
                                 "force_group_size": n})
        if not actor.use_dynamic_bsz:  # verl's micro-batch is then micro_batch_size_per_gpu groups
            batch.extra_info["micro_batch_size_per_gpu"] = int(actor.ppo_micro_batch_size_per_gpu) // n
        batch = super()._update_actor(batch, metrics)
        for key in fused.BATCH_METRICS:  # the names verl's three-call pipeline reports them under
            if "actor/" + key in metrics:
                metrics[key] = metrics.pop("actor/" + key)
        first_mini_batch = getattr(self, "_last_actor_metrics", {}).get("tb/kl")
        if first_mini_batch is not None and getattr(self, "local_trigger_step", 0) == 0:  # the step's first update
            while isinstance(first_mini_batch, list | tuple):  # one value per mini-batch (and epoch), in order
                first_mini_batch = first_mini_batch[0]
            metrics["tb/kl_step_start"] = float(first_mini_batch)
        return batch

    def _compute_advantage(self, batch, metrics: dict):
        if self.fused:
            return self._fused_advantage(batch, metrics)
        if self.config.algorithm.adv_estimator in losses.ESTIMATOR_NAMES:
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["rm_scores", "uid"])
            padded = data.to_padded_tensor()  # as verl's own _compute_advantage reads these fields
            reward = padded["rm_scores"].sum(-1).numpy()
            real = [not tag.get("is_padding", False) for tag in batch.tags]  # verl's no-op rows are no group
            uids = [uid for uid, keep in zip(_as_list(padded["uid"]), real) if keep]
            metrics["tb/zero_reward_variance_frac"] = tb.zero_variance_fraction(reward[real], uids)
        batch = super()._compute_advantage(batch, metrics)
        metrics.update(losses.ESTIMATOR_METRICS)
        if "actor/reward_kl_penalty" in metrics:
            metrics["tb/kl"] = metrics["actor/reward_kl_penalty"]
            if getattr(self, "local_trigger_step", 0) == 0:  # the step's first update (of k in separate_async)
                metrics["tb/kl_step_start"] = metrics["actor/reward_kl_penalty"]
        return batch

    def step(self, metrics: dict, timing_raw: dict):
        batch = super().step(metrics, timing_raw)
        self._update_reference()  # before verl saves this step's checkpoint, so the checkpoint holds it
        return batch

    def _reference_moved(self, global_steps: int) -> bool:
        """Whether a reference update has run by the end of ``global_steps``: the reference is no longer the
        model verl loads it from, so checkpoints carry it."""
        every = self.tba.ref_reset_every
        return bool(self.use_reference_policy and tb.multiples_passed(0, global_steps * self.updates_per_step, every))

    def _update_reference(self) -> None:
        """After the updates of this step: every ``ref_reset_every`` updates, ref <- a ref + (1 - a) policy
        (a = ref_ema; several due at once, as when k updates make one step, apply a^n)."""
        u = self.updates_per_step
        due = tb.multiples_passed((self.global_steps - 1) * u, self.global_steps * u, self.tba.ref_reset_every)
        if not due or not self.use_reference_policy:
            return
        keep = self.tba.ref_ema ** due
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
        logger.info("tba: reference updated from the policy after update %d (keep %.3g)",
                    self.global_steps * u, keep)

    # -- asynchrony metrics: who waited, how long syncs took, how fast data flowed ---------------------------
    def _searcher_stats(self) -> list[dict]:
        servers = [server for manager in self._rollout_server_managers()
                   for replica in getattr(manager, "rollout_replicas", []) for server in replica.servers]
        stats = []
        for server in servers:
            try:
                stats.append(ray.get(server.stats.remote(), timeout=10))
            except Exception:  # noqa: BLE001 - a dead searcher is reported, not fatal
                stats.append(None)
        return stats

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        now = time.time()
        step_s = float(timing_raw.get("step", 0.0)) or 1e-9
        metrics["tba/trainer_idle_ratio"] = float(timing_raw.get("gen", 0.0)) / step_s
        metrics["tba/data_wait_s_per_update"] = float(timing_raw.get("gen", 0.0)) / self.updates_per_step
        metrics["tba/weight_sync_s"] = float(timing_raw.get("update_weights", 0.0))
        metrics["tba/trajectories_consumed_per_s"] = len(batch.keys) / step_s
        metrics.update(self._trainer_call_metrics(len(batch.keys)))
        stats = self._searcher_stats()
        metrics["tba/searchers_alive"] = sum(s is not None for s in stats)
        previous, self._last_searcher_stats = getattr(self, "_last_searcher_stats", None), (now, stats)
        if previous and len(previous[1]) == len(stats):
            wall, idle, made = now - previous[0], [], 0
            for i, (cur, old) in enumerate(zip(stats, previous[1])):
                # a searcher dead now or then, or restarted since (its counters began again), is not measured
                if cur is None or old is None or cur["generated"] < old["generated"]:
                    continue
                idle.append(max(0.0, 1.0 - (cur["busy_seconds"] - old["busy_seconds"]) / wall))
                made += cur["generated"] - old["generated"]
                metrics[f"tba/searcher_{i}/idle_ratio"] = idle[-1]
                metrics[f"tba/searcher_{i}/generated_per_s"] = (cur["generated"] - old["generated"]) / wall
            if idle:
                metrics["tba/searcher_idle_ratio"] = sum(idle) / len(idle)
                metrics["tba/trajectories_generated_per_s"] = made / wall
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)

    # -- replay store and reference persistence next to verl's checkpoint --------------------------------
    def _save_checkpoint(self):
        # written before verl's tracker file, so a crash mid-save leaves the previous checkpoint current
        folder = step_folder(self.config.trainer.default_local_dir, self.global_steps)
        if hasattr(self.replay_buffer, "save_store"):
            os.makedirs(folder, exist_ok=True)
            self.replay_buffer.save_store(os.path.join(folder, REPLAY_FILE))
        if self._reference_moved(self.global_steps):
            target = os.path.join(os.path.abspath(folder), REFERENCE_DIR)
            ray.get([w.__ray_call__.remote(_save_reference_shard, target) for w in self.ref_policy_wg.workers])
        super()._save_checkpoint()

    def _resumed_folder(self) -> str:
        """The checkpoint folder verl resumed from: ``trainer.resume_from_path`` or the latest under
        ``trainer.default_local_dir``."""
        trainer = self.config.trainer
        if trainer.resume_mode == "resume_path":
            folder = str(trainer.resume_from_path)
        else:
            folder = step_folder(trainer.default_local_dir, self.global_steps)
        return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if self.global_steps <= 0:
            return
        folder = self._resumed_folder()
        if hasattr(self.replay_buffer, "load_store"):
            path = os.path.join(folder, REPLAY_FILE)
            if os.path.exists(path):
                self.replay_buffer.load_store(path)
            else:
                logger.warning("tba: no replay store at %s; resuming with an empty store", path)
        if self.use_reference_policy:
            reference = os.path.join(folder, REFERENCE_DIR)
            if os.path.isdir(reference):
                ray.get([w.__ray_call__.remote(_load_reference_shard, reference) for w in self.ref_policy_wg.workers])
                print(f"tba-ext: restored the reference policy from {reference}", flush=True)
            elif self._reference_moved(self.global_steps):
                print(f"tba-ext: WARNING: {folder} holds no reference policy ({REFERENCE_DIR}/) although "
                      f"tba.ref_reset_every={self.tba.ref_reset_every} has moved it by step {self.global_steps}: "
                      "the resumed run's KL anchor is the initial model", file=sys.stderr, flush=True)


@register_trainer("tba_sync")
class TBATrainerSync(TBATrainerMixin, PPOTrainerSync):
    base_mode = "sync"


@register_trainer("tba_colocate_async")
class TBATrainerColocateAsync(TBATrainerMixin, PPOTrainerColocateAsync):
    base_mode = "colocate_async"


class _FlushTolerantLogger(logging.LoggerAdapter):
    """verl 0.9.1 calls ``logger.info(..., flush=True)`` when hybrid replicas are off
    (trainer_separate_async.py, _setup), which the logging module rejects with a TypeError."""

    def log(self, level, msg, *args, **kwargs):
        kwargs.pop("flush", None)
        super().log(level, msg, *args, **kwargs)


_separate_async_module = sys.modules[PPOTrainerSeparateAsync.__module__]
if not isinstance(_separate_async_module.logger, _FlushTolerantLogger):
    _separate_async_module.logger = _FlushTolerantLogger(_separate_async_module.logger, {})


@register_trainer("tba_separate_async")
class TBATrainerSeparateAsync(TBATrainerMixin, PPOTrainerSeparateAsync):
    """Decoupled searchers: verl's standalone rollout pool generates continuously; weights sync every
    ``trainer.v1.separate_async.parameter_sync_step`` (k) local updates.

    With ``tba.searcher_queue_prompts`` the searchers run free: before every update the prompts queued or in
    generation are topped up to that many, whatever the trainer consumed, instead of verl's one batch per
    global step; the sampler (``min_fresh_groups``) then trains on what the store holds without waiting."""

    base_mode = "separate_async"

    SEARCHER_RESTART_WAIT_S = 300

    # the stages of verl's CheckpointEngineManager.update_weights around the transfer itself
    SYNC_PHASES = ("abort_replicas", "release_kv_cache_replicas", "build_process_group", "resume_kv_cache_replicas",
                   "resume_generation_replicas")

    def on_init_end(self):
        self._sync_phase_s = dict.fromkeys(self.SYNC_PHASES, 0.0)
        manager = self.standalone_checkpoint_manager
        for name in self.SYNC_PHASES:
            setattr(manager, name, self._timed(name, getattr(manager, name)))
        super().on_init_end()

    def _timed(self, name, method):
        """``method`` adding its wall time to ``_sync_phase_s[name]``, reported with the step's metrics. verl's
        ``auto_await`` methods are re-wrapped around the timed coroutine, keeping their await-or-run rule."""
        raw = getattr(method, "__wrapped__", None)
        if raw is not None and inspect.iscoroutinefunction(raw):
            owner = method.__self__

            @auto_await
            @functools.wraps(raw)
            async def timed(*args, **kwargs):
                with self._sync_phase(name):
                    return await raw(owner, *args, **kwargs)
        else:
            @functools.wraps(method)
            def timed(*args, **kwargs):
                with self._sync_phase(name):
                    return method(*args, **kwargs)
        return timed

    @contextlib.contextmanager
    def _sync_phase(self, name):
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync_phase_s[name] += time.perf_counter() - start

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        # where this step's weight sync went (step 1 also holds the initial one): verl's stages around the
        # transfer; the rest of tba/weight_sync_s is the transfer itself
        for name, seconds in self._sync_phase_s.items():
            metrics[f"tba/weight_sync/{name}_s"] = seconds
        self._sync_phase_s = dict.fromkeys(self.SYNC_PHASES, 0.0)
        if self.tba.searcher_queue_prompts is not None:  # how far generation runs ahead of consumption
            metrics["tba/searcher_prompts_ahead"] = self._submitted_prompts - self._consumed_prompts
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)

    def _add_batch_to_generate(self):
        if self.tba.searcher_queue_prompts is None:
            return super()._add_batch_to_generate()
        self._top_up_searchers()

    # prompts handed to the searchers and prompts the trainer sampled, since the start (searcher pacing)
    _submitted_prompts = 0
    _consumed_prompts = 0

    def on_sample_begin(self):
        super().on_sample_begin()
        if self.tba.searcher_queue_prompts is not None:
            self._consumed_prompts += self.config.data.train_batch_size // self.parameter_sync_step
            self._top_up_searchers()

    def _add_prompts_to_generate(self, num_prompts: int) -> int:
        added = super()._add_prompts_to_generate(num_prompts)  # warm-up, top-ups and verl's refills alike
        self._submitted_prompts += added
        return added

    def _top_up_searchers(self) -> int:
        """Queue prompts (whole ``data.gen_batch_size`` chunks) until ``searcher_queue_prompts`` are pending
        or generating, within ``searcher_prompts_per_consumed`` if set."""
        buffer = self.replay_buffer
        buffer._sync_metadata_from_transfer_queue()
        inflight = len(buffer.pending_keys["train"]) + len(buffer.running_keys["train"])
        chunk = dataloader_fetch(self.config.data)
        missing = prompts_to_queue(self.tba.searcher_queue_prompts, inflight, chunk, self._submitted_prompts,
                                   self._consumed_prompts, self.tba.searcher_prompts_per_consumed)
        return self._add_prompts_to_generate(missing) if missing > 0 else 0

    def on_step_end(self):
        """verl's weight sync, retried while a searcher that died is being restarted by Ray: the sync's first
        call to it then fails with ActorUnavailableError ("the actor is restarting"), and would end the run."""
        deadline = time.time() + self.SEARCHER_RESTART_WAIT_S
        while True:
            try:
                return super().on_step_end()
            except ray.exceptions.ActorUnavailableError as exc:
                if time.time() > deadline:
                    raise
                logger.warning("tba: a searcher is restarting; weight sync retried in 2 s (%s)", exc)
                time.sleep(2)

    def _compute_old_log_prob(self, batch, metrics: dict):
        if self.fused:
            return batch
        # verl restores the sync-window's pi_old here for PPO's clipped ratio. TB has no ratio: its log Z is
        # estimated at the policy being updated, as the paper's trainer does, so use the current weights.
        return PPOTrainer._compute_old_log_prob(self, batch, metrics)


TRAINER_NAMES = ("tba_sync", "tba_colocate_async", "tba_separate_async")
