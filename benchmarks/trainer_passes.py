"""What the trainer computes per optimizer update: the fused TB update against verl's three-call path and Dr. GRPO.

    python benchmarks/trainer_passes.py [--steps 21] [--repeats 3] [--size small]

Every configuration trains the same model on the same data in tba_sync (one optimizer update per global step,
8 prompts x K = 4); the first step is not measured. Per update, from tba-ext's counters and verl's timers:
- trainer_calls_per_update: calls to the trainer's worker groups (compute_log_prob, compute_ref_log_prob,
  update_actor); the reference's own worker group counts;
- forward_units_per_trajectory: 1 per forward pass, 3 per forward + backward, per trained trajectory;
- trainer_s: the trainer's path, verl's timers old_log_prob + ref + adv + update_actor (not generation or the
  weight sync).
The arith task's cpu_tb / cpu_tb_pg runs have no replay store: every update's rows are fresh, so a trainer-side
reference computes all of them every update, as an EMA reference (``tb_fused_ema_ref``) must; that configuration
adds the EMA's weight average after every update (``step_s``, the whole step, shows it).
Configurations: tb and tb_pg fused with the searcher's reference log-probs (the rollout server scores each sample
with its copy of the initial model, as TBA's searchers do: no reference pass on the trainer), tb and tb_pg fused
(the default: the trainer's reference forward on rows the replay store holds none for, inside the update's own
call), the same with that forward in a call of its own before the update (``tba.ref_in_update=false``), tb and
tb_pg three-call
(``tba.fused_update=false``) and Dr. GRPO (verl's own estimator and loss, through tba_sync for the counters: its
pipeline is verl's). The
repeats run the configurations in turn (rotated), so load drifts reach all alike. Figures: median over the
repeats of each run's median step, with the min-max spread; ratios of medians from this one run.
"""

import os
import statistics

from common import SEARCHER_REFERENCE, parse_args, prepare_run, provenance

from tba_ext.tools import report
from tba_ext.tools.launch import run_verl

STAGES = ("old_log_prob", "ref", "adv", "update_actor")
CONFIGS = {
    "tb_fused_searcher_ref": ("cpu_tb", [SEARCHER_REFERENCE]),
    "tb_pg_fused_searcher_ref": ("cpu_tb_pg", [SEARCHER_REFERENCE]),
    "tb_fused": ("cpu_tb", []),
    "tb_fused_ref_call": ("cpu_tb", ["tba.ref_in_update=false"]),
    # an EMA reference moving every update: every row's reference forward every update, and the weight average
    "tb_fused_ema_ref": ("cpu_tb", ["tba.ref_reset_every=1", "tba.ref_ema=0.9"]),
    "tb_three_call": ("cpu_tb", ["tba.fused_update=false"]),
    "tb_pg_fused": ("cpu_tb_pg", []),
    "tb_pg_fused_ref_call": ("cpu_tb_pg", ["tba.ref_in_update=false"]),
    "tb_pg_three_call": ("cpu_tb_pg", ["tba.fused_update=false"]),
    "drgrpo": ("cpu_drgrpo", ["trainer.v1.trainer_mode=tba_sync"]),
}


def extra_args(parser):
    parser.add_argument("--replot", action="store_true", help="draw --out's plot again from its JSON, no run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", default="small")
    parser.add_argument(
        "--configs",
        nargs="+",
        default=list(CONFIGS),
        choices=list(CONFIGS),
        help="a subset (the ratios need their pairs: *_three_call, drgrpo)",
    )


