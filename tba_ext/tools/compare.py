"""``tba-ext compare``: TB, TBA′ and Dr. GRPO on identical model, warm start, data and seeds, over staleness.

Staleness s sets how stale every method's data are (``tba_ext.tools.recipe.method_overrides``): s = 0 is
on-policy; s > 0 lets generation run s batches ahead with verl's own staleness cap off for every arm, and TB / TBA′
replay nothing staler than s; ``mix`` trains every method on batches that mix staleness 1, 4, 10 and 32, each group
once. Dr. GRPO is verl's built-in (``adv_estimator=grpo``, ``norm_adv_by_std_in_grpo=False``, no KL), uncorrected
and with verl's rollout corrections (``recipe.METHODS``). The quickstart's recipe (model, warm start, lr, batch,
beta, m) is the one used here. Each run reports held-out greedy accuracy (verl's own validation, before training and
every ``eval_every`` updates), the sampled accuracy of the exported model and the staleness it trained on; the
summary is mean, sd and a 95 % t-interval of the gain over seeds, and arms are paired by seed only where they
trained on equally stale data.
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
                **_staleness_means(rows),
            }
    for by_s in summary.values():  # issue 14's goal: how much of its on-policy gain a method keeps off-policy
        on_policy = by_s.get("0")
        for cell in by_s.values():
            for key in ("gain", "sampled_gain"):
                base = on_policy[f"{key}_mean"] if on_policy else 0.0
                cell[f"{key}_kept"] = cell[f"{key}_mean"] / base if base > 0 else None
    return summary


def _staleness_means(rows: list[dict]) -> dict:
    """``trained_staleness`` over seeds (``staleness_<figure>``): the mean of each figure, the largest max, and
    the dropped groups summed; empty where a run has none recorded."""
    stats = [r.get("trained_staleness") for r in rows]
    if not stats or any(st is None or st["mean"] is None for st in stats):
        return {}
    return {
        "staleness_median": float(np.mean([st["median"] for st in stats])),
        "staleness_p90": float(np.mean([st["p90"] for st in stats])),
        "staleness_max": max(st["max"] for st in stats),
        "dropped_groups": sum(st["dropped_groups"] for st in stats),
    }


def _diversity_means(rows: list[dict]) -> dict:
    """Mean over seeds of each diversity figure after training (``<figure>_after_mean``), where every run has it."""
    after = [r.get("diversity_after") for r in rows]
    if not after or any(d is None for d in after):
        return {}
    return {f"{key}_after_mean": float(np.mean([d[key] for d in after])) for key in after[0]}


# arms whose mean trained-on staleness differs by more than this share of the larger are not paired: their
# difference would measure the staleness as much as the method
STALENESS_TOLERANCE = 0.10
STALENESS_KEY = "training/off_policy/trajectory_staleness"  # verl's, per update: (step - 1) - newest version


def trained_staleness(records: list[dict]) -> dict:
    """How stale the data a run trained on were, in updates, from verl's per-update staleness metrics: the mean,
    median and 90th percentile of the per-update mean, the largest staleness of any trained trajectory, and the
    groups verl's own cap dropped (each refilled with another prompt; 0 with the cap off)."""
    means = report.series(records, f"{STALENESS_KEY}/mean")[1]
    maxes = report.series(records, f"{STALENESS_KEY}/max")[1]
    dropped = sum(v for r in records for k, v in r["data"].items() if k.endswith("/off_policy/evicted_samples"))
    return {
        "mean": _mean(means),
        "median": float(np.median(means)) if means else None,
        "p90": float(np.percentile(means, 90)) if means else None,
        "max": max(maxes) if maxes else None,
        "dropped_groups": int(dropped),
    }


def staleness_mismatch(results: list[dict], method: str, baseline: str, s: str) -> str | None:
    """Why ``method`` and ``baseline`` at level ``s`` must not be paired (None: their mean trained-on staleness,
    averaged over seeds, is within STALENESS_TOLERANCE, or unrecorded)."""

    def mean_of(m: str) -> float | None:
        runs = [r for r in results if run_cell(r)[:2] == (m, s) and r.get("mean_staleness") is not None]
        return _mean([r["mean_staleness"] for r in runs])

    a, b = mean_of(method), mean_of(baseline)
    if a is None or b is None or abs(a - b) <= STALENESS_TOLERANCE * max(abs(a), abs(b)):
        return None
    return (
        f"not paired: {label(method)} trained on data {a:.1f} updates old on average and {label(baseline)} on "
        f"{b:.1f}, more than {100 * STALENESS_TOLERANCE:.0f} % apart"
    )


