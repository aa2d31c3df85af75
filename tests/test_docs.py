"""The docs are true of the code: the site builds with strict warnings, its generated parts are current, every
code path it names exists, every result says how it was made, and the README's switch blocks pass the start-up
checks of a verl pipeline they are pasted into."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tba_ext.adapters.checks import check_tb_run, check_tba_run

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_docs_site_builds_with_strict_warnings(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "results" / "index.html").exists()


def test_the_generated_pages_are_what_the_code_and_the_results_give():
    r = subprocess.run([sys.executable, "docs/generate.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# `tba_ext/x.py`, `tests/test_x.py::test_name`, `benchmarks/x.py`, `examples/x.sh`, `benchmarks/results/x.json`
CODE_PATH = re.compile(r"`((?:tba_ext|tests|benchmarks|examples|configs)/[\w./*<>{},-]+)(?:::(\w+))?")


def test_every_code_path_the_docs_name_exists():
    missing = []
    for page in PAGES:
        for path, name in CODE_PATH.findall(page.read_text()):
            if any(c in path for c in "*<>{},"):  # a pattern: its folder must exist
                path = path[: min(path.index(c) for c in "*<>{}," if c in path)].rsplit("/", 1)[0]
            target = ROOT / path.rstrip(".")
            if not target.exists():
                missing.append(f"{page.name}: {path}")
            elif name and target.is_file() and not re.search(rf"\b{name}\b", target.read_text()):
                missing.append(f"{page.name}: {path}::{name}")
    assert not missing, missing


def test_every_result_says_how_and_where_it_was_made():
    for path in sorted((ROOT / "benchmarks" / "results").rglob("*.json")):
        if any(part.endswith("_run") for part in path.parts):  # benchmark run folders (not committed)
            continue
        doc = json.loads(path.read_text())
        provenances = (
            [doc["provenance"]] if "provenance" in doc else [r.get("provenance") for r in doc["regimes"].values()]
        )
        for p in provenances:
            assert p and p.get("commit") and p.get("date") and p.get("cores"), path


def switch_blocks() -> list[list[str]]:
    """The overrides of each `python -m verl.trainer.main_ppo ... \\` block in the README."""
    blocks = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S):
        if "verl.trainer.main_ppo ..." in block:
            text = block.split("verl.trainer.main_ppo ...", 1)[1].replace("\\\n", " ")
            blocks.append([word for word in shlex.split(text, comments=True)])
    return blocks


def pasted_into_a_grpo_pipeline(overrides: list[str]) -> dict:
    """verl's own ppo_trainer.yaml as a GRPO user has it (4 responses per prompt, micro-batches of 8), plus the
    block's overrides."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        grpo = ["actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"]
        cfg = compose("ppo_trainer", overrides=[*grpo, *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def test_the_readme_switch_blocks_pass_the_start_up_checks_and_fail_without_a_key():
    tb, tb_pg = switch_blocks()
    check_tb_run(pasted_into_a_grpo_pipeline(tb))
    cfg = pasted_into_a_grpo_pipeline(tb_pg)
    settings, _ = check_tba_run(cfg)
    assert cfg["trainer"]["v1"]["trainer_mode"] == "tba_colocate_async" and settings.ref_reset_every == 50
    assert cfg["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"] == "tb_pg"
    # the checks bite: each block without one of its keys is refused
    with pytest.raises(ValueError, match="use_kl_in_reward"):
        check_tb_run(pasted_into_a_grpo_pipeline([o for o in tb if not o.startswith("algorithm.use_kl_in_reward")]))
    with pytest.raises(ValueError, match="rollout_is"):
        check_tba_run(pasted_into_a_grpo_pipeline([o for o in tb_pg if "rollout_correction" not in o]))
