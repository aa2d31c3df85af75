"""The package a user installs from a clone: a wheel built from this tree, installed on its own (no editable path,
not run from the repository) next to the verl already installed, registers through verl's ``verl.plugins`` entry
point and carries every config ``tba-ext`` ships."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHECK = textwrap.dedent(
    """
    import importlib.metadata as md, os, sys
    from importlib import resources

    target = sys.argv[1]
    [entry] = [e for e in md.entry_points(group="verl.plugins") if e.name == "tba_ext"]
    assert entry.value == "tba_ext.verl_plugin", entry
    import verl  # loads the plugins of the verl.plugins entry point group
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    import tba_ext
    assert tba_ext.__file__.startswith(target), tba_ext.__file__  # the wheel's copy, not the clone's
    assert {"tb", "tb_pg"} <= set(ADV_ESTIMATOR_REGISTRY) and {"tb", "tb_pg"} <= set(POLICY_LOSS_REGISTRY)
    assert {"tba_sync", "tba_colocate_async", "tba_separate_async"} <= set(TRAINER_REGISTRY)
    from tba_ext.tools.config import list_configs
    configs = resources.files("tba_ext") / "configs"
    for name in list_configs():
        folder = configs / "gpu" if (configs / "gpu" / f"{name}.yaml").is_file() else configs
        assert (folder / f"{name}.yaml").is_file(), name
    print(len(list_configs()), "configs")
    """
)


def test_a_wheel_built_from_the_clone_registers_with_verl_and_ships_its_configs(tmp_path):
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", ROOT], check=True)
    [wheel] = (tmp_path / "dist").glob("tba_ext-*.whl")
    target = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", target, wheel], check=True)
    shipped = sorted(p.name for p in (ROOT / "tba_ext" / "configs").rglob("*.yaml"))
    assert sorted(p.name for p in (target / "tba_ext" / "configs").rglob("*.yaml")) == shipped
    # run from elsewhere with the wheel's copy first on the path (verl and the other dependencies: this env's)
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(target)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("configs")
