"""What tba-ext reads back from disk is verified whole and cannot run code: the sealed format (no verl)."""

import os
import pickle
import random

import numpy as np
import pytest
import torch

from tba_ext.core import sealed
from tba_ext.core.replay import (
    REPLAY_FILE,
    ReplaySampler,
    Trajectory,
    TrajectoryStore,
    check_store_file,
    load_checked,
    save_atomic,
    saved_ledger,
)
from tba_ext.core.settings import ReplaySettings


def test_every_type_a_verl_row_carries_comes_back_equal_and_of_its_type():
    value = {
        "none": None,
        "flags": [True, False],
        "ints": (1, -(2**62)),
        "float": 0.1,
        "text": "data_source",
        "raw": b"\x00\xff",
        "nested": {"reward_model": {"ground_truth": "42"}, 7: ("a", 1)},
        "int32": np.arange(5, dtype=np.int32),
        "f16": np.array([[0.5, -1.0]], dtype=np.float16),
        "scalar": np.int64(3),
        "objects": np.array([{"a": 1}, "b", None], dtype=object),
        "tensor": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "bf16": torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
        "empty": torch.zeros(0, 4),
        "bool_tensor": torch.tensor([True, False]),
    }
    back = sealed.unpack(sealed.pack(value))
    assert back.keys() == value.keys()
    for key in ("none", "flags", "ints", "float", "text", "raw", "nested"):
        assert back[key] == value[key] and type(back[key]) is type(value[key]), key
    for key in ("int32", "f16"):
        assert back[key].dtype == value[key].dtype and np.array_equal(back[key], value[key])
    assert back["scalar"] == 3 and back["scalar"].dtype == np.int64
    assert back["objects"].dtype == object and back["objects"].tolist() == [{"a": 1}, "b", None]
    for key in ("tensor", "bf16", "empty", "bool_tensor"):
        assert back[key].dtype == value[key].dtype and back[key].shape == value[key].shape
        assert torch.equal(back[key], value[key])


@pytest.mark.parametrize("value", [object(), {"when": __import__("datetime").date(2026, 1, 1)}, {1, 2}])
def test_a_type_that_only_pickle_could_store_is_refused_by_name(value):
    with pytest.raises(TypeError, match="cannot store a value of type"):
        sealed.pack(value)


def a_saved_store(tmp_path):
    store = TrajectoryStore(4, 100)
    for i in range(60):
        traj = Trajectory(f"p{i % 7}", list(range(i, i + 20)), float(i % 2), version=i, extras=b"x" * 10)
        traj.ledger_id = store.ledger.new_id()
        store.admit(traj, prompt_payload=b"prompt fields")
    path = tmp_path / REPLAY_FILE
    save_atomic({"sampler": ReplaySampler(store, ReplaySettings(seed=3)).state_dict(), "largest_group": 2}, str(path))
    return store, path


def test_every_single_bit_flip_in_a_saved_store_is_refused_by_the_preflight_the_load_and_the_ledger_command(tmp_path):
    store, path = a_saved_store(tmp_path)
    good = path.read_bytes()
    assert len(load_checked(str(path))["sampler"]["store"]["trajectories"]) == len(store)
    rng = random.Random(0)
    # every byte of the header (magic and digest), then 300 random bits of the body
    positions = [(i, rng.randrange(8)) for i in range(len(sealed.MAGIC) + sealed.DIGEST_BYTES)]
    positions += [(rng.randrange(len(good)), rng.randrange(8)) for _ in range(300)]
    for byte, bit in positions:
        flipped = bytearray(good)
        flipped[byte] ^= 1 << bit
        path.write_bytes(bytes(flipped))
        for load in (check_store_file, load_checked, saved_ledger):
            with pytest.raises(ValueError, match=f"replay store checkpoint {path} is (corrupt|not a tba-ext)"):
                load(str(path))
    path.write_bytes(good[:-1])  # cut by one byte
    with pytest.raises(ValueError, match="corrupt"):
        load_checked(str(path))


