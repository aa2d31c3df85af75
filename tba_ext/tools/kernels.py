"""The CPU kernels the quickstart's and compare's model build and warm start run on: the same on every x86-64 CPU.

A float32 result is a function of the vector unit torch dispatches to: one seed's warm start scored held-out greedy
0.3625 on AVX512, 0.4625 on AVX2 and 0.175 without SIMD, and the initial weights move with it too. So
``recipe.prepare`` builds and warm-starts the model in a child process on torch's scalar kernels, MKL's conditional
numerical reproducibility path and one thread (``PINNED_KERNELS``; torch reads them when it starts, so a running
process cannot switch). The RL runs after it use the CPU's own kernels. ``TBA_EXT_KERNELS=native`` runs the step in
the calling process on its own kernels.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile

PINNED_KERNELS = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
KERNELS_ENV = "TBA_EXT_KERNELS"
# what a pinned child may run: a fixed list, so a spec file names a step, never code
STEPS = {"model_and_warm_start": "tba_ext.tools.recipe:model_and_warm_start"}


def kernels_pinned() -> bool:
    """Whether this process runs on PINNED_KERNELS."""
    return all(os.environ.get(key) == value for key, value in PINNED_KERNELS.items())


def _function(step: str):
    module, _, name = STEPS[step].partition(":")
    return getattr(importlib.import_module(module), name)


def on_pinned_kernels(step: str, **kwargs):
    """``step`` (a key of STEPS) called with JSON-able ``kwargs`` on PINNED_KERNELS: in this process if it runs on
    them (or KERNELS_ENV is native), else in a child; its JSON-able result."""
    mode = os.environ.get(KERNELS_ENV, "pinned")
    if mode not in ("pinned", "native"):
        raise ValueError(f"{KERNELS_ENV}={mode!r}: choose pinned (the default) or native")
    if mode == "native" or kernels_pinned():
        return _function(step)(**kwargs)
    with tempfile.TemporaryDirectory() as tmp:
        spec = os.path.join(tmp, "step.json")
        with open(spec, "w") as f:
            json.dump({"step": step, "kwargs": kwargs}, f)
        subprocess.run([sys.executable, "-m", __name__, spec], env={**os.environ, **PINNED_KERNELS}, check=True)
        with open(spec) as f:
            return json.load(f)["result"]


if __name__ == "__main__":  # the pinned child: the step in a JSON file, which it rewrites with the result
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    spec["result"] = _function(spec["step"])(**spec["kwargs"])
    with open(sys.argv[1], "w") as f:
        json.dump(spec, f)
