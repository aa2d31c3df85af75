"""A rehearsal of each GPU config on CPU: the config composed as a GPU user composes it (`tba-ext train --config
NAME` with MODEL_PATH / DATA_DIR and the other variables its README names), the model and scorers swapped for tiny
offline ones with the real ones' tokenizer kind (Qwen: a ChatML template, pad and eos set; RhoMath, Pythia, GPT-2:
no template, no pad token), the CPU runtime on, and run through data loading, the reward function, verl's
validation before training and one global step of updates (its k local updates and the weight sync after them).
What the CPU cannot hold is scaled down by the ``cpu_scale`` overrides below and nothing else: devices, batch and
group sizes, lengths, the rollout backend and the weight-sync engine. The Megatron configs go as far as the engine
(Megatron cannot run here): composed, checked, their data loaded through verl's dataset with the tokenizer, their
reward function on their rows."""

import json
import math
import os

import pandas as pd
import pytest
from omegaconf import OmegaConf

from tba_ext.tasks.data import corpus_for, write_task
from tba_ext.tools.models import ModelSpec, make_model

QUESTIONS = [(a, b) for a in range(2, 12) for b in range(1, 6)]  # 40 train, 10 test


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """A GSM8K copy in the official layout, TL;DR posts, the red-team prompts, and one tiny model per tokenizer kind
    (with the TL;DR reward model, the red-team victim and toxicity classifier of the template-less kind)."""
    from test_tldr_redteam import POSTS

    root = tmp_path_factory.mktemp("rehearsal")
    gsm = root / "gsm8k_src"
    gsm.mkdir()
    for split, pairs in (("train", QUESTIONS[:40]), ("test", QUESTIONS[40:])):
        with open(gsm / f"{split}.jsonl", "w") as f:
            for a, b in pairs:
                q = f"Tom has {a} apples and buys {b} more. How many apples does he have?"
                f.write(json.dumps({"question": q, "answer": f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b}"}))
                f.write("\n")
    tldr = root / "tldr_src"
    tldr.mkdir()
    posts = [dict(p, title=f"{p['title']} ({i})") for i in range(16) for p in POSTS]  # 48 distinct posts
    for split in ("train", "validation"):
        (tldr / f"{split}.jsonl").write_text("\n".join(json.dumps(p) for p in posts) + "\n")
    data = {}
    for task, source in (("gsm8k", gsm), ("tldr", tldr), ("redteam", None)):
        data[task] = root / f"data_{task}"
        # 40 training prompts: a global step of 20 (k = 10 x 2) and the searchers' queue; the red-team rehearsal's 8
        # groups per micro-batch (its config's) draw 80 a step, over more than one epoch
        write_task(task, str(data[task]), 40, 8, 0, source=str(source) if source else None)
    texts = corpus_for("gsm8k", 0, str(gsm)) + corpus_for("tldr", 0, str(tldr)) + corpus_for("redteam", 0)
    models = {}
    for name, head, chat in (
        ("chatml", "lm", True),
        ("raw", "lm", False),
        ("rm", "reward", False),
        ("victim", "lm", False),
        ("toxicity", "toxicity", False),
    ):
        models[name] = root / f"model_{name}"
        make_model(str(models[name]), texts, ModelSpec(size="tiny", seed=0), head=head, chat_template=chat)
    return {"data": data, "models": models, "root": root}


# config -> (tokenizer kind, task, environment beyond MODEL_PATH / DATA_DIR, overrides a CPU reward path needs)
REHEARSALS = {
    "tba_qwen2.5-7b_gsm8k_fsdp2": ("chatml", "gsm8k", {}, []),
    "drgrpo_qwen2.5-7b_gsm8k_fsdp2": ("chatml", "gsm8k", {}, []),
    "tba_rhomath-1b_gsm8k": ("raw", "gsm8k", {}, []),
    # verl's reward-model server is a vLLM /classify server (GPU only): on CPU the same reward model scores
    # through tba-ext's reward function, whose validation scores the rehearsal checks against the model run directly
    "tba_pythia-1b_tldr": (
        "raw",
        "tldr",
        {"RM_PATH": "{rm}"},
        ["reward.reward_model.enable=false"],  # verl's vLLM reward server is GPU-only: the function scores locally
    ),
    "tba_gpt2_redteam": ("raw", "redteam", {"VICTIM_PATH": "{victim}", "TOXICITY_PATH": "{toxicity}"}, []),
}


# What a rehearsal replaces (key prefix -> why); anything else it changed would be a silent difference from the
# GPU run, which test_a_rehearsal_replaces_only_what_it_lists refuses
REPLACED = {
    "actor_rollout_ref.rollout.": "hfcpu generation with the Ray object-store weight sync, K = 4, one device",
    "actor_rollout_ref.model.": "no packed sequences or flash-attn (sdpa), no gradient checkpointing",
    "actor_rollout_ref.actor.use_torch_compile": "no torch.compile on CPU",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "fewer prompts per update",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "K = 4 per group, the config's groups per micro-batch",
    "actor_rollout_ref.actor.fsdp_config.": "fp32 (bf16 matmuls are slow on CPU)",
    "actor_rollout_ref.ref.": "fp32, its micro-batch",
    "data.": "fewer prompts per step (k x the update's), short prompts and responses, no dataloader workers",
    "trainer.": "one CPU node, one global step, no checkpoints, console logging",
    "tba.searcher_queue_prompts": "two of the smaller steps queued",
    "trainer.v1.sampler.sampler_kwargs.samples_per_prompt": "S follows K = 4",
    "trainer.v1.sampler.sampler_kwargs.min_buffer_groups": "no initial buffer (one step)",
    "reward.num_workers": "one reward worker",
    "reward.reward_model.enable": "verl's vLLM reward server is GPU-only: the reward function scores locally",
    "transfer_queue.": "one storage unit",
    "ray_kwargs.": "a small object store, no dashboard, logical devices for verl's resource pools",
}
REHEARSAL_K = 4  # responses per prompt on CPU


def micro_batch_plan(cfg) -> tuple[int, int]:
    """(ppo_micro_batch_size_per_gpu, ppo_mini_batch_size) at K = REHEARSAL_K with the config's own number of prompt
    groups per micro-batch (a fraction of one for Dr. GRPO's), and whole micro-batches per update."""
    actor = cfg.actor_rollout_ref.actor
    micro = max(1, REHEARSAL_K * int(actor.ppo_micro_batch_size_per_gpu) // int(cfg.actor_rollout_ref.rollout.n))
    mini = max(2, micro // REHEARSAL_K)
    assert mini * REHEARSAL_K % micro == 0, (micro, mini)
    return micro, mini


def cpu_scale(cfg, run_dir) -> list[str]:
    """Devices, sizes and backends a 2-core CPU machine holds (``REPLACED``); the config's algorithm, sampler,
    schedules, prompt template, reward and loss settings, k and groups per micro-batch are left as they are."""
    k = int(cfg.trainer.v1.separate_async.parameter_sync_step)
    micro, mini = micro_batch_plan(cfg)  # mini: prompts per update
    sampler = cfg.trainer.v1.sampler.get("sampler_kwargs") or {}
    return [
        "actor_rollout_ref.rollout.name=hfcpu",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=ray_object_store",
        "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=tba_ext.cpu.ray_checkpoint_engine",
        "actor_rollout_ref.rollout.load_format=auto",
        "actor_rollout_ref.rollout.free_cache_engine=false",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"actor_rollout_ref.rollout.n={REHEARSAL_K}",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "++actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.use_torch_compile=false",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        *(
            f"++actor_rollout_ref.{role}.fsdp_config.{key}=fp32"
            for role in ("actor", "ref")
            for key in ("model_dtype", "mixed_precision.param_dtype")
        ),
        f"data.train_batch_size={k * mini}",
        "data.max_prompt_length=256",
        "data.max_response_length=16",
        "data.dataloader_num_workers=0",
        *(["++trainer.v1.sampler.sampler_kwargs.samples_per_prompt=5"] if sampler.get("samples_per_prompt") else []),
        "++trainer.v1.sampler.sampler_kwargs.min_buffer_groups=null",
        *([f"tba.searcher_queue_prompts={2 * k * mini}"] if "tba" in cfg else []),
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.device=cpu",
        "trainer.logger=[console]",
        "trainer.total_training_steps=1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir}/checkpoints",
        "reward.num_workers=1",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "++ray_kwargs.ray_init.num_cpus=16",
        "++ray_kwargs.ray_init.num_gpus=2",
        "++ray_kwargs.ray_init.object_store_memory=300000000",
        "++ray_kwargs.ray_init.include_dashboard=false",
    ]


def as_a_gpu_user(monkeypatch, fixtures, kind, task, env):
    paths = {name: str(path) for name, path in fixtures["models"].items()}
    monkeypatch.setenv("MODEL_PATH", paths[kind])
    monkeypatch.setenv("DATA_DIR", str(fixtures["data"][task]))
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(**paths))
    return paths


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(REHEARSALS))
def test_gpu_config_rehearsed_on_cpu_validates_and_trains_a_step(name, fixtures, monkeypatch, tmp_path, margin):
    from tba_ext.tools import report
    from tba_ext.tools.config import compose
    from tba_ext.tools.launch import run_verl

    kind, task, env, reward_overrides = REHEARSALS[name]
    paths = as_a_gpu_user(monkeypatch, fixtures, kind, task, env)
    overrides = [o.format(**paths) for o in reward_overrides]
    overrides += cpu_scale(compose(name, overrides), tmp_path)
    overrides.append(f"trainer.validation_data_dir={tmp_path / 'val'}")  # what validation scored, row by row
    metrics = tmp_path / "metrics.jsonl"
    run_verl(name, overrides, log_path=str(tmp_path / "verl.log"), metrics_path=str(metrics), stall_timeout=600)
    records = report.read_metrics(str(metrics))
    steps = [r for r in records if "actor/pg_loss" in r["data"] or "actor/tb/residual_var" in r["data"]]
    assert len(steps) == 1, [sorted(r["data"])[:20] for r in records]
    assert any(key.startswith("val-") for r in records for key in r["data"]), "no validation before training"
    for r in steps:  # an untrained tiny model earns no reward, so the gradient may be 0: finite is the claim
        assert r["data"]["response_length/mean"] > 0 and math.isfinite(r["data"]["actor/grad_norm"])
        assert all(math.isfinite(v) for v in r["data"].values() if isinstance(v, float)), r["data"]
    if task == "tldr":
        every_score_is_the_reward_models_logit(fixtures, tmp_path / "val" / "0.jsonl", paths["rm"], margin)


def every_score_is_the_reward_models_logit(fixtures, dumped_path, rm, margin) -> None:
    """Each summary verl's reward worker scored at validation got the reward model's logit on that post and that
    summary, computed here directly (other padding: float32 rounding of a logit)."""
    from tba_ext.tasks import tldr
    from tba_ext.tasks.scorers import reward_model_scores

    posts = [r["extra_info"]["prompt_text"] for r in tldr.load_rows(str(fixtures["root"] / "tldr_src"), "validation")]
    dumped = [json.loads(line) for line in dumped_path.read_text().splitlines()]
    assert len(dumped) == 8  # the test split
    for row in dumped:
        post = [p for p in posts if p in row["input"]]
        assert len(post) == 1, row["input"]
        expected = reward_model_scores(str(rm), [tldr.rm_text(post[0], row["output"])])[0]
        margin("reward-model score gap", row["score"] - expected, 1e-4)


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["tba_rhomath-1b_gsm8k", "tba_pythia-1b_tldr", "tba_gpt2_redteam"])
def test_a_template_less_config_without_its_raw_prompt_template_is_refused(name, fixtures, monkeypatch):
    """What the rehearsals would meet on the template-less models without the configs' raw prompt template:
    verl would drop every row; the preflight refuses, naming the key."""
    from tba_ext.tools import config
    from tba_ext.tools.config import compose, preflight

    kind, task, env, reward_overrides = REHEARSALS[name]
    paths = as_a_gpu_user(monkeypatch, fixtures, kind, task, env)
    monkeypatch.setenv("TBA_EXT_CPU_RUNTIME", "off")  # as on the GPU node: only the template is at fault
    monkeypatch.setattr(config, "check_attention", lambda aro: None)  # the GPU node has flash-attn installed
    # the fixtures hold 40 rows, fewer than the TL;DR config's 500-prompt initial buffer, which preflight refuses
    no_initial_buffer = ["++trainer.v1.sampler.sampler_kwargs.min_buffer_groups=null"]
    cfg = compose(name, [o.format(**paths) for o in reward_overrides] + no_initial_buffer)
    preflight(cfg)
    OmegaConf.set_struct(cfg, False)
    del cfg.data.apply_chat_template_kwargs["chat_template"]
    with pytest.raises(ValueError, match="chat_template"):
        preflight(cfg)


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["tba_qwen2.5-7b_math_megatron", "drgrpo_qwen2.5-7b_math_megatron"])
def test_megatron_config_rehearsed_up_to_the_engine(name, fixtures, monkeypatch, tmp_path):
    """Composed as a GPU user does, checked by the preflight a GPU node runs, its data read by verl's own dataset
    with the (ChatML) tokenizer and the config's data settings, and its reward function scoring those rows."""
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from tba_ext.tasks.rewards import compute_score
    from tba_ext.tools.config import compose, load_tokenizer, preflight

    math_dir = tmp_path / "math_src"
    math_dir.mkdir()
    rows = [  # 100 problems: one global step of the Dr. GRPO twin's 64 prompts (verl's own loop divides by the count)
        {"problem": f"{ask} ${a}+{b}$?", "solution": f"It is $\\boxed{{{a + b}}}$."}
        for ask in ("What is", "How much is")
        for a, b in QUESTIONS
    ]
    for split in ("train", "test"):
        (math_dir / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    write_task("math", str(tmp_path / "data"), 64, 8, 0, source=str(math_dir))
    monkeypatch.setenv("MODEL_PATH", str(fixtures["models"]["chatml"]))
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("TBA_EXT_CPU_RUNTIME", "off")  # the GPU node's view: the CPU runtime's fsdp2-only rule is not
    cfg = compose(name, [])
    preflight(cfg)
    tokenizer = load_tokenizer(cfg.actor_rollout_ref.model.path)
    dataset = RLHFDataset(data_files=[cfg.data.train_files], tokenizer=tokenizer, config=cfg.data)
    assert len(dataset) == 64 and dataset[0]["raw_prompt"][0]["content"].startswith(("What is", "How much is"))
    plain = OmegaConf.to_container(cfg, resolve=True)
    fn = plain["reward"]["custom_reward_function"]
    assert fn["path"] == "pkg://tba_ext.tasks.rewards" and fn["name"] == "compute_score"
    for row in pd.read_parquet(os.path.join(str(tmp_path / "data"), "train.parquet")).itertuples():
        gold = row.reward_model["ground_truth"]
        assert compute_score(row.data_source, f"so \\boxed{{{gold}}}", gold, row.extra_info) == 1.0


def flat(node, prefix="") -> dict:
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in flat(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: node}


@pytest.mark.parametrize("name", sorted(REHEARSALS))
def test_a_rehearsal_replaces_only_what_it_lists_and_keeps_groups_per_micro_batch(name, tmp_path):
    """Every key a rehearsal changes from the config a GPU user composes is in ``REPLACED``; the algorithm, the
    sampler, the schedules, k and the number of prompt groups per micro-batch are the config's own."""
    from tba_ext.tools.config import compose

    overrides = [o.format(rm="rm") for o in REHEARSALS[name][3]]
    gpu_cfg, cpu_cfg = compose(name, []), compose(name, overrides + cpu_scale(compose(name, overrides), tmp_path))
    # unresolved: a value verl derives from another (${...}) changes with it, and is not a replacement of its own
    gpu_flat, cpu_flat = (flat(OmegaConf.to_container(c, resolve=False)) for c in (gpu_cfg, cpu_cfg))
    gpu, cpu = (OmegaConf.to_container(c, resolve=True) for c in (gpu_cfg, cpu_cfg))
    changed = {key for key in gpu_flat.keys() | cpu_flat.keys() if gpu_flat.get(key) != cpu_flat.get(key)}
    unlisted = sorted(key for key in changed if not any(key.startswith(prefix) for prefix in REPLACED))
    assert not unlisted, unlisted
    assert "algorithm.kl_ctrl.kl_coef" not in changed and cpu["algorithm"] == gpu["algorithm"]
    assert cpu.get("tba", {}).get("beta") == gpu.get("tba", {}).get("beta")
    k = "trainer.v1.separate_async.parameter_sync_step"
    assert cpu_flat[k] == gpu_flat[k]

    def groups_per_micro_batch(c):
        return c["actor_rollout_ref"]["actor"]["ppo_micro_batch_size_per_gpu"] / c["actor_rollout_ref"]["rollout"]["n"]

    assert groups_per_micro_batch(cpu) == groups_per_micro_batch(gpu)
