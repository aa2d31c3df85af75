"""Bad-input fuzzing shared by ``tests/test_fuzz_inputs.py`` (the unit lane, a fixed seed) and
``benchmarks/fuzz_inputs.py`` (more cases): bad configurations (wrong types, out-of-range values, misspelled keys,
contradictory keys across tba.*, algorithm.*, actor_rollout_ref.*, trainer.*, trainer.v1.*, sampler_kwargs.*,
data.*) and malformed data rows, each carrying the key or row the refusal must name, and the checks
``tba-ext train`` runs before Ray starts (``check_overrides_are_read``, ``compose``, ``preflight``), classified.

A case passes when the checks raise one exception (no chained cause shown) of type ValueError / TypeError /
FileNotFoundError, raised in tba_ext, whose message names the key (or the file and row) at fault. Every other end
is a failure: accepted silently, refused without naming the key, a traceback from outside tba_ext (verl, omegaconf,
hydra, pandas), or a chain of exceptions.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import random
import re
import traceback
from collections import Counter

CONFIGS = ("cpu_tb", "cpu_tb_pg", "cpu_tba", "cpu_tba_decoupled", "cpu_drgrpo")
TB = ("cpu_tb", "cpu_tb_pg", "cpu_tba", "cpu_tba_decoupled")  # a tba: node and the TB estimator
REPLAY = ("cpu_tba", "cpu_tba_decoupled")  # the replay sampler's sampler_kwargs
SK = "trainer.v1.sampler.sampler_kwargs."
ARO = "actor_rollout_ref."
ALLOWED = (ValueError, TypeError, FileNotFoundError)
# the outcomes; the first is the only pass
NAMED, UNNAMED, ACCEPTED, OUTSIDE, CHAINED = (
    "refused_named",
    "refused_unnamed",
    "accepted",
    "outside_tba_ext",
    "chained",
)


@dataclasses.dataclass
class Case:
    """One bad input: ``overrides`` on ``config`` (and, for a data case, a file built from ``rows``), refused by a
    message that holds every string of ``names``."""

    label: str
    config: str
    overrides: list[str]
    names: list[str]
    data: dict | None = None  # {"split": "train_files" | "val_files", "mutation": name, "row": 0-based index}


@dataclasses.dataclass
class Key:
    """A config key, its type (int, float, bool, str), its range, whether null is valid, the configs that read it."""

    key: str
    type: str
    range: str = ""  # int: >0 >=0 >=1 >=2; float: >0 >=0 [0,1] [0,1) (0,1] finite; str: the valid values, "|"-separated
    null: bool = False
    configs: tuple[str, ...] = CONFIGS
    inf: bool = False  # +inf is valid (no limit)


# The keys the fuzzer breaks. A value left out of a key's bad values is valid or harmless there: said beside it.
KEYS = [
    # tba: (tba_ext.core.settings.TBASettings)
    Key("tba.beta.final", "float", ">0", True, TB),
    Key("tba.beta.anneal_steps", "int", ">=0", configs=TB),
    Key("tba.ref_reset_every", "int", ">=0", configs=TB),
    Key("tba.ref_ema", "float", "[0,1)", configs=TB),
    Key("tba.searcher_queue_prompts", "int", ">0", True, ("cpu_tba_decoupled",)),
    Key("tba.searcher_prompts_per_consumed", "float", ">0", True, ("cpu_tba_decoupled",)),
    Key("tba.fused_update", "bool", configs=TB),
    Key("tba.ref_cache", "bool", configs=TB),
    Key("tba.ref_in_update", "bool", configs=TB),
    Key("tba.ref_cache_check", "bool", configs=TB),
    Key("tba.lr_schedule.name", "str", "wsd", True, TB),
    Key("tba.lr_schedule.warmup_updates", "int", ">=0", configs=TB),
    Key("tba.lr_schedule.stable_updates", "int", ">=0", configs=TB),
    Key("tba.lr_schedule.decay_updates", "int", ">=0", configs=TB),
    Key("tba.lr_schedule.decay_shape", "str", "cosine|linear", configs=TB),
    Key("tba.lr_schedule.min_lr_ratio", "float", "[0,1]", configs=TB),
    # the replay sampler (tba_ext.core.settings.ReplaySettings)
    Key(SK + "recency_prob", "float", "[0,1]", configs=REPLAY),
    Key(SK + "reward_inv_temp", "float", "finite", configs=REPLAY),  # any finite value: < 0 prefers low rewards
    Key(SK + "samples_per_prompt", "int", ">=2", True, REPLAY),
    Key(SK + "per_prompt_capacity", "int", ">0", configs=REPLAY),
    Key(SK + "capacity", "int", ">0", configs=REPLAY),
    Key(SK + "capacity_bytes", "int", ">0", True, REPLAY),
    Key(SK + "max_staleness", "int", ">=0", True, ("cpu_tba",)),  # decoupled: >= k - 1, a contradiction below
    Key(SK + "max_replays", "int", ">=1", True, REPLAY),
    Key(SK + "recency_window", "int", ">=1", configs=REPLAY),
    Key(SK + "max_nonfinite_frac", "float", "[0,1]", configs=REPLAY),
    Key(SK + "min_fresh_groups", "int", ">=0", True, REPLAY),
    Key(SK + "min_buffer_groups", "int", ">=1", True, REPLAY),
    Key(SK + "wait_timeout_s", "float", ">0", configs=REPLAY),
    Key(SK + "seed", "int", configs=REPLAY),  # any int
    # algorithm.*
    Key("algorithm.adv_estimator", "str", "tb|tb_pg|grpo"),  # which of them a config takes: the contradictions
    Key("algorithm.use_kl_in_reward", "bool"),
    Key("algorithm.kl_penalty", "str", "kl", configs=TB),
    Key("algorithm.kl_ctrl.type", "str", "fixed", configs=TB),
    Key("algorithm.kl_ctrl.kl_coef", "float", ">0", configs=("cpu_tb", "cpu_tba", "cpu_tba_decoupled")),
    Key("algorithm.kl_ctrl.kl_coef", "float", ">=0", configs=("cpu_tb_pg",)),  # 0: TBA′ without KL
    Key("algorithm.rollout_correction.bypass_mode", "bool"),
    # inf: no truncation at all, what tb_pg wants (1e6 is its finite stand-in)
    Key("algorithm.rollout_correction.rollout_is_threshold", "float", ">0", configs=("cpu_tb_pg",), inf=True),
    Key("algorithm.gamma", "float", "finite"),
    Key("algorithm.norm_adv_by_std_in_grpo", "bool", null=True, configs=("cpu_drgrpo",)),  # null: read as false
    # actor_rollout_ref.actor.*
    Key(ARO + "actor.ppo_mini_batch_size", "int", ">0"),
    Key(ARO + "actor.ppo_micro_batch_size_per_gpu", "int", ">0"),
    Key(ARO + "actor.ppo_epochs", "int", ">=1"),
    Key(ARO + "actor.entropy_coeff", "float", "finite", configs=("cpu_drgrpo",)),  # TB: must be 0 (contradiction)
    Key(ARO + "actor.shuffle", "bool", configs=("cpu_drgrpo",)),  # TB's fused update: must be false (contradiction)
    Key(ARO + "actor.use_kl_loss", "bool"),
    Key(ARO + "actor.loss_agg_mode", "str", "token-mean|seq-mean-token-sum-norm", configs=("cpu_drgrpo",)),
    Key(ARO + "actor.clip_ratio", "float", ">0", configs=("cpu_drgrpo",)),
    Key(ARO + "actor.optim.lr", "float", ">0"),
    Key(ARO + "actor.optim.weight_decay", "float", "finite"),
    Key(ARO + "actor.policy_loss.is_ratio_max", "float", ">=1", configs=("cpu_tb_pg",)),
    # actor_rollout_ref.rollout.*
    Key(ARO + "rollout.n", "int", ">=2", configs=TB),  # a VarGrad group
    Key(ARO + "rollout.n", "int", ">=1", configs=("cpu_drgrpo",)),  # n=1: verl's GRPO scores a group of one as is
    Key(ARO + "rollout.temperature", "float", ">0"),
    Key(ARO + "rollout.top_p", "float", "(0,1]"),
    Key(ARO + "rollout.name", "str", "hfcpu"),
    Key(ARO + "rollout.calculate_log_probs", "bool"),
    Key(ARO + "rollout.log_prob_micro_batch_size_per_gpu", "int", ">0"),
    # trainer.* and trainer.v1.*
    Key("trainer.total_training_steps", "int", ">0", True),
    Key("trainer.total_epochs", "int", ">0"),
    Key("trainer.n_gpus_per_node", "int", ">0"),
    Key("trainer.nnodes", "int", ">0"),
    Key("trainer.v1.trainer_mode", "str", "tba_sync|tba_colocate_async|tba_separate_async"),
    # any number: verl takes <= 0 as none, a fraction of a batch as fewer prompts
    Key("trainer.v1.colocate_async.num_warmup_batches", "float", "", configs=("cpu_tba",)),
    Key("trainer.v1.separate_async.num_warmup_batches", "float", "", configs=("cpu_tba_decoupled",)),
    Key("trainer.v1.separate_async.parameter_sync_step", "int", ">=1", configs=("cpu_tba_decoupled",)),
    # data.*
    Key("data.train_batch_size", "int", ">0"),
    Key("data.max_prompt_length", "int", ">0"),
    Key("data.max_response_length", "int", ">0"),
    Key("data.gen_batch_size", "int", ">0", True),
    Key("data.train_max_samples", "int"),  # any int: <= 0 means every row
    Key("data.shuffle", "bool"),
    Key("data.seed", "int", "", True),  # null: verl seeds from the clock
    Key("data.prompt_key", "str", "prompt"),
]


def bad_values(key: Key) -> list[tuple[str, str]]:
    """(override value, what is wrong with it) for a key: wrong types, null where it is not valid, out of range."""
    out = []
    if key.type == "int":
        out += [("abc", "a string"), ("'8'", "a quoted number"), ("[1,2]", "a list"), ("2.5", "a float")]
        out += [("true", "a bool"), ("{a:1}", "a dict")]
        out += {">0": [("0", "zero"), ("-3", "negative")], ">=0": [("-1", "negative")]}.get(key.range, [])
        out += {">=1": [("0", "zero"), ("-2", "negative")], ">=2": [("1", "below 2"), ("0", "zero")]}.get(key.range, [])
    elif key.type == "float":
        out += [("abc", "a string"), ("'0.5'", "a quoted number"), ("[0.5]", "a list"), ("true", "a bool")]
        out += [("nan", "NaN"), ("-inf", "-infinite")] + ([] if key.inf else [("inf", "infinite")])
        out += {
            ">0": [("0", "zero"), ("-0.5", "negative")],
            ">=0": [("-0.5", "negative")],
            ">=1": [("0.5", "below 1"), ("0", "zero")],
            "[0,1]": [("1.5", "above 1"), ("-0.1", "negative")],
            "[0,1)": [("1.0", "1"), ("-0.1", "negative")],
            "(0,1]": [("0", "zero"), ("1.5", "above 1")],
        }.get(key.range, [])
    elif key.type == "bool":
        # 0 / 1 are left out: Python, omegaconf and verl all read them as the bool they stand for
        out += [("abc", "a string"), ("'false'", "a quoted bool (truthy)"), ("[true]", "a list"), ("0.5", "a float")]
    else:
        out += [("nope_" + key.key.rsplit(".", 1)[1][:6], "an unknown value"), ("3", "an int"), ("[a]", "a list")]
    if not key.null:
        out.append(("null", "null"))
    return out


def typo(rng: random.Random, name: str) -> str:
    """A misspelling of one key name: a letter dropped, doubled or swapped with the next."""
    if len(name) < 3:
        return name + name[-1]
    for _ in range(20):
        i = rng.randrange(1, len(name) - 1)
        kind = rng.choice(("drop", "double", "swap"))
        if kind == "drop":
            bad = name[:i] + name[i + 1 :]
        elif kind == "double":
            bad = name[:i] + name[i] + name[i:]
        else:
            bad = name[:i] + name[i + 1] + name[i] + name[i + 2 :]
        if bad != name and "__" not in bad and not bad.startswith("_") and not bad.endswith("_"):
            return bad
    return name + "x"


# keys misspelled, with the configs that have them
MISSPELL = [
    ("tba.ref_reset_every", TB),
    ("tba.beta.anneal_steps", TB),
    ("tba.lr_schedule.min_lr_ratio", TB),
    (SK + "recency_prob", REPLAY),
    (SK + "max_staleness", REPLAY),
    ("algorithm.kl_ctrl.kl_coef", TB),
    ("algorithm.use_kl_in_reward", CONFIGS),
    ("algorithm.rollout_correction.rollout_is", CONFIGS),
    (ARO + "actor.ppo_mini_batch_size", CONFIGS),
    (ARO + "actor.optim.lr", CONFIGS),
    (ARO + "actor.policy_loss.loss_mode", CONFIGS),
    (ARO + "rollout.temperature", CONFIGS),
    (ARO + "rollout.n", CONFIGS),
    ("data.max_prompt_length", CONFIGS),
    ("data.train_batch_size", CONFIGS),
    ("trainer.total_training_steps", CONFIGS),
    ("trainer.v1.trainer_mode", CONFIGS),
    ("trainer.v1.separate_async.parameter_sync_step", ("cpu_tba_decoupled",)),
]

# (label, config, overrides, names: the refusal names one of these keys; a list inside names all of them)
CONTRADICTIONS = [
    ("tb loss_mode, grpo estimator", "cpu_tb", ["algorithm.adv_estimator=grpo"], ["algorithm.adv_estimator"]),
    (
        "tb_pg loss_mode, tb estimator",
        "cpu_tb_pg",
        ["algorithm.adv_estimator=tb"],
        ["algorithm.adv_estimator"],
    ),
    (
        "tb estimator, vanilla loss_mode",
        "cpu_tb",
        [ARO + "actor.policy_loss.loss_mode=vanilla"],
        [ARO + "actor.policy_loss.loss_mode"],
    ),
    (
        "tb estimator on the Dr. GRPO config",
        "cpu_drgrpo",
        ["algorithm.adv_estimator=tb", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.05"],
        [ARO + "actor.policy_loss.loss_mode"],
    ),
    ("tb loss on Dr. GRPO", "cpu_drgrpo", [ARO + "actor.policy_loss.loss_mode=tb"], ["algorithm.adv_estimator"]),
    ("tb without KL in reward", "cpu_tb", ["algorithm.use_kl_in_reward=false"], ["algorithm.use_kl_in_reward"]),
    ("tb with KL loss", "cpu_tba", [ARO + "actor.use_kl_loss=true"], [ARO + "actor.use_kl_loss"]),
    ("tb with low_var_kl", "cpu_tb_pg", ["algorithm.kl_penalty=low_var_kl"], ["algorithm.kl_penalty"]),
    ("tb with adaptive kl", "cpu_tb", ["algorithm.kl_ctrl.type=adaptive"], ["algorithm.kl_ctrl.type"]),
    ("tb with bypass mode", "cpu_tba", ["algorithm.rollout_correction.bypass_mode=true"], ["bypass_mode"]),
    ("tb with one sample", "cpu_tba_decoupled", [ARO + "rollout.n=1"], [ARO + "rollout.n"]),
    (
        "mini-batch not dividing the batch",
        "cpu_tb",
        [ARO + "actor.ppo_mini_batch_size=3"],
        [ARO + "actor.ppo_mini_batch_size"],
    ),
    (
        "mini-batch not dividing the batch (Dr. GRPO)",
        "cpu_drgrpo",
        [ARO + "actor.ppo_mini_batch_size=5"],
        [ARO + "actor.ppo_mini_batch_size"],
    ),
    (
        "mini-batch above the batch",
        "cpu_drgrpo",
        [ARO + "actor.ppo_mini_batch_size=16", ARO + "actor.ppo_micro_batch_size_per_gpu=16"],
        [ARO + "actor.ppo_mini_batch_size"],
    ),
    (
        "decoupled k not dividing the batch",
        "cpu_tba_decoupled",
        ["trainer.v1.separate_async.parameter_sync_step=3"],
        ["trainer.v1.separate_async.parameter_sync_step"],
    ),
    (
        "decoupled k x mini-batch != batch",
        "cpu_tba_decoupled",
        ["trainer.v1.separate_async.parameter_sync_step=4"],
        ["trainer.v1.separate_async.parameter_sync_step"],
    ),
    (
        "decoupled batch != k x mini-batch",
        "cpu_tba_decoupled",
        ["data.train_batch_size=24"],
        ["trainer.v1.separate_async.parameter_sync_step"],
    ),
    ("staleness cap below k - 1", "cpu_tba_decoupled", [SK + "max_staleness=0"], [SK + "max_staleness"]),
    (
        "staleness cap below k - 1 (k=4)",
        "cpu_tba_decoupled",
        [
            "trainer.v1.separate_async.parameter_sync_step=4",
            ARO + "actor.ppo_mini_batch_size=4",
            SK + "max_staleness=2",
        ],
        [SK + "max_staleness"],
    ),
    ("S below rollout.n", "cpu_tba", [SK + "samples_per_prompt=3"], [SK + "samples_per_prompt"]),
    (
        "S above n in verl's own mode",
        "cpu_tba",
        [SK + "samples_per_prompt=8", "trainer.v1.trainer_mode=colocate_async"],
        [SK + "samples_per_prompt"],
    ),
    ("capacity below one generation", "cpu_tba", [SK + "per_prompt_capacity=2"], [SK + "per_prompt_capacity"]),
    ("searcher queue without searchers", "cpu_tba", ["+tba.searcher_queue_prompts=16"], ["tba.searcher_queue_prompts"]),
    (
        "searcher queue below one fetch",
        "cpu_tba_decoupled",
        ["tba.searcher_queue_prompts=8"],
        ["tba.searcher_queue_prompts"],
    ),
    (
        "pacing without a queue",
        "cpu_tb",
        ["tba.searcher_prompts_per_consumed=1.0"],
        ["tba.searcher_prompts_per_consumed"],
    ),
    ("EMA without resets", "cpu_tb", ["tba.ref_ema=0.5"], ["tba.ref_ema"]),
    (
        "reset inside an update call",
        "cpu_tb",
        [ARO + "actor.ppo_mini_batch_size=4", ARO + "actor.ppo_micro_batch_size_per_gpu=4", "tba.ref_reset_every=3"],
        ["tba.ref_reset_every"],
    ),
    (
        "reference resets with LoRA",
        "cpu_tb_pg",
        [ARO + "model.lora_rank=8"],
        ["tba.ref_reset_every"],
    ),
    ("tb_pg without rollout IS", "cpu_tb_pg", ["algorithm.rollout_correction.rollout_is=null"], ["rollout_is"]),
    ("tb_pg with sequence IS", "cpu_tb_pg", ["algorithm.rollout_correction.rollout_is=sequence"], ["rollout_is"]),
    (
        "tb_pg with truncating IS",
        "cpu_tb_pg",
        ["algorithm.rollout_correction.rollout_is_threshold=2.0"],
        ["algorithm.rollout_correction.rollout_is_threshold"],
    ),
    (
        "tb_pg with IS batch normalisation",
        "cpu_tb_pg",
        ["algorithm.rollout_correction.rollout_is_batch_normalize=true"],
        ["rollout_is_batch_normalize"],
    ),
    (
        "tb_pg without rollout log-probs",
        "cpu_tb_pg",
        [ARO + "rollout.calculate_log_probs=false"],
        [ARO + "rollout.calculate_log_probs"],
    ),
    ("tb_pg without a loss scale", "cpu_tb_pg", [ARO + "actor.loss_scale_factor=null"], ["loss_scale_factor"]),
    ("tb with rollout IS", "cpu_tb", ["algorithm.rollout_correction.rollout_is=token"], ["rollout_is"]),
    (
        "wsd with verl's schedule",
        "cpu_tb",
        ["tba.lr_schedule.name=wsd", ARO + "actor.optim.lr_scheduler_type=cosine"],
        ["lr_scheduler_type"],
    ),
    (
        "wsd with verl's warmup",
        "cpu_tba",
        ["tba.lr_schedule.name=wsd", ARO + "actor.optim.lr_warmup_steps=5"],
        ["lr_warmup_steps"],
    ),
    ("fused with an entropy bonus", "cpu_tb", [ARO + "actor.entropy_coeff=0.01"], [ARO + "actor.entropy_coeff"]),
    ("fused with shuffled mini-batches", "cpu_tba", [ARO + "actor.shuffle=true"], [ARO + "actor.shuffle"]),
    (
        "fused micro-batch splitting a group",
        "cpu_tb",
        [ARO + "actor.ppo_micro_batch_size_per_gpu=6"],
        [ARO + "actor.ppo_micro_batch_size_per_gpu"],
    ),
    ("rollout.n not dividing the micro-batch", "cpu_tb_pg", [ARO + "rollout.n=3"], ["ppo_micro_batch_size_per_gpu"]),
    (
        "fused dynamic batch too small for a group",
        "cpu_tb",
        [ARO + "actor.use_dynamic_bsz=true", ARO + "actor.ppo_max_token_len_per_gpu=64"],
        [ARO + "actor.ppo_max_token_len_per_gpu"],
    ),
    (
        "batch above the rows",
        "cpu_tb",
        ["data.train_batch_size=512", ARO + "actor.ppo_mini_batch_size=512"],
        ["data.train_batch_size"],
    ),
    ("train_max_samples below a batch", "cpu_tb", ["data.train_max_samples=4"], ["data.train_max_samples"]),
    ("verl's sync with too few rows", "cpu_drgrpo", ["data.train_max_samples=4"], ["data.train_max_samples"]),
    (
        "decoupled mode on the hybrid engine",
        "cpu_tb",
        ["trainer.v1.trainer_mode=tba_separate_async"],
        ["trainer.v1.separate_async.parameter_sync_step", ARO + "rollout.nnodes"],
    ),
    ("a GPU rollout on CPU", "cpu_tba", [ARO + "rollout.name=sglang"], [ARO + "rollout.name"]),
    ("FSDP1 on CPU", "cpu_drgrpo", [ARO + "actor.strategy=fsdp"], [ARO + "actor.strategy"]),
    (
        "flash attention without flash-attn",
        "cpu_tb",
        [ARO + "model.override_config.attn_implementation=flash_attention_2"],
        [ARO + "model.override_config.attn_implementation"],
    ),
    ("model dir missing", "cpu_tb", [ARO + "model.path=/nonexistent/model"], [ARO + "model.path"]),
    ("train file missing", "cpu_tba", ["data.train_files=/nonexistent/train.parquet"], ["data.train_files"]),
    ("val file missing", "cpu_drgrpo", ["data.val_files=/nonexistent/test.parquet"], ["data.val_files"]),
    ("prompt column missing", "cpu_tb", ["data.prompt_key=question"], ["data.prompt_key"]),
    ("both micro-batch sizes", "cpu_drgrpo", ["+" + ARO + "actor.ppo_micro_batch_size=8"], ["ppo_micro_batch_size"]),
]

# malformed data rows: (mutation, what the refusal names besides the file's key: the row, or a column)
ROW_MUTATIONS = [
    "prompt_null",
    "prompt_empty",
    "prompt_content_empty",
    "prompt_content_null",
    "prompt_role_null",
    "prompt_role_empty",
    "reward_model_null",
    "ground_truth_null",
    "ground_truth_nan",
    "ground_truth_empty_rule",
    "data_source_null",
    "data_source_empty",
    "data_source_unknown",
    # a prompt longer than data.max_prompt_length is left out: verl's agent loop left-truncates it with a warning
]
FILE_MUTATIONS = [
    "no_prompt_column",
    "no_reward_model_column",
    "no_data_source_column",
    "prompt_strings",
    "reward_model_strings",
    "empty",
    "not_parquet",
]


def generate(n: int, seed: int) -> list[Case]:
    """``n`` bad cases from ``random.Random(seed)``: every template (key x bad value, misspelling, contradiction,
    data mutation) once, in a seeded order, before any repeats with other configs, rows and misspellings."""
    rng = random.Random(seed)
    templates = []
    for key in KEYS:
        for value, why in bad_values(key):
            templates.append(("value", key, value, why))
    for key, configs in MISSPELL:
        templates += [("misspell", key, configs, "+"), ("misspell", key, configs, "")]
    templates += [("contradiction", *c) for c in CONTRADICTIONS]
    templates += [("interpolation", key) for key in KEYS[::7]]
    data = []
    for split in ("train_files", "val_files"):
        data += [("row", m, split) for m in ROW_MUTATIONS] + [("file", m, split) for m in FILE_MUTATIONS]
    rng.shuffle(templates)
    rng.shuffle(data)
    cases = []
    for i in range(n):  # every DATA_EVERY-th case breaks a data file
        pool, j = (data, i // DATA_EVERY) if i % DATA_EVERY == DATA_EVERY - 1 else (templates, i - i // DATA_EVERY)
        cases.append(make_case(rng, pool[j % len(pool)]))
    return cases


DATA_EVERY = 6


def template_counts() -> tuple[int, int]:
    """(config templates, data templates): ``generate`` covers every one once n reaches DATA_EVERY x data's."""
    config = sum(len(bad_values(k)) for k in KEYS) + 2 * len(MISSPELL) + len(CONTRADICTIONS) + len(KEYS[::7])
    return config, 2 * (len(ROW_MUTATIONS) + len(FILE_MUTATIONS))