def _gains(results: list[dict]) -> dict[tuple[str, str, int], float]:
    """Held-out greedy gain (after - before) of each run, by (method, staleness as text, seed)."""
    return {run_cell(r): r["accuracy_after"] - r["accuracy_before"] for r in results}


def _paired_cells(diffs: dict, refused: dict | None = None) -> dict:
    """method -> s -> per-seed differences, summarised: mean, sd, half-width of the 95 % paired t-interval, n seeds,
    whether the interval excludes 0 and the two-sided paired t-test's p-value (``p_holm``, adjusted over a whole
    study, is added by ``holm_adjust``). ``refused``: (method, s) -> why that cell is not paired."""
    from scipy import stats

    out: dict = {}
    for method, by_s in diffs.items():
        for s, values in by_s.items():
            reason = (refused or {}).get((method, s))
            if reason:
                out.setdefault(method, {})[s] = {"refused": reason, "n_seeds": len(values)}
                continue
            mean, sd, half = interval95(values)
            p = float(stats.ttest_1samp(values, 0.0).pvalue) if len(values) > 1 and sd > 0 else None
            out.setdefault(method, {})[s] = {
                "mean": mean,
                "sd": sd,
                "ci95": half,
                "n_seeds": len(values),
                "excludes_zero": len(values) > 1 and (mean - half > 0 or mean + half < 0),
                "p_value": p,
            }
    return out


def holm_adjust(families: list[dict]) -> None:
    """Holm's step-down adjustment over every paired cell of a study (all of ``families``: paired differences and
    staleness costs), written into each cell as ``p_holm``: the study reports about thirty intervals, and one
    excluding 0 by chance is expected among them."""
    from statsmodels.stats.multitest import multipletests

    cells = [c for family in families for by_s in family.values() for c in by_s.values()]
    cells = [c for c in cells if c.get("p_value") is not None]
    if not cells:
        return
    adjusted = multipletests([c["p_value"] for c in cells], method="holm")[1]
    for cell, p in zip(cells, adjusted):
        cell["p_holm"] = float(p)


def paired_differences(results: list[dict], baseline: str = "drgrpo", exclude=()) -> dict:
    """Per method (but ``exclude``) and staleness, the seed-paired difference of held-out greedy gain against
    ``baseline`` (the same seed's model, warm start and data order), summarised by ``_paired_cells``; none between
    arms at unequal staleness (``staleness_mismatch``). Seeds without both runs are left out."""
    gains = _gains(results)
    diffs: dict = {}
    for (method, s, seed), gain in sorted(gains.items(), key=lambda kv: str(kv[0])):
        base = gains.get((baseline, s, seed))
        if method != baseline and method not in exclude and base is not None:
            diffs.setdefault(method, {}).setdefault(s, []).append(gain - base)
    refused = {
        (method, s): staleness_mismatch(results, method, baseline, s) for method, by_s in diffs.items() for s in by_s
    }
    return _paired_cells(diffs, refused)


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
    refused = {}
    for (method, s, seed), c in ordered:
        if method != baseline and (baseline, s, seed) in cost:
            diffs.setdefault(f"{method} - {baseline}", {}).setdefault(s, []).append(c - cost[(baseline, s, seed)])
            refused[(f"{method} - {baseline}", s)] = staleness_mismatch(results, method, baseline, s)
    return _paired_cells(diffs, refused)


def _band_plot(curves: dict, path: str, x: str, mix=STALENESS_MIX) -> None:
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
            f"s = {s}" if s != MIXED else f"mixed s in {{{', '.join(map(str, mix))}}}": [
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
        + method_overrides(method, s, p.recency_prob, p.batch, p.staleness_mix)
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
    staleness = trained_staleness(records)
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
        "mean_staleness": staleness["mean"],
        "trained_staleness": staleness,
        "wall_s": wall,
    }
    print(
        f"   held-out {before['accuracy']:.3f} -> {after['accuracy']:.3f} (sampled "
        f"{before['sampled_accuracy']:.3f} -> {after['sampled_accuracy']:.3f}) in {wall:.0f}s",
        flush=True,
    )
    return result, curve


