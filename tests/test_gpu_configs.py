"""The GPU configs compose with verl's own trainer configs and pass verl's validation and ours, without
launching anything (Megatron/vLLM cannot run here)."""

import os
import re

import pytest
import verl  # noqa: F401
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from tba_ext.adapters.checks import check_tba_run
from tba_ext.tools.config import GPU_CONFIG_DIR as CONFIG_DIR
from tba_ext.tools.config import compose as tba_compose
from tba_ext.tools.config import list_configs

GPU_CONFIGS = sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml") and not f.startswith("_"))


def test_gpu_configs_ship_in_the_package_and_tba_ext_train_finds_them():
    assert os.path.samefile(os.path.join(os.path.dirname(__file__), "..", "configs"), CONFIG_DIR)  # repo link
    assert CONFIG_DIR.startswith(os.path.dirname(__import__("tba_ext").__file__))
    assert set(GPU_CONFIGS) <= set(list_configs()) and len(GPU_CONFIGS) == 7
    with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):  # as verl's main_ppo
        direct = OmegaConf.to_container(compose(config_name="tba_qwen2.5-7b_gsm8k_fsdp2"), resolve=True)
    via_cli = OmegaConf.to_container(tba_compose("tba_qwen2.5-7b_gsm8k_fsdp2", []), resolve=True)
    assert via_cli == direct and via_cli["algorithm"]["adv_estimator"] == "tb"


def test_tba_ext_configs_prints_the_folder_for_verls_launcher(capsys):
    from tba_ext.cli import main

    assert main(["configs", "--path", "tba_rhomath-1b_gsm8k"]) == 0
    assert capsys.readouterr().out.strip() == CONFIG_DIR
    assert main(["configs"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in GPU_CONFIGS) and "cpu_tba_decoupled" in listing


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_gpu_config_composes_and_validates(name):
    with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):
        cfg = compose(config_name=name)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    plain = OmegaConf.to_container(cfg, resolve=True)
    check_tba_run(plain)
    assert plain["actor_rollout_ref"]["rollout"]["name"] == "vllm"
    # verl's separate_async contract, checked in its trainer constructor
    if plain["trainer"]["v1"]["trainer_mode"] in ("separate_async", "tba_separate_async"):
        k = plain["trainer"]["v1"]["separate_async"]["parameter_sync_step"]
        assert plain["data"]["train_batch_size"] == k * plain["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"]


# Where a TBA config and its Dr. GRPO twin may differ, key prefix -> why. Everything else (data, model, rollout,
# engines, optimizer, trainer layout, seeds) must be the same, compared over the whole composed config.
INTENDED_TWIN_DIFFERENCES = {
    "algorithm.adv_estimator": "the algorithm",
    "algorithm.kl_ctrl.kl_coef": "TB's beta; Dr. GRPO has no KL term (use_kl_in_reward false)",
    "algorithm.use_kl_in_reward": "TB's reference log-probs enter through verl's KL-in-reward",
    "algorithm.norm_adv_by_std_in_grpo": "Dr. GRPO: no std normalisation",
    "algorithm.rollout_correction.": "TBA' weights tokens by pi_theta / pi_rollout (token-level rollout IS)",
    "actor_rollout_ref.actor.policy_loss.": "the loss",
    "actor_rollout_ref.actor.loss_agg_mode": "TB is a per-sequence loss (its aggregation is its own)",
    "critic.loss_agg_mode": "interpolated from the actor's (no critic runs)",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "the fused TB update holds one whole group of K",
    "tba.": "TBA's own settings",
    "trainer.v1.trainer_mode": "the tba_* mode around verl's",
    "trainer.v1.sampler.": "TBA's replay buffer vs verl's staleness-filtered sampler",
    "trainer.experiment_name": "names",
    "trainer.default_local_dir": "names",
    "actor_rollout_ref.rollout.trace.experiment_name": "names",
}


def flatten(node, prefix=""):
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    return {k: v for key, value in node.items() for k, v in flatten(value, f"{prefix}{key}.").items()}


