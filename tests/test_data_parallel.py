"""Two data-parallel FSDP2 trainer ranks on CPU (gloo, two logical GPU slots) against one: the same update.

The trainer runs beside one searcher (verl's separate_async, hybrid_engine=False), so both layouts get their
data from the same single rollout replica; hfcpu seeds every request (seed, prompt, occurrence), so the same
prompts give the same responses whatever the trainer layout. One update with plain SGD (Adam's first step is
sign-like and would hide small gradient differences; clipping would hide a wrong scale): the 2-rank parameters
must equal the 1-rank ones.

Two prompts x 3 responses per update: three rows per rank, groups split across ranks, so the loss is only right if
its normalisation spans the ranks (verl's ``global_batch_info``). verl's no-op padding rows cannot occur here:
its config check makes the batch a multiple of the rank count and the TBA sampler always serves whole batches
(padding rows are covered by tests/test_tb_math.py).
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from tba_ext.tools.launch import run_verl

pytestmark = pytest.mark.e2e

# measured: max |theta_2 - theta_1| / max |theta_1 - theta_0| about 1e-7 (float32 reductions in another order)
RELATIVE_TOLERANCE = 1e-5


def one_update(tiny_run, run_dir, ranks: int, algo: str):
    overrides = [
        f"run_dir={tiny_run}", f"algo={algo}",
        "trainer.total_training_steps=1", f"trainer.n_gpus_per_node={ranks}",
        f"ray_kwargs.ray_init.num_gpus={ranks + 1}",
        "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=3",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",  # several micro-batches per rank
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=3",
        "trainer.v1.separate_async.parameter_sync_step=1", "trainer.v1.separate_async.num_warmup_batches=0",
        "tba.searcher_queue_prompts=null", "trainer.v1.sampler.sampler_kwargs.min_fresh_groups=null",
        # plain SGD, no clipping: the step is lr x the gradient, so a wrong scale (e.g. a per-rank normalisation)
        # shows (a clipped step has norm lr whatever the scale)
        "actor_rollout_ref.actor.optim.optimizer=SGD", "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.optim.weight_decay=0.0", "actor_rollout_ref.actor.optim.clip_grad=1e9",
        "actor_rollout_ref.actor.grad_clip=1e9",
        "trainer.save_freq=1", "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
        f"trainer.default_local_dir={run_dir}/checkpoints",
    ]
    run_verl("cpu_tba_decoupled", overrides, log_path=str(run_dir / "verl.log"),
             metrics_path=str(run_dir / "metrics.jsonl"))
    metrics = [json.loads(line)["data"] for line in open(run_dir / "metrics.jsonl")]
    weights = load_file(str(run_dir / "checkpoints/global_step_1/actor/huggingface/model.safetensors"))
    return weights, metrics[0]


@pytest.mark.parametrize("algo", ["tb", "tb_pg"])
def test_two_data_parallel_ranks_make_the_same_update_as_one(tiny_run, tmp_path, algo):
    start = load_file(str(tiny_run / "model" / "model.safetensors"))
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one, metrics_one = one_update(tiny_run, tmp_path / "one", 1, algo)
    two, metrics_two = one_update(tiny_run, tmp_path / "two", 2, algo)

    # the same data reached both: same rewards, same sequence lengths (padding rows are not counted)
    assert metrics_two["critic/score/mean"] == pytest.approx(metrics_one["critic/score/mean"])
    assert metrics_two["response_length/mean"] == pytest.approx(metrics_one["response_length/mean"])
    assert metrics_two["actor/grad_norm"] == pytest.approx(metrics_one["actor/grad_norm"], rel=1e-4)
    names = sorted(set(start) & set(one) & set(two))
    step = max((one[n].float() - start[n].float()).abs().max().item() for n in names)
    gap = max((two[n].float() - one[n].float()).abs().max().item() for n in names)
    print(f"{algo}: max step {step:.3g}, max 2-rank gap {gap:.3g} ({gap / step:.2g} of the step), grad norm "
          f"{metrics_one['actor/grad_norm']:.6g} vs {metrics_two['actor/grad_norm']:.6g}")
    assert step > 1e-4, "the update did not move the parameters"
    assert gap <= RELATIVE_TOLERANCE * step, f"2 ranks vs 1: max gap {gap:.3g}, max step {step:.3g}"
