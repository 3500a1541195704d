"""The delta file of a FAISS index (`<db>.retrieval.delta`): the vectors added since the index
file was written, so that a chat turn writes what it adds, not the whole index.

The file is a sequence of blocks, each appended and flushed to disk (fsync) by one refresh:

    b"MDV1" | header length (u32) | body length (u32) | CRC-32 of header and body (u32)
    | header (JSON) | body: message ids (int64), unix ms (int64), vectors (float32, n x dim)

The header names the index file the block extends (`generation`, a random token the index's
description holds), the state it extends (`before`: vectors added, last vector id) and reaches
(`after`), the vectors' size and each row's session and user. A block of another generation, or
that does not extend the state reached so far (written by another process from an older state),
is skipped: its vectors are in the index file, or in a block read before. A block whose bytes do
not match (a write cut short, a damaged disk) ends the reading: `read` says what is wrong, and
the caller writes the file again from the blocks before it and the database.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"MDV1"
_HEAD = struct.Struct("<4sIII")


@dataclass
class Block:
    """The rows one refresh added to the delta."""

    generation: str
    before: tuple[int, int]  # (vectors added, last vector id) the block extends
    after: tuple[int, int]
    dim: int
    message_ids: Any  # int64 array
    times: Any  # int64 array
    sessions: list[str]
    users: list[str]
    vectors: Any  # float32 array, rows x dim

    def __len__(self) -> int:
        return len(self.sessions)


def encode(block: Block) -> bytes:
    """The bytes of one block, as appended to the file."""
    import numpy as np

    header = json.dumps(
        {
            "generation": block.generation,
            "before": list(block.before),
            "after": list(block.after),
            "dim": block.dim,
            "n": len(block),
            "sessions": block.sessions,
            "users": block.users,
        }
    ).encode()
    body = b"".join(
        (
            np.ascontiguousarray(block.message_ids, dtype=np.int64).tobytes(),
            np.ascontiguousarray(block.times, dtype=np.int64).tobytes(),
            np.ascontiguousarray(block.vectors, dtype=np.float32).tobytes(),
        )
    )
    crc = zlib.crc32(body, zlib.crc32(header))
    return _HEAD.pack(MAGIC, len(header), len(body), crc) + header + body


def read(path: Path) -> tuple[list[Block], str | None]:
    """The intact blocks of a delta file in order (none when there is no file), and what is
    wrong with the bytes after them (None: nothing)."""
    import numpy as np

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], None
    except OSError as exc:
        return [], f"unreadable ({exc})"
    blocks: list[Block] = []
    at = 0
    while at < len(data):
        where = f"block {len(blocks) + 1} (byte {at})"
        if len(data) - at < _HEAD.size:
            return blocks, f"{where} is cut short"
        magic, head_len, body_len, crc = _HEAD.unpack_from(data, at)
        start = at + _HEAD.size
        end = start + head_len + body_len
        if magic != MAGIC:
            return blocks, f"{where} is not a block"
        if end > len(data):
            return blocks, f"{where} is cut short"
        header, body = data[start : start + head_len], data[start + head_len : end]
        if zlib.crc32(body, zlib.crc32(header)) != crc:
            return blocks, f"{where} does not match its checksum"
        try:
            info = json.loads(header)
            n, dim = int(info["n"]), int(info["dim"])
            if body_len != n * (16 + 4 * dim) or len(info["sessions"]) != n:
                raise ValueError("sizes do not match")
            blocks.append(
                Block(
                    generation=str(info["generation"]),
                    before=(int(info["before"][0]), int(info["before"][1])),
                    after=(int(info["after"][0]), int(info["after"][1])),
                    dim=dim,
                    message_ids=np.frombuffer(body, dtype=np.int64, count=n),
                    times=np.frombuffer(body, dtype=np.int64, count=n, offset=8 * n),
                    sessions=[str(s) for s in info["sessions"]],
                    users=[str(u) for u in info["users"]],
                    vectors=np.frombuffer(body, dtype=np.float32, offset=16 * n).reshape(n, dim),
                )
            )
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            return blocks, f"{where} is unreadable ({exc})"
        at = end
    return blocks, None


def chain(blocks: list[Block], generation: str, state: tuple[int, int]) -> list[Block]:
    """The blocks that extend the index file of `generation` from its `state` (vectors added,
    last vector id), each the state the one before reached; the others are skipped."""
    kept = []
    for block in blocks:
        if block.generation == generation and block.before == state and block.after[0] > state[0]:
            kept.append(block)
            state = block.after
    return kept


def append(path: Path, data: bytes) -> None:
    """Append a block and flush it to disk (the folder too when the file is new)."""
    new = not path.exists()
    with open(path, "ab") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    if new:
        sync_folder(path.parent)


def sync_folder(folder: Path) -> None:
    """fsync a folder, so that a file made or renamed in it survives a crash."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # a platform that cannot open a directory (Windows)
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def empty_arrays() -> dict[str, Any]:
    """The per-row arrays of an index with no row: message ids, session and user codes, times."""
    import numpy as np

    return {
        "message_ids": np.zeros(0, dtype=np.int64),
        "sessions": np.zeros(0, dtype=np.int32),
        "users": np.zeros(0, dtype=np.int32),
        "times": np.zeros(0, dtype=np.int64),
    }


class Rows:
    """The delta in memory: its vectors (a buffer that doubles, so that adding a turn's rows
    costs what they hold) and its per-row arrays."""

    def __init__(self) -> None:
        self.n = 0
        self.arrays = empty_arrays()
        self._buffer: Any = None

    def add(self, matrix: Any, arrays: dict[str, Any]) -> None:
        import numpy as np

        need = self.n + len(matrix)
        if self._buffer is None or len(self._buffer) < need:
            grown = np.empty((max(need, 2 * self.n, 64), matrix.shape[1]), dtype=np.float32)
            if self._buffer is not None:
                grown[: self.n] = self._buffer[: self.n]
            self._buffer = grown
        self._buffer[self.n : need] = matrix
        self.n = need
        for key, values in arrays.items():
            self.arrays[key] = np.concatenate([self.arrays[key], values])

    def vectors(self, dim: int) -> Any:
        """The delta's vectors, rows x `dim`."""
        import numpy as np

        if self._buffer is None:
            return np.zeros((0, dim), dtype=np.float32)
        return self._buffer[: self.n]