@pytest.mark.parametrize(
    "tba,drgrpo",
    [
        ("tba_qwen2.5-7b_gsm8k_fsdp2", "drgrpo_qwen2.5-7b_gsm8k_fsdp2"),
        ("tba_qwen2.5-7b_math_megatron", "drgrpo_qwen2.5-7b_math_megatron"),
    ],
)
def test_tba_and_drgrpo_twins_differ_only_where_intended(tba, drgrpo):
    a, b = (flatten(OmegaConf.to_container(tba_compose(name, []), resolve=True)) for name in (tba, drgrpo))
    differing = sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))
    unintended = [
        f"{k}: {a.get(k, '<absent>')} vs {b.get(k, '<absent>')}"
        for k in differing
        if not any(k == p or (p.endswith(".") and k.startswith(p)) for p in INTENDED_TWIN_DIFFERENCES)
    ]
    assert not unintended, unintended
    assert "algorithm.adv_estimator" in differing  # they are different algorithms on the same everything else


def test_tldr_scores_with_verls_reward_model_and_redteam_with_its_scorers():
    def load(name):
        with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):
            return OmegaConf.to_container(compose(config_name=name), resolve=True)

    tldr = load("tba_pythia-1b_tldr")["reward"]
    assert tldr["reward_model"]["enable"] and tldr["reward_model"]["rollout"]["name"] == "vllm"
    # tba-ext's function posts the raw text to verl's served reward model (verl's own path applies a chat template)
    assert tldr["custom_reward_function"]["path"] == "pkg://tba_ext.tasks.rewards"
    assert tldr["custom_reward_function"]["reward_kwargs"]["reward_model_path"] == tldr["reward_model"]["model_path"]
    redteam = load("tba_gpt2_redteam")["reward"]["custom_reward_function"]
    assert redteam["path"] == "pkg://tba_ext.tasks.rewards"
    assert {"victim_model_path", "toxicity_model_path"} <= set(redteam["reward_kwargs"])


@pytest.mark.parametrize("name", ["tba_qwen2.5-7b_math_megatron", "drgrpo_qwen2.5-7b_math_megatron"])
def test_the_math_configs_reward_function_scores_math_rows(name):
    """verl loads reward.custom_reward_function and calls it on every validation row before training: MATH
    rows (tba-ext's prepare-data and verl's own MATH sources) must get a score, not an error."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    cfg = tba_compose(name, [])
    score = get_custom_reward_fn(cfg)  # as verl loads it
    for source in ("tba_ext/math", "HuggingFaceH4/MATH-500"):
        assert score(source, "so the answer is \\boxed{\\frac{1}{2}}", "0.5", {}) == 1.0
        assert score(source, "so the answer is \\boxed{2}", "0.5", {}) == 0.0


@pytest.mark.parametrize(
    "override, named",
    [
        ("+actor_rollout_ref.rollout.gpu_memory_utilizaton=0.5", "actor_rollout_ref.rollout.gpu_memory_utilizaton"),
        ("+actor_rollout_ref.actor.ppo_micro_batch_size_per_gpus=4", "ppo_micro_batch_size_per_gpus"),
        ("+trainer.v1.sampler.sampler_kwargs.recency_probb=0.5", "recency_probb"),
        ("+tba.ref_reset_everyy=5", "tba.ref_reset_everyy"),
        ("+trainer.fooo=1", "trainer.fooo (no code reads 'fooo')"),  # like no key there: no code has the name
        ("+actor_rollout_ref.model.override_config.attn_implementaton=sdpa", "no code reads 'attn_implementaton'"),
        ("++data.custom_flag.depth=2", "data.custom_flag.depth"),
    ],
)
def test_a_launch_refuses_an_override_nothing_reads_naming_it(override, named, monkeypatch, tmp_path):
    """A misspelled key added with ``+`` is named before Ray starts (verl builds its dataclasses from their fields and
    drops the rest; tba.* and the sampler's kwargs are read by tba-ext's own settings)."""
    from tba_ext.tools.config import check_overrides_are_read

    def launch_checks(name, overrides):  # what `tba-ext train` checks of the config before any file or Ray
        check_overrides_are_read(name, overrides)
        check_tba_run(OmegaConf.to_container(tba_compose(name, overrides), resolve=True))

    launch_checks("tba_qwen2.5-7b_gsm8k_fsdp2", ["actor_rollout_ref.rollout.gpu_memory_utilization=0.5"])
    # keys code reads that the composed config lacks: a transformers config field, a verl key read with .get()
    launch_checks(
        "tba_qwen2.5-7b_gsm8k_fsdp2",
        ["+actor_rollout_ref.model.override_config.rope_theta=10000", "+trainer.remove_previous_ckpt_in_save=false"],
    )
    with pytest.raises(ValueError, match=re.escape(named)):
        launch_checks("tba_qwen2.5-7b_gsm8k_fsdp2", [override])


def test_flash_attention_without_flash_attn_is_refused_before_ray_starts(monkeypatch):
    import importlib.util

    from tba_ext.tools.config import check_attention

    aro = OmegaConf.to_container(tba_compose("tba_qwen2.5-7b_gsm8k_fsdp2", []), resolve=True)["actor_rollout_ref"]
    assert aro["model"]["override_config"]["attn_implementation"] == "flash_attention_2"
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "flash_attn" else real_find_spec(n, *a))
    with pytest.raises(ValueError, match=r"attn_implementation=flash_attention_2 needs flash-attn"):
        check_attention(aro)
    aro["model"]["override_config"]["attn_implementation"] = "sdpa"
    check_attention(aro)


def llama_style_tokenizer(texts):
    """A tokenizer of the RhoMath SFT model's kind (Llama-2's, built offline): BOS ``<s>`` put before every text it
    encodes with special tokens, eos ``</s>``, no pad token, no chat template."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    from tba_ext.tools.models import train_tokenizer

    backend = train_tokenizer(texts, 512, chat_template=False).backend_tokenizer
    backend.add_special_tokens(["<s>", "</s>"])
    bos = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")


