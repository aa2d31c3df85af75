"""``tba-ext compare``: TB, TBA′ and Dr. GRPO on identical model, warm start, data and seeds, over staleness.

Staleness s bounds every source of off-policy data for every method (``tba_ext.tools.recipe.method_overrides``):
s = 0 is on-policy; s > 0 lets generation run s batches ahead and TB / TBA′ replay nothing staler than s;
``mix`` trains every method on batches that mix staleness 1, 4, 10 and 32, each group once.
Dr. GRPO is verl's built-in (``adv_estimator=grpo``, ``norm_adv_by_std_in_grpo=False``, no KL).
The quickstart's recipe (model, warm start, lr, batch, beta, m) is the one used here. Each run reports held-out
greedy accuracy (verl's own validation, before training and every ``eval_every`` updates) and the sampled
accuracy of the exported model; the summary is mean, sd and a 95 % t-interval of the gain over seeds.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import time

import numpy as np

from tba_ext.core.steps import hf_model_dir
from tba_ext.tools import report
from tba_ext.tools.evaluate import greedy_accuracy
from tba_ext.tools.launch import run_verl
from tba_ext.tools.recipe import (
    COMPARED,
    EVAL_SAMPLES,
    METHODS,
    MIXED,
    STALENESS_MIX,
    STALL_TIMEOUT_S,
    label,
    level_order,
    method_overrides,
    prepare,
    recipe_for,
    training_overrides,
)


def interval95(values: list[float]) -> tuple[float, float, float]:
    """Mean, sd and the half-width of a two-sided 95 % t-interval (0 for a single value)."""
    from scipy import stats

    n = len(values)
    mean = float(np.mean(values))
    if n < 2:
        return mean, 0.0, 0.0
    sd = float(np.std(values, ddof=1))
    return mean, sd, float(stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n))


def summarise(results: list[dict]) -> dict:
    """Per method and staleness: gain (after - before, held-out greedy) mean, sd, 95 % interval, n; and the share
    of the method's on-policy (s = 0) mean gain it keeps (``gain_kept``, ``sampled_gain_kept``; None without a
    positive s = 0 gain)."""
    out: dict = {}
    for r in results:
        out.setdefault(r["method"], {}).setdefault(str(r["staleness"]), []).append(r)
    summary = {}
    for method, by_s in out.items():
        summary[method] = {}
        for s, rows in by_s.items():
            gains = [r["accuracy_after"] - r["accuracy_before"] for r in rows]
            sampled = [r["sampled_after"] - r["sampled_before"] for r in rows]
            mean, sd, half = interval95(gains)
            s_mean, s_sd, s_half = interval95(sampled)
            summary[method][s] = {
                "gain_mean": mean,
                "gain_sd": sd,
                "gain_ci95": half,
                "n_seeds": len(rows),
                "sampled_gain_mean": s_mean,
                "sampled_gain_sd": s_sd,
                "sampled_gain_ci95": s_half,
                "accuracy_after_mean": float(np.mean([r["accuracy_after"] for r in rows])),
                **_diversity_means(rows),
                "wall_s_mean": float(np.mean([r["wall_s"] for r in rows])),
                # how stale the trained samples were (verl's staleness metric, mean over updates and seeds): the
                # methods at one s must train on equally stale data for the comparison to hold
                "mean_staleness": _mean([r["mean_staleness"] for r in rows if r.get("mean_staleness") is not None]),
            }
    for by_s in summary.values():  # issue 14's goal: how much of its on-policy gain a method keeps off-policy
        on_policy = by_s.get("0")
        for cell in by_s.values():
            for key in ("gain", "sampled_gain"):
                base = on_policy[f"{key}_mean"] if on_policy else 0.0
                cell[f"{key}_kept"] = cell[f"{key}_mean"] / base if base > 0 else None
    return summary


def _diversity_means(rows: list[dict]) -> dict:
    """Mean over seeds of each diversity figure after training (``<figure>_after_mean``), where every run has it."""
    after = [r.get("diversity_after") for r in rows]
    if not after or any(d is None for d in after):
        return {}
    return {f"{key}_after_mean": float(np.mean([d[key] for d in after])) for key in after[0]}


def _gains(results: list[dict]) -> dict[tuple[str, str, int], float]:
    """Held-out greedy gain (after - before) of each run, by (method, staleness as text, seed)."""
    return {run_cell(r): r["accuracy_after"] - r["accuracy_before"] for r in results}


def _paired_cells(diffs: dict) -> dict:
    """method -> s -> per-seed differences, summarised: mean, sd, half-width of the 95 % paired t-interval, n seeds
    and whether the interval excludes 0."""
    out: dict = {}
    for method, by_s in diffs.items():
        for s, values in by_s.items():
            mean, sd, half = interval95(values)
            out.setdefault(method, {})[s] = {
                "mean": mean,
                "sd": sd,
                "ci95": half,
                "n_seeds": len(values),
                "excludes_zero": len(values) > 1 and (mean - half > 0 or mean + half < 0),
            }
    return out


def paired_differences(results: list[dict], baseline: str = "drgrpo") -> dict:
    """Per method and staleness, the seed-paired difference of held-out greedy gain against ``baseline`` (the same
    seed's model, warm start and data order), summarised by ``_paired_cells``. Seeds without both runs are left
    out."""
    gains = _gains(results)
    diffs: dict = {}
    for (method, s, seed), gain in sorted(gains.items(), key=lambda kv: str(kv[0])):
        base = gains.get((baseline, s, seed))
        if method != baseline and base is not None:
            diffs.setdefault(method, {}).setdefault(s, []).append(gain - base)
    return _paired_cells(diffs)


def staleness_cost(results: list[dict], baseline: str = "drgrpo") -> dict:
    """What staleness costs each method, paired by seed: its held-out greedy gain at s minus its own on-policy
    (s = 0) gain on the same seed; and, under ``"<method> - <baseline>"``, that cost minus the baseline's on the
    same seed (does a method lose less to stale data than Dr. GRPO does?). Summarised by ``_paired_cells``; empty
    without on-policy runs."""
    gains = _gains(results)
    cost = {
        (method, s, seed): gain - gains[(method, "0", seed)]
        for (method, s, seed), gain in gains.items()
        if s != "0" and (method, "0", seed) in gains
    }
    diffs: dict = {}
    ordered = sorted(cost.items(), key=lambda kv: (method_order(kv[0][0]), str(kv[0])))
    for (method, s, _seed), c in ordered:  # each method's own cost, then each cost against the baseline's
        diffs.setdefault(method, {}).setdefault(s, []).append(c)
    for (method, s, seed), c in ordered:
        if method != baseline and (baseline, s, seed) in cost:
            diffs.setdefault(f"{method} - {baseline}", {}).setdefault(s, []).append(c - cost[(baseline, s, seed)])
    return _paired_cells(diffs)


def _band_plot(curves: dict, path: str, x: str) -> None:
    """Held-out greedy accuracy gain over each seed's warm start vs updates (or wall-clock), mean over seeds with a
    95 % band: one panel per method and one line per staleness, or, for a single staleness (the stress study), one
    panel with one line per method. Gains, not accuracies: the seeds' warm starts differ by more than the methods
    do, and the comparison is paired by seed."""
    import matplotlib.pyplot as plt

    by_method: dict = {}
    for name, runs in curves.items():
        method, _, s = name.rpartition(" s=")
        by_method.setdefault(method, {})[str(s)] = runs
    methods = sorted(by_method, key=method_order)
    levels = sorted({s for by_s in by_method.values() for s in by_s}, key=level_order)
    if len(levels) == 1 or MIXED in levels:  # a panel per staleness, a line per method (the stress study)
        panels = {
            f"s = {s}" if s != MIXED else f"mixed s in {{{', '.join(map(str, STALENESS_MIX))}}}": [
                (label(m), by_method[m][s]) for m in methods if s in by_method[m]
            ]
            for s in levels
        }
    else:
        panels = {
            label(m): [(f"s={s}", runs) for s, runs in sorted(by_method[m].items(), key=lambda kv: level_order(kv[0]))]
            for m in methods
        }
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels) + 1, 3.6), sharey=True, squeeze=False)
    for ax, (title, lines) in zip(axes[0], panels.items()):
        for name, runs in lines:
            _band(ax, name, runs, x)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_title(title)
        ax.set_xlabel("optimizer updates" if x == "step" else "wall-clock (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("held-out greedy accuracy - warm start")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _band(ax, name: str, runs: list[dict], x: str) -> None:
    """One line: the mean over runs of the gain at the evaluations every run made, with its 95 % band."""
    steps = sorted(set.intersection(*[set(r["steps"]) for r in runs]))
    if not steps:
        return
    values = np.array([[dict(zip(r["steps"], r["accuracy"]))[t] - r["accuracy"][0] for t in steps] for r in runs])
    xs = steps if x == "step" else np.mean([[dict(zip(r["steps"], r["time"]))[t] for t in steps] for r in runs], 0)
    stats = [interval95(list(col)) for col in values.T]
    mean = np.array([m for m, _, _ in stats])
    half = np.array([h for _, _, h in stats])
    ax.plot(xs, mean, marker="o", markersize=3, label=f"{name} (n={len(runs)})")
    ax.fill_between(xs, mean - half, mean + half, alpha=0.15)


def compare(
    run_dir: str,
    short: bool = False,
    seeds=(0,),
    staleness=(0,),
    methods=COMPARED,
    steps: int | None = None,
    eval_every: int | None = None,
    results_path: str | None = None,
    task: str | None = None,
) -> dict:
    """Every method at every staleness for every seed, each seed's methods from one prepared folder (identical
    model, data and warm start); the results JSON, report and plots in ``run_dir``."""
    p = recipe_for(task, short)  # its method is the quickstart's objective; compare runs each of ``methods``
    steps = steps or (3 if short else p.rl_steps)
    eval_every = eval_every or steps
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown method(s) {sorted(unknown)}; choose from {list(METHODS)}")
    run_dir = os.path.abspath(run_dir)
    if os.path.exists(run_dir):
        shutil.rmtree(run_dir)
    report.ensure_dir(run_dir)
    results, curves = [], {}
    total, done = len(seeds) * len(staleness) * len(methods), 0
    for seed in seeds:
        seed_dir = f"{run_dir}/seed{seed}"
        prepare(seed_dir, p, seed)  # identical model, data and warm start for every method
        before = greedy_accuracy(
            f"{seed_dir}/model_sft", f"{seed_dir}/data/test.parquet", samples=EVAL_SAMPLES, seed=seed
        )
        for s in staleness:
            for method in methods:
                done += 1
                print(f"== [{done}/{total}] {label(method)} s={s} seed={seed}", flush=True)
                result, curve = train_one(seed_dir, p, seed, method, s, steps, eval_every, before)
                results.append(result)
                curves.setdefault(f"{method} s={s}", []).append(curve)
    payload = {
        "recipe": {k: v for k, v in dataclasses.asdict(p).items() if k != "method"},  # each method ran
        "steps": steps,
        "seeds": list(seeds),
        "staleness": list(staleness),
        "methods": list(methods),
        "labels": {m: label(m) for m in methods},
        "runs": results,
        "curves": curves,
    }
    return write_results(run_dir, payload, results_path)


def train_one(
    seed_dir: str, p, seed: int, method: str, s: int | str, steps: int, eval_every: int, before: dict
) -> tuple[dict, dict]:
    """One verl run of ``method`` at staleness ``s`` from the seed's prepared folder, evaluated on the held-out
    split: its result row and its validation curve (accuracy vs updates and vs seconds)."""
    tag = f"{method}_s{s}"
    metrics, ckpt = f"{seed_dir}/{tag}.jsonl", f"{seed_dir}/{tag}_ckpt"
    start = time.time()
    run_verl(
        METHODS[method].config,
        training_overrides(seed_dir, p, seed, steps, eval_every)
        + method_overrides(method, s, p.recency_prob, p.batch)
        + [
            f"trainer.save_freq={steps}",
            f"trainer.default_local_dir={ckpt}",
            "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
        ],
        log_path=metrics.replace(".jsonl", ".log"),
        metrics_path=metrics,
        stall_timeout=STALL_TIMEOUT_S,
    )
    wall = time.time() - start
    after = greedy_accuracy(hf_model_dir(ckpt, steps), f"{seed_dir}/data/test.parquet", samples=EVAL_SAMPLES, seed=seed)
    shutil.rmtree(ckpt, ignore_errors=True)
    records = report.add_elapsed(report.read_metrics(metrics))
    val_key = report.find_key(records, "val-core/", "mean@1")
    val_steps, val = report.series(records, val_key) if val_key else ([], [])
    times = dict(zip(*report.series(records, "tba/elapsed_s")))
    curve = {
        "steps": [0, *val_steps[1:]],
        "accuracy": val,
        "time": [0.0, *[times.get(x, float("nan")) for x in val_steps[1:]]],
    }
    result = {
        "method": method,
        "staleness": s,
        "seed": seed,
        "accuracy_before": before["accuracy"],
        "accuracy_after": after["accuracy"],
        "sampled_before": before["sampled_accuracy"],
        "sampled_after": after["sampled_accuracy"],
        # pass@k and distinct right answers per prompt of the sampled responses, before and after
        "diversity_before": before.get("diversity"),
        "diversity_after": after.get("diversity"),
        "train_reward_last": report.series(records, "critic/score/mean")[1][-1],
        "grad_norm_median": float(np.median(report.series(records, "actor/grad_norm")[1])),
        "mean_staleness": _mean(report.series(records, "training/off_policy/trajectory_staleness/mean")[1]),
        "wall_s": wall,
    }
    print(
        f"   held-out {before['accuracy']:.3f} -> {after['accuracy']:.3f} (sampled "
        f"{before['sampled_accuracy']:.3f} -> {after['sampled_accuracy']:.3f}) in {wall:.0f}s",
        flush=True,
    )
    return result, curve


def method_order(method: str) -> int:
    """Sort key of methods: METHODS' order (TB, TBA′, Dr. GRPO, ...); results' older label names last."""
    return list(METHODS).index(method) if method in METHODS else len(METHODS)


def run_cell(run: dict) -> tuple[str, str, int]:
    """What a run is one of in a grid: (method, staleness as text: ints and "mix" alike, seed)."""
    return run["method"], str(run["staleness"]), run["seed"]


def merge(paths: list[str], run_dir: str, results_path: str | None = None) -> dict:
    """One grid from compare runs made in parallel (e.g. one process per seed on the same recipe and steps)."""
    parts = [report.read_json(path) for path in paths]
    for key in ("recipe", "steps"):
        if any(part[key] != parts[0][key] for part in parts):
            raise ValueError(f"cannot merge compare results with different {key}: {paths}")
    cells = [run_cell(r) for part in parts for r in part["runs"]]
    twice = sorted({cell for cell in cells if cells.count(cell) > 1})
    if twice:  # a run counted twice would narrow every interval it enters
        method, s, seed = twice[0]
        raise ValueError(f"cannot merge: {label(method)} at s = {s}, seed {seed} is in more than one of {paths}")
    methods = sorted({m for part in parts for m in part["methods"]}, key=method_order)
    curves: dict = {}
    for part in parts:
        for name, runs in part["curves"].items():
            curves.setdefault(name, []).extend(runs)
    payload = {
        **parts[0],
        "seeds": sorted({s for part in parts for s in part["seeds"]}),
        "staleness": sorted({s for part in parts for s in part["staleness"]}, key=level_order),
        # a part may add a method to seeds already run (TB added to a TBA′ and Dr. GRPO grid)
        "methods": methods,
        # tables list methods in the order of their runs
        "runs": sorted((r for part in parts for r in part["runs"]), key=lambda r: method_order(r["method"])),
        "labels": {m: label(m) for m in methods},
        "curves": curves,
    }
    report.ensure_dir(run_dir)
    return write_results(run_dir, payload, results_path)


def write_results(run_dir: str, payload: dict, results_path: str | None) -> dict:
    """Summary, paired differences, JSON, band plots (vs updates and vs wall-clock) and report.md of a compare run."""
    payload["summary"] = summarise(payload["runs"])
    payload["paired_vs_drgrpo"] = paired_differences(payload["runs"])
    payload["staleness_cost"] = staleness_cost(payload["runs"])
    if any(r["method"] == "tb_pg_nokl" for r in payload["runs"]):  # the stress study: what the KL term adds
        payload["paired_vs_tb_pg_nokl"] = paired_differences(payload["runs"], baseline="tb_pg_nokl")
    _band_plot(payload["curves"], f"{run_dir}/accuracy_vs_updates.png", "step")
    _band_plot(payload["curves"], f"{run_dir}/accuracy_vs_time.png", "time")
    report.write_json(payload, f"{run_dir}/compare.json")
    if results_path:
        report.write_json(payload, results_path)
    tables = compare_tables(payload)
    task = payload["recipe"].get("task", "")
    with open(f"{run_dir}/report.md", "w") as f:
        f.write(
            f"# {', '.join(label(m) for m in payload['methods'])} on {task} (CPU)\n\nIdentical model, warm start, "
            "data and seeds; staleness s bounds all off-policy data (s = 0: on-policy). Gain = held-out accuracy "
            "after - before: greedy, and sampled (mean reward of "
            f"{EVAL_SAMPLES} temperature-1 samples per prompt).\n\n"
            + tables
            + "\n![vs updates](accuracy_vs_updates.png)\n\n![vs time](accuracy_vs_time.png)\n"
        )
    print(tables)
    print(f"report: {run_dir}/report.md")
    return payload


def compare_tables(doc: dict) -> str:
    """A compare study's tables in markdown (its report.md and the docs): per method and staleness the gain over
    seeds; each method's seed-paired difference against Dr. GRPO (and against TBA′ with beta = 0 where the study ran
    it); diversity after training beside the warm start's."""
    labels = doc.get("labels", {})
    rows = [
        "| method | s | n | greedy gain (mean +- sd) | 95 % interval | sampled gain (mean +- sd) "
        "| kept (greedy, sampled) | staleness trained on |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, cells in doc["summary"].items():
        for s in sorted(cells, key=level_order):
            c = cells[s]
            interval = _interval(c["gain_mean"], c["gain_ci95"], c["n_seeds"])
            kept = (
                f"{100 * c['gain_kept']:.0f} %, {100 * c['sampled_gain_kept']:.0f} %"
                if s != "0" and c.get("gain_kept") is not None and c.get("sampled_gain_kept") is not None
                else ""
            )
            name = labels.get(method, method)
            rows.append(
                f"| {name} | {s} | {c['n_seeds']} | {c['gain_mean']:+.3f} +- {c['gain_sd']:.3f} | "
                f"{interval} | {c['sampled_gain_mean']:+.3f} +- {c['sampled_gain_sd']:.3f} | {kept} | "
                + ("" if c.get("mean_staleness") is None else f"{c['mean_staleness']:.1f}")
                + " |"
            )
    for key, baseline in (("paired_vs_drgrpo", "Dr. GRPO"), ("paired_vs_tb_pg_nokl", "TBA′ β=0")):
        if doc.get(key):
            intro = f"Paired by seed (same warm start and data order), greedy gain minus {baseline}'s"
            rows += ["", *_paired_rows(doc[key], intro, lambda m, b=baseline: f"{labels.get(m, m)} - {b}")]
    if doc.get("staleness_cost"):
        intro = (
            "Staleness cost, paired by seed: a method's greedy gain at s minus its own on-policy (s = 0) gain, and "
            "that cost minus Dr. GRPO's (above 0: the method loses less to stale data)"
        )
        rows += ["", *_paired_rows(doc["staleness_cost"], intro, lambda m: _cost_name(m, labels))]
    return "\n".join(rows) + "\n" + _diversity_table(doc)


def _cost_name(key: str, labels: dict) -> str:
    """A staleness_cost row's name: "TBA′ at s - at s = 0", or "TBA′'s cost - Dr. GRPO's" for a paired cost."""
    method, _, baseline = key.partition(" - ")
    if baseline:
        return f"{labels.get(method, label(method))}'s cost - {labels.get(baseline, label(baseline))}'s"
    return f"{labels.get(method, label(method))} at s - at s = 0"


def _paired_rows(paired: dict, intro: str, name) -> list[str]:
    """A table of seed-paired differences (``_paired_cells``), each row named by ``name(key)``."""
    rows = [
        f"{intro}, 95 % paired t-interval:",
        "",
        "| difference | s | n seeds | mean +- sd | 95 % interval | excludes 0 |",
        "|---|---|---|---|---|---|",
    ]
    for method, cells in paired.items():
        for s in sorted(cells, key=level_order):
            c = cells[s]
            rows.append(
                f"| {name(method)} | {s} | {c['n_seeds']} | {c['mean']:+.3f} +- "
                f"{c['sd']:.3f} | {_interval(c['mean'], c['ci95'], c['n_seeds'])} | "
                f"{'yes' if c['excludes_zero'] else 'no'} |"
            )
    return rows


def _diversity_table(doc: dict) -> str:
    """pass@k of the 16 temperature-1 samples per held-out prompt and distinct right answers per prompt: the warm
    start's (every method of a seed starts from it) and each method's after training, means over seeds."""
    runs = [r for r in doc["runs"] if r.get("diversity_after")]
    if not runs:
        return ""
    keys = list(runs[0]["diversity_after"])
    head = " | ".join(k.replace("distinct_correct_per_prompt", "distinct right / prompt") for k in keys)
    rows = [
        "",
        "Diversity on the held-out split, means over seeds:",
        "",
        f"| run | s | {head} |",
        "|---|---|" + "---|" * len(keys),
    ]
    starts = {r["seed"]: r["diversity_before"] for r in runs}
    rows.append(
        "| warm start | | " + " | ".join(f"{sum(d[k] for d in starts.values()) / len(starts):.3f}" for k in keys) + " |"
    )
    labels = doc.get("labels", {})
    for method, cells in doc["summary"].items():
        for s in sorted(cells, key=level_order):
            c = cells[s]
            values = " | ".join(f"{c[k + '_after_mean']:.3f}" if k + "_after_mean" in c else "-" for k in keys)
            rows.append(f"| {labels.get(method, method)} | {s} | {values} |")
    return "\n".join(rows) + "\n"


def _interval(mean: float, half: float, n: int) -> str:
    return f"[{mean - half:+.3f}, {mean + half:+.3f}]" if n > 1 else "- (one seed)"


def _mean(values):
    return sum(values) / len(values) if values else None