def make_case(rng: random.Random, template) -> Case:
    kind = template[0]
    if kind == "value":
        _, key, value, why = template
        config = rng.choice(key.configs)
        plus = "++" if key.key.startswith(SK) else ""  # sampler_kwargs holds only the keys a config sets
        return Case(f"{key.key}={value} ({why})", config, [f"{plus}{key.key}={value}"], [key.key])
    if kind == "misspell":
        _, key, configs, plus = template
        *parents, name = key.split(".")
        bad = ".".join([*parents, typo(rng, name)])
        return Case(f"misspelled {plus}{bad}", rng.choice(configs), [f"{plus}{bad}=1"], [bad])
    if kind == "contradiction":
        _, label, config, overrides, names = template
        return Case(label, config, list(overrides), list(names))
    if kind == "interpolation":
        key = template[1]
        config = rng.choice(key.configs)
        return Case(f"{key.key}: dangling interpolation", config, [f"{key.key}=${{nope.missing}}"], [key.key])
    _, mutation, split = template
    config = rng.choice(CONFIGS)
    row = rng.randrange(0, ROWS[split]) if kind == "row" else 0
    names = [f"data.{split}"] + ([f"row {row + 1}"] if kind == "row" else [])
    names += {
        "no_prompt_column": ["'prompt'"],
        "no_reward_model_column": ["'reward_model'"],
        "no_data_source_column": ["'data_source'"],
        "empty": ["no rows"],
        "not_parquet": ["not a readable parquet"],
        "prompt_strings": ["row 1"],
        "reward_model_strings": ["row 1"],
    }.get(mutation, [])
    data = {"split": split, "mutation": mutation, "row": row}
    return Case(f"data.{split}: {mutation}" + (f" at row {row + 1}" if kind == "row" else ""), config, [], names, data)


