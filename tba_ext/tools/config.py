"""Which config a run uses and whether it can run: compose a tba-ext config (or the user's YAML on top of ours)
with verl's, and check everything that can fail before Ray starts, each error naming the key or path at fault."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import importlib.util
import math
import os
import re
import types
import typing
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
    with the overrides applied. Hydra's refusal of an override (a key not in the config, bad override syntax)
    becomes a ValueError naming the override, not a traceback from inside hydra."""
    from hydra.errors import HydraException

    config_dir, name, extra = config_location(config_name)
    try:
        return hydra_compose_at(config_dir, name, [*extra, *overrides])
    except HydraException as exc:
        raise ValueError(override_refusal(overrides, exc)) from None


def hydra_compose_at(config_dir: str, name: str, overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name=name, overrides=overrides)


def override_refusal(overrides: list[str], exc: Exception) -> str:
    """Hydra's refusal as one message naming the override at fault."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    if isinstance(exc, OverrideParseException):
        parser = OverridesParser.create()
        for line in overrides:
            try:
                parser.parse_overrides([line])
            except OverrideParseException:
                return (
                    f"override {line!r} is not valid override syntax ({exc}); quote a value that holds "
                    "spaces or any of , [ ] { } ( ) = : ' \""
                )
    text = " ".join(str(exc).split())
    cause = exc.__cause__
    if cause is not None and "full_key" in str(cause):  # omegaconf's: its first line and the key
        lines = str(cause).splitlines()
        text += f" ({lines[0].strip()}; " + next((x.strip() for x in lines if "full_key" in x), "") + ")"
    return f"config override refused: {text}"


def list_configs(gpu: bool = True) -> list[str]:
    """The CPU configs, then (``gpu``) the GPU ones."""

    def names(folder):
        return sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".yaml") and not f.startswith("_"))

    return names(CONFIG_DIR) + (names(GPU_CONFIG_DIR) if gpu else [])


def _target_class(node: dict):
    """The class a config node's ``_target_`` names (verl builds its dataclass configs from them); None where there
    is none or this install lacks it (Megatron's engine on a CPU machine: verl refuses that itself)."""
    target = node.get("_target_")
    if not (isinstance(target, str) and "." in target):
        return None
    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def unread_keys(node, path: str = "") -> set[str]:
    """Keys of config nodes that verl turns into a dataclass (``_target_``) which are not fields of it: verl builds
    the dataclass from its fields and drops the rest without a word."""
    found: set[str] = set()
    if not isinstance(node, dict):
        return found
    cls = _target_class(node)
    if cls is not None and dataclasses.is_dataclass(cls):
        fields = {f.name for f in dataclasses.fields(cls)}
        found |= {path + key for key in node if key != "_target_" and key not in fields}
    for key, value in node.items():
        found |= unread_keys(value, f"{path}{key}.")
    return found


def _field_kinds(annotation) -> set[str] | None:
    """The scalar kinds (int, float, bool, str, None) a dataclass field's annotation allows; None for any other
    annotation (a nested config, a list, Any), which is not checked."""
    if annotation in (int, float, bool, str):
        return {annotation.__name__}
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = [_field_kinds(a) if a is not type(None) else {"None"} for a in typing.get_args(annotation)]
        return set().union(*kinds) if all(k is not None for k in kinds) else None
    return None


def _value_fits(value, kinds: set[str]) -> bool:
    if value is None:  # verl's own defaults leave many non-Optional fields null (critic.*, distillation.*)
        return True
    if isinstance(value, bool):
        return "bool" in kinds
    if isinstance(value, int):
        return bool(kinds & {"int", "float"})
    if isinstance(value, float):
        return "float" in kinds and not math.isnan(value)
    return isinstance(value, str) and "str" in kinds


def mistyped_keys(node, path: str = "") -> list[str]:
    """Values in config nodes that verl turns into a dataclass (``_target_``) whose type is not the field's (a
    string or a list for an int, a quoted '0.5' or NaN for a float, a string for a bool): verl builds the dataclass
    without converting them and fails, or misreads them, once its workers run."""
    found: list[str] = []
    if not isinstance(node, dict):
        return found
    cls = _target_class(node)
    if cls is not None:
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # an annotation that does not resolve in this install: not checked
            hints = {}
        for key, value in node.items():
            kinds = _field_kinds(hints.get(key)) if key != "_target_" else None
            if kinds and not isinstance(value, dict) and not _value_fits(value, kinds):
                wanted = " or ".join(sorted("null" if k == "None" else k for k in kinds))
                found.append(f"{path}{key}={value!r} (must be {wanted})")
    for key, value in node.items():
        found += mistyped_keys(value, f"{path}{key}.")
    return found


# nodes that take any key: keyword arguments handed on, the model's config overrides, tba-ext's rollout options
FREE_FORM = ("kwargs", "override_config", "custom", "ray_init", "env_vars", "runtime_env")


def misspelled_additions(base: dict, overrides: list[str]) -> list[str]:
    """Keys an override adds (``+data.max_prompt_lenght=512``) to a node verl reads as a plain dict (data,
    trainer, trainer.v1.*, algorithm.rollout_correction) that look like a misspelling of a key already there:
    verl reads the key it knows and ignores the new one. Keys unlike any there are taken as meant."""
    found = []
    for line in overrides:
        if not line.startswith("+") or "=" not in line:
            continue
        key = line.lstrip("+").split("=", 1)[0]
        parent_path, _, name = key.rpartition(".")
        parent = base
        for part in parent_path.split(".") if parent_path else []:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or name in parent or "_target_" in parent or parent_path in ("", "tba"):
            continue
        if parent_path.rpartition(".")[2].endswith(FREE_FORM):
            continue
        close = difflib.get_close_matches(name, [k for k in parent if isinstance(k, str)], n=1, cutoff=0.8)
        if close:
            found.append(f"{key} (did you mean {parent_path}.{close[0]}?)")
    return found


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@functools.cache
def _source_names(package: str, only: tuple[str, ...] = ()) -> frozenset[str]:
    """Every identifier and word in the Python source of an installed ``package`` (``only``: files whose relative
    path starts with one of these), read as text: nothing is imported. A name absent from it is read by no code."""
    spec = importlib.util.find_spec(package)
    root = os.path.dirname(spec.origin) if spec and spec.origin else None
    names: set[str] = set()
    for folder, _, files in os.walk(root) if root else ():
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and (not only or os.path.relpath(path, root).startswith(only)):
                with open(path, encoding="utf-8", errors="replace") as f:
                    names.update(_IDENTIFIER.findall(f.read()))
    return frozenset(names)


HANDED_ON = tuple(name for name in FREE_FORM if name != "override_config")  # keys no config class reads
# where the code that reads a model's override_config lives: transformers' config classes
_HF_CONFIG_SOURCES = ("configuration_utils.py", "modeling_utils.py", "models/")


def _holds(node, parts: list[str]) -> bool:
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def unread_additions(
    base: dict, overrides: list[str], extra_sources: tuple[str, ...] = (), composed: dict | None = None
) -> list[str]:
    """Keys an override adds with ``+`` / ``++`` that no code could read: a name that appears nowhere in verl's or
    tba-ext's source (for ``override_config``, transformers' config classes; ``extra_sources``: the user's files the
    config names, such as its reward function): a misspelled name added under trainer is one. ``tba:`` is checked by
    ``tba_ext.core.settings``, and free-form nodes handing keyword arguments on are not checked."""
    readers = _source_names("verl") | _source_names("tba_ext")
    for path in extra_sources:
        with open(path, encoding="utf-8", errors="replace") as f:
            readers |= set(_IDENTIFIER.findall(f.read()))
    found = []
    for line in overrides:
        if not line.startswith("+") or "=" not in line:
            continue
        parts = line.lstrip("+").split("=", 1)[0].split(".")
        node, depth = base, 0
        while depth < len(parts) and isinstance(node, dict) and parts[depth] in node:
            node, depth = node[parts[depth]], depth + 1
        if depth == len(parts) or parts[0] == "tba" or any(p.endswith(HANDED_ON) for p in parts[:-1]):
            continue
        if composed is not None and not _holds(composed, parts):  # a config group chosen (+cpu_rollout=vllm)
            continue
        hf = "override_config" in parts[:-1]
        names = readers | _source_names("transformers", _HF_CONFIG_SOURCES) if hf else readers
        unknown = [p for p in parts[depth:] if p not in names]
        if unknown:
            found.append(f"{'.'.join(parts)} (no code reads {unknown[0]!r})")
    return found


def check_overrides_are_read(config_name: str, overrides: list[str]) -> None:
    """Refuse an override that nothing reads (``+actor_rollout_ref.rollout.gpu_memory_utilizaton=0.5``): one that
    adds a key to a node verl builds a dataclass from, which is not a field of it, or a misspelling of a key of a
    node verl reads as a dict (``misspelled_additions``). The ``tba:`` node's keys are checked by
    ``tba_ext.core.settings``; free-form nodes (``override_config``, ``sampler_kwargs``) take any key."""
    if not overrides:
        return
    base_config = OmegaConf.to_container(compose(config_name, []), resolve=False)
    base = unread_keys(base_config)
    composed = OmegaConf.to_container(compose(config_name, overrides), resolve=False)
    added = unread_keys(composed) - base
    if added:
        raise ValueError(
            f"override(s) of {', '.join(sorted(added))}: no such key in verl's config (nothing would read it); "
            "check the spelling against `python -m verl.trainer.main_ppo --cfg job`"
        )
    misspelled = misspelled_additions(base_config, overrides)
    if misspelled:
        raise ValueError(
            f"override(s) adding {', '.join(misspelled)}: no such key in verl's config (nothing would read it)"
        )
    reward = (composed.get("custom_reward_function") or {}).get("path")
    sources = (reward,) if isinstance(reward, str) and os.path.isfile(reward) else ()
    unread = unread_additions(base_config, overrides, sources, composed)
    if unread:
        raise ValueError(
            f"override(s) adding {', '.join(unread)}: a key no code of verl, transformers or tba-ext reads; check "
            "the spelling (`python -m verl.trainer.main_ppo --cfg job` lists verl's keys)"
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


# the reward function tba-ext ships (the data sources it scores: tba_ext.tasks.rewards.SCORED_SOURCES)
OUR_REWARD = ("pkg://tba_ext.tasks.rewards", "compute_score")


def resolved(cfg) -> dict:
    """The config as nested dicts with every interpolation resolved; one that cannot be (``${nope}``) is refused
    naming its key."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        # the key whose own value holds the missing name (data.max_response_length=${nope}), not the one that
        # reached it through another interpolation (actor_rollout_ref.rollout.response_length)
        missing = re.search(r"'([^']+)'", message)
        keys = [
            path
            for path, value in _leaves(OmegaConf.to_container(cfg, resolve=False))
            if missing and isinstance(value, str) and "${" in value and missing.group(1) in value
        ] or [getattr(exc, "full_key", None) or "the config"]
        raise ValueError(f"{', '.join(keys)}: {message}") from None


def _leaves(node, path: str = ""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{path}{key}.")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaves(value, f"{path}{i}.")
    else:
        yield path[:-1], node


def check_registered_names(plain: dict) -> None:
    """The advantage estimator, policy loss and trainer mode, which verl looks up in its registries only once Ray
    and its workers run."""
    import verl.trainer.ppo.v1  # noqa: F401  (registers verl's own trainer modes)
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    import tba_ext.adapters.decoupled
    import tba_ext.adapters.losses
    import tba_ext.adapters.trainer  # noqa: F401  (registers tba_sync, tba_colocate_async)

    policy_loss = plain["actor_rollout_ref"]["actor"].get("policy_loss") or {}
    for key, value, registry in (
        ("algorithm.adv_estimator", plain["algorithm"].get("adv_estimator"), ADV_ESTIMATOR_REGISTRY),
        (
            "actor_rollout_ref.actor.policy_loss.loss_mode",
            policy_loss.get("loss_mode", "vanilla"),
            POLICY_LOSS_REGISTRY,
        ),
        ("trainer.v1.trainer_mode", (plain["trainer"].get("v1") or {}).get("trainer_mode", "sync"), TRAINER_REGISTRY),
    ):
        if value not in registry:
            raise ValueError(f"{key}={value!r} is not registered with verl; choose one of {sorted(map(str, registry))}")


def preflight(cfg) -> None:
    """Every check that can fail before Ray starts, each naming the key or path at fault."""
    from tba_ext.adapters.checks import (
        check_micro_batch_sizes,
        check_planned_steps,
        check_resume_store,
        check_tba_run,
        check_verl_values,
    )
    from tba_ext.cpu.hf_rollout import check_hfcpu_lora
    from tba_ext.cpu.runtime import cpu_runtime_active
    from tba_ext.cpu.vllm_cpu import check_vllm_cpu_model
    from tba_ext.tasks.data import check_chat_template, check_dataset
    from tba_ext.tasks.rewards import SCORED_SOURCES
    from tba_ext.tools.models import check_model_dir

    plain = resolved(cfg)
    # the keys as the user sets them, before mistyped_keys meets them where they are interpolated (data.max_*)
    check_verl_values(plain)
    check_micro_batch_sizes(plain)
    mistyped = mistyped_keys(plain)
    if mistyped:
        raise ValueError(f"wrong type: {'; '.join(mistyped)}")
    check_tba_run(plain)
    check_resume_store(plain["trainer"])
    check_registered_names(plain)
    check_model_dir(plain["actor_rollout_ref"]["model"]["path"])
    check_chat_template(load_tokenizer(plain["actor_rollout_ref"]["model"]["path"]), plain["data"])
    reward_fn = plain["reward"].get("custom_reward_function") or {}
    reward_kwargs = reward_fn.get("reward_kwargs") or {}
    sources = SCORED_SOURCES if (reward_fn.get("path"), reward_fn.get("name")) == OUR_REWARD else None
    rows = dict.fromkeys(("train_files", "val_files"), 0)
    for key in rows:
        files = plain["data"][key]
        paths = [files] if isinstance(files, str) else files
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
            raise ValueError(f"data.{key} must be a parquet file's path or a list of them, got {files!r}")
        for path in paths:
            if not os.path.exists(path):
                raise FileNotFoundError(f"data.{key}: no such file: {path} (build it with `tba-ext prepare-data`)")
            rows[key] += check_dataset(
                path, f"data.{key}", plain["data"].get("prompt_key", "prompt"), reward_kwargs, sources
            )
    # the rows verl loads (data.train_max_samples caps them) before its filters: the trainer checks again after them
    cap = plain["data"].get("train_max_samples") or -1
    if 0 < cap < rows["train_files"]:
        check_planned_steps(plain, cap, f"data.train_files capped by data.train_max_samples={cap}")
    else:
        check_planned_steps(plain, rows["train_files"])
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
