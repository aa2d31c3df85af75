"""The replay journal: what the trainer reads from the searchers, appended and fsynced before any of it is trained on,
so a trainer killed between two checkpoints loses none of it. No verl import.

One journal per checkpoint: ``global_step_N/tba_journal.bin`` holds what was read after checkpoint N was saved. A
resume from N replays it into the restored store, in the order it was read, then appends to it. Each record is one
read (``append``): its byte length, how many trajectories it holds, a BLAKE2b digest, then msgpack
(``tba_ext.core.sealed``, data only). A kill mid-append can only cut the last record: ``read_journal`` returns the
records before it and the cut one's trajectory count, which the caller books as lost. A damaged record elsewhere is
refused, naming the file.
"""

from __future__ import annotations

import os
import struct

from tba_ext.core.sealed import DIGEST_BYTES, SealedFileError, digest, pack, unpack

JOURNAL_FILE = "tba_journal.bin"
_HEAD = struct.Struct(f"<QQ{DIGEST_BYTES}s")  # body bytes, trajectories, digest of the body


class Journal:
    """An open journal, appended to by ``append``."""

    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "ab")

    def append(self, record: dict, trajectories: int) -> None:
        """One read's ``record`` (msgpack-able), durable once this returns: written, flushed and fsynced."""
        body = pack(record)
        self._file.write(_HEAD.pack(len(body), trajectories, digest(body)) + body)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def read_journal(path: str) -> tuple[list[dict], int | None]:
    """The records of the journal at ``path`` in the order written, and the trajectories of a record a crash cut
    at the end (0 if none; None when even its header was cut, so its count is unknown). A cut record is removed
    from the file, so that appends go on after the last whole one."""
    with open(path, "rb") as f:
        data = f.read()
    records, at = [], 0
    while at < len(data):
        length, trajectories, expected = _HEAD.unpack_from(data, at) if len(data) - at >= _HEAD.size else (0, None, b"")
        body = data[at + _HEAD.size : at + _HEAD.size + length]
        if trajectories is None or len(body) < length:  # the last record, cut mid-write (its header too: None)
            with open(path, "r+b") as f:
                f.truncate(at)
                os.fsync(f.fileno())
            return records, trajectories
        if digest(body) != expected:
            raise SealedFileError(
                f"replay journal {path} is corrupt: the record at byte {at} does not match its digest (not a write "
                "cut by a crash, which can only shorten the last record)"
            )
        records.append(unpack(body))
        at += _HEAD.size + length
    return records, 0