# rows of the files the data cases break (enough for every config's batch)
ROWS = {"train_files": 64, "val_files": 16}


def mutate_rows(frame, mutation: str, row: int):
    """A copy of a verl parquet frame (arith task) with one row, or the file's layout, broken."""
    frame = frame.copy(deep=True)
    prompts = [copy.deepcopy(list(p)) for p in frame["prompt"]]
    rewards = [dict(r) for r in frame["reward_model"]]
    if mutation == "prompt_null":
        prompts[row] = None
    elif mutation == "prompt_empty":
        prompts[row] = []
    elif mutation.startswith("prompt_content_") or mutation.startswith("prompt_role_"):
        field = "content" if "content" in mutation else "role"
        prompts[row][0][field] = None if mutation.endswith("null") else ""
    elif mutation == "reward_model_null":
        rewards[row] = None
    elif mutation == "ground_truth_null":
        rewards[row]["ground_truth"] = None
    elif mutation == "ground_truth_nan":  # a numeric column (float ground truths), one NaN
        rewards = [{**r, "ground_truth": float(r["ground_truth"])} for r in rewards]
        rewards[row]["ground_truth"] = float("nan")
    elif mutation == "ground_truth_empty_rule":
        rewards[row]["ground_truth"] = ""
    elif mutation.startswith("data_source_"):
        frame.loc[row, "data_source"] = {"null": None, "empty": "", "unknown": "tba_ext/arithmetic"}[
            mutation.removeprefix("data_source_")
        ]
    elif mutation.startswith("no_") and mutation.endswith("_column"):
        return frame.drop(columns=[mutation.removeprefix("no_").removesuffix("_column")])
    elif mutation == "prompt_strings":
        prompts = [p[0]["content"] for p in prompts]
    elif mutation == "reward_model_strings":
        rewards = [str(r["ground_truth"]) for r in rewards]
    elif mutation == "empty":
        return frame.iloc[:0]
    frame["prompt"] = prompts
    frame["reward_model"] = rewards
    return frame


