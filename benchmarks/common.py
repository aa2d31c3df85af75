"""What the verl-launching benchmarks share: their command line and a prepared run folder (arith task)."""

import argparse
import os

from tba_ext.tools.models import ModelSpec, make_model
from tba_ext.tasks.data import corpus_for, write_task
from tba_ext.tools.warmstart import warm_start


def parse_args(name: str, steps: int, extra=None):
    """--steps, --run-dir, --out (benchmarks/results/<name>...), plus ``extra(parser)``'s options."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--run-dir", default=f"benchmarks/results/{name}_run")
    parser.add_argument("--out", default=f"benchmarks/results/{name}.json")
    if extra:
        extra(parser)
    return parser.parse_args()


def prepare_run(run_dir: str, train_size: int, size: str = "tiny", warm_steps: int = 150) -> str:
    """An offline model (warm-started unless ``warm_steps`` is 0, then in ``model/``) and the arith task."""
    run = os.path.abspath(run_dir)
    init = f"{run}/model_init" if warm_steps else f"{run}/model"
    make_model(init, corpus_for("arith", 0), ModelSpec(size=size, seed=0))
    write_task("arith", f"{run}/data", train_size, 64, 0)
    if warm_steps:
        warm_start(init, f"{run}/data/train.parquet", f"{run}/model", steps=warm_steps, log_every=0)
    return run
