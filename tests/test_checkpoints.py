"""A checkpoint of another run is refused whole, with a message naming what differs, never loaded in part."""

import pytest
import torch

from tba_ext.adapters.reference import check_reference_folder
from tba_ext.core.replay import load_checked


def save_shards(folder, ranks):
    folder.mkdir(exist_ok=True)
    for rank in ranks:
        torch.save({"world_size": len(ranks), "tensors": {}}, folder / f"rank_{rank}.pt")


@pytest.mark.parametrize("saved, world", [(range(2), 1), (range(1), 2), ([0, 2], 2), (range(12), 11)])
def test_a_reference_saved_over_another_number_of_ranks_is_refused_before_any_rank_loads(tmp_path, saved, world):
    save_shards(tmp_path / "reference", list(saved))
    with pytest.raises(RuntimeError, match=rf"{world} rank\(s\).*trainer\.n_gpus_per_node x trainer\.nnodes"):
        check_reference_folder(str(tmp_path / "reference"), world)


def test_a_reference_of_this_runs_ranks_passes(tmp_path):
    save_shards(tmp_path / "reference", range(12))
    (tmp_path / "reference" / ".rank_3.pt.tmp").write_bytes(b"")  # a save cut off before its rename
    check_reference_folder(str(tmp_path / "reference"), 12)


@pytest.mark.parametrize(
    "content, message",
    [(b"not a checkpoint", "corrupt or unreadable"), (None, "not a tba-ext replay store")],
)
def test_a_damaged_or_foreign_replay_store_is_refused_naming_its_path(tmp_path, content, message):
    path = tmp_path / "replay_store.pt"
    if content is None:
        torch.save({"format": "someone else's"}, path)
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as refused:
        load_checked(str(path))
    assert str(path) in str(refused.value)
