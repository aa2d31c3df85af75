"""Decides whether the CPU runtime is active, and applies the fixes verl 0.9.1 needs on CPU.

Override with ``TBA_EXT_CPU_RUNTIME=on|off|auto``. Auto: off where torch sees a CUDA device or ``nvidia-smi`` is
present; inside a Ray cluster (a process of a running job, or the launcher joining one), on only when no node of
the cluster has a GPU, so a CPU-only head node of a GPU cluster never switches the run to the CPU platform; else
(a local run before Ray starts) on. Each fix names the verl limitation it works around.
"""

from __future__ import annotations

import functools
import os
import shutil

import torch

OVERRIDE_ENV = "TBA_EXT_CPU_RUNTIME"


def cpu_runtime_active() -> bool:
    mode = os.environ.get(OVERRIDE_ENV, "auto").strip().lower()
    if mode in ("on", "1", "true", "cpu"):
        return True
    if mode in ("off", "0", "false", "gpu"):
        return False
    if mode != "auto":
        raise ValueError(f"{OVERRIDE_ENV} must be one of on/off/auto, got {mode!r}")
    if torch.cuda.is_available() or shutil.which("nvidia-smi") is not None:
        return False
    return not _ray_cluster_has_gpu()


def cluster_has_gpu(nodes: list[dict]) -> bool:
    """Whether any alive node of a Ray cluster (``ray.nodes()``) has a real GPU. Ray adds an
    ``accelerator_type:<model>`` resource on nodes whose GPUs it detects; the logical GPU slots the CPU configs
    declare (``num_gpus`` without a device) carry none, so they do not count."""
    return any(
        node.get("Alive", True) and any(key.startswith("accelerator_type:") for key in node.get("Resources", {}))
        for node in nodes
    )


_CLUSTER_HAS_GPU: list[bool] = []  # asked once per connected process: a job's cluster does not change platform


def _ray_cluster_has_gpu() -> bool:
    """This process's Ray cluster has a GPU node (False before or outside Ray: a local run's cluster is this
    machine, decided above)."""
    import sys

    if _CLUSTER_HAS_GPU:
        return _CLUSTER_HAS_GPU[0]
    if "ray" not in sys.modules:  # not a Ray process; importing ray here would only slow every CLI call
        return False
    import ray

    if not ray.is_initialized():
        return False
    _CLUSTER_HAS_GPU.append(cluster_has_gpu(ray.nodes()))
    return _CLUSTER_HAS_GPU[0]


def apply_cpu_fixes() -> list[str]:
    """Patch the three places where verl 0.9.1 assumes an accelerator. Returns the names of the fixes."""
    applied = []

    # verl builds the process-group backend as f"cpu:gloo,{device}:{backend}", which torch rejects as
    # "Duplicate device type cpu" when the device is the CPU (verl/utils/distributed.py:89).
    import verl.utils.distributed as verl_dist

    original = verl_dist.initialize_global_process_group_ray
    if not getattr(original, "_tba_ext_cpu", False):

        @functools.wraps(original)
        def initialize_global_process_group_ray(timeout_second=None, backend=None):
            if backend is None or backend.count("cpu:") > 1:
                backend = "gloo"
            return original(timeout_second=timeout_second, backend=backend)

        initialize_global_process_group_ray._tba_ext_cpu = True
        verl_dist.initialize_global_process_group_ray = initialize_global_process_group_ray
    applied.append("gloo-process-group")

    # verl forces CPUOffloadPolicy(pin_memory=True) for forward-only (reference) FSDP2 engines
    # (workers/engine/fsdp/transformer_impl.py:462); pinning needs an accelerator.
    import verl.utils.fsdp_utils as fsdp_utils

    base = fsdp_utils.CPUOffloadPolicy
    if base is not None and not getattr(base, "_tba_ext_cpu", False):

        class UnpinnedCPUOffloadPolicy(base):
            _tba_ext_cpu = True

            def __init__(self, pin_memory: bool = False, **kwargs):
                super().__init__(pin_memory=False, **kwargs)

        fsdp_utils.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy
    applied.append("unpinned-cpu-offload")

    # verl registers its FSDP engine for devices ["cuda", "npu"] only (transformer_impl.py:1143); the
    # engine itself runs on CPU tensors when the platform is CPU, so look it up under "cuda".
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    applied.append("fsdp-engine-on-cpu")
    return applied
