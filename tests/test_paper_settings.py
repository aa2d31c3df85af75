"""The paper's settings, each beside the config that claims it and true in it once composed as verl sees it.

Every row: config, what the paper says, where it says it (TBA = arXiv 2503.18929; "reference code" = its
repository, as read in tba-reference-spec.md section 4), the config key (dotted) and the value. Where a config
departs from the paper on purpose, the row says so and checks the departure is what the comment claims.
"""

import math

import pytest
from omegaconf import OmegaConf

from tba_ext.core.steps import updates_per_step
from tba_ext.tasks.data import BOS_RAW_PROMPT_TEMPLATE, RAW_PROMPT_TEMPLATE
from tba_ext.tools.config import compose

NO_CLIP = 1e9  # a gradient-norm threshold TB's gradients (norms in the hundreds) never reach: no clipping

PAPER = [
    # (config, setting, source, key, value)
    ("tba_rhomath-1b_gsm8k", "lr 1e-5", "Table 2", "actor_rollout_ref.actor.optim.lr", 1e-5),
    ("tba_rhomath-1b_gsm8k", "warmup 50 updates", "Table 2", "tba.lr_schedule.warmup_updates", 50),
    ("tba_rhomath-1b_gsm8k", "stable 450 updates", "Table 2", "tba.lr_schedule.stable_updates", 450),
    (
        "tba_rhomath-1b_gsm8k",
        "decay 500 updates (cosine, HF WSD)",
        "Table 2; reference code lr_scheduler_type",
        "tba.lr_schedule.decay_updates",
        500,
    ),
    ("tba_rhomath-1b_gsm8k", "WSD schedule", "Table 2", "tba.lr_schedule.name", "wsd"),
    (
        "tba_rhomath-1b_gsm8k",
        "cosine decay",
        "reference code (HF get_wsd_schedule default)",
        "tba.lr_schedule.decay_shape",
        "cosine",
    ),
    (
        "tba_rhomath-1b_gsm8k",
        "weight decay 0",
        "reference code (HF AdamW default)",
        "actor_rollout_ref.actor.optim.weight_decay",
        0.0,
    ),
    (
        "tba_rhomath-1b_gsm8k",
        "no gradient clipping",
        "reference code (clip_grad_norm_ never called)",
        "actor_rollout_ref.actor.grad_clip",
        NO_CLIP,
    ),
    (
        "tba_rhomath-1b_gsm8k",
        "no gradient clipping",
        "reference code",
        "actor_rollout_ref.actor.optim.clip_grad",
        NO_CLIP,
    ),
    (
        "tba_rhomath-1b_gsm8k",
        "bf16 weights (no fp32 master copy)",
        "reference code (model loaded in bf16)",
        "actor_rollout_ref.actor.fsdp_config.model_dtype",
        "bf16",
    ),
    ("tba_rhomath-1b_gsm8k", "K = 20", "Table 2", "actor_rollout_ref.rollout.n", 20),
    (
        "tba_rhomath-1b_gsm8k",
        "S = 24 generated per prompt",
        "Table 2",
        "trainer.v1.sampler.sampler_kwargs.samples_per_prompt",
        24,
    ),
    ("tba_rhomath-1b_gsm8k", "7 prompts per update", "Table 2", "actor_rollout_ref.actor.ppo_mini_batch_size", 7),
    ("tba_rhomath-1b_gsm8k", "beta 0.012", "Table 2", "algorithm.kl_ctrl.kl_coef", 0.012),
    ("tba_rhomath-1b_gsm8k", "beta -> 0.004", "Table 2", "tba.beta.final", 0.004),
    ("tba_rhomath-1b_gsm8k", "beta annealed by update 500", "Table 2", "tba.beta.anneal_steps", 500),
    ("tba_rhomath-1b_gsm8k", "m = 0.95", "Table 2", "trainer.v1.sampler.sampler_kwargs.recency_prob", 0.95),
    ("tba_rhomath-1b_gsm8k", "sync every k = 2 updates", "Table 2", "trainer.v1.separate_async.parameter_sync_step", 2),
    (
        "tba_rhomath-1b_gsm8k",
        "uniform reward sampling",
        "Table 2",
        "trainer.v1.sampler.sampler_kwargs.reward_inv_temp",
        0.0,
    ),
    ("tba_rhomath-1b_gsm8k", "T = 0.7", "Table 2", "actor_rollout_ref.rollout.temperature", 0.7),
    ("tba_rhomath-1b_gsm8k", "no reference reset", "Table 2 (none listed); reference code", "tba.ref_reset_every", 0),
    ("tba_rhomath-1b_gsm8k", "3 searchers", "Table 2", "actor_rollout_ref.rollout.n_gpus_per_node", 3),
    ("tba_rhomath-1b_gsm8k", "512 response tokens", "reference code response_length", "data.max_response_length", 512),
    (
        "tba_rhomath-1b_gsm8k",
        "500 initial completions = 21 prompts of S = 24",
        "Table 2",
        "trainer.v1.sampler.sampler_kwargs.min_buffer_groups",
        21,
    ),
    (
        "tba_rhomath-1b_gsm8k",
        'BOS, then the raw prompt "[MATH TASK] Problem:...Solution:" (no chat template)',
        "reference code gsm8k_utils.py:29; the SFT model's Llama-2 tokenizer puts <s> first",
        "data.apply_chat_template_kwargs.chat_template",
        BOS_RAW_PROMPT_TEMPLATE,
    ),
    (
        "tba_pythia-1b_tldr",
        "raw TL;DR query (no chat template)",
        "reference code",
        "data.apply_chat_template_kwargs.chat_template",
        RAW_PROMPT_TEMPLATE,
    ),
    (
        "tba_gpt2_redteam",
        "raw instruction (GPT-2: no chat template)",
        "section 5.3",
        "data.apply_chat_template_kwargs.chat_template",
        RAW_PROMPT_TEMPLATE,
    ),
    ("tba_pythia-1b_tldr", "lr 3e-6", "Table 3", "actor_rollout_ref.actor.optim.lr", 3e-6),
    (
        "tba_pythia-1b_tldr",
        "linear decay, no warmup (HF default)",
        "reference code (TRL defaults)",
        "tba.lr_schedule.decay_shape",
        "linear",
    ),
    ("tba_pythia-1b_tldr", "no warmup", "reference code", "tba.lr_schedule.warmup_updates", 0),
    (
        "tba_pythia-1b_tldr",
        "decay to 0 over the run (260 updates here, 256 in the paper)",
        "reference code",
        "tba.lr_schedule.decay_updates",
        260,
    ),
    ("tba_pythia-1b_tldr", "weight decay 0", "reference code", "actor_rollout_ref.actor.optim.weight_decay", 0.0),
    ("tba_pythia-1b_tldr", "no gradient clipping", "reference code", "actor_rollout_ref.actor.grad_clip", NO_CLIP),
    (
        "tba_pythia-1b_tldr",
        "fp32 trainer",
        'App. B.2 ("32-bit precision")',
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
        "fp32",
    ),
    (
        "tba_pythia-1b_tldr",
        "fp32 reference",
        "App. B.2",
        "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype",
        "fp32",
    ),
    ("tba_pythia-1b_tldr", "K = 20", "Table 3", "actor_rollout_ref.rollout.n", 20),
    (
        "tba_pythia-1b_tldr",
        "S = K = 20",
        "reference code (multiplier 1.0)",
        "trainer.v1.sampler.sampler_kwargs.samples_per_prompt",
        20,
    ),
    ("tba_pythia-1b_tldr", "8 prompts per update", "Table 3", "actor_rollout_ref.actor.ppo_mini_batch_size", 8),
    ("tba_pythia-1b_tldr", "beta 1.0", "reference code kl_coef", "algorithm.kl_ctrl.kl_coef", 1.0),
    ("tba_pythia-1b_tldr", "beta -> 0.05", "reference code kl_coef_final", "tba.beta.final", 0.05),
    ("tba_pythia-1b_tldr", "m = 0.5", "Table 3; section 5.4", "trainer.v1.sampler.sampler_kwargs.recency_prob", 0.5),
    ("tba_pythia-1b_tldr", "k = 10", "Table 3", "trainer.v1.separate_async.parameter_sync_step", 10),
    ("tba_pythia-1b_tldr", "128 response tokens", "reference code", "data.max_response_length", 128),
    (
        "tba_pythia-1b_tldr",
        "softmax(score) replay, inverse temperature 1",
        "reference code",
        "trainer.v1.sampler.sampler_kwargs.reward_inv_temp",
        1.0,
    ),
    (
        "tba_pythia-1b_tldr",
        "10 000 initial samples = 500 prompts of S = 20",
        "reference code",
        "trainer.v1.sampler.sampler_kwargs.min_buffer_groups",
        500,
    ),
    ("tba_qwen2.5-7b_math_megatron", "lr 1e-6", "Table 4", "actor_rollout_ref.actor.optim.lr", 1e-6),
    ("tba_qwen2.5-7b_math_megatron", "T = 1.0", "Table 4", "actor_rollout_ref.rollout.temperature", 1.0),
    ("tba_qwen2.5-7b_math_megatron", "max prompt 1024", "Table 4", "data.max_prompt_length", 1024),
    (
        "tba_qwen2.5-7b_math_megatron",
        "32 prompts per update",
        "Table 4",
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        32,
    ),
    ("tba_qwen2.5-7b_math_megatron", "K = 16", "Table 4", "actor_rollout_ref.rollout.n", 16),
    ("tba_qwen2.5-7b_math_megatron", "beta 0.005", "Table 4", "algorithm.kl_ctrl.kl_coef", 0.005),
    (
        "tba_qwen2.5-7b_math_megatron",
        "rho 50: NOT here (refused on Megatron; use FSDP2 engines)",
        "Table 4",
        "tba.ref_reset_every",
        0,
    ),
    (
        "tba_qwen2.5-7b_math_megatron",
        "Dr. GRPO's length normalisation by a constant (the max response length)",
        "Table 4 (ratio Dr. GRPO loss)",
        "actor_rollout_ref.actor.loss_scale_factor",
        2048,
    ),
    ("tba_gpt2_redteam", "beta 0.05", "section 5.3", "algorithm.kl_ctrl.kl_coef", 0.05),
    ("tba_gpt2_redteam", "k = 10", "section 5.3", "trainer.v1.separate_async.parameter_sync_step", 10),
    ("tba_gpt2_redteam", "m = 0.5", "section 5.3", "trainer.v1.sampler.sampler_kwargs.recency_prob", 0.5),
    ("tba_gpt2_redteam", "buffer of 100k", "section 5.3", "trainer.v1.sampler.sampler_kwargs.capacity", 100_000),
    (
        "tba_gpt2_redteam",
        "batch 128 (prompts per update here)",
        "section 5.3",
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        128,
    ),
]

