"""The docs are true of the code: the site builds with strict warnings, its generated parts are current, every
code path it names exists, every result says how it was made, the README's switch blocks pass the start-up
checks of a verl pipeline they are pasted into, every install line names verl extras that bring what it is for, and
the README, the hand-written pages and the CHANGELOG carry no run history (no commits; one Added / Changed / Fixed
per release)."""

import json
import os
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
    # no -q: mkdocs' quiet mode drops the warnings before strict mode counts them (a missing page or image passes)
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
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


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")  # ![alt](path)
IMAGE_BYTES = 150_000  # a plot in git: matplotlib's PNGs at dpi 110-120 are 25-90 KB


def test_every_image_the_docs_embed_exists_is_small_and_every_docs_image_is_embedded():
    """The plots are copied into docs/img by docs/generate.py from the git-ignored benchmarks/results; a page
    that embeds one not copied, or a copy that no page shows, fails here (the strict build also warns on the
    first)."""
    embedded, missing = set(), []
    for page in PAGES:
        for path in IMAGE.findall(page.read_text()):
            target = (page.parent / path).resolve()
            if target.is_file():
                embedded.add(target)
            else:
                missing.append(f"{page.name}: {path}")
    assert not missing, missing
    images = {p.resolve() for p in (ROOT / "docs" / "img").rglob("*") if p.is_file()}
    assert embedded and images, "no image embedded"
    assert not images - embedded, sorted(str(p.relative_to(ROOT)) for p in images - embedded)
    large = [f"{p.relative_to(ROOT)}: {p.stat().st_size} bytes" for p in embedded if p.stat().st_size > IMAGE_BYTES]
    assert not large, large


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


# a commit hash: 7-40 hex digits with at least one letter and one digit
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def test_the_readme_the_hand_written_docs_and_the_changelog_are_free_of_run_history():
    """Provenance (commits, dates, machines) is on the generated results page; the README, the hand-written pages
    and the CHANGELOG name no commit, and the CHANGELOG gives each release one Added, Changed, Fixed and Removed
    at most (Keep a Changelog)."""
    for page in [*PAGES, ROOT / "CHANGELOG.md"]:
        if page != ROOT / "docs" / "results.md":
            assert not COMMIT_HASH.findall(page.read_text()), (page.name, COMMIT_HASH.findall(page.read_text()))
    releases = re.split(r"^## ", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)[1:]
    assert releases and releases[0].startswith("Unreleased")
    for release in releases:
        headings = re.findall(r"^### (.+)$", release, re.M)
        assert len(headings) == len(set(headings)) and set(headings) <= {"Added", "Changed", "Fixed", "Removed"}, (
            release.splitlines()[0],
            headings,
        )


# How a page narrates the history of a number instead of saying what is true: dates, "was 2", "now", "no longer",
# runs made "later" or "earlier" than others, a difference "not yet explained", what happened "once in CI"
NARRATION = re.compile(
    r"\b20\d\d-\d\d-\d\d\b|\(was\b|\bwas (?:removed|added|renamed|replaced|dropped)\b|\bnow\b|\bno longer\b"
    r"|\b(?:later|earlier) (?:single )?(?:runs?|sessions?|grids?|installs?)\b|\bruns? (?:later|earlier) than\b"
    r"|\bnot yet (?:explained|found)\b|\bonce in CI\b|\bin a run without it\b|\bit also stopped\b",
    re.I,
)