class Checker:
    """Runs the checks ``tba-ext train`` runs before Ray (``check_overrides_are_read``, ``compose``,
    ``preflight``) on a case, over a tiny model and arith data built once under ``root``."""

    def __init__(self, root: str):
        import pandas as pd

        from tba_ext.tasks.data import corpus_for, write_task
        from tba_ext.tools.models import ModelSpec, make_model

        self.root = root
        if not os.path.exists(os.path.join(root, "model", "config.json")):
            make_model(os.path.join(root, "model"), corpus_for("arith", 0), ModelSpec(size="tiny", seed=0))
        if not os.path.exists(os.path.join(root, "data", "test.parquet")):
            write_task("arith", os.path.join(root, "data"), ROWS["train_files"], ROWS["val_files"], seed=0)
        self.frames = {
            split: pd.read_parquet(os.path.join(root, "data", f"{name}.parquet"))
            for split, name in (("train_files", "train"), ("val_files", "test"))
        }
        self.bases: dict = {}

    def overrides(self, case: Case) -> list[str]:
        extra = [f"run_dir={self.root}"]
        if case.data:
            extra.append(f"data.{case.data['split']}={self.write(case)}")
        return extra + case.overrides

    def write(self, case: Case) -> str:
        split, mutation, row = case.data["split"], case.data["mutation"], case.data["row"]
        path = os.path.join(self.root, "bad", f"{split}_{mutation}_{row}.parquet")
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if mutation == "not_parquet":
                with open(path, "wb") as f:
                    f.write(b"prompt,reward_model\nnot,parquet\n")
            else:
                mutate_rows(self.frames[split], mutation, row).to_parquet(path)
        return path

    def check(self, case: Case) -> None:
        """The checks, raising what they raise."""
        from tba_ext.tools.config import check_overrides_are_read, compose, preflight

        overrides = self.overrides(case)
        check_overrides_are_read(case.config, overrides)
        preflight(compose(case.config, overrides))

    def outcome(self, case: Case) -> dict:
        """{"outcome": one of NAMED / UNNAMED / ACCEPTED / OUTSIDE / CHAINED, "error", "raised_at"}."""
        self.overrides(case)  # builds a data case's file: the harness's own errors are not an outcome
        try:
            self.check(case)
        except Exception as exc:  # every end is classified
            return classify(case, exc)
        return {"outcome": ACCEPTED, "error": None, "raised_at": None}

    @contextlib.contextmanager
    def fast_compose(self):
        """Hydra composes a config in ~0.5 s on a busy 2-core machine: compose each config's base once and apply a
        case's overrides to a copy with hydra's own override parser and ``_apply_overrides_to_config`` (what
        hydra's compose runs after loading the defaults list; no case overrides a config group). The checks only
        read the composed config, so the base and the last composed config are handed out again as they are; and
        omegaconf's parse of an interpolation string (an ANTLR parse, most of the time spent resolving verl's
        config) is remembered: the same few hundred strings recur in every case."""
        from unittest import mock

        import omegaconf._utils
        import omegaconf.base
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from omegaconf import OmegaConf

        from tba_ext.tools import config as config_module

        real = config_module.hydra_compose_at
        last: dict = {}

        def fast(config_dir: str, name: str, overrides: list[str]):
            hydra_lines = [o for o in overrides if o.startswith("hydra.")]
            case_lines = [o for o in overrides if o not in hydra_lines]
            key = (config_dir, name, tuple(hydra_lines))
            if key not in self.bases:
                self.bases[key] = real(config_dir, name, hydra_lines)
            if not case_lines:
                return self.bases[key]
            if last.get("key") != (key, tuple(case_lines)):
                cfg = copy.deepcopy(self.bases[key])
                ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides(case_lines), cfg)
                last.update(key=(key, tuple(case_lines)), cfg=cfg)
            return last["cfg"]

        parse = functools.lru_cache(maxsize=None)(omegaconf.base.parse)
        containers: dict = {}
        bases = self.bases

        class CachingOmegaConf:
            """``check_overrides_are_read`` turns the same base config into a container in every case, and only
            reads it: each base's container is made once."""

            def __getattr__(self, name):
                return getattr(OmegaConf, name)

            @staticmethod
            def to_container(cfg, resolve=False, **kwargs):
                if kwargs or not any(cfg is b for b in bases.values()):
                    return OmegaConf.to_container(cfg, resolve=resolve, **kwargs)
                key = (id(cfg), resolve)
                if key not in containers:
                    containers[key] = OmegaConf.to_container(cfg, resolve=resolve)
                return containers[key]

        with (
            mock.patch.object(config_module, "OmegaConf", CachingOmegaConf()),
            mock.patch.object(config_module, "hydra_compose_at", fast),
            mock.patch.object(omegaconf.base, "parse", parse),
            mock.patch.object(omegaconf._utils, "parse", parse),
        ):
            yield