class RunsCode:
    def __reduce__(self):
        return (os.system, (f"touch {RunsCode.marker}",))


@pytest.mark.parametrize("writer", ["torch.save", "pickle"])
def test_a_pickle_with_a_reduce_payload_at_the_stores_path_is_refused_and_its_code_never_runs(tmp_path, writer):
    RunsCode.marker = tmp_path / "ran"
    path = tmp_path / REPLAY_FILE
    payload = {"format": "tba-ext-replay", "format_version": 4, "state": RunsCode()}
    if writer == "torch.save":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload))
    for load in (check_store_file, load_checked):
        with pytest.raises(ValueError, match="not a tba-ext sealed file .*never reads those"):
            load(str(path))
    assert not RunsCode.marker.exists()


def test_a_sealed_file_of_another_kind_or_version_is_refused_naming_what_it_is(tmp_path):
    path = tmp_path / REPLAY_FILE
    sealed.write_sealed(str(path), {"format": "someone else's"})
    with pytest.raises(ValueError, match="is not a tba-ext replay store"):
        load_checked(str(path))
    sealed.write_sealed(str(path), {"format": "tba-ext-replay", "format_version": 4, "state": {}})
    with pytest.raises(ValueError, match=r"format version 4, this tba-ext reads \(5,\)"):
        load_checked(str(path))


def test_a_store_saved_without_dedup_is_refused_by_a_store_that_dedups_instead_of_half_loading(tmp_path):
    mixed = TrajectoryStore(8, 100, dedup=False)
    for version in range(4):  # the same response at every version: four copies, kept as four
        mixed.admit(Trajectory("p", [1, 2, 3], 1.0, version))
    state = mixed.state_dict()
    with pytest.raises(ValueError, match="resume with the staleness_mix it was saved with"):
        TrajectoryStore(8, 100, dedup=True).load_state_dict(state)
    same = TrajectoryStore(8, 100, dedup=False)
    same.load_state_dict(state)
    assert len(same) == 4 and same.resize(2, 100, None) == 2  # resized, not looping


def test_a_store_whose_index_disagrees_with_its_items_is_refused(tmp_path):
    store = TrajectoryStore(8, 100)
    store.admit(Trajectory("p", [1, 2], 1.0, 0))
    store.admit(Trajectory("p", [3, 4], 1.0, 1))
    state = store.state_dict()
    state["trajectories"][1] = (*state["trajectories"][0][:3], 1, *state["trajectories"][0][4:])
    with pytest.raises(ValueError, match="two trajectories of prompt 'p' as one"):
        TrajectoryStore(8, 100).load_state_dict(state)
    state = store.state_dict()
    state["version_prompts"] = [(0, ["p"])]
    with pytest.raises(ValueError, match="version index does not match"):
        TrajectoryStore(8, 100).load_state_dict(state)


def test_every_flipped_bit_in_a_reference_shard_is_refused_before_any_rank_loads(tmp_path):
    from tba_ext.adapters.reference import check_reference_folder

    folder = tmp_path / "tba_reference"
    folder.mkdir()
    for rank in range(2):
        tensors = {"w": torch.randn(8, 4).to(torch.bfloat16), "b": torch.ones(4)}
        sealed.write_sealed(str(folder / f"rank_{rank}.pt"), {"world_size": 2, "tensors": tensors})
    check_reference_folder(str(folder), 2)
    good = (folder / "rank_1.pt").read_bytes()
    rng = random.Random(1)
    for _ in range(100):
        flipped = bytearray(good)
        flipped[rng.randrange(len(good))] ^= 1 << rng.randrange(8)
        (folder / "rank_1.pt").write_bytes(bytes(flipped))
        with pytest.raises(ValueError, match=f"reference shard {folder}/rank_1.pt is (corrupt|not a tba-ext)"):
            check_reference_folder(str(folder), 2)
    torch.save({"world_size": 2, "tensors": {}}, folder / "rank_1.pt")  # a shard as an older tba-ext wrote it
    with pytest.raises(ValueError, match="never reads those"):
        check_reference_folder(str(folder), 2)