def test_rhomath_prompts_start_with_one_bos_as_its_sft_model_was_trained(tmp_path):
    """The config's prompt template through verl's own code: the ids the agent loop sends to the rollout (its
    Continuous Token builder) and the length verl's dataset filters on are the raw prompt after exactly one BOS, the
    tokenizer's plain encoding of the prompt (verl tokenizes the rendered template without adding special tokens).
    A tokenizer without a BOS gets the raw prompt."""
    import pandas as pd
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from tba_ext.tasks.gsm8k import PROMPT
    from tba_ext.tools.models import train_tokenizer

    kwargs = OmegaConf.to_container(tba_compose("tba_rhomath-1b_gsm8k", []).data.apply_chat_template_kwargs)
    messages = [{"role": "user", "content": PROMPT.format(question="Tom has 3 apples and buys 4. How many now?")}]
    tokenizer = llama_style_tokenizer([messages[0]["content"]] * 8)
    encoded = tokenizer(messages[0]["content"])["input_ids"]
    assert encoded[0] == tokenizer.bos_token_id and encoded.count(tokenizer.bos_token_id) == 1
    builder = create_continuous_token_builder(tokenizer, hf_model_type="llama", chat_template_kwargs=kwargs)
    assert builder.build_initial_tokens(messages) == encoded
    without_bos = train_tokenizer([messages[0]["content"]] * 8, 512, chat_template=False)  # GPT-2's kind: none
    assert without_bos.apply_chat_template(messages, tokenize=False, **kwargs) == messages[0]["content"]
    path = tmp_path / "train.parquet"
    pd.DataFrame([{"prompt": messages, "data_source": "tba_ext/gsm8k"}]).to_parquet(path)
    for limit, kept in ((len(encoded), 1), (len(encoded) - 1, 0)):  # the filter counts the one BOS, no second
        data_config = OmegaConf.create(
            {
                "max_prompt_length": limit,
                "apply_chat_template_kwargs": kwargs,
                "filter_overlong_prompts_workers": 1,
                "cache_dir": str(tmp_path / "cache"),
            }
        )
        assert len(RLHFDataset([str(path)], tokenizer, data_config)) == kept


def test_a_config_group_chosen_with_plus_is_not_taken_for_an_unread_key():
    """``+cpu_rollout=vllm`` picks a config group (hydra merges it): no key of that name is added, so nothing to
    refuse."""
    from tba_ext.tools.config import check_overrides_are_read

    check_overrides_are_read("cpu_tba", ["+cpu_rollout=vllm"])
    with pytest.raises(ValueError, match="no code reads 'fooo'"):
        check_overrides_are_read("cpu_tba", ["+cpu_rollout=vllm", "+trainer.fooo=1"])
