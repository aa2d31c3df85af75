"""``tba-ext doctor``: is tba-ext loaded into verl, and is every registration where verl looks for it?"""

from __future__ import annotations

import importlib.metadata as md


def expected_registrations() -> dict[str, list[str]]:
    from tba_ext.core.settings import TB_MODES

    return {
        "policy_loss": list(TB_MODES),
        "adv_estimator": list(TB_MODES),
        "rollout": ["hfcpu"],
        "trainer_mode": ["tba_sync", "tba_colocate_async", "tba_separate_async"],
        "checkpoint_engine": ["ray_object_store"],
        "platform": ["cpu"],
        "reward_manager": ["tba_checked"],
    }


def registered_in_verl() -> dict[str, list[str]]:
    """Read verl's own registries (not our bookkeeping), so a plugin that failed to load shows up."""
    import verl  # noqa: F401  (loads the entry-point plugins)
    from verl.checkpoint_engine.base import CheckpointEngineRegistry
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.plugin.platform import PlatformRegistry
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    return {
        "policy_loss": sorted(POLICY_LOSS_REGISTRY),
        "adv_estimator": sorted(str(k) for k in ADV_ESTIMATOR_REGISTRY),
        "rollout": sorted(n for n in RolloutReplicaRegistry._registry if (n, "async") in _ROLLOUT_REGISTRY),
        "trainer_mode": sorted(TRAINER_REGISTRY),
        "platform": sorted(PlatformRegistry.registered_names()),
        "checkpoint_engine": sorted(CheckpointEngineRegistry._registry),
        "reward_manager": sorted(REWARD_MANAGER),
    }


def missing_registrations() -> dict[str, list[str]]:
    present = registered_in_verl()
    return {
        kind: [n for n in names if n not in present.get(kind, [])]
        for kind, names in expected_registrations().items()
        if any(n not in present.get(kind, []) for n in names)
    }


def report() -> tuple[bool, list[str]]:
    import ray
    import torch

    lines = [
        f"tba-ext {md.version('tba-ext')}",
        f"verl {md.version('verl')}, torch {torch.__version__}, ray {ray.__version__}",
    ]
    missing = missing_registrations()
    from verl.plugin.platform import get_platform

    from tba_ext.cpu.runtime import cpu_runtime_active

    lines.append(
        f"platform: {get_platform().device_name} (tba-ext CPU runtime {'on' if cpu_runtime_active() else 'off'})"
    )
    from tba_ext import verl_plugin

    for kind, names in expected_registrations().items():
        status = "MISSING " + ", ".join(missing[kind]) if kind in missing else "ok"
        lines.append(f"  {kind:14s} {', '.join(names):32s} {status}")
    if verl_plugin.REGISTERED.get("cpu_fixes"):
        lines.append(f"  cpu fixes      {', '.join(verl_plugin.REGISTERED['cpu_fixes'])}")
    if missing:
        lines.append("tba-ext is NOT fully registered with verl: the verl.plugins entry point did not load.")
        lines.append("Check `pip show tba-ext` and that VERL_USE_EXTERNAL_PLUGINS is unset or names tba_ext.")
    return not missing, lines