# optimizer updates of the paper's runs (section 4 of the spec): each config's global steps x updates per step
PAPER_UPDATES = [
    ("tba_rhomath-1b_gsm8k", 1000, "Table 2"),
    ("tba_pythia-1b_tldr", 260, "Table 3: 256"),
    ("tba_gpt2_redteam", 5000, "section 5.3"),
    ("tba_qwen2.5-7b_math_megatron", 400, "Table 4"),
]

_composed: dict = {}


def config(name):
    if name not in _composed:
        _composed[name] = OmegaConf.to_container(compose(name, []), resolve=True)
    return _composed[name]


def lookup(cfg, dotted):
    for key in dotted.split("."):
        cfg = cfg[key]
    return cfg


@pytest.mark.parametrize("name,setting,source,key,value", PAPER, ids=[f"{row[0]}:{row[3]}" for row in PAPER])
def test_each_config_holds_the_papers_setting(name, setting, source, key, value):
    got = lookup(config(name), key)
    if isinstance(value, float) and not math.isnan(value):
        assert float(got) == pytest.approx(value), f"{name}: {key}={got}, paper {setting} ({source})"
    else:
        assert got == value, f"{name}: {key}={got}, paper {setting} ({source})"


@pytest.mark.parametrize("name,updates,source", PAPER_UPDATES)
def test_each_config_runs_the_papers_number_of_updates(name, updates, source):
    cfg = config(name)
    assert cfg["trainer"]["total_training_steps"] * updates_per_step(cfg) == updates, source
