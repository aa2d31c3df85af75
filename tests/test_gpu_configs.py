"""The GPU configs compose with verl's own trainer configs and pass verl's validation and ours, without
launching anything (Megatron/vLLM cannot run here)."""

import os

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
    assert tldr["custom_reward_function"]["path"] is None  # verl's discriminative-RM path, not a rule
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
