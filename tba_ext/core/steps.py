"""The arithmetic of verl's step units: optimizer updates per global step, the policy version data is counted
against, prompts to queue at the searchers, and verl's checkpoint folders. No verl import.

Every schedule and staleness setting of tba-ext counts optimizer updates (the paper's unit): one verl global step
is ``updates_per_step`` of them (k = parameter_sync_step in separate_async; train_batch_size /
ppo_mini_batch_size x ppo_epochs in general).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from typing import Any

_STEP_FOLDER = re.compile(r"global_step_(\d+)")


def step_folder(default_local_dir: str, global_step: int) -> str:
    """verl's checkpoint folder of a global step (``trainer.default_local_dir``/global_step_N)."""
    return os.path.join(default_local_dir, f"global_step_{global_step}")


def step_folders(default_local_dir: str) -> dict[int, str]:
    """verl's checkpoint folders under ``default_local_dir``, by global step."""
    if not os.path.isdir(default_local_dir):
        return {}
    found = (_STEP_FOLDER.fullmatch(name) for name in os.listdir(default_local_dir))
    return {int(m.group(1)): os.path.join(default_local_dir, m.group(0)) for m in found if m}


def prune_retired(default_local_dir: str, current_step: int, own: tuple[str, ...]) -> list[str]:
    """tba-ext's files (``own``: names inside a step folder) removed from every step folder verl's
    ``max_actor_ckpt_to_keep`` retired: those other than ``current_step``'s whose ``actor/`` verl deleted. Returns
    what was removed."""
    removed = []
    for step, folder in step_folders(default_local_dir).items():
        if step == current_step or os.path.isdir(os.path.join(folder, "actor")):
            continue
        for name in own:
            path = os.path.join(folder, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
            else:
                continue
            removed.append(path)
    return removed


def remove_stale_temp_files(default_local_dir: str, own: tuple[str, ...]) -> list[str]:
    """The temporary files a kill mid-save left of tba-ext's files (``own``, and the files inside a folder of
    ``own``): ``<name>.tmp-<pid>`` and ``.<name>.tmp``. Called at start, when no save is running."""
    removed = []
    for folder in step_folders(default_local_dir).values():
        places = [folder, *(os.path.join(folder, name) for name in own if os.path.isdir(os.path.join(folder, name)))]
        for place in places:
            for name in os.listdir(place):
                base = name.removeprefix(".").split(".tmp", 1)[0]
                stale = ".tmp-" in name or name.endswith(".tmp")
                if stale and (place != folder or base in own):
                    os.remove(os.path.join(place, name))
                    removed.append(os.path.join(place, name))
    return removed


def hf_model_dir(default_local_dir: str, global_step: int) -> str:
    """The Hugging Face copy verl saves with ``checkpoint.save_contents`` including hf_model."""
    return os.path.join(step_folder(default_local_dir, global_step), "actor", "huggingface")


def updates_per_step(cfg: Mapping[str, Any]) -> int:
    """Optimizer updates in one verl global step: one per mini-batch and PPO epoch (in separate_async the
    mini-batch count is k = parameter_sync_step, verl's own contract)."""
    actor = cfg["actor_rollout_ref"]["actor"]
    batch, mini = int(cfg["data"]["train_batch_size"]), int(actor["ppo_mini_batch_size"])
    return int(actor.get("ppo_epochs", 1)) * max(batch // mini, 1)


TBA_MODE_PREFIX = "tba_"  # tba-ext's trainer modes: verl's mode of the same name behind the prefix


def is_tba_mode(mode) -> bool:
    """Whether ``trainer.v1.trainer_mode`` names one of tba-ext's trainer modes."""
    return str(mode).startswith(TBA_MODE_PREFIX)


def verl_mode(mode) -> str:
    """The verl trainer mode a ``trainer.v1.trainer_mode`` runs as (``tba_separate_async`` -> ``separate_async``)."""
    return str(mode).removeprefix(TBA_MODE_PREFIX)


def local_updates(cfg: Mapping[str, Any]) -> int:
    """k: the ``update_actor`` calls that make one global step, each a local update between weight syncs
    (``trainer.v1.separate_async.parameter_sync_step`` in (tba_)separate_async; 1 in every other mode)."""
    v1 = cfg["trainer"].get("v1") or {}
    if verl_mode(v1.get("trainer_mode", "sync")) != "separate_async":
        return 1
    return int((v1.get("separate_async") or {}).get("parameter_sync_step") or 1)


def trainer_version(global_step: int, local_update: int, updates_per_step: int, local_updates: int) -> int:
    """Optimizer updates already applied to the policy that trains at ``local_update`` (from 0) of verl global
    step ``global_step`` (from 1), whose ``updates_per_step`` updates are made in ``local_updates`` samples (k in
    separate_async, else 1): the version the staleness of the sampled data is counted against."""
    return (max(global_step, 1) - 1) * updates_per_step + local_update * (updates_per_step // local_updates)


def dataloader_fetch(data: Mapping[str, Any]) -> int:
    """Prompts verl's dataloader hands over at once: ``data.gen_batch_size``, else ``data.train_batch_size``."""
    return data.get("gen_batch_size") or data["train_batch_size"]


def verl_dataloader_fetch(cfg: Mapping[str, Any]) -> int:
    """Prompts verl's V1 dataloader hands over at once (its ``_init_dataloader``): 1 where verl refills exactly
    (every trainer mode but sync, which a tba_* mode runs as; DAPO's ``algorithm.filter_groups``;
    ``trainer.v1.sampler.sync_refill_failed_groups``), else ``dataloader_fetch``."""
    v1 = cfg["trainer"].get("v1") or {}
    mode = verl_mode(v1.get("trainer_mode", "sync"))
    dapo = bool((cfg["algorithm"].get("filter_groups") or {}).get("enable", False))
    if mode != "sync" or dapo or (v1.get("sampler") or {}).get("sync_refill_failed_groups", False):
        return 1
    return dataloader_fetch(cfg["data"])


def steps_per_epoch(rows: int, train_batch_size: int) -> int:
    """Global steps in one pass over ``rows`` training prompts: verl's count (whole batches, rows //
    data.train_batch_size), and 1 where a step draws more prompts than the dataset holds (the dataloader starts the
    dataset again within the step), where verl's count is 0."""
    return max(rows // train_batch_size, 1)


def epochs_for_steps(total_training_steps: int | None, total_epochs: int, per_epoch: int) -> int:
    """``trainer.total_epochs`` under which verl's V1 loop, which stops after total_epochs x ``per_epoch`` global
    steps or after total_training_steps, whichever comes first, runs all total_training_steps: at least
    ceil(total_training_steps / per_epoch); total_epochs where it already does, or where total_training_steps is
    None (verl then derives it from the epochs)."""
    if total_training_steps is None:
        return total_epochs
    return max(total_epochs, -(-int(total_training_steps) // per_epoch))


def prompts_to_queue(
    queue: int, inflight: int, chunk: int, submitted: int, consumed: int, per_consumed: float | None
) -> int:
    """Prompts to hand the searchers now (whole dataloader ``chunk``s): enough to bring those queued or generating
    up to ``queue``; paced (``per_consumed``), never more than ``queue + per_consumed * consumed`` submitted in
    all, so the searchers stay at most the queue ahead of what the trainer consumes."""
    missing = queue - inflight
    if per_consumed is not None:
        missing = min(missing, int(queue + per_consumed * consumed) - submitted)
    return max(missing, 0) // chunk * chunk


def scheduler_updates_per_call(cfg: Mapping[str, Any]) -> int:
    """Optimizer updates per verl scheduler step: verl steps the actor's scheduler once per ``update_actor`` call,
    which is one per global step, or one per local update in separate_async."""
    return updates_per_step(cfg) // local_updates(cfg)
