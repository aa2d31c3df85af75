"""TBA trainer modes for verl's V1 trainer: ``trainer.v1.trainer_mode=tba_sync`` / ``tba_colocate_async`` (here)
and ``tba_separate_async`` (``tba_ext.adapters.decoupled``).

Each runs verl's own ``sync`` / ``colocate_async`` / ``separate_async`` trainer and adds the per-step work of TBA.
This module holds the TB hooks:
- start-up checks of the TB settings (``tba_ext.adapters.checks``), failing before any worker starts;
- the fused TB update (``tba_ext.adapters.fused``): whole prompt groups per data-parallel rank, no old-log-prob
  pass, the group index handed to the loss; verl's three-call path where it cannot run (Megatron);
- the beta schedule, written into verl's KL coefficient, which the tb estimators also read as beta;
- TB metrics in verl's stream (tb/beta, tb/log_z, tb/kl, tb/zero_reward_variance_frac, ...);
- saving/restoring the replay store with verl's checkpoints.
Beside it: ``reference`` (reference log-probs once per trajectory, the reference's updates and checkpoint) and
``trainer_metrics`` (worker calls per update, asynchrony metrics).
Schedules and staleness count optimizer updates: a global step is ``updates_per_step`` of them.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import ray
import torch
import transfer_queue as tq
from omegaconf import OmegaConf, open_dict
from tensordict import NonTensorStack, TensorDict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions, log_seqlen_unbalance
from verl.workers.utils.padding import response_to_nested

from tba_ext.adapters import fused, losses
from tba_ext.adapters.checks import RESUME_REMEDY, check_tba_run, fused_update_plan, planned_epochs
from tba_ext.adapters.llm_client import ReferenceKeepingClient
from tba_ext.adapters.lr_schedule import install_lr_schedule
from tba_ext.adapters.reference import REFERENCE_DIR, ReferenceMixin, data_parallel_size
from tba_ext.adapters.trainer_metrics import TrainerMetricsMixin
from tba_ext.core import steps, tb, wire
from tba_ext.core.hold import hold_point
from tba_ext.core.journal import JOURNAL_FILE
from tba_ext.core.replay import REPLAY_FILE
from tba_ext.core.steps import scheduler_updates_per_call, step_folder, updates_per_step
from tba_ext.tasks.data import check_chat_template

logger = logging.getLogger(__name__)
OWN_FILES = (REPLAY_FILE, JOURNAL_FILE, REFERENCE_DIR)  # what tba-ext writes into verl's global_step_N folders


def _first(value) -> float:
    """The first of verl's per-mini-batch (and per-epoch) metric values, in order; a float stays as it is."""
    while isinstance(value, list | tuple):
        value = value[0]
    return float(value)