def raised_at(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def in_tba_ext(location: str) -> bool:
    return f"{os.sep}tba_ext{os.sep}" in location and f"{os.sep}site-packages{os.sep}verl" not in location


def names_all(message: str, names: list[str]) -> bool:
    """Whether the message holds every name (a row as a whole word: row 1 is not row 12)."""
    for name in names:
        if name.startswith("row "):
            if not re.search(rf"\b{re.escape(name)}\b", message):
                return False
        elif name not in message:
            return False
    return True


def classify(case: Case, exc: Exception) -> dict:
    where = raised_at(exc)
    message = f"{type(exc).__name__}: {exc}"
    result = {"error": message[:600], "raised_at": where}
    if exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__):
        chained = exc.__cause__ or exc.__context__
        return {**result, "outcome": CHAINED, "chained": f"{type(chained).__name__}: {str(chained)[:300]}"}
    if not isinstance(exc, ALLOWED) or not in_tba_ext(where):
        return {**result, "outcome": OUTSIDE}
    # a data case names the file's key and the row (or column); a config case one of its keys
    ok = names_all(str(exc), case.names) if case.data else any(names_all(str(exc), [n]) for n in case.names)
    return {**result, "outcome": NAMED if ok else UNNAMED}


def run_cases(checker: Checker, cases: list[Case]) -> tuple[Counter, list[dict]]:
    """Counts per outcome and the failures (every outcome but NAMED)."""
    counts, failures = Counter(), []
    with checker.fast_compose():
        for case in cases:
            result = checker.outcome(case)
            counts[result["outcome"]] += 1
            if result["outcome"] != NAMED:
                failures.append({"case": case.label, "config": case.config, "overrides": case.overrides, **result})
    return counts, failures
