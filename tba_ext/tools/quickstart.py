"""``tba-ext quickstart``: the CPU end-to-end run, top to bottom.

1. build a Qwen2-architecture model and a BPE tokenizer offline;
2. write the arithmetic task (train/test parquet);
3. supervised warm start (plain torch loop, see warmstart.py);
4. TBA with verl: the recipe's objective (``recipe.FULL.method``) + the replay buffer in colocate_async mode, with
   verl's greedy validation on the held-out split before and after training;
5. report: metrics.jsonl, report.md, PNG curves, and the trained model in Hugging Face format.
"""

from __future__ import annotations

import os
import shutil
import time

from tba_ext.core.steps import hf_model_dir
from tba_ext.tools import report
from tba_ext.tools.evaluate import greedy_accuracy
from tba_ext.tools.launch import run_verl
from tba_ext.tools.recipe import (
    EVAL_SAMPLES,
    FULL,
    METHODS,
    SHORT,
    STALL_TIMEOUT_S,
    Recipe,
    label,
    method_overrides,
    prepare,
    training_overrides,
)


def rl_overrides(run_dir: str, p: Recipe, seed: int, extra: list[str] | None = None) -> list[str]:
    """The quickstart's run: the recipe's method at its staleness, saved with a Hugging Face copy at the end."""
    steps = p.rl_steps
    return [
        *training_overrides(run_dir, p, seed, steps),
        *method_overrides(p.method, p.staleness, p.recency_prob),
        f"trainer.save_freq={steps}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "actor_rollout_ref.actor.checkpoint.load_contents=[model,optimizer,extra]",
        f"trainer.default_local_dir={run_dir}/checkpoints",
        *(extra or []),
    ]


def quickstart(run_dir: str, short: bool = False, seed: int = 0, overrides: list[str] | None = None) -> dict:
    p = SHORT if short else FULL
    run_dir = os.path.abspath(run_dir)
    if os.path.exists(run_dir):
        shutil.rmtree(run_dir)
    report.ensure_dir(run_dir)
    start = time.time()
    info = prepare(run_dir, p, seed)
    before = greedy_accuracy(f"{run_dir}/model_sft", f"{run_dir}/data/test.parquet", samples=EVAL_SAMPLES, seed=seed)
    print(
        f"      held-out accuracy after warm start: greedy {before['accuracy']:.3f}, sampled "
        f"{before['sampled_accuracy']:.3f}",
        flush=True,
    )

    method = METHODS[p.method]
    print(
        f"[4/5] {method.label} training with verl ({method.config}{', replay' if method.replay else ''}, generation "
        f"{p.staleness} batch ahead): {p.rl_steps} steps",
        flush=True,
    )
    metrics_path = f"{run_dir}/metrics.jsonl"
    t_rl = time.time()
    run_verl(
        method.config,
        rl_overrides(run_dir, p, seed, overrides),
        log_path=f"{run_dir}/verl.log",
        metrics_path=metrics_path,
        stall_timeout=STALL_TIMEOUT_S,
    )
    rl_seconds = time.time() - t_rl

    print("[5/5] evaluating and writing the report", flush=True)
    hf_dir = hf_model_dir(f"{run_dir}/checkpoints", p.rl_steps)
    final_model = f"{run_dir}/model_tba"
    shutil.copytree(hf_dir, final_model)
    after = greedy_accuracy(final_model, f"{run_dir}/data/test.parquet", samples=EVAL_SAMPLES, seed=seed)
    records = report.add_elapsed(report.read_metrics(metrics_path))
    summary = {
        "run_dir": run_dir,
        "short": short,
        "seed": seed,
        "method": p.method,
        **info,
        "accuracy_before": before["accuracy"],
        "accuracy_after": after["accuracy"],
        "test_prompts": after["n"],
        "sampled_before": before["sampled_accuracy"],
        "sampled_after": after["sampled_accuracy"],
        "rl_steps": p.rl_steps,
        "rl_seconds": rl_seconds,
        "total_seconds": time.time() - start,
    }
    val_key = report.find_key(records, "val-core/", "mean@1")
    if val_key:
        _, val = report.series(records, val_key)
        summary["verl_validation_before_after"] = val
    report.write_json(summary, f"{run_dir}/summary.json")
    write_report(run_dir, summary, records)
    print(
        f"\nquickstart done in {summary['total_seconds']:.0f}s: held-out greedy accuracy "
        f"{before['accuracy']:.3f} -> {after['accuracy']:.3f}, sampled {before['sampled_accuracy']:.3f} -> "
        f"{after['sampled_accuracy']:.3f} ({after['n']} prompts)"
    )
    print(f"report: {run_dir}/report.md (curves: {run_dir}/curves.png; trained model: {final_model})")
    return summary


def write_report(run_dir: str, summary: dict, records: list[dict]) -> None:
    objective = (
        ("actor/tb/residual_var", "TB loss (residual variance)")
        if summary["method"] == "tb"
        else ("tb/mean_abs_advantage", "|TB advantage| (TBA′ policy-gradient weight)")
    )
    panels = [
        ("critic/score/mean", "train reward"),
        objective,
        ("tb/kl", "KL to reference"),
        ("replay/staleness_mean", "staleness (versions)"),
        ("replay/fraction", "replay fraction"),
    ]
    report.plot_runs({"tba": records}, panels, f"{run_dir}/curves.png", title="tba-ext quickstart")
    lines = [
        "# tba-ext quickstart",
        "",
        f"Model: Qwen2 architecture, {summary['model']['parameters']:,} parameters, built offline "
        f"(seed {summary['seed']}). Task: integer addition, answer must be the number only; held-out prompts "
        "ask operand pairs never trained on. Sampled accuracy: mean reward of temperature-1 samples.",
        "",
        report.md_table(
            [
                {
                    "stage": "after warm start (SFT)",
                    "held-out greedy accuracy": summary["accuracy_before"],
                    "held-out sampled accuracy": summary["sampled_before"],
                },
                {
                    "stage": f"after {summary['rl_steps']} TBA steps ({label(summary['method'])} objective)",
                    "held-out greedy accuracy": summary["accuracy_after"],
                    "held-out sampled accuracy": summary["sampled_after"],
                },
            ],
            ["stage", "held-out greedy accuracy", "held-out sampled accuracy"],
        ),
        "",
        f"Held-out prompts: {summary['test_prompts']}. verl's own greedy validation (before, after): "
        f"{summary.get('verl_validation_before_after')}.",
        f"Wall time: {summary['total_seconds']:.0f} s in all; verl training run {summary['rl_seconds']:.0f} s "
        "(including about a minute of Ray start-up).",
        "",
        "![curves](curves.png)",
        "",
        "Files: `metrics.jsonl` (verl's metrics, one line per step), `verl.log`, `summary.json`, "
        "`model_tba/` (trained model, Hugging Face format).",
    ]
    with open(f"{run_dir}/report.md", "w") as f:
        f.write("\n".join(lines) + "\n")
