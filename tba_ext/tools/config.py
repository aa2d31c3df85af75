"""Which config a run uses and whether it can run: compose a tba-ext config (or the user's YAML on top of ours)
with verl's, and check everything that can fail before Ray starts, each error naming the key or path at fault."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from importlib import resources

from omegaconf import OmegaConf

CONFIG_DIR = str(resources.files("tba_ext") / "configs")
# the GPU configs (verl + vLLM, multi-node): primary configs carrying their own hydra.searchpath; ``configs/`` in
# the repository links here
GPU_CONFIG_DIR = os.path.join(CONFIG_DIR, "gpu")


# verl's configs are found through the search path given at launch (hydra only takes one from the primary config
# or the command line), so a user's own YAML can build on ours: ``defaults: [cpu_tba, _self_]``
SEARCHPATH = "hydra.searchpath=[pkg://verl.trainer.config]"
USER_CONFIG_SEARCHPATH = "hydra.searchpath=[pkg://tba_ext.configs,pkg://verl.trainer.config]"


def config_location(config: str) -> tuple[str, str, list[str]]:
    """(config dir, config name, search-path override) for a packaged config name or a path to the user's YAML."""
    if config.endswith((".yaml", ".yml")) or os.sep in config:
        path = os.path.abspath(config)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--config: no such file: {path}")
        return os.path.dirname(path), os.path.splitext(os.path.basename(path))[0], [USER_CONFIG_SEARCHPATH]
    if os.path.exists(os.path.join(GPU_CONFIG_DIR, f"{config}.yaml")) and not config.startswith("_"):
        return GPU_CONFIG_DIR, config, [USER_CONFIG_SEARCHPATH]
    if not os.path.exists(os.path.join(CONFIG_DIR, f"{config}.yaml")):
        raise ValueError(
            f"unknown config {config!r}; tba-ext ships: {', '.join(list_configs())} (or give a path to your own YAML)"
        )
    return CONFIG_DIR, config, [SEARCHPATH]


def compose(config_name: str, overrides: list[str]):
    """The config verl will see: our overlay on verl's ppo_trainer.yaml (or the user's YAML on top of ours),
    with the overrides applied."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir, name, extra = config_location(config_name)
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name=name, overrides=[*extra, *overrides])


def list_configs(gpu: bool = True) -> list[str]:
    """The CPU configs, then (``gpu``) the GPU ones."""

    def names(folder):
        return sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".yaml") and not f.startswith("_"))

    return names(CONFIG_DIR) + (names(GPU_CONFIG_DIR) if gpu else [])


def unread_keys(node, path: str = "") -> set[str]:
    """Keys of config nodes that verl turns into a dataclass (``_target_``) which are not fields of it: verl builds
    the dataclass from its fields and drops the rest without a word."""
    found: set[str] = set()
    if not isinstance(node, dict):
        return found
    target = node.get("_target_")
    if isinstance(target, str) and "." in target:
        module, _, name = target.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            cls = None  # an engine this install lacks (Megatron's on a CPU machine): verl refuses it itself
        if cls is not None and dataclasses.is_dataclass(cls):
            fields = {f.name for f in dataclasses.fields(cls)}
            found |= {path + key for key in node if key != "_target_" and key not in fields}
    for key, value in node.items():
        found |= unread_keys(value, f"{path}{key}.")
    return found


def check_overrides_are_read(config_name: str, overrides: list[str]) -> None:
    """Refuse an override that nothing reads (``+actor_rollout_ref.rollout.gpu_memory_utilizaton=0.5``): one that
    adds a key to a node verl builds a dataclass from, which is not a field of it. The ``tba:`` node's keys are
    checked by ``tba_ext.core.settings``; free-form nodes (``override_config``, ``sampler_kwargs``) take any key."""
    if not overrides:
        return
    base = unread_keys(OmegaConf.to_container(compose(config_name, []), resolve=False))
    added = unread_keys(OmegaConf.to_container(compose(config_name, overrides), resolve=False)) - base
    if added:
        raise ValueError(
            f"override(s) of {', '.join(sorted(added))}: no such key in verl's config (nothing would read it); "
            "check the spelling against `python -m verl.trainer.main_ppo --cfg job`"
        )


def check_attention(aro: dict) -> None:
    """verl's FSDP engine loads the model with flash_attention_2 unless told otherwise; without flash-attn
    installed it fails only after Ray and every worker started."""
    if aro["actor"].get("strategy") not in ("fsdp", "fsdp2"):
        return
    attn = (aro["model"].get("override_config") or {}).get("attn_implementation", "flash_attention_2")
    if attn == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ValueError(
            "actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2 needs flash-attn, "
            'which is not installed: pip install "verl[vllm,fsdp]==0.9.1" (its fsdp extra brings it), or set the '
            "key to sdpa together with actor_rollout_ref.model.use_remove_padding=false"
        )


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def preflight(cfg) -> None:
    """Every check that can fail before Ray starts, each naming the key or path at fault."""
    from tba_ext.adapters.checks import check_planned_steps, check_tba_run
    from tba_ext.cpu.hf_rollout import check_hfcpu_lora
    from tba_ext.cpu.runtime import cpu_runtime_active
    from tba_ext.cpu.vllm_cpu import check_vllm_cpu_model
    from tba_ext.tasks.data import check_chat_template, check_dataset
    from tba_ext.tools.models import check_model_dir

    plain = OmegaConf.to_container(cfg, resolve=True)
    check_tba_run(plain)
    check_model_dir(plain["actor_rollout_ref"]["model"]["path"])
    check_chat_template(load_tokenizer(plain["actor_rollout_ref"]["model"]["path"]), plain["data"])
    reward_kwargs = (plain["reward"].get("custom_reward_function") or {}).get("reward_kwargs") or {}
    rows = dict.fromkeys(("train_files", "val_files"), 0)
    for key in rows:
        files = plain["data"][key]
        for path in [files] if isinstance(files, str) else files:
            if not os.path.exists(path):
                raise FileNotFoundError(f"data.{key}: no such file: {path} (build it with `tba-ext prepare-data`)")
            rows[key] += check_dataset(path, f"data.{key}", plain["data"].get("prompt_key", "prompt"), reward_kwargs)
    # the rows verl loads (data.train_max_samples caps them) before its filters: the trainer checks again after them
    cap = plain["data"].get("train_max_samples") or -1
    check_planned_steps(plain, min(rows["train_files"], cap) if cap > 0 else rows["train_files"])
    rollout = plain["actor_rollout_ref"]["rollout"]["name"]
    if cpu_runtime_active() and rollout not in ("hfcpu", "vllm"):
        raise ValueError(
            f"actor_rollout_ref.rollout.name={rollout} needs a GPU build; on this CPU host use hfcpu "
            "(or vllm with vllm-cpu installed; or set TBA_EXT_CPU_RUNTIME=off on a GPU machine)"
        )
    if rollout == "hfcpu":
        check_hfcpu_lora(plain["actor_rollout_ref"]["model"])
    if cpu_runtime_active() and rollout == "vllm":
        check_vllm_cpu_model(plain["actor_rollout_ref"]["model"]["path"])
    check_attention(plain["actor_rollout_ref"])
    if cpu_runtime_active() and plain["actor_rollout_ref"]["actor"]["strategy"] != "fsdp2":
        raise ValueError("actor_rollout_ref.actor.strategy must be fsdp2 on CPU (FSDP1/Megatron need a GPU)")
