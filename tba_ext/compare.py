"""``tba-ext compare``: TBA vs Dr. GRPO on identical data, model and seeds, at one or more staleness levels.

Staleness level s = verl colocate_async's ``num_warmup_batches``: generation runs s batches ahead of training,
so trained data is up to s weight versions old (s = 0 is on-policy sync). Dr. GRPO is verl's built-in
(`algorithm.adv_estimator=grpo`, `norm_adv_by_std_in_grpo=False`, `loss_agg_mode=seq-mean-token-sum-norm`,
no KL); TBA is tb + the replay buffer. Every run reports greedy held-out accuracy before/after (verl's own
validation). One report: curves vs steps and vs wall-clock, KL to reference, staleness, side by side.
"""

from __future__ import annotations

import os
import shutil
import time

from tba_ext import report
from tba_ext.launch import run_verl
from tba_ext.quickstart import FULL, SHORT, STALL_TIMEOUT_S, prepare, training_overrides


def run_overrides(run_dir: str, p: dict, seed: int, staleness: int, steps: int) -> list[str]:
    mode = [f"trainer.v1.colocate_async.num_warmup_batches={staleness}"] if staleness else []
    return training_overrides(run_dir, p, seed, steps) + mode


ALGORITHMS = {
    # name: (config, trainer mode when staleness = 0, trainer mode when > 0)
    "TBA": ("cpu_tba", "tba_sync", "tba_colocate_async"),
    "Dr. GRPO": ("cpu_drgrpo", "sync", "colocate_async"),
}


def compare(run_dir: str, short: bool = False, seeds=(0,), staleness=(0,)) -> dict:
    p = dict(SHORT if short else FULL)
    steps = 3 if short else 40
    run_dir = os.path.abspath(run_dir)
    if os.path.exists(run_dir):
        shutil.rmtree(run_dir)
    report.ensure_dir(run_dir)
    results, curves = [], {}
    for seed in seeds:
        seed_dir = f"{run_dir}/seed{seed}"
        prepare(seed_dir, p, seed)  # identical model, data and warm start for both algorithms
        for s in staleness:
            for name, (config, sync_mode, async_mode) in ALGORITHMS.items():
                label = f"{name} s={s} seed={seed}"
                print(f"== {label}", flush=True)
                metrics = f"{seed_dir}/{name.replace('. ', '').replace(' ', '_')}_s{s}.jsonl"
                start = time.time()
                run_verl(config, run_overrides(seed_dir, p, seed, s, steps)
                         + [f"trainer.v1.trainer_mode={async_mode if s else sync_mode}"],
                         log_path=metrics.replace(".jsonl", ".log"), metrics_path=metrics,
                         stall_timeout=STALL_TIMEOUT_S)
                records = report.add_elapsed(report.read_metrics(metrics))
                curves[label] = records
                val_key = report.find_key(records, "val-core/", "mean@1")
                val = report.series(records, val_key)[1] if val_key else []
                kl = report.series(records, "actor/reward_kl_penalty")[1] or report.series(records, "tb/kl")[1]
                results.append({
                    "algorithm": name, "staleness": s, "seed": seed,
                    "accuracy_before": val[0] if val else None, "accuracy_after": val[-1] if val else None,
                    "train_reward_last": report.series(records, "critic/score/mean")[1][-1],
                    "wall_s": time.time() - start,
                    "mean_staleness": _mean(report.series(records, "training/off_policy/trajectory_staleness/mean")[1]),
                    "kl_last": kl[-1] if kl else None,
                })
    panels = [("critic/score/mean", "train reward"), ("training/off_policy/trajectory_staleness/mean", "staleness"),
              ("actor/grad_norm", "grad norm")]
    report.plot_runs(curves, panels, f"{run_dir}/curves_vs_step.png", title="TBA vs Dr. GRPO")
    report.plot_runs(curves, panels[:1], f"{run_dir}/reward_vs_time.png", x="time", title="reward vs wall-clock")
    report.write_json(results, f"{run_dir}/results.json")
    table = report.md_table(results, ["algorithm", "staleness", "seed", "accuracy_before", "accuracy_after",
                                      "train_reward_last", "mean_staleness", "kl_last", "wall_s"])
    with open(f"{run_dir}/report.md", "w") as f:
        f.write("# TBA vs Dr. GRPO (CPU)\n\nIdentical model, warm start, data and seeds per row pair; staleness s = "
                "generation batches ahead of training (verl colocate_async).\n\n" + table +
                "\n\n![vs step](curves_vs_step.png)\n\n![vs time](reward_vs_time.png)\n")
    print(table)
    print(f"report: {run_dir}/report.md")
    return {"results": results}


def _mean(values):
    return sum(values) / len(values) if values else None
