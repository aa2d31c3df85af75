"""The files tba-ext writes and reads back: data only, sealed with a digest, written atomically. No verl import.

A sealed file is ``MAGIC``, a 32-byte BLAKE2b digest of the body, then the body. ``read_sealed`` checks the magic and
the digest before any byte of the body is decoded, so a cut, overwritten or bit-flipped file is refused whole.

Bodies are msgpack through ``pack`` / ``unpack``: None, bool, int, float, str, bytes, list, tuple, dict, numpy arrays
and scalars, torch tensors (any dtype, bfloat16 included). Nothing in that set names a function or a class to call,
so a file cannot run code when it is read (a pickle can: its ``__reduce__`` runs inside ``pickle.loads`` and
``torch.load(weights_only=False)``).
"""

from __future__ import annotations

import hashlib
import os

import msgpack
import numpy as np
import torch

MAGIC = b"TBA-EXT-SEALED-1\n"
DIGEST_BYTES = 32
# msgpack extension codes
_TUPLE, _NDARRAY, _TENSOR, _NPSCALAR, _OBJECT_ARRAY, _BIG_INT = 1, 2, 3, 4, 5, 6
_TORCH_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


class SealedFileError(ValueError):
    """A sealed file that is cut, altered, of another kind, or holds what ``unpack`` does not read."""


def digest(body: bytes) -> bytes:
    """The BLAKE2b digest every sealed file and journal record carries."""
    return hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest()


def _corrupt(what: str) -> SealedFileError:
    return SealedFileError(f"{what} is corrupt: its contents do not match its digest (a cut or altered file)")


def _encode(value):
    """msgpack's hook for what it does not pack itself."""
    if isinstance(value, tuple):
        return msgpack.ExtType(_TUPLE, pack(list(value)))
    if type(value) is int:  # beyond 64 bits (numpy's generator state holds 128-bit integers)
        return msgpack.ExtType(_BIG_INT, str(value).encode())
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        return msgpack.ExtType(_TENSOR, pack([str(value.dtype).removeprefix("torch."), list(value.shape), data]))
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return msgpack.ExtType(_OBJECT_ARRAY, pack([list(value.shape), value.reshape(-1).tolist()]))
        if value.dtype.kind not in "biufc" or value.dtype.fields is not None:
            raise TypeError(f"cannot store a numpy array of dtype {value.dtype}")
        return msgpack.ExtType(_NDARRAY, pack([value.dtype.str, list(value.shape), value.tobytes()]))
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        return msgpack.ExtType(_NPSCALAR, pack([value.dtype.str, value.tobytes()]))
    for base in (str, bytes, int, float, dict, list):  # a subclass (np.str_, OrderedDict, an IntEnum) as its base
        if isinstance(value, base):
            return base(value)
    raise TypeError(f"cannot store a value of type {type(value).__module__}.{type(value).__qualname__}")


def _decode(code: int, data: bytes):
    if code == _BIG_INT:
        return int(data.decode())
    fields = unpack(data)
    if code == _TUPLE:
        return tuple(fields)
    if code == _NDARRAY:
        dtype, shape, raw = fields
        return np.frombuffer(raw, dtype=_numeric_dtype(dtype)).reshape(shape).copy()
    if code == _NPSCALAR:
        dtype, raw = fields
        return np.frombuffer(raw, dtype=_numeric_dtype(dtype))[0]
    if code == _OBJECT_ARRAY:
        shape, items = fields
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(shape)
    if code == _TENSOR:
        dtype, shape, raw = fields
        if dtype not in _TORCH_DTYPES:
            raise SealedFileError(f"unknown tensor dtype {dtype!r}")
        if not raw:
            return torch.empty(shape, dtype=_TORCH_DTYPES[dtype])
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(_TORCH_DTYPES[dtype]).reshape(shape)
    raise SealedFileError(f"unknown msgpack extension {code}")


def _numeric_dtype(name: str) -> np.dtype:
    dtype = np.dtype(name)
    if dtype.kind not in "biufc" or dtype.fields is not None:
        raise SealedFileError(f"unexpected array dtype {name!r}")
    return dtype


def pack(value) -> bytes:
    """``value`` as msgpack; a TypeError names the first type it cannot store."""
    return msgpack.packb(value, default=_encode, use_bin_type=True, strict_types=True)  # tuples reach _encode


def unpack(data: bytes):
    return msgpack.unpackb(data, ext_hook=_decode, raw=False, strict_map_key=False)


def sealed(body: bytes) -> bytes:
    return MAGIC + digest(body) + body


def opened(data: bytes, what: str) -> bytes:
    """The body of sealed bytes ``data``, refused (naming ``what``) unless its magic and digest hold."""
    if not data.startswith(MAGIC):
        kind = "a pickle / torch.save file" if data[:2] in (b"PK", b"\x80\x02", b"\x80\x04", b"\x80\x05") else None
        raise SealedFileError(
            f"{what} is not a tba-ext sealed file" + (f" ({kind}: tba-ext never reads those)" if kind else "")
        )
    head = len(MAGIC) + DIGEST_BYTES
    if len(data) < head or data[len(MAGIC) : head] != digest(data[head:]):
        raise _corrupt(what)
    return data[head:]


def check_sealed(path: str, what: str | None = None) -> None:
    """Verify the file at ``path`` as ``opened`` does, reading it in chunks (a preflight over large files)."""
    what = what or path
    head = len(MAGIC) + DIGEST_BYTES
    try:
        with open(path, "rb") as f:
            start = f.read(head)
            running = hashlib.blake2b(digest_size=DIGEST_BYTES)
            for chunk in iter(lambda: f.read(1 << 24), b""):
                running.update(chunk)
    except OSError as exc:
        raise SealedFileError(f"{what} is unreadable: {exc}") from exc
    if not start.startswith(MAGIC):
        opened(start, what)  # refuses it with the message of a full read
    if len(start) < head or start[len(MAGIC) :] != running.digest():
        raise _corrupt(what)


def write_atomic(path: str, data: bytes) -> None:
    """``data`` to a temporary file beside ``path``, fsynced, renamed over ``path``, and the folder fsynced: a crash
    at any point leaves the old file or the new one, and the rename survives a power loss."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def write_sealed(path: str, value) -> None:
    write_atomic(path, sealed(pack(value)))


def read_sealed(path: str, what: str | None = None):
    """The value a ``write_sealed`` stored at ``path``; a SealedFileError names the file when it is not intact."""
    what = what or path
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise SealedFileError(f"{what} is unreadable: {exc}") from exc
    body = opened(data, what)
    try:
        return unpack(body)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise SealedFileError(f"{what} holds data tba-ext cannot read: {exc}") from exc
