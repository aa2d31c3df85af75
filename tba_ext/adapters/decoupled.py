"""``trainer.v1.trainer_mode=tba_separate_async``: TBA with decoupled searchers on verl's separate_async trainer.

verl's standalone rollout pool generates continuously; weights sync every
``trainer.v1.separate_async.parameter_sync_step`` (k) local updates. What this mode adds to the TBA hooks: the
searcher queue (free-running or paced searchers, ``tba.searcher_queue_prompts``), per-stage weight-sync timing,
and a weight sync that waits for a searcher Ray is restarting instead of ending the run.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import sys
import time

import ray
from verl.trainer.ppo.v1.trainer_base import PPOTrainer, register_trainer
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.utils.debug import marked_timer
from verl.utils.ray_utils import auto_await

from tba_ext.adapters.llm_client import ReferenceKeepingClient
from tba_ext.adapters.trainer import TBATrainerMixin
from tba_ext.core.steps import dataloader_fetch, prompts_to_queue

logger = logging.getLogger(__name__)


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

    def get_llm_client(self):  # verl's resuming client, keeping the searchers' reference log-probs
        return self.standalone_server_manager.get_client(client_cls=ReferenceKeepingClient)

    # the stages of verl's CheckpointEngineManager.update_weights around the transfer itself
    SYNC_PHASES = (
        "abort_replicas",
        "release_kv_cache_replicas",
        "build_process_group",
        "resume_kv_cache_replicas",
        "resume_generation_replicas",
    )

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
            with marked_timer("top_up", self.timing_raw):  # part of the data wait: timing_s/top_up
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
        missing = prompts_to_queue(
            self.tba.searcher_queue_prompts,
            inflight,
            chunk,
            self._submitted_prompts,
            self._consumed_prompts,
            self.tba.searcher_prompts_per_consumed,
        )
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


TRAINER_NAME = "tba_separate_async"
