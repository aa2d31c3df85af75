"""What the tba_* trainer modes report beside TB's own metrics: the trainer's worker calls and forward units per
optimizer update, and the asynchrony figures (who waited, how long weight syncs took, how fast data flowed)."""

from __future__ import annotations

import functools
import time

import ray


class TrainerMetricsMixin:
    """Part of ``TBATrainerMixin``: wraps the trainer's worker-group calls to count them, and adds ``tba/*``
    to verl's metrics at every step."""

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
        return {
            "tba/trainer_calls_per_update": calls["calls"] / self.updates_per_step,
            "tba/trainer_forward_units_per_trajectory": calls["units"] / max(trained_rows, 1),
        }

    # -- asynchrony metrics: who waited, how long syncs took, how fast data flowed ---------------------------
    def _searcher_stats(self) -> list[dict | None]:
        """Each searcher server's counters: the hfcpu server's ``stats``; ``{}`` for a live server without them
        (verl's vLLM / SGLang servers, probed with ``get_server_address``); None for one that does not answer."""
        servers = [
            server
            for manager in self._rollout_server_managers()
            for replica in getattr(manager, "rollout_replicas", [])
            for server in replica.servers
        ]
        stats = []
        for server in servers:
            try:
                if hasattr(server, "stats"):
                    stats.append(ray.get(server.stats.remote(), timeout=10))
                else:
                    ray.get(server.get_server_address.remote(), timeout=10)
                    stats.append({})
            except Exception:
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
        if self.use_reference_policy:  # reference updates so far (tba.ref_reset_every; one per update with the EMA)
            metrics["tba/reference_updates"] = self.reference_version
        stats = self._searcher_stats()
        metrics["tba/searchers_alive"] = sum(s is not None for s in stats)
        previous, self._last_searcher_stats = getattr(self, "_last_searcher_stats", None), (now, stats)
        if previous:
            metrics.update(searcher_rates(previous[1], stats, now - previous[0]))
        if "tba/trajectories_generated_per_s" not in metrics and "replay/ingested" in metrics:
            # servers without counters (vLLM): what reached the replay store this step, all searchers together
            metrics["tba/trajectories_generated_per_s"] = metrics["replay/ingested"] / step_s
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)


def searcher_rates(before: list[dict | None], now: list[dict | None], wall: float) -> dict[str, float]:
    """Per-searcher idle ratio, generation rate and rows per generation batch between two reads of the servers'
    counters. A searcher dead at either read, restarted since (its counters began again) or without counters is
    not measured."""
    metrics, idle, made = {}, [], 0
    if len(before) != len(now):
        return metrics
    for i, (cur, old) in enumerate(zip(now, before)):
        if not cur or not old or cur["generated"] < old["generated"]:
            continue
        idle.append(max(0.0, 1.0 - (cur["busy_seconds"] - old["busy_seconds"]) / wall))
        rows, batches = cur["generated"] - old["generated"], cur["batches"] - old["batches"]
        made += rows
        metrics[f"tba/searcher_{i}/idle_ratio"] = idle[-1]
        metrics[f"tba/searcher_{i}/generated_per_s"] = rows / wall
        if batches > 0:  # a CPU generation step costs nearly as much for a few rows as for many
            metrics[f"tba/searcher_{i}/rows_per_batch"] = rows / batches
    if idle:
        metrics["tba/searcher_idle_ratio"] = sum(idle) / len(idle)
        metrics["tba/trajectories_generated_per_s"] = made / wall
    return metrics