def _as_list(values) -> list:
    """TransferQueue returns non-tensor fields as NonTensorStack (``tolist``) or an already-listed sequence."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


class TBATrainerMixin(ReferenceMixin, TrainerMetricsMixin):
    base_mode: str = ""

    def __init__(self, config):
        plain = OmegaConf.to_container(config, resolve=True)
        self.tba, self.replay_settings = check_tba_run(plain)
        self.updates_per_step = updates_per_step(plain)
        self.fused, why = fused_update_plan(plain, self.tba)
        if plain["algorithm"].get("adv_estimator") in losses.ESTIMATOR_NAMES:
            print(
                "tba-ext: "
                + (
                    "fused TB update: one forward + backward per micro-batch, log Z from it, no old-log-prob pass"
                    if self.fused
                    else f"three-call TB update ({why})"
                ),
                flush=True,
            )
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

    def _init_dataloader(self):
        # before verl tokenizes the prompts: with no chat template it would drop every row and train on nothing
        check_chat_template(self.tokenizer, OmegaConf.to_container(self.config.data, resolve=True))
        super()._init_dataloader()
        self._plan_epochs()

    def _plan_epochs(self):
        """Make verl's loop run the planned ``trainer.total_training_steps`` whatever the dataset's size: it stops
        after trainer.total_epochs x steps_per_epoch global steps (rows // data.train_batch_size, which it divides
        by), so a step drawing more prompts than the dataset holds counts as an epoch and trainer.total_epochs rises
        to cover the plan. Refuses (``checks.planned_epochs``) a dataset the dataloader cannot serve."""
        rows = len(self.train_dataset)
        self.steps_per_epoch, epochs = planned_epochs(OmegaConf.to_container(self.config, resolve=True), rows)
        trainer = self.config.trainer
        if epochs != trainer.total_epochs:
            print(
                f"tba-ext: trainer.total_epochs {trainer.total_epochs} -> {epochs}, to run trainer.total_training_steps"
                f"={trainer.total_training_steps}: {self.steps_per_epoch} global step(s) an epoch ({rows} training "
                f"prompts, data.train_batch_size={self.config.data.train_batch_size})",
                flush=True,
            )
            with open_dict(self.config):
                trainer.total_epochs = epochs

    def on_init_end(self):
        if self.fused:  # the actor workers' loss becomes the fused TB loss (same actor config)
            ray.get([w.__ray_call__.remote(fused.install_fused_loss) for w in self.actor_rollout_wg.workers])
        placement = self.reference_placement()
        if placement:
            print(f"tba-ext: {placement}", flush=True)
        self._count_trainer_calls()
        super().on_init_end()

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
        hold_point("step_begin", self.global_steps)
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
        dp_size = data_parallel_size(self.actor_rollout_wg, "actor")
        uids = _as_list(tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid"])["uid"])
        members: dict = {}
        for row, (uid, tag) in enumerate(zip(uids, batch.tags)):
            if tag.get("is_padding", False):
                raise RuntimeError(
                    "tba-ext fused update: verl padded the batch; prompts per update must be a "
                    "multiple of the data-parallel size (data.train_batch_size)"
                )
            members.setdefault(uid, []).append(row)
        groups = list(members.values())
        n = int(self.config.actor_rollout_ref.rollout.n)
        if any(len(g) != n for g in groups) or len(groups) % dp_size:
            raise RuntimeError(
                f"tba-ext fused update: {len(groups)} groups of sizes {sorted({len(g) for g in groups})}"
                f" cannot be split whole over {dp_size} ranks in groups of rollout.n={n}"
            )
        seqlen = torch.tensor([tag["seq_len"] for tag in batch.tags], dtype=torch.int64)
        workload = calculate_workload(seqlen).tolist()
        parts = get_seqlen_balanced_partitions(
            [sum(workload[r] for r in g) for g in groups], k_partitions=dp_size, equal_size=True
        )
        order = [row for part in parts for group in sorted(part) for row in groups[group]]
        batch.reorder(order)
        metrics.update(
            log_seqlen_unbalance(
                seqlen_list=seqlen.tolist(),
                prefix=logging_prefix,
                partitions=[[row for group in part for row in groups[group]] for part in parts],
            )
        )
        return batch

    def _compute_old_log_prob(self, batch, metrics: dict):
        if self.fused:  # TB has no ratio against pi_old and takes log Z from the training forward
            return batch
        return super()._compute_old_log_prob(batch, metrics)

    def _fused_advantage(self, batch, metrics: dict):
        """Fused: the driver writes each row's group index (the loss groups by it) and, for verl's data metrics,
        the reward part of the advantage, r - mean_group r (the KL part is known only to the forward: tb/*)."""
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["rm_scores", "uid", "response_mask"]
        )
        response_mask = data["response_mask"]
        padded = data.to_padded_tensor()
        reward = (padded["rm_scores"] * padded["response_mask"]).sum(-1)
        uids = _as_list(padded["uid"])
        groups = tb.group_ids(uids)
        metrics["tb/zero_reward_variance_frac"] = tb.zero_variance_fraction(reward.numpy(), uids)
        metrics["tb/beta"] = self.current_beta()
        centred = (reward - tb.group_mean(reward, groups)).unsqueeze(-1) * padded["response_mask"].to(reward.dtype)
        nested = response_to_nested(centred, response_mask)
        fields = TensorDict(
            {
                wire.GROUP_FIELD: groups,
                wire.ON_POLICY_FIELD: self._on_policy_rows(batch.tags),
                "advantages": nested,
                "returns": nested.clone(),
            },
            batch_size=len(batch),
        )
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)

    def _on_policy_rows(self, tags) -> torch.Tensor:
        """1 for each row generated whole by the weights this step's first update starts from (verl's weight
        version g - 1 at step g), 0 otherwise and at a separate_async step's later local updates: the rows the
        fused loss's weight-sync check compares with the rollout's log-probs."""
        current = self.global_steps - 1 if getattr(self, "local_trigger_step", 0) == 0 else None
        return torch.tensor(
            [int(tag.get("min_global_steps") == tag.get("max_global_steps") == current) for tag in tags],
            dtype=torch.int64,
        )

    def _update_actor(self, batch, metrics: dict):
        batch = self._fused_update_actor(batch, metrics) if self.fused else super()._update_actor(batch, metrics)
        kl = metrics.get("tb/kl")
        if kl is not None and self.parameter_sync_step > 1:  # a separate_async step's k updates (verl averages them)
            metrics[f"tb/local_update_{getattr(self, 'local_trigger_step', 0) + 1}/kl"] = _first(kl)
        self._update_reference()  # at the update rho says, before the next update samples its batch
        return batch

    def _fused_update_actor(self, batch, metrics: dict):
        n = int(self.config.actor_rollout_ref.rollout.n)
        actor = self.config.actor_rollout_ref.actor
        batch.extra_info.update(
            {
                wire.BETA_KEY: self.current_beta(),
                wire.MODE_KEY: actor.policy_loss.loss_mode,
                wire.GROUP_SIZE_KEY: n,
                wire.UPDATE_KEY: f"{self.global_steps}.{getattr(self, 'local_trigger_step', 0)}",
                "force_group_size": n,
            }
        )
        if not actor.use_dynamic_bsz:  # verl's micro-batch is then micro_batch_size_per_gpu groups
            batch.extra_info["micro_batch_size_per_gpu"] = int(actor.ppo_micro_batch_size_per_gpu) // n
        if self.ref_in_update:  # where the reference forward of the marked rows writes, and its micro-batch
            batch.extra_info.update(self._reference_pass_info)
        batch = super()._update_actor(batch, metrics)
        self._keep_reference_from_update(batch)
        for key in fused.BATCH_METRICS:  # the names verl's three-call pipeline reports them under
            if "actor/" + key in metrics:
                metrics[key] = metrics.pop("actor/" + key)
        first_mini_batch = getattr(self, "_last_actor_metrics", {}).get("tb/kl")
        if first_mini_batch is not None and getattr(self, "local_trigger_step", 0) == 0:  # the step's first update
            metrics["tb/kl_step_start"] = _first(first_mini_batch)
        return batch

    def _estimator_metrics(self, batch) -> dict:
        """The three-call path's TB statistics, from the KL-penalised rewards verl's estimator call just used
        (verl's estimator interface returns advantages only)."""
        data = tq.kv_batch_get(
            keys=batch.keys,
            partition_id=batch.partition_id,
            select_fields=["token_level_rewards", "rm_scores", "response_mask", "uid"],
        )
        padded = data.to_padded_tensor()
        real = torch.tensor([not tag.get("is_padding", False) for tag in batch.tags])  # verl's no-op rows
        uids = [uid for uid, keep in zip(_as_list(padded["uid"]), real.tolist()) if keep]
        mask = padded["response_mask"].to(padded["token_level_rewards"].dtype)
        score = (padded["token_level_rewards"] * mask).sum(-1)[real]
        reward = (padded["rm_scores"] * mask).sum(-1)[real]
        beta = float(self.config.algorithm.kl_ctrl.kl_coef)
        _, stats = tb.tb_advantage(
            score, tb.group_ids(uids), beta, pg_units=self.config.algorithm.adv_estimator == "tb_pg"
        )
        return {
            "tb/beta": beta,
            "tb/zero_reward_variance_frac": tb.zero_variance_fraction(reward.numpy(), uids),
            **{f"tb/{name}": value for name, value in stats.items()},
        }

    def _compute_advantage(self, batch, metrics: dict):
        if self.fused:
            return self._fused_advantage(batch, metrics)
        batch = super()._compute_advantage(batch, metrics)
        if self.config.algorithm.adv_estimator in losses.ESTIMATOR_NAMES:
            metrics.update(self._estimator_metrics(batch))
        if "actor/reward_kl_penalty" in metrics:
            metrics["tb/kl"] = metrics["actor/reward_kl_penalty"]
            if getattr(self, "local_trigger_step", 0) == 0:  # the step's first update (of k in separate_async)
                metrics["tb/kl_step_start"] = metrics["actor/reward_kl_penalty"]
        return batch

    # -- replay store and reference persistence next to verl's checkpoint --------------------------------
    def _save_checkpoint(self):
        # written before verl's tracker file, so a crash mid-save leaves the previous checkpoint current
        folder = step_folder(self.config.trainer.default_local_dir, self.global_steps)
        if hasattr(self.replay_buffer, "save_store"):
            os.makedirs(folder, exist_ok=True)
            self.replay_buffer.save_store(os.path.join(folder, REPLAY_FILE))
        self._save_reference(folder)
        super()._save_checkpoint()
        if hasattr(self.replay_buffer, "start_journal"):  # after verl's tracker names this checkpoint: a crash
            # before it resumes from the previous one, whose journal holds every read until now
            self.replay_buffer.start_journal(os.path.join(folder, JOURNAL_FILE))
        # verl's max_actor_ckpt_to_keep deletes the actor/ of the folders it retires; tba-ext's files there go too
        for path in steps.prune_retired(self.config.trainer.default_local_dir, self.global_steps, OWN_FILES):
            print(f"tba-ext: removed {path} (its checkpoint retired by trainer.max_actor_ckpt_to_keep)", flush=True)
        hold_point("checkpoint_saved", self.global_steps)

    def _resumed_folder(self) -> str:
        """The checkpoint folder verl resumed from: ``trainer.resume_from_path`` or the latest under
        ``trainer.default_local_dir``."""
        trainer = self.config.trainer
        if trainer.resume_mode == "resume_path":
            folder = str(trainer.resume_from_path)
        else:
            folder = step_folder(trainer.default_local_dir, self.global_steps)
        return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)

    def _install_lr_schedule(self) -> None:
        """``tba.lr_schedule`` into the actor workers, before verl loads a checkpoint (which then restores its
        position along with the optimizer's)."""
        schedule = dataclasses.asdict(self.tba.lr_schedule)
        per_call = scheduler_updates_per_call(OmegaConf.to_container(self.config, resolve=True))
        ray.get([w.__ray_call__.remote(install_lr_schedule, schedule, per_call) for w in self.actor_rollout_wg.workers])
        print(
            f"tba-ext: learning rate {schedule['name']} {schedule['warmup_updates']} / {schedule['stable_updates']}"
            f" / {schedule['decay_updates']} updates, {schedule['decay_shape']} decay (tba.lr_schedule)",
            flush=True,
        )

    def _load_checkpoint(self):
        # verl calls this once, in its set-up, after the workers exist and whether or not it resumes
        if self.tba.lr_schedule.name is not None:
            self._install_lr_schedule()
        for path in steps.remove_stale_temp_files(self.config.trainer.default_local_dir, OWN_FILES):
            print(f"tba-ext: removed {path}, left by a save that was killed", flush=True)
        super()._load_checkpoint()
        if self.global_steps <= 0:
            return
        folder = self._resumed_folder()
        if hasattr(self.replay_buffer, "load_store"):
            path = os.path.join(folder, REPLAY_FILE)
            if os.path.exists(path):
                journal = os.path.join(folder, JOURNAL_FILE)
                try:
                    self.replay_buffer.load_store(path)
                    if os.path.exists(journal):
                        self.replay_buffer.replay_journal(journal)
                    else:  # a checkpoint written before any read after it
                        self.replay_buffer.start_journal(journal)
                except ValueError as exc:  # refused whole: nothing of it was loaded
                    raise ValueError(f"{exc}. {RESUME_REMEDY}") from exc
            else:
                logger.warning("tba: no replay store at %s; resuming with an empty store", path)
        self._restore_reference(folder)


@register_trainer("tba_sync")
class TBATrainerSync(TBATrainerMixin, PPOTrainerSync):
    base_mode = "sync"


@register_trainer("tba_colocate_async")
class TBATrainerColocateAsync(TBATrainerMixin, PPOTrainerColocateAsync):
    base_mode = "colocate_async"

    def get_llm_client(self):  # verl's resuming client, keeping the searchers' reference log-probs
        return self.llm_server_manager.get_client(client_cls=ReferenceKeepingClient)


TRAINER_NAMES = ("tba_sync", "tba_colocate_async")  # tba_separate_async: tba_ext.adapters.decoupled
