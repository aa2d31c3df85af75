"""A checkpoint of another run is refused whole, with a message naming what differs, never loaded in part."""

import os

import pytest

from tba_ext.adapters.reference import check_reference_folder
from tba_ext.core.replay import load_checked
from tba_ext.core.sealed import write_sealed


def save_shards(folder, ranks):
    folder.mkdir(exist_ok=True)
    for rank in ranks:
        write_sealed(str(folder / f"rank_{rank}.pt"), {"world_size": len(ranks), "tensors": {}})


@pytest.mark.parametrize("saved, world", [(range(2), 1), (range(1), 2), ([0, 2], 2), (range(12), 11)])
def test_a_reference_saved_over_another_number_of_ranks_is_refused_before_any_rank_loads(tmp_path, saved, world):
    save_shards(tmp_path / "reference", list(saved))
    with pytest.raises(RuntimeError, match=rf"{world} rank\(s\).*trainer\.n_gpus_per_node x trainer\.nnodes"):
        check_reference_folder(str(tmp_path / "reference"), world)


def test_a_reference_of_this_runs_ranks_passes(tmp_path):
    save_shards(tmp_path / "reference", range(12))
    (tmp_path / "reference" / "rank_3.pt.tmp-123").write_bytes(b"")  # a save cut off before its rename
    check_reference_folder(str(tmp_path / "reference"), 12)


@pytest.mark.parametrize(
    "content, message",
    [(b"not a checkpoint", "not a tba-ext sealed file"), (None, "not a tba-ext replay store")],
)
def test_a_damaged_or_foreign_replay_store_is_refused_naming_its_path(tmp_path, content, message):
    path = tmp_path / "replay_store.pt"
    if content is None:
        write_sealed(str(path), {"format": "someone else's"})
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as refused:
        load_checked(str(path))
    assert str(path) in str(refused.value)


@pytest.mark.parametrize("damage", ["cut in half", "a byte flipped", "intact"])
def test_the_store_a_resume_would_load_is_checked_whole_before_ray_starts(tmp_path, damage):
    from tba_ext.adapters.checks import check_resume_store
    from tba_ext.core.replay import REPLAY_FILE, ReplaySampler, Trajectory, TrajectoryStore, save_atomic
    from tba_ext.core.settings import ReplaySettings

    store = TrajectoryStore(4, 100)
    for i in range(50):
        store.admit(Trajectory(f"p{i % 7}", list(range(i, i + 20)), float(i % 2), version=i))
    ckpt = tmp_path / "ckpt"
    folder = ckpt / "global_step_6"
    folder.mkdir(parents=True)
    path = folder / REPLAY_FILE
    save_atomic({"sampler": ReplaySampler(store, ReplaySettings()).state_dict()}, str(path))
    data = bytearray(path.read_bytes())
    if damage == "cut in half":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "a byte flipped":  # inside the stored trajectories: only the digest can tell
        data[len(data) // 3] ^= 0xFF
        path.write_bytes(bytes(data))
    trainer = {"resume_mode": "auto", "default_local_dir": str(ckpt)}
    check_resume_store(trainer)  # no tracker file yet: a fresh start, nothing to check
    (ckpt / "latest_checkpointed_iteration.txt").write_text("6")
    for resume in (trainer, {"resume_mode": "resume_path", "resume_from_path": str(folder)}):
        if damage == "intact":
            check_resume_store(resume)
            continue
        with pytest.raises(ValueError, match="is corrupt: its contents do not match its digest") as refused:
            check_resume_store(resume)
        assert str(path) in str(refused.value) and "trainer.resume_from_path" in str(refused.value)
    check_resume_store({"resume_mode": "disable", "default_local_dir": str(ckpt)})


def test_tba_files_leave_the_step_folders_verls_retention_retired_and_stale_temp_files_go_at_start(tmp_path):
    from tba_ext.adapters.trainer import OWN_FILES
    from tba_ext.core.steps import prune_retired, remove_stale_temp_files, step_folder

    for step in (2, 4, 6):
        folder = step_folder(str(tmp_path), step)
        os.makedirs(os.path.join(folder, "tba_reference"))
        for name in ("tba_replay.pt", "tba_journal.bin", "tba_reference/rank_0.pt", "data.pt"):
            open(os.path.join(folder, name), "w").close()
        if step != 2:  # verl's max_actor_ckpt_to_keep=2 removed global_step_2/actor, the others keep theirs
            os.makedirs(os.path.join(folder, "actor"))
    os.makedirs(step_folder(str(tmp_path), 8))  # the step being saved: no actor/ yet
    open(os.path.join(step_folder(str(tmp_path), 8), "tba_replay.pt"), "w").close()
    removed = prune_retired(str(tmp_path), 8, OWN_FILES)
    assert sorted(removed) == sorted(os.path.join(step_folder(str(tmp_path), 2), n) for n in OWN_FILES)
    assert os.listdir(step_folder(str(tmp_path), 2)) == ["data.pt"]  # verl's own file is verl's business
    assert os.path.exists(os.path.join(step_folder(str(tmp_path), 8), "tba_replay.pt"))
    assert prune_retired(str(tmp_path), 8, OWN_FILES) == []

    four = step_folder(str(tmp_path), 4)
    stale = [
        os.path.join(four, "tba_replay.pt.tmp-4242"),  # write_atomic's, killed before its rename
        os.path.join(four, "tba_reference", "rank_0.pt.tmp-77"),
        os.path.join(four, "tba_reference", ".rank_1.pt.tmp"),  # the shard writer's older name
    ]
    kept = [os.path.join(four, "data.pt.tmp-1"), os.path.join(four, "actor", "model.tmp-9")]  # not tba-ext's
    for path in stale + kept:
        open(path, "w").close()
    assert sorted(remove_stale_temp_files(str(tmp_path), OWN_FILES)) == sorted(stale)
    assert all(os.path.exists(path) for path in kept)
    assert os.path.exists(os.path.join(four, "tba_replay.pt"))
