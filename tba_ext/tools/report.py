"""Run folders: read verl's metrics JSONL, draw PNG curves, write report.md."""

from __future__ import annotations

import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def read_metrics(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], float(r["data"][key])) for r in records if key in r["data"]]
    return [p[0] for p in pts], [p[1] for p in pts]


def find_key(records: list[dict], prefix: str, suffix: str) -> str | None:
    for r in records:
        for key in r["data"]:
            if key.startswith(prefix) and key.endswith(suffix):
                return key
    return None


def plot_runs(
    runs: dict[str, list[dict]], panels: list[tuple[str, str]], path: str, x: str = "step", title: str = ""
) -> str:
    """One PNG: a panel per (metric key, label), one line per run. ``x`` is "step" or "time"."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels):
        for name, records in runs.items():
            steps, values = series(records, key)
            if not values:
                continue
            if x == "time":
                times = dict(zip(*series(records, "tba/elapsed_s")))
                steps = [times.get(s, float("nan")) for s in steps]
            ax.plot(steps, values, marker="o", markersize=2, label=name)
        ax.set_title(label)
        ax.set_xlabel("wall-clock (s)" if x == "time" else "step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def add_elapsed(records: list[dict]) -> list[dict]:
    """Cumulative wall-clock per step from verl's own step timer (timing_s/step)."""
    total = 0.0
    for r in records:
        total += float(r["data"].get("timing_s/step", 0.0))
        r["data"]["tba/elapsed_s"] = total
    return records


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def write_json(obj, path: str) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


def md_table(rows: list[dict], columns: list[str]) -> str:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        out.append("| " + " | ".join(_fmt(row.get(c, "")) for c in columns) + " |")
    return "\n".join(out)


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def ensure_dir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path
