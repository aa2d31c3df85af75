"""The replay journal: what a trainer read after its checkpoint survives a kill, and a resume replays it with the
ids it had. The kill -9 itself, through the real trainer, is in tests/test_e2e.py."""

import numpy as np
import pytest
from omegaconf import OmegaConf

from tba_ext.adapters.sampler import TBAReplaySampler
from tba_ext.core.journal import Journal, read_journal
from tba_ext.core.replay import Trajectory, journal_fields
from tba_ext.core.sealed import SealedFileError


def test_records_come_back_in_order_and_a_cut_last_record_is_reported_with_its_count(tmp_path):
    path = tmp_path / "journal.bin"
    journal = Journal(str(path))
    records = [{"entries": [[i, None, np.arange(i + 1, dtype=np.int32)]] * (i + 1)} for i in range(3)]
    ends = []
    for i, record in enumerate(records):
        journal.append(record, i + 1)
        ends.append(path.stat().st_size)
    journal.close()
    whole = path.read_bytes()
    back, cut = read_journal(str(path))
    assert cut == 0 and [len(r["entries"]) for r in back] == [1, 2, 3]
    assert np.array_equal(back[2]["entries"][0][2], np.arange(3, dtype=np.int32))
    header = 16 + 32  # body bytes, trajectories, digest
    for end in range(ends[1] + 1, ends[2]):  # every place a kill can cut the last append
        path.write_bytes(whole[:end])
        back, cut = read_journal(str(path))
        assert len(back) == 2 and cut == (3 if end - ends[1] >= header else None), end
        assert path.read_bytes() == whole[: ends[1]]  # the cut record is gone: appends go on after record 2
    damaged = bytearray(whole)
    damaged[ends[0] + header + 2] ^= 0x10  # inside the second record: not a cut, a corruption
    path.write_bytes(bytes(damaged))
    with pytest.raises(SealedFileError, match=f"replay journal {path} is corrupt: the record at byte {ends[0]}"):
        read_journal(str(path))


def a_replay_buffer():
    return TBAReplaySampler(
        trainer_mode="tba_sync",
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs={"per_prompt_capacity": 3},
    )


def test_a_resume_admits_the_journals_reads_with_their_ids_and_books_a_cut_read_as_crash(tmp_path):
    checkpointed = a_replay_buffer()  # the store as its checkpoint holds it: 2 ids
    for i in range(2):
        traj = Trajectory("p0", [i, 1], 1.0, 0)
        traj.ledger_id = checkpointed.store.ledger.new_id()
        checkpointed.store.admit(traj, prompt_payload=b"fields")
    state = checkpointed.sampler.state_dict()

    path = tmp_path / "tba_journal.bin"
    journal = Journal(str(path))
    reads = [[("p0", [7, 7]), ("p1", [5]), ("p1", [5])], [("p2", [1, 2, 3])]]  # p1's second copy: a duplicate
    next_id = 2
    for read in reads:
        entries = []
        for prompt, response in read:
            entries.append([next_id, None, prompt, b"fields", *journal_fields(Trajectory(prompt, response, 0.5, 3))])
            next_id += 1
        entries.append([next_id, "unknown_version"])
        next_id += 1
        journal.append({"entries": entries, "largest_group": 3}, len(entries))
    journal.append({"entries": [[next_id, None]] * 4}, 4)
    journal.close()
    with open(path, "r+b") as f:  # the last read cut by the kill
        f.truncate(path.stat().st_size - 3)

    resumed = a_replay_buffer()
    resumed.sampler.load_state_dict(state)
    resumed.replay_journal(str(path))
    counts = resumed.store.ledger.counts()
    assert counts["ids"] == next_id + 4 and counts["dropped/crash"] == 4 and counts["dropped/unknown_version"] == 2
    assert counts["evicted/duplicate"] == 1 and counts["stored"] == len(resumed.store) == 2 + 3
    resumed.store.ledger.check(resumed.store.stored_ledger_ids())
    assert [t.ledger_id for t in resumed.store.trajectories("p2")] == [6]
    assert resumed.journal_replayed == 6 and resumed.unknown_version == 2
    resumed.journal.append({"entries": []}, 0)  # it goes on appending to the same journal, after the whole records
    assert [len(r["entries"]) for r in read_journal(str(path))[0]] == [4, 2, 0]

    stranger = a_replay_buffer()  # a journal that does not follow this store's ledger
    with pytest.raises(ValueError, match="does not continue the ledger of the checkpoint beside it"):
        stranger.replay_journal(str(path))
