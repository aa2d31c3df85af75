"""A two-node Ray cluster on one host, started the way a cluster user starts one (``ray start`` per node, own
ports and resources), and decoupled TBA joining it: the trainer on one node, the searcher on the other, weights
crossing nodes through Ray's object store; stopping the nodes as ``ray stop`` does leaves no process behind.

Each node is ``ray start --block``, so its daemons and workers stay in its process tree and the test stops
exactly what it started (never ``ray stop``, which would stop every Ray on the machine)."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest
import ray

pytestmark = pytest.mark.e2e


# each node's worker ports: a fixed range per test process, which the other ports must stay out of (Ray refuses
# to start a node whose components share a port; a random port inside the range failed a CI run once)
WORKER_PORTS_BASE = 40000 + (os.getpid() % 100) * 200
WORKER_PORTS = range(WORKER_PORTS_BASE, WORKER_PORTS_BASE + 200)


# every port this process has handed out: the kernel may give a closed port back at once, and a port picked for the
# GCS is not bound until its node starts, so a second pick could return it (a CI run failed with runtime_env_agent
# and gcs_server on one port)
HANDED_OUT: set[int] = set()


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in WORKER_PORTS and port not in HANDED_OUT:
            HANDED_OUT.add(port)
            return port


def start_node(env, tmp_path, ray_tmp, gcs_address, head: bool, worker_ports: int, resources: str | None = None):
    """One Ray node; two on one host need their own ports (on real machines the defaults do). ``resources``: Ray's
    ``--resources`` JSON (a fake GPU model's ``accelerator_type:...``)."""
    args = [
        os.path.join(os.path.dirname(sys.executable), "ray"),
        "start",
        "--block",
        f"--temp-dir={ray_tmp}",
        "--num-cpus=8",
        "--num-gpus=1",
        "--object-store-memory=200000000",
        "--disable-usage-stats",
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
        f"--min-worker-port={worker_ports}",
        f"--max-worker-port={worker_ports + 99}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
    ]
    if resources:
        args.append(f"--resources={resources}")
    if head:
        args += [
            "--head",
            f"--port={gcs_address.rsplit(':', 1)[1]}",
            "--include-dashboard=false",
            f"--ray-client-server-port={free_port()}",
        ]
    else:
        args += [f"--address={gcs_address}"]
    log = open(tmp_path / f"node_{'head' if head else 'worker'}.log", "w")
    # SIGINT back to default: Ray's node stops its agents with it, and a test started in the background (``cmd &``
    # in a script) would hand down an ignored SIGINT that leaves them running
    return subprocess.Popen(
        args,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def tree(proc) -> list[psutil.Process]:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop_leftovers(procs, grace: float) -> str:
    """Wait ``grace`` s for ``procs`` to exit on their own, then SIGTERM the rest, wait ``grace`` s more and SIGKILL
    what still runs. Returns the titles of those that needed a signal."""
    deadline = time.time() + grace
    while (left := [p for p in procs if alive(p)]) and time.time() < deadline:
        time.sleep(1)
    outlived = titles(left)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in left:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        deadline = time.time() + grace
        while (left := [p for p in left if alive(p)]) and time.time() < deadline:
            time.sleep(1)
    return outlived


def titles(procs) -> str:
    out = []
    for p in procs:
        try:
            out.append(" ".join(p.cmdline()))
        except psutil.Error:
            pass
    return "\n".join(out)


def test_decoupled_tba_on_a_two_node_cluster_trainer_and_searcher_on_different_nodes(tiny_run, tmp_path):
    trace = tmp_path / "rollout_trace.jsonl"
    env = dict(
        os.environ,
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
        OMP_NUM_THREADS="1",
        TBA_EXT_ROLLOUT_TRACE=str(trace),
    )
    env.pop("RAY_ADDRESS", None)
    gcs_address = f"{ray.util.get_node_ip_address()}:{free_port()}"
    ray_tmp = tempfile.mkdtemp(prefix="tba_mn_", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    base = WORKER_PORTS_BASE
    head = start_node(env, tmp_path, ray_tmp, gcs_address, head=True, worker_ports=base)
    nodes = [head]
    seen: set[psutil.Process] = set()
    try:
        time.sleep(5)
        nodes.append(start_node(env, tmp_path, ray_tmp, gcs_address, head=False, worker_ports=base + 100))
        deadline = time.time() + 120
        while "2.0 GPU" not in (
            status := subprocess.run(
                [os.path.join(os.path.dirname(sys.executable), "ray"), "status", f"--address={gcs_address}"],
                env=env,
                capture_output=True,
                text=True,
            ).stdout
        ):
            assert time.time() < deadline, f"the two nodes did not join:\n{status}"
            assert all(n.poll() is None for n in nodes), (tmp_path / "node_worker.log").read_text()[-2000:]
            time.sleep(2)

        metrics = tmp_path / "metrics.jsonl"
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tba_ext.cli",
                "train",
                "--config",
                "cpu_tba_decoupled",
                "--log",
                str(tmp_path / "verl.log"),
                "--metrics",
                str(metrics),
                f"run_dir={tiny_run}",
                f"+ray_kwargs.ray_init.address={gcs_address}",
                "trainer.total_training_steps=4",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        placement = {}
        while run.poll() is None:  # where verl placed the trainer and the searcher
            for name, node in (("head", head), ("worker", nodes[1])):
                procs = tree(node)
                seen.update(procs)
                text = titles(procs)
                for role, marker in (("trainer", "WorkerDict"), ("searcher", "HFCPUServer")):
                    if marker in text:
                        placement.setdefault(role, set()).add(name)
            time.sleep(2)
        out = run.stdout.read()
        assert run.returncode == 0, out[-3000:]

        records = [json.loads(line)["data"] for line in open(metrics)]
        assert len(records) == 4
        assert placement.get("trainer") and placement.get("searcher"), placement
        assert len(placement["trainer"]) == 1 and placement["trainer"].isdisjoint(placement["searcher"]), placement
        # weights crossed nodes: the searcher (on the other node) served versions the trainer published
        versions = [
            e["global_steps"] for e in map(json.loads, trace.read_text().splitlines()) if e["event"] == "weights"
        ]
        assert versions and max(versions) >= 2, versions
    finally:
        for node in reversed(nodes):
            seen.update(tree(node))
            if node.poll() is None:
                node.send_signal(signal.SIGTERM)
        for node in nodes:
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.kill()
    # a clean stop, as `ray stop` makes one: a process that outlives its node (Ray's dashboard agent only notices
    # its raylet's death by polling, which lagged > 60 s once on a loaded CI machine) gets SIGTERM, then SIGKILL
    # after a grace period; nothing the two nodes started may be left running
    outlived = stop_leftovers(seen, grace=30)
    if outlived:
        print("outlived their node and were stopped:\n" + outlived)
    left = [p for p in seen if alive(p)]
    assert not left, titles(left)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def wait_for_node(gcs_address, env, node, tmp_path):
    deadline = time.time() + 120
    while (
        "1.0 GPU"
        not in subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "ray"), "status", f"--address={gcs_address}"],
            env=env,
            capture_output=True,
            text=True,
        ).stdout
    ):
        assert time.time() < deadline and node.poll() is None, (tmp_path / "node_head.log").read_text()[-2000:]
        time.sleep(2)


