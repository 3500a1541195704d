"""The zip an export comes in (ChatGPT's, Claude.ai's): its conversations, read within the
bounds (`Limits`) before anything is parsed. `memcli.formats.read` unzips an input that is a zip
before any reader sees it."""

from __future__ import annotations

import io
import json
import re
import zipfile
import zlib

from memcli.errors import InputError
from memcli.formats.base import LIMITS, Limits
from memcli.formats.reader import Input

#: How a zip file starts.
ZIP = b"PK\x03\x04"
_SPLIT = re.compile(r"(?:^|/)conversations(?:-\d+)?\.json$")


def unzip(data: bytes, name: str, limits: Limits = LIMITS) -> tuple[bytes, str]:
    """The conversations of an export's zip: its `conversations.json`, or the parts ChatGPT
    splits it into (`conversations-000.json`, ...) joined as one JSON array. Each entry is read
    within `limits` (its declared and its actual size, and how much it expands)."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        entries = sorted(
            (i for i in archive.infolist() if _SPLIT.search(i.filename)), key=lambda i: i.filename
        )
        if not entries:
            raise InputError(
                f"{name}: a zip without conversations.json", "Give the export's zip as it came"
            )
        if len(entries) > limits.max_parts:
            raise InputError(
                f"{name}: a zip of {len(entries):,} conversation files, more than the"
                f" {limits.max_parts:,} memcli reads",
                "Import the conversations in smaller zips or files",
            )
        if len(entries) == 1:
            return _entry(archive, entries[0], name, limits), f"{name}:{entries[0].filename}"
        declared = sum(i.file_size for i in entries)
        if declared > limits.max_bytes:
            raise _over(name, f"its conversations expand to {declared:,} bytes", limits)
        parts = []
        for entry in entries:
            value = Input(_entry(archive, entry, name, limits), name).value
            if not isinstance(value, list):
                raise InputError(
                    f"{name}:{entry.filename}: not a JSON array", "Give the zip as it came"
                )
            parts.extend(value)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, RuntimeError) as exc:
        raise InputError(f"{name}: not a readable zip ({exc})", "Give the zip as it came") from None
    except NotImplementedError as exc:  # a compression method zipfile does not know
        raise InputError(f"{name}: {exc}", "Give the zip as it came") from None
    return json.dumps(parts).encode(), name


#: An entry may expand by any ratio up to this size (small files compress as they may).
_RATIO_FREE = 2**20
_CHUNK = 2**20


def _entry(archive: zipfile.ZipFile, entry: zipfile.ZipInfo, name: str, limits: Limits) -> bytes:
    """An entry's bytes, read a chunk at a time: InputError (naming it) as soon as it is larger
    than it says, than `limits.max_bytes`, or expands more than `limits.max_ratio` times."""
    at = f"{name}:{entry.filename}"
    most = min(entry.file_size, limits.max_bytes)
    if entry.file_size > limits.max_bytes:
        raise _over(at, f"it expands to {entry.file_size:,} bytes", limits)
    ratio_cap = max(_RATIO_FREE, limits.max_ratio * max(entry.compress_size, 1))
    if entry.file_size > ratio_cap:
        raise _bomb(at, entry, limits)
    chunks, size = [], 0
    with archive.open(entry) as handle:
        while chunk := handle.read(_CHUNK):
            size += len(chunk)
            if size > most:
                raise _over(at, "it holds more bytes than its header says", limits)
            if size > ratio_cap:
                raise _bomb(at, entry, limits)
            chunks.append(chunk)
    return b"".join(chunks)


def _over(at: str, what: str, limits: Limits) -> InputError:
    return InputError(
        f"{at}: {what}, more than the {limits.max_bytes:,} memcli reads of one input",
        "Import the conversations in smaller files",
    )


def _bomb(at: str, entry: zipfile.ZipInfo, limits: Limits) -> InputError:
    return InputError(
        f"{at}: expands from {entry.compress_size:,} bytes to more than"
        f" {limits.max_ratio} times that, as a zip bomb does",
        "Give the export's zip as it came",
    )