# what each method is paired against, where the study ran it: the corrected Dr. GRPO a verl user would run on
# stale data, the uncorrected one, and TBA′ with beta = 0 (what the KL term adds)
BASELINES = ("drgrpo_tis", "drgrpo", "tb_pg_nokl")


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


def analyse(payload: dict) -> dict:
    """A compare study's statistics from its runs, by the current rules (a results JSON written before a rule
    changed is shown by them too): the summary, the paired differences against each of BASELINES it ran (none
    between arms at unequal staleness), the staleness costs and the Holm adjustment over all of them."""
    out = {k: v for k, v in payload.items() if not k.startswith("paired_vs_")}
    out["summary"] = summarise(out["runs"])
    ran = {r["method"] for r in out["runs"]}
    for i, baseline in enumerate(BASELINES):
        if baseline in ran:  # each pair once: B - A is not listed again where A - B is
            out[f"paired_vs_{baseline}"] = paired_differences(out["runs"], baseline, exclude=BASELINES[:i])
    out["staleness_cost"] = staleness_cost(out["runs"])
    holm_adjust([out[k] for k in out if k.startswith("paired_vs_")] + [out["staleness_cost"]])
    return out


def write_results(run_dir: str, payload: dict, results_path: str | None) -> dict:
    """Statistics (``analyse``), JSON, band plots (vs updates and vs wall-clock) and report.md of a compare run."""
    payload = analyse(payload)
    mix = payload["recipe"].get("staleness_mix", STALENESS_MIX)
    _band_plot(payload["curves"], f"{run_dir}/accuracy_vs_updates.png", "step", mix)
    _band_plot(payload["curves"], f"{run_dir}/accuracy_vs_time.png", "time", mix)
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
    seeds; each method's seed-paired difference against each of BASELINES the study ran, with its p-value and the
    Holm-adjusted one; the staleness costs; diversity after training beside the warm start's."""
    labels = doc.get("labels", {})

    def shown(method: str) -> str:
        return labels.get(method, label(method))

    rows = [
        "| method | s | n | greedy gain (mean +- sd) | 95 % interval | sampled gain (mean +- sd) "
        "| kept (greedy, sampled) | staleness trained on: mean (median, p90; max) | groups dropped |",
        "|---|---|---|---|---|---|---|---|---|",
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
                f"{_staleness_cell(c)} | {c.get('dropped_groups', '')} |"
            )
    for baseline in BASELINES:
        if doc.get(f"paired_vs_{baseline}"):
            name = labels.get(baseline, label(baseline))
            intro = f"Paired by seed (same warm start and data order), greedy gain minus {name}'s"
            rows += ["", *_paired_rows(doc[f"paired_vs_{baseline}"], intro, lambda m, b=name: f"{shown(m)} - {b}")]
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
        f"{intro}, 95 % paired t-interval (p: paired t-test; Holm: adjusted over every paired row of the study):",
        "",
        "| difference | s | n seeds | mean +- sd | 95 % interval | excludes 0 | p | Holm p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, cells in paired.items():
        for s in sorted(cells, key=level_order):
            c = cells[s]
            if c.get("refused"):
                rows.append(f"| {name(method)} | {s} | {c['n_seeds']} | {c['refused']} | | | | |")
                continue
            rows.append(
                f"| {name(method)} | {s} | {c['n_seeds']} | {c['mean']:+.3f} +- "
                f"{c['sd']:.3f} | {_interval(c['mean'], c['ci95'], c['n_seeds'])} | "
                f"{'yes' if c['excludes_zero'] else 'no'} | {_p(c.get('p_value'))} | {_p(c.get('p_holm'))} |"
            )
    return rows


def _staleness_cell(c: dict) -> str:
    if c.get("mean_staleness") is None:
        return ""
    if "staleness_p90" not in c:  # a run from before the distribution was recorded
        return f"{c['mean_staleness']:.1f}"
    spread = f"{c['staleness_median']:.1f}, {c['staleness_p90']:.1f}; {c['staleness_max']:.0f}"
    return f"{c['mean_staleness']:.1f} ({spread})"


def _p(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


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