def test_the_cpu_runtime_is_the_clusters_choice_not_one_nodes(tmp_path):
    """On this GPU-less host, a cluster whose only node declares logical GPU slots (as the CPU configs do) runs the
    CPU runtime; the same host in a cluster with a GPU node (a fake GPU model resource, as Ray adds for a detected
    GPU) does not, in the launcher's choice and in the cluster's worker processes alike."""
    from tba_ext.cpu.runtime import OVERRIDE_ENV
    from tba_ext.tools.launch import joined_cluster_runtime

    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1")
    env.pop("RAY_ADDRESS", None)
    env.pop(OVERRIDE_ENV, None)
    seen = {}
    for fake_gpu in (False, True):
        gcs_address = f"{ray.util.get_node_ip_address()}:{free_port()}"
        ray_tmp = tempfile.mkdtemp(prefix="tba_pc_", dir="/tmp")
        resources = '{"accelerator_type:H100": 1}' if fake_gpu else None
        head = start_node(
            env, tmp_path, ray_tmp, gcs_address, head=True, worker_ports=WORKER_PORTS_BASE, resources=resources
        )
        procs = set()
        try:
            wait_for_node(gcs_address, env, head, tmp_path)
            cfg = {"ray_kwargs": {"ray_init": {"address": gcs_address}}}
            launcher = joined_cluster_runtime(cfg)
            ray.init(address=gcs_address, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}}, log_to_driver=False)
            try:

                @ray.remote(num_cpus=1)
                def in_a_worker():
                    import os

                    from tba_ext.cpu.runtime import cpu_runtime_active

                    return os.environ.get("TBA_EXT_CPU_RUNTIME"), cpu_runtime_active()

                override, worker = ray.get(in_a_worker.remote(), timeout=120)
            finally:
                ray.shutdown()
            assert override is None  # the worker decided by itself, from the cluster
            seen[fake_gpu] = (launcher, worker)
            procs.update(tree(head))
        finally:
            head.send_signal(signal.SIGTERM)
            try:
                head.wait(timeout=60)
            except subprocess.TimeoutExpired:
                head.kill()
            stop_leftovers(list(procs), grace=10)
            shutil.rmtree(ray_tmp, ignore_errors=True)
    assert seen == {False: ("on", True), True: ("off", False)}, seen
