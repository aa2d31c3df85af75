"""verl's own CPU tests for core_algos and loss aggregation (shipped in the verl 0.9.1 wheel) still pass
with tba-ext loaded (its entry point registers at `import verl`, so every one of them runs with it)."""

import importlib.util
import os
import subprocess
import sys

import pytest

VERL_TESTS = [
    "trainer/ppo/test_core_algos_on_cpu.py",
    "trainer/ppo/test_loss_aggregation_on_cpu.py",
    "trainer/ppo/test_dynamic_policy_losses_on_cpu.py",
    "trainer/test_multi_trajectories_advantage_on_cpu.py",
]


def test_verl_cpu_tests_pass_with_tba_ext_loaded(tmp_path):
    spec = importlib.util.find_spec("tests.trainer")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("verl's wheel-shipped tests package is not installed next to verl")
    root = os.path.dirname(list(spec.submodule_search_locations)[0])
    files = [os.path.join(root, f) for f in VERL_TESTS if os.path.exists(os.path.join(root, f))]
    assert len(files) == len(VERL_TESTS), files
    check = "import verl; from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as R; assert 'tb' in R"
    subprocess.run([sys.executable, "-c", check], check=True, timeout=300)  # tba-ext is loaded in that process
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-4000:]
    assert " passed" in result.stdout
