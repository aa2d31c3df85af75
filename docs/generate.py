"""Writes the generated parts of the docs from the code and the results JSONs.

    python docs/generate.py          # rewrite them
    python docs/generate.py --check  # exit 1 naming each page that is stale (tests/test_docs.py runs this)

A page marks a generated block with ``<!-- generated: NAME -->`` ... ``<!-- end generated -->``; ``results.md`` is
generated whole from ``benchmarks/results/*.json`` (the archive folder is not rendered).

Plots: a page embeds ``img/X.png``, and ``docs/img/`` (tracked) mirrors ``benchmarks/results/`` (git-ignored): the
rewrite copies ``benchmarks/results/X.png`` over ``docs/img/X.png`` for every image a page embeds, where the benchmark
left one. ``--check`` does not compare PNGs (they are not reproducible bytewise); it fails on an embedded image that
is in neither place, and on one a benchmark left that is not yet copied.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import io
import json
import os
import re
import sys
import tokenize
from pathlib import Path

from tba_ext.tools.compare import analyse, compare_tables  # one renderer for compare's report.md and the docs

ROOT = Path(__file__).resolve().parents[1]

DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"
IMG = DOCS / "img"  # mirrors the plots of RESULTS that the pages embed
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")  # ![alt](path)
BLOCK = re.compile(r"(<!-- generated: (\S+) -->\n)(.*?)(<!-- end generated -->)", re.S)


# ---- settings tables, from the dataclasses and the comments beside their fields


def field_comments(cls) -> dict[str, str]:
    """Each field's comment: the lines right above it and the one on its line, joined."""
    lines, _ = inspect.getsourcelines(cls)
    source = "".join(lines)
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, alone on its line)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            alone = not tok.line[: tok.start[1]].strip()
            comments[tok.start[0]] = (tok.string.lstrip("#").strip(), alone)
    tree = ast.parse(source)  # a module-level class: its source is not indented
    out = {}
    for node in tree.body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above, line = [], node.lineno - 1
            while line in comments and comments[line][1]:
                above.insert(0, comments[line][0])
                line -= 1
            inline = comments.get(node.lineno)
            parts = above + ([inline[0]] if inline and not inline[1] else [])
            out[node.target.id] = " ".join(parts)
    return out


def yaml_value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def settings_rows(cls, prefix: str) -> list[str]:
    comments = field_comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(default):
            rows += settings_rows(type(default), f"{prefix}{f.name}.")
            continue
        doc = comments.get(f.name, "").replace("|", "\\|")
        rows.append(f"| `{prefix}{f.name}` | `{yaml_value(default)}` | {doc} |")
    return rows


def settings_table(cls, prefix: str) -> str:
    return "\n".join(["| key | default | what |", "|---|---|---|", *settings_rows(cls, prefix)]) + "\n"


# ---- configs and CLI


def configs_table() -> str:
    from tba_ext.tools.config import CONFIG_DIR, GPU_CONFIG_DIR, list_configs

    rows = ["| config | where | what |", "|---|---|---|"]
    for name in list_configs():
        gpu = os.path.exists(os.path.join(GPU_CONFIG_DIR, f"{name}.yaml"))
        path = os.path.join(GPU_CONFIG_DIR if gpu else CONFIG_DIR, f"{name}.yaml")
        with open(path) as f:
            head = []
            for line in f:  # the header comment's first paragraph, up to an indented list or a blank line
                text = line[1:] if line.startswith("#") else None
                if text is None or not text.strip() or text.startswith("   ") or len(head) == 3:
                    break
                head.append(text.strip())
        rows.append(f"| `{name}` | {'GPU' if gpu else 'CPU'} | {' '.join(head).replace('|', '/')} |")
    return "\n".join(rows) + "\n"


