"""The quickstart's and compare's model build and warm start (``recipe.prepare``) give the same model whatever
vector unit the calling process's torch uses.

Each run prepares a shortened recipe (the tiny model, 12 SFT steps) in a fresh process whose torch is forced onto
one CPU capability (``ATEN_CPU_CAPABILITY``, read when torch starts), and the saved warm-started weights are
compared bit for bit. On the caller's own kernels (``TBA_EXT_KERNELS=native``) the same command gives other weights,
so the comparison tells pinned kernels from native ones on this machine.
"""

import os
import subprocess
import sys

import pytest
import torch

from tba_ext.tools.kernels import KERNELS_ENV

pytestmark = pytest.mark.e2e  # three model builds and warm starts, each in two processes

PREPARE = """
import hashlib, sys
from dataclasses import replace
import torch
from safetensors.torch import load_file
from tba_ext.tools.recipe import SHORT, prepare

prepare(sys.argv[1], replace(SHORT, train=64, test=8, sft_steps=12), seed=0)
weights = load_file(f"{sys.argv[1]}/model_sft/model.safetensors")
digest = hashlib.sha256(b"".join(weights[k].numpy().tobytes() for k in sorted(weights))).hexdigest()
print(torch.backends.cpu.get_cpu_capability(), digest)
"""


def warm_started(tmp_path, capability: str, kernels: str, threads: int) -> tuple[str, str]:
    """(the capability the calling process ran on, a hash of the warm-started weights it saved)."""
    out = tmp_path / f"{capability}_{kernels}_{threads}"
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, OMP_NUM_THREADS=str(threads), **{KERNELS_ENV: kernels})
    done = subprocess.run([sys.executable, "-c", PREPARE, str(out)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    ran_on, digest = done.stdout.split()[-2:]
    return ran_on, digest


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() == "DEFAULT", reason="this CPU has no vector unit")
def test_the_warm_start_is_the_same_model_under_every_cpu_capability_and_thread_count(tmp_path):
    native = torch.backends.cpu.get_cpu_capability().lower()
    pinned = [warm_started(tmp_path, native, "pinned", 2), warm_started(tmp_path, "default", "pinned", 1)]
    assert [ran_on for ran_on, _ in pinned] == [native.upper(), "DEFAULT"]  # the callers did differ
    assert pinned[0][1] == pinned[1][1]
    # the control: on the caller's own kernels the same command gives other weights than on the pinned ones
    assert warm_started(tmp_path, native, "native", 2)[1] != pinned[0][1]


def test_an_unknown_kernel_choice_is_refused_naming_the_variable(monkeypatch, tmp_path):
    from tba_ext.tools.kernels import on_pinned_kernels

    monkeypatch.setenv(KERNELS_ENV, "fast")
    with pytest.raises(ValueError, match=f"{KERNELS_ENV}='fast': choose pinned"):
        on_pinned_kernels("model_and_warm_start", run_dir=str(tmp_path), recipe={}, seed=0)
