"""A ``cpu`` platform for verl's platform registry (verl 0.9.1 ships none and falls back to CUDA)."""

from __future__ import annotations

import contextlib
import os
from types import ModuleType, SimpleNamespace
from typing import Any

import psutil
import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

from tba_ext.cpu.runtime import cpu_runtime_active


def _memory_stats() -> SimpleNamespace:
    vm = psutil.virtual_memory()
    return SimpleNamespace(free=vm.available, total=vm.total)


class _CPUDeviceModule(ModuleType):
    """``torch.cpu`` plus the memory/device queries verl calls on ``torch.cuda`` (all answered for RAM)."""

    def __init__(self):
        super().__init__("tba_ext_cpu_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        stats = _memory_stats()
        return stats.free, stats.total

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return psutil.Process().memory_info().rss

    memory_reserved = memory_allocated
    max_memory_allocated = memory_allocated
    max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None


CPU_DEVICE_MODULE = _CPUDeviceModule()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl platform for CPU-only hosts: gloo collectives, RAM as device memory, Ray "GPU" slots."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return cpu_runtime_active()

    # verl passes this straight to tensor.to(device=...); an int would mean "accelerator 0"
    def current_device(self) -> str:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    # verl's resource pools always request Ray "GPU" resources (single_controller/ray/base.py:210); our
    # configs give Ray logical GPU slots on CPU hosts, one per worker process.
    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    # verl's vLLM replica launches its servers with these (vllm_async_server.py, vLLMReplica.launch_servers)
    def rollout_env_vars(self) -> dict[str, str]:
        return {
            "VLLM_TARGET_DEVICE": "cpu",
            # vLLM-CPU reserves this many GiB of KV cache per engine (default 4); tiny models need far less
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        }

    def cudart(self) -> Any:
        return None