def prose(text: str) -> str:
    """A page without its fenced code blocks and generated blocks (those say what the code and the JSONs say)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"<!-- generated: (\S+) -->.*?<!-- end generated -->", "", text, flags=re.S)


def test_the_readme_the_hand_written_docs_and_the_changelog_narrate_no_history():
    """They say what is true now, once: no dates, no "was / now / no longer", no runs told apart by when they ran
    (the results page, generated from the JSONs, carries each figure's provenance)."""
    found = {}
    for page in [*PAGES, ROOT / "CHANGELOG.md"]:
        if page != ROOT / "docs" / "results.md":
            hits = [m.group(0) for m in NARRATION.finditer(prose(page.read_text()))]
            if hits:
                found[page.name] = hits
    assert not found, found
    for sentence in (  # the pattern catches the sentences it was written against
        "a fresh install on 2026-12-06 gave 0.362",
        "Three later single runs fell outside it",
        "seeds 2, 3 and 4, run later than the rest",
        "warm starts made in a later session differ",
        "`reward_mix` (a prompt-level softmax) was removed",
        "in a run without it, paced responses averaged 63.0 tokens",
        "has 5 seeds (was 2)",
        "it now names the checkout",
        "On a fresh clone it also stopped before any run",
        "put it at 2.6e-4 once in CI",
    ):
        assert NARRATION.search(sentence), sentence


def switch_blocks(page: Path = ROOT / "README.md") -> list[list[str]]:
    """The overrides of each `python -m verl.trainer.main_ppo [...] \\` block in a page (the README by default),
    with the shell's variables expanded as bash would (``$HOME``)."""
    blocks = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
        if "python -m verl.trainer.main_ppo" in block and "--config" not in block:
            text = block.split("verl.trainer.main_ppo", 1)[1].replace("\\\n", " ").removeprefix(" ...")
            blocks.append([os.path.expandvars(word) for word in shlex.split(text, comments=True)])
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
    assert cfg["trainer"]["v1"]["trainer_mode"] == "tba_colocate_async" and settings.ref_reset_every == 48
    assert cfg["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"] == "tb_pg"
    # the checks bite: each block without one of its keys is refused
    with pytest.raises(ValueError, match="use_kl_in_reward"):
        check_tb_run(pasted_into_a_grpo_pipeline([o for o in tb if not o.startswith("algorithm.use_kl_in_reward")]))
    with pytest.raises(ValueError, match="rollout_is"):
        check_tba_run(pasted_into_a_grpo_pipeline([o for o in tb_pg if "rollout_correction" not in o]))


GUIDE = ROOT / "docs" / "guide.md"


def test_the_guide_block_passes_the_start_up_checks_of_a_grpo_pipeline():
    """The guide's one block (TBA′ + replay + a TBA trainer mode) pasted after a GRPO user's keys: the checks pass
    with replay on; without an objective key they refuse, without the sampler's name replay is off."""
    (block,) = switch_blocks(GUIDE)
    cfg = pasted_into_a_grpo_pipeline(block)
    settings, replay = check_tba_run(cfg)
    assert replay is not None and replay.recency_prob == 0.95
    assert settings.ref_reset_every == 48 and cfg["trainer"]["v1"]["trainer_mode"] == "tba_colocate_async"
    assert cfg["algorithm"]["adv_estimator"] == cfg["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"] == "tb_pg"
    assert cfg["trainer"]["v1"]["sampler"]["max_off_policy_threshold"] is None

    def without(part: str) -> dict:
        kept = [o for o in block if part not in o]
        assert len(kept) < len(block), part
        return pasted_into_a_grpo_pipeline(kept)

    with pytest.raises(ValueError, match="rollout_is"):
        check_tba_run(without("rollout_correction"))
    with pytest.raises(ValueError, match="loss_scale_factor"):
        check_tba_run(without("loss_scale_factor"))
    with pytest.raises(ValueError, match="use_kl_in_reward"):
        check_tba_run(without("algorithm.use_kl_in_reward"))
    assert check_tba_run(without("custom_sampler.name"))[1] is None  # replay off: verl's own sampler


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Each table of a markdown page: its rows (header and separator included), each a list of cells."""
    tables, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def test_the_guide_tables_have_one_line_cells_and_its_config_table_holds_every_key_of_its_block():
    text = GUIDE.read_text()
    tables = markdown_tables(text)
    config = [t for t in tables if t[0] == ["key", "default", "what it does"]]
    assert len(config) == 1 and len(tables) >= 3
    long_cells = [cell for table in tables for row in table for cell in row if len(cell) > 120]
    assert not long_cells, long_cells
    (block,) = switch_blocks(GUIDE)
    listed = " ".join(row[0] for row in config[0][2:])
    switch = block[next(i for i, o in enumerate(block) if o.startswith("trainer.v1.trainer_mode=")) :]
    names = {o.split("=", 1)[0].lstrip("+") for o in switch}  # the TBA keys; the GRPO run's own come before
    short = {n.replace("trainer.v1.sampler.sampler_kwargs.", "sampler_kwargs.") for n in names}
    missing = [n for n in short if f"`{n}`" not in listed and f"`{n.split('.', 1)[1]}`" not in listed]
    assert not missing, missing


# every file that tells a user which of verl's extras to install, and the places a Megatron config is launched from
INSTALL_LINE_FILES = [
    "README.md",
    "pyproject.toml",
    "docs/*.md",
    "examples/*.sh",
    "tba_ext/configs/gpu/*.yaml",
    "tba_ext/configs/gpu/README.md",
    "tba_ext/**/*.py",
]
MEGATRON_LAUNCH_FILES = [
    "README.md",
    "docs/gpu.md",
    "tba_ext/configs/gpu/README.md",
    "tba_ext/configs/gpu/tba_qwen2.5-7b_math_megatron.yaml",
    "examples/run_tba_prime_qwen2.5-7b_math_megatron.sh",
]
VERL_EXTRAS = re.compile(r"verl\[([^\]]+)\]")


def verl_extras_bring() -> dict[str, set[str]]:
    """Each extra of the installed verl -> the distributions it brings, nested ``verl[...]`` extras followed, read
    from verl's own metadata (its Requires-Dist lines)."""
    from importlib.metadata import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    meta = metadata("verl")
    extras = set(meta.get_all("Provides-Extra"))
    direct: dict[str, set[tuple[str, frozenset]]] = {e: set() for e in extras}
    for line in meta.get_all("Requires-Dist"):
        req = Requirement(line)
        for extra in extras:
            if req.marker is not None and req.marker.evaluate({"extra": extra}):
                direct[extra].add((canonicalize_name(req.name), frozenset(req.extras)))

    def bring(extra: str, seen: frozenset = frozenset()) -> set[str]:
        names = set()
        for name, nested in direct[extra]:
            names.add(name)
            if name == "verl":
                names |= set().union(*(bring(n, seen | {extra}) for n in nested - seen - {extra}))
        return names

    return {extra: bring(extra) for extra in extras}


def install_lines(pattern: str) -> list[tuple[str, str, list[list[str]]]]:
    """(file, line, the extras of each ``verl[...]`` on it) for each line of the matching files that names one."""
    found = []
    for path in sorted(ROOT.glob(pattern)):
        for line in path.read_text().splitlines():
            specs = [[e.strip() for e in m.group(1).split(",")] for m in VERL_EXTRAS.finditer(line)]
            if specs:
                found.append((str(path.relative_to(ROOT)), line.strip(), specs))
    return found


def test_every_install_line_names_verls_extras_and_the_megatron_ones_bring_megatron_core():
    """verl 0.9.1's ``mcore`` extra is mbridge alone; megatron-core comes with its ``megatron`` extra (flash-attn
    with ``fsdp`` and ``megatron``). Each install line is checked against the installed verl's metadata, and every
    place a Megatron config is launched from names an install that brings megatron-core."""
    brings = verl_extras_bring()
    assert "megatron-core" in brings["megatron"] and brings["mcore"] == {"mbridge"}

    def brought(extras):
        return set().union(*(brings[e] for e in extras))

    lines = [found for pattern in INSTALL_LINE_FILES for found in install_lines(pattern)]
    assert lines, "no install line found"
    for path, line, specs in lines:
        for extras in specs:
            assert set(extras) <= set(brings), f"{path}: verl has no extra {set(extras) - set(brings)}: {line}"
            if {"mcore", "megatron"} & set(extras):
                assert "megatron-core" in brought(extras), f"{path}: brings no megatron-core: {line}"
        if "flash-attn" in line:
            assert any("flash-attn" in brought(extras) for extras in specs), f"{path}: brings no flash-attn: {line}"
    for path in MEGATRON_LAUNCH_FILES:
        assert any("megatron-core" in brought(extras) for _, _, specs in install_lines(path) for extras in specs), (
            f"{path}: no install line that brings megatron-core (verl[vllm,megatron])"
        )