def one_run(run_dir, name, config, overrides, steps, repeat):
    path = f"{run_dir}/{name}_{repeat}.jsonl"
    if os.path.exists(path):
        os.unlink(path)
    run_verl(
        config,
        [
            f"run_dir={run_dir}",
            f"trainer.total_training_steps={steps}",
            f"trainer.default_local_dir={run_dir}/ckpt_{name}_{repeat}",
            *overrides,
        ],
        log_path=f"{run_dir}/{name}_{repeat}.log",
        metrics_path=path,
    )
    measured = [r["data"] for r in report.read_metrics(path)][1:]  # step 1: start-up, first weight sync
    stage_s = {s: statistics.median(d.get(f"timing_s/{s}", 0.0) for d in measured) for s in STAGES}
    return {
        "trainer_s": statistics.median(sum(d.get(f"timing_s/{s}", 0.0) for s in STAGES) for d in measured),
        "stage_s": stage_s,
        # the share of update_actor that is the reference forward inside it (tba.ref_in_update)
        "reference_in_update_s": statistics.median(d.get("actor/tba/reference_in_update_s", 0.0) for d in measured),
        # generation (verl's gen timer): where the searcher's reference forward is paid instead
        "gen_s": statistics.median(d.get("timing_s/gen", 0.0) for d in measured),
        # the whole step: generation, the trainer's path and what follows the update (the EMA reference's
        # weight average, the weight sync)
        "step_s": statistics.median(d.get("timing_s/step", 0.0) for d in measured),
        "trainer_calls_per_update": statistics.median(d["tba/trainer_calls_per_update"] for d in measured),
        "forward_units_per_trajectory": statistics.median(
            d["tba/trainer_forward_units_per_trajectory"] for d in measured
        ),
        # the trainer's work grows with the responses' length, which differs between policies as they learn
        "response_length": statistics.median(d.get("response_length/mean", 0.0) for d in measured),
        "updates": len(measured),
        "reward_last": measured[-1].get("critic/score/mean"),
    }


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main():
    args = parse_args("trainer_passes", steps=21, extra=extra_args)
    if args.replot:
        plot(report.read_json(args.out)["configurations"], args.out.replace(".json", ".png"))
        return
    run_dir = prepare_run(args.run_dir, train_size=512, size=args.size)
    meta = provenance()
    names = list(args.configs)
    runs = {name: [] for name in names}
    for repeat in range(args.repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            config, overrides = CONFIGS[name]
            runs[name].append(one_run(run_dir, name, config, overrides, args.steps, repeat))
            r = runs[name][-1]
            print(
                f"repeat {repeat + 1}/{args.repeats} {name}: trainer {r['trainer_s']:.3f} s/update, "
                f"{r['trainer_calls_per_update']:g} calls, {r['forward_units_per_trajectory']:g} units",
                flush=True,
            )
    summary = {
        name: {
            "trainer_s": spread([r["trainer_s"] for r in rs]),
            "stage_s": {s: statistics.median(r["stage_s"][s] for r in rs) for s in STAGES},
            "reference_in_update_s": statistics.median(r["reference_in_update_s"] for r in rs),
            "gen_s": spread([r["gen_s"] for r in rs]),
            "step_s": spread([r["step_s"] for r in rs]),
            "response_length": statistics.median(r["response_length"] for r in rs),
            "trainer_calls_per_update": statistics.median(r["trainer_calls_per_update"] for r in rs),
            "forward_units_per_trajectory": statistics.median(r["forward_units_per_trajectory"] for r in rs),
        }
        for name, rs in runs.items()
    }

    def ratio(a, b):
        if a not in summary or b not in summary:
            return None
        return summary[a]["trainer_s"]["median"] / summary[b]["trainer_s"]["median"]

    def calls(name):
        return summary[name]["trainer_calls_per_update"] if name in summary else None

    result = {
        "how": f"benchmarks/trainer_passes.py: {args.repeats} repeats x {len(names)} configurations, "
        f"{args.size} model, {args.steps} global steps of 1 update (first not measured), tba_sync, arith task",
        "provenance": meta,
        "worker_calls_per_update": {
            "tb": calls("tb_fused_searcher_ref"),
            "tb_pg": calls("tb_pg_fused_searcher_ref"),
            "tb_trainer_reference": calls("tb_fused"),
            "tb_pg_trainer_reference": calls("tb_pg_fused"),
            "tb_trainer_reference_own_call": calls("tb_fused_ref_call"),
            "tb_pg_trainer_reference_own_call": calls("tb_pg_fused_ref_call"),
        },
        "trainer_s_vs_three_call": {
            "tb": ratio("tb_fused_searcher_ref", "tb_three_call"),
            "tb_pg": ratio("tb_pg_fused_searcher_ref", "tb_pg_three_call"),
            "tb_trainer_reference": ratio("tb_fused", "tb_three_call"),
            "tb_pg_trainer_reference": ratio("tb_pg_fused", "tb_pg_three_call"),
            "tb_trainer_reference_own_call": ratio("tb_fused_ref_call", "tb_three_call"),
            "tb_pg_trainer_reference_own_call": ratio("tb_pg_fused_ref_call", "tb_pg_three_call"),
        },
        "trainer_s_vs_drgrpo": {
            "tb": ratio("tb_fused_searcher_ref", "drgrpo"),
            "tb_pg": ratio("tb_pg_fused_searcher_ref", "drgrpo"),
            "tb_trainer_reference": ratio("tb_fused", "drgrpo"),
            "tb_pg_trainer_reference": ratio("tb_pg_fused", "drgrpo"),
            "tb_trainer_reference_own_call": ratio("tb_fused_ref_call", "drgrpo"),
            "tb_pg_trainer_reference_own_call": ratio("tb_pg_fused_ref_call", "drgrpo"),
        },
        # the reference forward inside the update's call against the same forward in a call of its own
        "trainer_s_reference_in_update_vs_own_call": {
            "tb": ratio("tb_fused", "tb_fused_ref_call"),
            "tb_pg": ratio("tb_pg_fused", "tb_pg_fused_ref_call"),
        },
        # TBA' against TB, per update and per response token (the two policies' responses differ in length)
        "tb_pg_vs_tb": {
            "trainer_s": ratio("tb_pg_fused", "tb_fused"),
            "trainer_s_per_response_token": (
                ratio("tb_pg_fused", "tb_fused")
                * summary["tb_fused"]["response_length"]
                / summary["tb_pg_fused"]["response_length"]
                if "tb_pg_fused" in summary and "tb_fused" in summary
                else None
            ),
        },
        # the EMA reference against the fixed one, both computing every (fresh) row's reference in the update:
        # what the per-update weight average adds to the step
        "ema_reference_step_s_minus_fixed": (
            summary["tb_fused_ema_ref"]["step_s"]["median"] - summary["tb_fused"]["step_s"]["median"]
            if "tb_fused_ema_ref" in summary and "tb_fused" in summary
            else None
        ),
        "goals": {"worker_calls_per_update": 1, "trainer_s_vs_three_call": 0.65, "trainer_s_vs_drgrpo": 0.8},
        "configurations": summary,
        "runs": runs,
    }
    report.write_json(result, args.out)
    print(f"\n{'configuration':<26} {'trainer s/update':>22} {'calls':>6} {'units':>6} {'gen s':>7}")
    for name, s in summary.items():
        t = s["trainer_s"]
        print(
            f"{name:<26} {t['median']:9.3f} [{t['min']:.3f}, {t['max']:.3f}] {s['trainer_calls_per_update']:6g} "
            f"{s['forward_units_per_trajectory']:6g} {s['gen_s']['median']:7.3f}"
        )
    for key in (
        "worker_calls_per_update",
        "trainer_s_vs_three_call",
        "trainer_s_vs_drgrpo",
        "trainer_s_reference_in_update_vs_own_call",
        "tb_pg_vs_tb",
    ):
        print(f"{key}: " + ", ".join(f"{k} {v:.3g}" for k, v in result[key].items() if v is not None))
    plot(summary, args.out.replace(".json", ".png"))
    print(f"wrote {args.out}")


# display names of the configurations and of verl's timer stages
CONFIG_LABELS = {
    "tb_fused_searcher_ref": "TB fused, reference from the searchers",
    "tb_pg_fused_searcher_ref": "TBA′ fused, reference from the searchers",
    "tb_fused": "TB fused, trainer reference",
    "tb_fused_ref_call": "TB fused, reference in its own call",
    "tb_fused_ema_ref": "TB fused, EMA reference every update",
    "tb_three_call": "TB, three calls",
    "tb_pg_fused": "TBA′ fused, trainer reference",
    "tb_pg_fused_ref_call": "TBA′ fused, reference in its own call",
    "tb_pg_three_call": "TBA′, three calls",
    "drgrpo": "Dr. GRPO",
}
STAGE_LABELS = {
    "old_log_prob": "old log-prob pass",
    "ref": "reference forward",
    "adv": "advantage",
    "update_actor": "actor update (forward + backward)",
}


def plot(summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(names) + 2.2))
    left = [0.0] * len(names)
    for stage in STAGES:
        values = [summary[n]["stage_s"][stage] for n in names]
        ax.barh([CONFIG_LABELS.get(n, n) for n in names], values, left=left, label=STAGE_LABELS[stage])
        left = [a + v for a, v in zip(left, values)]
    ax.invert_yaxis()
    ax.set_xlabel("trainer seconds per optimizer update (median over repeats, by stage)")
    ax.set_title("Where the trainer's time per update goes: shorter bars cost less", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.4, -0.2), ncol=4, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
