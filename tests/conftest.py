import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

# |KL| between a policy and a reference that hold the same weights in two processes: float32 rounding only
# (~1e-8 per token here). It is also the line a moved policy's KL must clear: that KL is a signed per-token k1
# mean over the sampled tokens, usually 0.1-5 after one update at the tests' lr, but it comes near 0 (a few 1e-4)
# when the policy is nearly deterministic on the sampled tokens or positive and negative tokens cancel, so a test
# asks it to clear rounding, not to reach a size.
SAME_WEIGHTS_KL = 1e-5
# |log pi_theta - log pi_rollout| on one token when the rollout serves the trainer's weights: float32 rounding of
# two engines (incremental decoding against one forward pass), measured below 1e-5; a weight version one update
# old at the tests' learning rates moves log-probs by 1e-2 or more (the fused loss's weight-sync check)
SAME_WEIGHTS_LOGPROB = 1e-4


# The longest tests by the suite's --durations (several verl launches, or one long run): first of all
LONGEST_FIRST = (
    "tests/test_e2e.py::test_tba_replay_trains_on_stale_data_and_resumes_after_kill_9_twice",
    "tests/test_compare.py::test_compare_short",
    "tests/test_soak.py::test_a_short_soak",
    "tests/test_data_parallel.py",
    "tests/test_vllm_cpu.py",
    "tests/test_gpu_rehearsals.py::test_gpu_config_rehearsed_on_cpu",
)


def pytest_collection_modifyitems(config, items):
    """The suite ends when its last test does, and under pytest-xdist (``-n 2``) two long tests left for the end
    run alone: the longest go first, then the other e2e tests (a verl launch each), then the unit tests, which
    fill both cores to the end. The order within each rank is the collection order."""

    def rank(item) -> int:
        for i, prefix in enumerate(LONGEST_FIRST):
            if item.nodeid.startswith(prefix):
                return i
        return len(LONGEST_FIRST) + (item.get_closest_marker("e2e") is None)

    items.sort(key=rank)


@pytest.fixture(autouse=True)
def one_os_environ():
    """Every test ends with the ``os.environ`` object it started with.

    datasets' ``Dataset.map(num_proc>=1)`` rebinds ``os.environ`` to a deep copy (datasets 5.2,
    arrow_dataset.py:3540 and :3624); verl's RLHFDataset filters that way. monkeypatch then undoes its setenv
    on the original object while the copy keeps the value for every later test and subprocess: a GPU-view
    test's ``TBA_EXT_CPU_RUNTIME=off`` switched the e2e runs after it to the CUDA platform."""
    environ = os.environ
    yield
    os.environ = environ  # noqa: B003 (putting the original object back is the point)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A tiny offline model, the arith data and a short supervised warm start: shared by the tests."""
    from tba_ext.tasks.data import corpus_for, write_task
    from tba_ext.tools.models import ModelSpec, make_model
    from tba_ext.tools.warmstart import warm_start

    root = tmp_path_factory.mktemp("tiny_run")
    make_model(str(root / "model_init"), corpus_for("arith", 0), ModelSpec(size="tiny", seed=0))
    write_task("arith", str(root / "data"), train_size=256, test_size=32, seed=0)
    warm_start(
        str(root / "model_init"), str(root / "data" / "train.parquet"), str(root / "model"), steps=150, log_every=0
    )
    return root


@pytest.fixture()
def margin(request):
    """``margin(name, value, bound, below=True)``: assert ``value < bound`` (or ``> bound`` with below=False) and
    record how close it came (value / bound, or bound / value: 1.0 is the edge). Printed, and appended as a JSON
    line to ``$TBA_EXT_MARGINS`` when set, so repeated runs report their worst margin
    (benchmarks/e2e_margins.py)."""
    import json

    def check(name: str, value: float, bound: float, below: bool = True) -> None:
        value, bound = abs(float(value)), float(bound)
        ratio = value / bound if below else (bound / value if value else float("inf"))
        print(
            f"margin {request.node.nodeid} {name}: {value:.3g} {'<' if below else '>'} {bound:.3g} "
            f"({ratio:.3g} of the way to the bound)"
        )
        path = os.environ.get("TBA_EXT_MARGINS")
        if path:
            with open(path, "a") as f:
                f.write(
                    json.dumps(
                        {
                            "test": request.node.nodeid,
                            "check": name,
                            "value": value,
                            "bound": bound,
                            "below": below,
                            "ratio": ratio,
                        }
                    )
                    + "\n"
                )
        assert ratio < 1.0, f"{name}: {value:.3g} is not {'below' if below else 'above'} {bound:.3g}"

    return check


def wait_for(predicate, timeout: float, what: str, proc=None) -> None:
    """Poll ``predicate`` until it holds; fail saying what was awaited if the run ends or the time runs out."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read()[-3000:] if proc.stdout else ""
            raise AssertionError(f"the run ended (code {proc.returncode}) before {what}:\n{out}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Holds:
    """Hold points (``tba_ext/core/hold.py``) for runs a test starts: ``env(...)`` goes into the run's environment,
    ``reached(point, proc)`` waits until the run is held there (or fails saying what it waited for), and
    ``release(point)`` lets it go on."""

    def __init__(self, folder):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def env(self, *points: str) -> dict:
        from tba_ext.core.hold import HOLD_AT_ENV, HOLD_DIR_ENV

        return {HOLD_AT_ENV: ",".join(points), HOLD_DIR_ENV: str(self.folder)}

    def _parsed(self, point: str) -> tuple[str, str, int]:
        name, _, at = point.partition("@")
        return str(self.folder), name, int(at)

    def reached(self, point: str, proc, timeout: float = 600.0) -> dict:
        import json

        from tba_ext.core import hold

        wait_for(lambda: hold.reached(*self._parsed(point)), timeout, f"it reached the hold point {point}", proc)
        with open(hold.marker(*self._parsed(point), "reached")) as f:
            return json.load(f)

    def release(self, point: str) -> None:
        from tba_ext.core import hold

        hold.release(*self._parsed(point))


@pytest.fixture()
def holds(tmp_path):
    return Holds(tmp_path / "holds")
