"""Registers the ``hfcpu`` rollout backend with verl's rollout registries (lazy: loaded on first use)."""

NAME = "hfcpu"


def _load_replica():
    from tba_ext.cpu.hf_rollout import HFCPUReplica

    return HFCPUReplica


def register() -> None:
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(NAME, _load_replica)
    _ROLLOUT_REGISTRY[(NAME, "async")] = "tba_ext.cpu.hf_rollout.HFCPUServerAdapter"
