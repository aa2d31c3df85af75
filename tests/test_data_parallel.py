"""Two data-parallel FSDP2 trainer ranks on CPU (gloo, two logical GPU slots) against one: the same update.

The trainer runs beside one searcher (verl's separate_async, hybrid_engine=False), so both layouts get their
data from the same single rollout replica; hfcpu seeds every request (seed, prompt, occurrence), so the same
prompts give the same responses whatever the trainer layout. One update with plain SGD (Adam's first step is
sign-like and would hide small gradient differences; clipping would hide a wrong scale): the 2-rank parameters
must equal the 1-rank ones.

Two prompts x 3 responses per update, one micro-batch per group: the fused update gives each rank one whole
group, so the loss is only right if its normalisation spans the ranks (verl's ``global_batch_info``) and log Z
comes from the group's own rows. The 2-rank run takes the reference log-probs the searcher computed with its copy
of the initial model, except tb_pg's, which computes it on two ranks inside the update's own call
(``tba.ref_in_update``; the same reference pass serves tb). The 1-rank run is, for tb_pg, the fused update with the
reference from verl's reference call, so the comparison also checks the in-update reference against verl's; for tb,
verl's three-call pipeline, so the same comparison checks the fused update against it. Four verl runs in all.
verl's no-op padding rows cannot occur here:
its config check makes the batch a multiple of the rank count and the TBA sampler always serves whole batches
(padding rows are covered by tests/test_tb_math.py).
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from tba_ext.tools.launch import run_verl

pytestmark = pytest.mark.e2e

# How far two correct float32 updates of the same parameters may lie apart, from the arithmetic alone:
# - the two layouts sum the same per-token gradient terms in another order (two ranks' partial sums all-reduced
#   instead of one sum, other micro-batch boundaries). A float32 sum of n terms carries a rounding error of at
#   most n * eps32 times the largest term; with n <= ~1e3 terms per gradient element here (24 sequences x a few
#   tokens x the hidden units feeding it) and every term bounded by the largest gradient element, the two steps
#   differ by at most GRADIENT_ORDER_REL (1e3 x 1.2e-7 ~ 1e-4) of the largest step, lr x max |g|;
# - each layout then rounds theta - lr * g to float32 once, and the two results can fall on neighbouring floats
#   even when the steps agree to the bit: THETA_ULPS units in the last place of theta itself.
# A wrong normalisation (e.g. a rank dividing by its own rows) scales the step by a factor c != 1 and shows as a
# gap of |c - 1| x the step, thousands of times above the first term for any c off by more than 0.1 %.
GRADIENT_ORDER_REL = 1e-4
THETA_ULPS = 4


def one_update(tiny_run, run_dir, ranks: int, algo: str, fused: bool = True, reference: str = "searcher"):
    """``reference``: "searcher" (each searcher scores its samples with its copy of the initial model), "update"
    (the trainer, inside the update's own call: tba.ref_in_update) or "verl" (verl's reference call on every row:
    tba.ref_cache=false)."""
    overrides = [
        f"tba.fused_update={fused}",
        f"tba.ref_cache={reference != 'verl'}",
        f"actor_rollout_ref.rollout.custom.reference_logprobs={reference == 'searcher'}",
        f"run_dir={tiny_run}",
        f"algo={algo}",
        "trainer.total_training_steps=1",
        f"trainer.n_gpus_per_node={ranks}",
        f"ray_kwargs.ray_init.num_gpus={ranks + 1}",
        "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=3",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",  # several micro-batches per rank
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=3",
        "trainer.v1.separate_async.parameter_sync_step=1",
        "trainer.v1.separate_async.num_warmup_batches=0",
        "tba.searcher_queue_prompts=null",
        "trainer.v1.sampler.sampler_kwargs.min_fresh_groups=null",
        # plain SGD, no clipping: the step is lr x the gradient, so a wrong scale (e.g. a per-rank normalisation)
        # shows (a clipped step has norm lr whatever the scale)
        "actor_rollout_ref.actor.optim.optimizer=SGD",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.optim.clip_grad=1e9",
        "actor_rollout_ref.actor.grad_clip=1e9",
        "trainer.save_freq=1",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
        f"trainer.default_local_dir={run_dir}/checkpoints",
    ]
    run_verl(
        "cpu_tba_decoupled", overrides, log_path=str(run_dir / "verl.log"), metrics_path=str(run_dir / "metrics.jsonl")
    )
    metrics = [json.loads(line)["data"] for line in open(run_dir / "metrics.jsonl")]
    weights = load_file(str(run_dir / "checkpoints/global_step_1/actor/huggingface/model.safetensors"))
    return weights, metrics[0]


@pytest.mark.parametrize("algo", ["tb", "tb_pg"])
def test_two_data_parallel_ranks_make_the_same_update_as_one(tiny_run, tmp_path, algo, margin):
    start = load_file(str(tiny_run / "model" / "model.safetensors"))
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
    # The one-rank baseline: tb_pg's is the fused update with verl's reference call on the trainer (two worker
    # calls); tb's is verl's three-call pipeline (old log-probs, driver advantage, update), whose first update the
    # fused one must equal at theta = old (tb_pg's three-call equivalence: tests/test_fused.py). Two ranks make one
    # worker call: tb's takes the searcher's reference log-probs (its copy of the initial model), tb_pg's computes
    # the reference inside that call.
    if algo == "tb":
        one, metrics_one = one_update(tiny_run, tmp_path / "one", 1, algo, fused=False)
        assert "actor/entropy" in metrics_one  # verl's old-log-prob pass reports it; the fused update makes none
        two, metrics_two = one_update(tiny_run, tmp_path / "two", 2, algo)
        assert metrics_two["tba/ref_cached_frac"] == 1.0
    else:
        one, metrics_one = one_update(tiny_run, tmp_path / "one", 1, algo, reference="verl")
        assert metrics_one["tba/trainer_calls_per_update"] == 2
        two, metrics_two = one_update(tiny_run, tmp_path / "two", 2, algo, reference="update")
        reference_in_update_agrees(metrics_two, metrics_one)
    assert metrics_two["tba/trainer_calls_per_update"] == 1 and "actor/entropy" not in metrics_two

    # the same data reached both: same rewards, same sequence lengths (padding rows are not counted)
    assert metrics_two["critic/score/mean"] == pytest.approx(metrics_one["critic/score/mean"])
    assert metrics_two["response_length/mean"] == pytest.approx(metrics_one["response_length/mean"])
    # the gradient norm, like the step, differs only by the order of its float32 sums
    margin(
        "grad_norm rel gap",
        abs(metrics_two["actor/grad_norm"] / metrics_one["actor/grad_norm"] - 1),
        GRADIENT_ORDER_REL,
    )
    names = sorted(set(start) & set(one) & set(two))
    step = max((one[n].float() - start[n].float()).abs().max().item() for n in names)
    assert step > 1e-4, "the update did not move the parameters"
    worst, where = 0.0, None
    for n in names:
        ratio = ((two[n] - one[n]).abs() / allowed_gap(one[n], step)).max().item()
        if ratio > worst:
            worst, where = ratio, n
    gap = max((two[n].float() - one[n].float()).abs().max().item() for n in names)
    print(
        f"{algo}: max step {step:.3g}, max 2-rank gap {gap:.3g} ({gap / step:.2g} of the step), worst gap / "
        f"allowed {worst:.3g} ({where}), grad norm {metrics_one['actor/grad_norm']:.6g} vs "
        f"{metrics_two['actor/grad_norm']:.6g}"
    )
    margin("2-rank gap / float32 bound, worst element", worst, 1.0)
    if algo == "tb":
        # the driver's TB statistics of the three-call path (from verl's KL-penalised rewards) are the fused loss's
        # (from its forward): at theta = old both see the same log Z and advantages
        for key in ("tb/log_z", "tb/mean_abs_advantage"):
            assert metrics_two[key] == pytest.approx(metrics_one[key], rel=1e-4, abs=1e-5), key


def reference_in_update_agrees(metrics_in_update: dict, metrics_verl_reference: dict) -> None:
    """Two ranks computing the reference inside the update's own call: every row computed there, in the one call,
    and the same KL as verl's reference call gave the one-rank run (the parameters are compared by the caller)."""
    assert metrics_in_update["tba/ref_cached_frac"] == 0.0 and metrics_in_update["tba/ref_computed_frac"] == 1.0
    # a forward for the reference and a forward + backward, per trajectory
    assert metrics_in_update["tba/trainer_forward_units_per_trajectory"] == 4
    assert metrics_in_update["actor/tba/reference_in_update_s"] > 0  # the update's time splits into the two passes
    # placeholder reference log-probs (zeros) left in the update would move tb/kl and the step far outside this
    assert metrics_in_update["tb/kl"] == pytest.approx(metrics_verl_reference["tb/kl"], rel=1e-4, abs=1e-6)


def allowed_gap(theta: torch.Tensor, step: float) -> torch.Tensor:
    """Per element: THETA_ULPS units in the last place of theta (in its own dtype) + GRADIENT_ORDER_REL x step."""
    magnitude = theta.abs()
    ulp = torch.nextafter(magnitude, torch.full_like(magnitude, float("inf"))) - magnitude
    return THETA_ULPS * ulp.float() + GRADIENT_ORDER_REL * step