def cli_reference() -> str:
    os.environ["COLUMNS"] = "110"  # argparse wraps to the terminal: fixed, so the page does not depend on it
    from tba_ext.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parts = []
    for name, p in sub.choices.items():
        parts.append(f"### `tba-ext {name}`\n\n```text\n{p.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


# ---- results


COMPARE_CAPTION = (
    "Held-out greedy accuracy minus the warm start's against optimizer updates (one panel per method and a line per "
    "staleness s; for the stress study one panel per staleness, mixed included, and a line per method): mean over "
    "seeds with a 95 % band. In a grid, a method that learns from stale data keeps its s > 0 lines near its s = 0 line."
)


def figure(source: str, caption: str) -> str:
    """``benchmarks/results/<source>`` embedded as ``img/<source>`` with a one-line caption (its first sentence is
    the image's alt text), or nothing where neither the copy in docs/img nor the benchmark's own file exists."""
    if not (IMG / source).exists() and not (RESULTS / source).exists():
        return ""
    alt = caption.split(". ")[0].split(" (")[0].rstrip(".").replace("[", "").replace("]", "")
    return f"\n![{alt}](img/{source})\n\n*{caption}*\n"


def plots_of(stem: str) -> str:
    """The plots a results section shows (its renderer may place more of its own)."""
    stages = (
        "Trainer seconds per optimizer update by stage (medians over repeats), one bar per configuration. Compare the "
        "bar lengths: the fused TB and TBA′ updates skip the old log-prob pass that Dr. GRPO pays for."
    )
    spread_plot = (
        "Held-out greedy (left) and sampled (right) accuracy after the warm start and after training, one line per "
        "fresh run. Every line rises on both panels: the gain is larger than the spread of where runs end."
    )
    captions = {
        "trainer_passes": stages,
        "trainer_passes_trainer_ref": stages,
        "trainer_passes_searcher_ref": stages,
        "quickstart_spread": spread_plot,
        "soak": (
            "Global step reached (top) and the run's memory (bottom) against wall-clock, faults as vertical lines "
            "coloured by kind. After each fault the line picks up from the last checkpoint and goes on to the "
            "planned step; the bottom panel shows whether memory grows over the run."
        ),
    }
    if stem.startswith("compare_"):
        return figure(f"{stem}/accuracy_vs_updates.png", COMPARE_CAPTION) + figure(
            f"{stem}/accuracy_vs_time.png", "The same gains against wall-clock seconds."
        )
    return figure(f"{stem}.png", captions[stem]) if stem in captions else ""


@functools.cache
def load_results() -> dict[str, dict]:  # read once: the results page and the compare block both use it
    return {p.name: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}


def spread(s: dict, digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def provenance_line(doc: dict) -> str:
    p = doc.get("provenance")
    if not p:
        return "*No provenance recorded.*"
    where = f"{p.get('cores')} cores, {p.get('machine')}"
    versions = ", ".join(f"{k} {p[k]}" for k in ("tba_ext", "verl", "torch", "python") if p.get(k))
    load = p.get("load_avg_1m_at_start")
    text = f"commit `{str(p.get('commit'))[:10]}`{' (uncommitted changes)' if p.get('dirty') else ''}, {p.get('date')}"
    text += f"; {versions}; {where}" + (f"; load {load:.2f} at start" if load is not None else "")
    if p.get("source"):
        text += f". {p['source']}"
    return f"*Made at {text}.*"


def goal_line(doc: dict, keys: dict[str, str]) -> str:
    """'key value (goal op g: met)' for each headline key with a goal; a dict of values gives one per entry."""
    goals = doc.get("goals", {})
    ops = {"<=": lambda v, g: v <= g, ">=": lambda v, g: v >= g, "<": lambda v, g: v < g}
    parts = []
    for key, op in keys.items():
        if key not in doc or goals.get(key) is None:
            continue
        values = doc[key] if isinstance(doc[key], dict) else {"": doc[key]}
        for name, value in values.items():
            if value is None:
                continue
            label = f"`{key}`" + (f" ({name})" if name else "")
            met = "met" if ops[op](value, goals[key]) else "**not met**"
            parts.append(f"{label} {value:.3g} (goal {op} {goals[key]}: {met})")
    return "; ".join(parts)


def trainer_passes(doc: dict) -> str:
    rows = [
        "| configuration | trainer s / update | worker calls / update | forward units / trajectory "
        "| generation s / step | response tokens |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in doc["configurations"].items():
        gen = spread(c["gen_s"]) if "gen_s" in c else ""
        length = f"{c['response_length']:.1f}" if "response_length" in c else ""
        rows.append(
            f"| {name} | {spread(c['trainer_s'])} | {c['trainer_calls_per_update']:g} | "
            f"{c['forward_units_per_trajectory']:g} | {gen} | {length} |"
        )
    keys = {"worker_calls_per_update": "<=", "trainer_s_vs_three_call": "<=", "trainer_s_vs_drgrpo": "<="}
    placement = ", ".join(
        f"{name} {value:.3g}"
        for name, value in doc.get("trainer_s_reference_in_update_vs_own_call", {}).items()
        if value is not None
    )
    if placement:
        placement = f"\n\nTrainer s, the reference forward inside the update's call vs a call of its own: {placement}."
    versus_tb = doc.get("tb_pg_vs_tb") or {}
    if versus_tb.get("trainer_s"):
        placement += (
            f"\n\nTBA′ against TB: {versus_tb['trainer_s']:.3g} of its trainer s per update, "
            f"{versus_tb['trainer_s_per_response_token']:.3g} per response token."
        )
    return "\n".join(rows) + "\n\n" + goal_line(doc, keys) + placement + "\n"


def async_speedup(doc: dict) -> str:
    out = []
    for regime, r in doc.get("regimes", {}).items():
        out.append(
            f"**{regime}** ({r['task']}, max_response_length {r['max_response_length']}"
            f"{' with ignore_eos (every response runs to it)' if r.get('ignore_eos') else ''}, "
            f"{r['updates_measured']} measured updates of {r['prompts_per_update']} prompts, k = "
            f"{r['updates_per_sync']}, {r['repeats']} repeats, `{r['model']}` model): generation "
            f"{r['generation_share']:.2f} of sync's wall; ideal overlap {r['ideal_overlap']:.2f}x; CPU-bound ceiling "
            f"{r['cpu_bound_ceiling']:.2f}x on {r['cores']} cores (the searchers share the trainer's cores, so at most "
            f"{r['cpu_bound_ceiling'] / r['ideal_overlap']:.2f} of the ideal overlap is reachable here). "
            f"{provenance_line(r)}\n"
        )
        out.append(
            "| run | wall s | vs sync (per repeat) | fraction of ideal | trainer idle | searcher idle "
            "| weight sync share | cores busy | CPU s / update | response tokens |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        for name, c in r["configurations"].items():
            per_repeat = ", ".join(f"{x:.2f}" for x in c.get("speedup_vs_sync_per_repeat", []))
            speed = f"{c['speedup_vs_sync']:.2f}x ({per_repeat})" if "speedup_vs_sync" in c else "1.00x"
            frac = f"{c['fraction_of_ideal_overlap']:.2f}" if "fraction_of_ideal_overlap" in c else ""
            idle = spread(c["searcher_idle_ratio"]) if "searcher_idle_ratio" in c else ""
            length = f"{c['response_length_mean']['median']:.1f}" if "response_length_mean" in c else ""
            out.append(
                f"| {name} | {spread(c['wall_s'], 1)} | {speed} | {frac} | {spread(c['trainer_idle_ratio'])} | {idle} "
                f"| {c['weight_sync_share']['median']:.3f} | {c['cores_busy']['median']:.2f} | "
                f"{c['cpu_s_per_update']['median']:.2f} | {length} |"
            )
        out.append(
            f"\nGoals: speedup_vs_sync >= {r['goals']['speedup_vs_sync']}, fraction_of_ideal_overlap >= "
            f"{r['goals']['fraction_of_ideal_overlap']}"
            + (f", generation share >= {r['goals']['generation_share']}" if r["goals"].get("generation_share") else "")
            + ".\n"
        )
        plots = figure(
            f"async_speedup_{regime}.png",
            f"{regime.replace('_', '-')} regime: each configuration's measured updates on one time axis, the trainer's "
            "stages and when the searchers are busy. The decoupled rows finish the same work sooner where the "
            "trainer waits less for data (orange).",
        ) + figure(
            f"async_speedup_{regime}_cpu.png",
            f"{regime.replace('_', '-')} regime: CPU seconds per trained update by part of the run (medians of "
            "repeats), each bar labelled with the share of the wall the trainer workers waited for a core. Taller "
            "bars spend more CPU on the same trained work.",
        )
        if plots:
            out.append(plots.lstrip("\n"))
    return "\n".join(out)


def replay(doc: dict) -> str:
    keys = {"sample_ms_1e6": "<", "bytes_ratio": "<="}
    out = goal_line(doc, keys) + f"; insert at 1e6: {doc['insert_per_s_1e6']:,.0f} trajectories/s.\n"
    if "ledger" in doc:  # the trajectory ledger's books after a long run
        led = doc["ledger"]
        out += (
            f"\nLedger after {led['ids']:,d} trajectories read ({led['uses_per_id']} uses each): its books "
            f"{led['counts_ms_median']:.4f} ms per step (goal < 1), {led['saved_bytes'] / 2**20:.0f} MB in each "
            f"checkpoint ({led['saved_bytes_per_id']:.1f} B per trajectory read), one trajectory's history "
            f"{led['updates_of_s']:.2f} s.\n"
        )
    return out


def quickstart_spread(doc: dict) -> str:
    low, high = doc["gain_mean"] - doc["gain_ci95"], doc["gain_mean"] + doc["gain_ci95"]
    slow, shigh = (
        doc["sampled_gain_mean"] - doc["sampled_gain_ci95"],
        doc["sampled_gain_mean"] + doc["sampled_gain_ci95"],
    )
    rows = ["| seed | repeat | greedy before -> after | sampled before -> after | total s |", "|---|---|---|---|---|"]
    for r in doc["runs"]:
        rows.append(
            f"| {r['seed']} | {r['repeat'] + 1} | {r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f} | "
            f"{r['sampled_before']:.3f} -> {r['sampled_after']:.3f} | {r['total_seconds']:.0f} |"
        )
    after = ""
    if "accuracy_after" in doc:  # what the README's command prints, over fresh runs
        starts = "; ".join(f"{g:.3f} greedy, {s:.3f} sampled" for g, s in doc["warm_start_accuracies"])
        after = (
            f"After training, median (min-max) over {doc['n_runs']} runs: greedy {spread(doc['accuracy_after'], 3)}, "
            f"sampled {spread(doc['sampled_after'], 3)}; warm start: {starts}.\n\n"
        )
    return after + (
        f"Greedy gain {doc['gain_mean']:+.3f} +- {doc['gain_sd']:.3f} (mean +- sd, 95 % interval [{low:+.3f}, "
        f"{high:+.3f}]), sampled gain {doc['sampled_gain_mean']:+.3f} +- {doc['sampled_gain_sd']:.3f} ([{slow:+.3f}, "
        f"{shigh:+.3f}]); {doc['runs_improved']} of {doc['n_runs']} runs improved (greedy), "
        f"{doc['sampled_runs_improved']} (sampled).\n\n" + "\n".join(rows) + "\n"
    )


def e2e_margins(doc: dict) -> str:
    rows = ["| check | runs | worst value / bound |", "|---|---|---|"]
    for name, c in doc["checks"].items():
        rows.append(f"| {name.replace('|', '/')} | {len(c['values'])} | {c['worst_ratio']:.3g} |")
    return doc.get("how", "") + "\n\n" + "\n".join(rows) + "\n"


def cpu_overlap(doc: dict) -> str:
    cases = ", ".join(f"{n} at once {c['throughput_vs_one']:.2f}x" for n, c in doc["cases"].items())
    return f"Throughput of single-threaded workers against one alone on {doc['cpus']} cores: {cases}.\n"


def gpu_smoke(doc: dict) -> str:
    rows = [
        f"| {mode} | {u['loss_rel_diff']:.1e} | {u['grad_rel_diff']:.1e} | {u['ref_log_prob_max_abs_diff']:.1e} | "
        f"{'yes' if u['ok'] else 'NO'} |"
        for mode, u in doc["updates"].items()
    ]
    head = "| update | loss rel. diff | gradient rel. diff | reference max abs diff | within tolerance |"
    return f"Tolerances {doc['tolerance']}.\n\n" + "\n".join([head, "|---|---|---|---|---|", *rows]) + "\n"


def trainer_passes_gpu(doc: dict) -> str:
    times = {name: p["s_per_update"] for name, p in doc["paths"].items()}
    paths = " ".join(f"{n} {t['median']:.3f} s/update ({t['min']:.3f}-{t['max']:.3f});" for n, t in times.items())
    return f"{paths} fused / three-call {doc['trainer_s_fused_vs_three_call']:.2f} on {doc['provenance']['device']}.\n"


# file name (without .json) -> (title, what made it, renderer)
def soak(doc: dict) -> str:
    """The soak's figures: faults, steps, the ledger's books, memory."""
    books = doc["ledger_final"]
    evicted = ", ".join(f"{k.split('/')[1]} {v}" for k, v in books.items() if k.startswith("evicted/") and v)
    dropped = ", ".join(f"{k.split('/')[1]} {v}" for k, v in books.items() if k.startswith("dropped/") and v)
    kinds: dict[str, int] = {}
    for fault in doc["faults"]:
        kinds[fault["kind"]] = kinds.get(fault["kind"], 0) + 1
    memory = doc.get("memory") or {}
    rows = [
        "| figure | value |",
        "|---|---|",
        f"| updates completed / planned | {doc['updates_completed']} / {doc['planned_updates']} |",
        f"| faults survived | {doc['faults_survived']} of {len(doc['faults'])}: "
        + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))
        + " |",
        f"| duplicate / skipped optimizer steps | {doc['duplicate_steps']} / {doc['skipped_steps']} |",
        f"| steps redone after crashes (from the last checkpoint) | {doc['steps_redone_after_crashes']} |",
        f"| trajectories read / stored at the end / trained on | {books.get('ids')} / {books.get('stored')} / "
        f"{books.get('trained_ids')} ({books.get('uses')} uses) |",
        f"| evicted (rule) / dropped (reason) | {evicted or 'none'} / {dropped or 'none'} |",
        f"| unaccounted; books balanced at every step | {books.get('unaccounted')}; "
        f"{'yes' if doc['ledger_balanced_every_step'] else 'no'} |",
        f"| lost to crashes (read after the checkpoint resumed from), per crash | "
        f"{', '.join(str(round(x)) for x in doc['trajectories_lost_to_crashes'])} |",
        f"| store size, max (trajectories, MB) | {doc['store_trajectories_max']}, {doc['store_mb_max']:.2f} |",
    ]
    for key, what in (
        ("session_rss_mb", "all the run's processes"),
        ("largest_worker_rss_mb", "largest trainer worker"),
    ):
        if key in memory:
            m = memory[key]
            rows.append(
                f"| RSS of {what}: median over the first / last third of the run, max (MB) | "
                f"{m['first_third_median']:.0f} / {m['last_third_median']:.0f}, {m['max']:.0f} |"
            )
    by_kind: dict[str, list[float]] = {}
    for fault in doc["faults"]:
        if fault.get("wall_s_to_next_new_step") is not None:
            by_kind.setdefault(fault["kind"], []).append(fault["wall_s_to_next_new_step"])
    if by_kind:
        rows.append(
            "| wall time from a fault to the next new step, by kind (s) | "
            + ", ".join(f"{k} {min(v):.0f}-{max(v):.0f}" for k, v in sorted(by_kind.items()))
            + " |"
        )
    return "\n".join(rows) + f"\n\nBound on loss: {doc['loss_bound']}.\n"


RENDERERS = {
    "trainer_passes_trainer_ref": (
        "Trainer cost per update with the trainer's reference forward (a vLLM searcher's case): tb, tb_pg, Dr. GRPO",
        "benchmarks/trainer_passes.py --configs tb_fused tb_pg_fused drgrpo --out "
        "benchmarks/results/trainer_passes_trainer_ref.json",
        trainer_passes,
    ),
    "trainer_passes": (
        "Trainer cost per update, tb and tb_pg with the searcher's reference log-probs",
        "benchmarks/trainer_passes.py --configs tb_fused_searcher_ref tb_pg_fused_searcher_ref tb_three_call "
        "tb_pg_three_call drgrpo",
        trainer_passes,
    ),
    "trainer_passes_searcher_ref": (
        "Trainer cost per update, tb: the searcher's reference log-probs against the trainer's reference forward "
        "(inside the update's call, and in a call of its own)",
        "benchmarks/trainer_passes.py --configs tb_fused_searcher_ref tb_fused tb_fused_ref_call tb_fused_ema_ref "
        "tb_three_call drgrpo",
        trainer_passes,
    ),
    "async_speedup": (
        "Decoupled vs sync",
        "benchmarks/async_speedup.py --regime short|generation_bound",
        async_speedup,
    ),
    "replay": ("Replay store speed and footprint", "benchmarks/replay.py", replay),
    "quickstart_spread": (
        "Quickstart: fresh runs of the README's command",
        "benchmarks/quickstart_spread.py",
        quickstart_spread,
    ),
    "compare_primary": ("Primary: TBA′ against Dr. GRPO token-IS at s = 8", "benchmarks/evidence.py", compare_tables),
    "compare_dose": ("Dose-response over staleness on arith20", "benchmarks/evidence.py", compare_tables),
    "compare_arms_s8": ("Every arm at s = 8 on arith20", "benchmarks/evidence.py", compare_tables),
    "compare_countdown_s8": ("Countdown at s = 8", "benchmarks/evidence.py", compare_tables),
    "compare_arith20": ("Paired grid on arith20", "benchmarks/evidence.py", compare_tables),
    "compare_countdown": ("Paired grid on countdown", "benchmarks/evidence.py", compare_tables),
    "compare_stress": ("Staleness stress: s = 32, with and without KL", "benchmarks/evidence.py", compare_tables),
    "compare_stress_long": ("Staleness stress: 120 updates at s = 32", "benchmarks/evidence.py", compare_tables),
    "e2e_margins": ("How close the e2e checks come to their bounds", "benchmarks/e2e_margins.py", e2e_margins),
    "cpu_overlap": ("What two cores give", "benchmarks/cpu_overlap.py", cpu_overlap),
    "gpu_smoke": ("One fused TB and TBA′ update on a GPU", "benchmarks/gpu_smoke.py", gpu_smoke),
    "soak": ("Soak: a decoupled run through faults", "benchmarks/soak.py", soak),
    "trainer_passes_gpu": (
        "Fused update against the three-call path on a GPU",
        "benchmarks/trainer_passes_gpu.py",
        trainer_passes_gpu,
    ),
}


def results_page() -> str:
    docs = load_results()
    unknown = sorted(set(n[:-5] for n in docs) - set(RENDERERS))
    if unknown:
        raise SystemExit(
            f"docs/generate.py has no renderer for benchmarks/results/{unknown[0]}.json: add one to "
            "RENDERERS, or move the file to benchmarks/results/archive/"
        )
    parts = [
        "# Results\n",
        "Generated by `python docs/generate.py` from `benchmarks/results/*.json`; do not edit. Each section says how "
        "and "
        "where its figures were made. Superseded and exploratory results are in `benchmarks/results/archive/`. "
        "Figures are medians over repeats with their min-max spread unless a section says otherwise.\n",
    ]
    for stem, (title, script, render) in RENDERERS.items():
        doc = docs.get(f"{stem}.json")
        if doc is None:
            continue
        how = doc.get("how") if isinstance(doc.get("how"), str) and render is not e2e_margins else None
        parts.append(f"## {title}\n")
        made = "each regime says where it was made" if "regimes" in doc else provenance_line(doc)
        parts.append(f"`benchmarks/results/{stem}.json`, made by `{script}`; {made}\n")
        if how:
            parts.append(how + "\n")
        parts.append(render(doc) + plots_of(stem))
    return "\n".join(parts)


# ---- the pages


def blocks() -> dict[str, str]:
    from tba_ext.core.settings import ReplaySettings, TBASettings

    return {
        "ReplaySettings": lambda: settings_table(ReplaySettings, "sampler_kwargs."),
        "TBASettings": lambda: settings_table(TBASettings, "tba."),
        "configs": configs_table,
        "cli": cli_reference,
        **{
            study: functools.partial(study_block, study)
            for study in RENDERERS
            if study.startswith("compare_")  # each compare study's results section has its block on the compare page
        },
        "soak": lambda: soak_block(load_results().get("soak.json")),
        "primary_claim": primary_claim,
    }


PRIMARY = (
    "TBA′ minus Dr. GRPO with verl's token-level IS, both at staleness s = 8 on arith20 (held-out greedy gain, paired "
    "by seed)"
)


def primary_claim() -> str:
    """The one sentence on the science the README and the guide give: the primary comparison's result, "no
    difference" included, from benchmarks/results/compare_primary.json."""
    doc = load_results().get("compare_primary.json")
    if doc is None:
        run = "`python benchmarks/evidence.py --only primary`"
        return f"The primary comparison, {PRIMARY}, has not been run yet ({run}).\n"
    cell = analyse(doc)["paired_vs_drgrpo_tis"]["tb_pg"]["8"]
    if cell.get("refused"):
        return f"The primary comparison, {PRIMARY}, is not paired: {cell['refused']}.\n"
    mean, half, n = cell["mean"], cell["ci95"], cell["n_seeds"]
    if not cell["excludes_zero"]:
        verdict = "no difference at the 0.05 level (the interval includes 0)"
    else:
        verdict = f"{'TBA′' if mean > 0 else 'Dr. GRPO token-IS'} gains more (the interval excludes 0)"
    return (
        f"The primary comparison, {PRIMARY}, over {n} seeds: {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}] "
        f"(95 % paired t-interval, p = {cell['p_value']:.3f}): {verdict}.\n"
    )


def study_block(stem: str) -> str:
    """A compare study on the compare page: its tables and plots (where it was made: on the results page)."""
    doc = load_results().get(f"{stem}.json")
    if doc is None:
        return f"(not run yet: `python benchmarks/evidence.py --only {stem.removeprefix('compare_')}`)\n"
    return compare_tables(analyse(doc)) + plots_of(stem)


def soak_block(doc: dict | None) -> str:
    if doc is None:
        return "(no soak results yet: `python benchmarks/soak.py`)\n"
    # where and on what code it was made: on the results page (the hand-written pages carry no run history)
    return (
        "`benchmarks/results/soak.json` ([how and where it was made](results.md)):\n\n" + soak(doc) + plots_of("soak")
    )


def rendered() -> dict[Path, str]:
    """Every generated page's text as it should be."""
    makers = blocks()
    pages = {}
    for page in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        text = page.read_text()

        def fill(m, page=page):
            name = m.group(2)
            if name not in makers:
                raise SystemExit(f"{page.name}: unknown generated block {name!r}; known: {sorted(makers)}")
            return m.group(1) + makers[name]() + m.group(4)

        new = BLOCK.sub(fill, text)
        if new != text:
            pages[page] = new
    pages[DOCS / "results.md"] = results_page()
    return pages


def embedded_plots(pages: dict[Path, str]) -> tuple[list[str], list[str]]:
    """(the img/ sources every page embeds, with ``pages``' text for the generated ones; the embedded images that
    are in neither docs/img nor benchmarks/results, as 'page: path')."""
    sources, missing = set(), []
    for page in sorted(DOCS.glob("*.md")):
        for path in IMAGE.findall(pages.get(page, page.read_text())):
            if path.startswith("img/"):
                sources.add(path[len("img/") :])
            if not (DOCS / path).exists() and not (path.startswith("img/") and (RESULTS / path[4:]).exists()):
                missing.append(f"{page.name}: {path}")
    return sorted(sources), missing


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="only report stale pages (PNGs: only missing ones)")
    args = parser.parse_args()
    stale = []
    pages = rendered()
    sources, missing = embedded_plots(pages)
    if missing:
        print(f"embedded images that do not exist: {', '.join(missing)}", file=sys.stderr)
        return 1
    for source in sources:  # a benchmark's plot over its copy: only on a rewrite, and only where it differs
        new, copy = RESULTS / source, IMG / source
        if new.exists() and (not copy.exists() or (not args.check and copy.read_bytes() != new.read_bytes())):
            stale.append(copy.relative_to(ROOT))
            if not args.check:
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.write_bytes(new.read_bytes())
    for page, text in pages.items():
        if not page.exists() or page.read_text() != text:
            stale.append(page.relative_to(ROOT))
            if not args.check:
                page.write_text(text)
    if args.check and stale:
        print(f"stale generated docs: {', '.join(map(str, stale))}; run python docs/generate.py", file=sys.stderr)
        return 1
    print(f"{'stale' if args.check else 'rewrote'}: {', '.join(map(str, stale)) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
