"""The dense side of retrieval: a FAISS index over the message vectors stored in the database, or
pgvector's own search on a PostgreSQL database that has it (`vectors_for` picks).

The database holds the vectors (the source of truth). The index lives in files beside a SQLite
database: `<db>.retrieval.faiss` (the vectors), `<db>.retrieval.npz` (per row: message id, session
and user codes, unix time in ms) and `<db>.retrieval.json` (what the files cover, written last);
for a PostgreSQL database without pgvector, as `retrieval.faiss` (and so on) in
`<index_dir>/<hash of the server's host, port and database name>/`, where `index_dir` is the
folder the caller names (the CLI's: `$MEMCLI_HOME/indexes`; none: in memory only). They are
loaded by a query, extended when vectors were only added since, and rebuilt from SQLite when they
are missing, stale, unreadable or damaged: the description holds a CRC-32 of the other two files
(checked at load; an IVF index, memory-mapped, is not read whole for it), and a sample of the
index's rows is compared with the vectors SQLite holds for their messages. Each file is written
to a temporary name, flushed to disk (fsync) and renamed, the description last. An in-memory
database keeps its index in memory only.

Up to `IVF_FROM` vectors the index is exact (a flat inner-product index). Above, an inverted-file
index (IVF, `nlist` about the square root of the count) with 8-bit scalar-quantised vectors (a
quarter of the bytes to read per query; the cosines move by about 0.001) is memory-mapped at query
time, so that a fresh process searches a million messages without reading them all: the search
visits the `nprobe` nearest lists (and every list when a filter leaves few messages in scope).
"""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memcli.store import index as sql
from memcli.store import vectors as vsql

if TYPE_CHECKING:
    import numpy as np

    from memcli.store.index import Scope

#: Bumped when the files' layout changes, so that older files are rebuilt.
FORMAT = 4
#: Rows of a loaded index compared with SQLite's vectors, and by how much an IVF index's 8-bit
#: vectors may miss their own cosine of 1.
SAMPLE = 16
QUANTISED = 0.02
IVF_FROM = 200_000
NPROBE = 48
_KEYS = ("message_ids", "sessions", "users", "times")


def vectors_for(
    store: Any, model: str, index_dir: str | Path | None = None
) -> MessageVectors | PgVectors:
    """The dense search over a store's vectors of `model`: pgvector's on a PostgreSQL database
    that has it, else a FAISS index kept in step with the database (for a PostgreSQL one, its
    files under `index_dir`)."""
    if sql.has_pgvector(store):
        return PgVectors(store, model)
    return MessageVectors(store, model, index_dir)


def describe(store: Any, index_dir: str | Path | None = None) -> str:
    """Where a store's vectors are searched, in words (`memcli info`): "pgvector", or the FAISS
    index files' folder (as `vectors_for` would choose, with the same `index_dir`)."""
    if sql.has_pgvector(store):
        return "pgvector (in the database)"
    path = MessageVectors(store, "", index_dir).file("faiss")
    if path is None:
        return "FAISS index in memory (built again by each process)"
    if store.dialect == "postgresql":
        return f"FAISS index files in {path.parent}"
    return f"FAISS index files beside the database ({path.name}, .npz, .json)"


class PgVectors:
    """The vectors of one model searched by PostgreSQL itself (pgvector: no index file)."""

    #: (As MessageVectors: whether the last refresh rebuilt an index. Never: PostgreSQL keeps it.)
    rebuilt = False

    def __init__(self, store: Any, model: str) -> None:
        self.store = store
        self.model = model

    def close(self) -> None:
        """Nothing to free: the vectors stay in the database (the store closes its reader)."""

    def _connection(self) -> Any:
        """The store's second connection (`PostgresStore.reader`), so that the search runs
        while BM25 ranks on the first; the store itself inside a transaction (its writes are
        not committed, and it may hold the locks the search's filling would wait for)."""
        reader = getattr(self.store, "reader", None)
        if reader is None or self.store.transaction_depth > 0:
            return self.store
        return reader()

    def refresh(self) -> None:
        """Copy the vectors stored since into pgvector's column."""
        from memcli.store import pg_index

        pg_index.fill_embeddings(self._connection())

    def to_fill(self) -> tuple[int, float]:
        """How many stored vectors the next search adds to pgvector's index first, and about
        how many seconds that takes (`refresh`)."""
        from memcli.store import pg_index

        count = pg_index.unfilled(self._connection())
        return count, count / pg_index.FILL_RATE

    def search(self, vector: np.ndarray, scope: Scope, n: int) -> list[tuple[int, float]]:
        """(message id, cosine) of the best `n` messages in scope, each once, best first."""
        if n <= 0:
            return []
        self.refresh()
        return sql.vector_search(self._connection(), self.model, vector, scope, n)


class MessageVectors:
    """The FAISS index over one model's message vectors, kept in step with the database."""

    def __init__(self, store: Any, model: str, index_dir: str | Path | None = None) -> None:
        """`index_dir`: where the files of a database that has no file of its own (PostgreSQL)
        are kept, each database in a folder of its own; None keeps its index in memory only."""
        self.store = store
        self.model = model
        self.index_dir = None if index_dir is None else Path(index_dir)
        self.index: Any = None
        self.added = self.deleted = self.max_id = self.dim = 0
        self.rebuilt = False
        self._mapped = False  # whether the index is a read-only memory map of its file
        self._arrays: dict[str, Any] = {}
        self._codes: dict[str, dict[str, int]] = {"session": {}, "user": {}}
        self._last_mask: tuple[Any, Any] | None = None
        self._bitmap: tuple[Any, Any] | None = None  # the last mask packed for FAISS

    def close(self) -> None:
        """Free the index: a memory-mapped one (an IVF index's file) is unmapped and its file
        handle closed. The files stay; the next search reads them again."""
        self._reset()
        self._bitmap = None

    def file(self, suffix: str) -> Path | None:
        """Where the index keeps a file: beside a SQLite database; under `index_dir` for a
        PostgreSQL one; nowhere for an in-memory database (or a PostgreSQL one without
        `index_dir`)."""
        if self.store.dialect == "postgresql":
            from memcli.store.pg_index import database_key

            if self.index_dir is None:
                return None
            return self.index_dir / database_key(self.store) / f"retrieval.{suffix}"
        db = getattr(self.store, "path", None)
        return None if db is None else Path(f"{db}.retrieval.{suffix}")

    @property
    def count(self) -> int:
        return 0 if self.index is None else int(self.index.ntotal)

    def refresh(self) -> None:
        """Load the files, extend the index with new vectors, or rebuild it from SQLite; first
        finish a delete that was stopped before it removed the files (`finish_deletes`)."""
        if finish_deletes(self.store, self.index_dir):
            self._reset()
        added, deleted = vsql.vector_stats(self.store, self.model)
        if self.index is not None and (added, deleted) == (self.added, self.deleted):
            return  # up to date (`rebuilt` still tells what the last change was)
        self.rebuilt = False
        if self.index is None:
            self._load()
            if self.index is not None and (added, deleted) == (self.added, self.deleted):
                return
        if self.index is not None and deleted == self.deleted and added > self.added:
            expected = added - self.added
            rows = list(vsql.iter_vectors(self.store, self.model, self.max_id))
            if len(rows) == expected and all(r[5] == self.dim for r in rows):
                self._writable()
                self._append(rows)
                self.added = added
                self._save()
                return
        self._rebuild(added, deleted)

    def _rebuild(self, added: int, deleted: int) -> None:
        import numpy as np

        rows = list(vsql.iter_vectors(self.store, self.model, 0))
        dims = {r[5] for r in rows}
        if len(dims) > 1:  # vectors of two sizes under one model name: keep the latest size
            rows = [r for r in rows if r[5] == rows[-1][5]]
        self._reset()
        self.added, self.deleted = added, deleted
        self.rebuilt = True
        if rows:
            self.dim = rows[0][5]
            matrix = np.frombuffer(b"".join(r[6] for r in rows), dtype=np.float32)
            matrix = matrix.reshape(len(rows), self.dim)
            self.index = _new_index(matrix)
            self._append(rows, matrix)
        self._save()

    def _writable(self) -> None:
        """A memory-mapped index is read-only: read it into memory before adding to it."""
        import faiss

        path = self.file("faiss")
        if self._mapped and path is not None:
            self.index = faiss.read_index(str(path))
            self._mapped = False

    def _reset(self) -> None:
        import numpy as np

        self.index = None
        self._mapped = False
        self.added = self.deleted = self.max_id = self.dim = 0
        self._arrays = {
            "message_ids": np.zeros(0, dtype=np.int64),
            "sessions": np.zeros(0, dtype=np.int32),
            "users": np.zeros(0, dtype=np.int32),
            "times": np.zeros(0, dtype=np.int64),
        }
        self._codes = {"session": {}, "user": {}}
        self._last_mask = None

    def _code(self, kind: str, value: str) -> int:
        return self._codes[kind].setdefault(value, len(self._codes[kind]))

    def _append(self, rows: list[tuple[Any, ...]], matrix: Any = None) -> None:
        """Add (vector id, message id, session, user, time, dim, bytes) rows to the index."""
        import faiss
        import numpy as np

        if not rows:
            return
        if matrix is None:
            matrix = np.frombuffer(b"".join(r[6] for r in rows), dtype=np.float32)
            matrix = matrix.reshape(len(rows), self.dim)
        if self.index is None:
            self.index = faiss.IndexFlatIP(self.dim)
        self.index.add(np.ascontiguousarray(matrix))
        new = {
            "message_ids": np.asarray([r[1] for r in rows], dtype=np.int64),
            "sessions": np.asarray([self._code("session", r[2]) for r in rows], dtype=np.int32),
            "users": np.asarray([self._code("user", r[3]) for r in rows], dtype=np.int32),
            "times": np.asarray([r[4] for r in rows], dtype=np.int64),
        }
        for key, values in new.items():
            self._arrays[key] = np.concatenate([self._arrays[key], values])
        self.max_id = int(rows[-1][0])

    def _load(self) -> None:
        """Read the files if all three are there, readable, undamaged and agree with SQLite; else
        leave it empty (rebuilt from SQLite).

        Damage: the description records a CRC-32 of each file as written; a file that no longer
        matches is not used. A flat index (read whole anyway) is checked in full; a memory-mapped
        one (IVF, a big store) is not read whole to check it, but its arrays are, and for both a
        sample of rows is compared with the vectors SQLite holds for their messages, which also
        catches files of another database with the same counts."""
        import numpy as np

        self._reset()
        path, arrays, meta = self.file("faiss"), self.file("npz"), self.file("json")
        if path is None or arrays is None or meta is None:
            return
        try:
            import faiss

            info = json.loads(meta.read_text())
            if info.get("model") != self.model or info.get("format") != FORMAT:
                return
            if _file_crc(arrays) != info["crc_npz"]:
                return
            if info.get("ivf"):
                index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
            else:
                if _file_crc(path) != info["crc_faiss"]:
                    return
                index = faiss.read_index(str(path))
            with np.load(str(arrays)) as npz:
                loaded = {key: npz[key] for key in _KEYS}
            if any(len(v) != index.ntotal for v in loaded.values()) or index.d != info["dim"]:
                return
            if index.ntotal != info["count"]:
                return
            if not self._agrees(index, loaded["message_ids"], bool(info.get("ivf"))):
                return
        except Exception:
            return  # missing, unreadable or damaged: rebuilt from SQLite
        self.index = index
        self._mapped = bool(info.get("ivf"))
        self._arrays = loaded
        self.added, self.deleted = info["added"], info["deleted"]
        self.max_id, self.dim = info["max_id"], info["dim"]
        self._codes = {"session": dict(info["sessions"]), "user": dict(info["users"])}

    def _agrees(self, index: Any, message_ids: Any, ivf: bool) -> bool:
        """Whether SAMPLE rows spread over the index hold vectors SQLite has for their messages
        (an IVF index's 8-bit vectors to within QUANTISED; a flat index's exactly)."""
        import numpy as np

        n = int(index.ntotal)
        if n == 0:
            return True
        rows = sorted({i * n // SAMPLE for i in range(SAMPLE)} | {n - 1})
        ids = [int(message_ids[r]) for r in rows]
        stored = vsql.message_vectors(self.store, self.model, ids)
        for row, message_id in zip(rows, ids, strict=True):
            pieces = stored.get(message_id)
            if not pieces:
                return False
            matrix = np.frombuffer(b"".join(v for _, v in pieces), dtype=np.float32)
            matrix = matrix.reshape(len(pieces), -1)
            if matrix.shape[1] != index.d:
                return False
            if ivf:
                # The row's own list is the nearest to its vector: found among the first few.
                scores, found = index.search(np.ascontiguousarray(matrix), 8)
                if not any(
                    r >= 0 and int(message_ids[r]) == message_id and s >= 1 - QUANTISED
                    for r, s in zip(found.ravel(), scores.ravel(), strict=True)
                ):
                    return False
            elif not bool(np.isclose(matrix, index.reconstruct(row), atol=1e-6).all(axis=1).any()):
                return False
        return True

    def _save(self) -> None:
        """Write the files durably, each to a temporary name, flushed to disk and renamed; the
        description (with each file's checksum) last. A crash leaves either the old files or
        ones the description does not match, which are rebuilt."""
        import faiss
        import numpy as np

        path, arrays, meta = self.file("faiss"), self.file("npz"), self.file("json")
        if path is None or arrays is None or meta is None:
            return
        try:
            if meta.exists():
                meta.unlink()  # the files are not valid together until the description is back
            if self.index is None:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            data = faiss.serialize_index(self.index)  # a uint8 array
            crc_faiss = _crc(data)
            _write(path, data)
            del data
            buffer = io.BytesIO()
            np.savez(buffer, **self._arrays)
            crc_npz = _crc(buffer.getvalue())
            _write(arrays, buffer.getvalue())
            info = {
                "model": self.model,
                "format": FORMAT,
                "count": self.count,
                "added": self.added,
                "deleted": self.deleted,
                "max_id": self.max_id,
                "dim": self.dim,
                "ivf": isinstance(self.index, faiss.IndexIVF),
                "sessions": list(self._codes["session"].items()),
                "users": list(self._codes["user"].items()),
                "crc_faiss": crc_faiss,
                "crc_npz": crc_npz,
            }
            _write(meta, json.dumps(info).encode())
        except OSError:
            pass  # a cache: SQLite still has everything, and the next query rebuilds it

    def search(self, vector: np.ndarray, scope: Scope, n: int) -> list[tuple[int, float]]:
        """(message id, cosine) of the best `n` messages in scope, each once, best first."""
        import numpy as np

        self.refresh()
        if self.index is None or self.count == 0 or n <= 0:
            return []
        if vector.shape[-1] != self.dim:
            from memcli.errors import ModelError

            raise ModelError(
                f"the stored vectors have {self.dim} dimensions, the model makes"
                f" {vector.shape[-1]}",
                "Search with the model the messages were embedded with",
            )
        mask = self._mask(scope)
        total = self.count if mask is None else int(mask.sum())
        if total == 0:
            return []
        # A message's status changes: asked of SQLite (the few in short-term memory), not the file.
        active = sql.active_ids(self.store, scope)
        query = np.ascontiguousarray(vector.reshape(1, -1), dtype=np.float32)
        want = min(total, n * 2)
        while True:
            scores, rows = self._rows(query, want, mask, total)
            best: dict[int, float] = {}
            for score, row in zip(scores, rows, strict=True):
                if row >= 0:
                    best.setdefault(int(self._arrays["message_ids"][row]), float(score))
            if active:
                best = {item: score for item, score in best.items() if item not in active}
            found = int((rows >= 0).sum())
            if len(best) >= n or want >= total or found < want:  # found < want: no more there
                return list(best.items())[:n]
            want = min(total, want * 4)

    def _mask(self, scope: Scope) -> Any:
        """The rows in scope (None: all), kept for the next search of the same scope."""
        key = (self.count, scope.user_id, scope.session_id, scope.since, scope.until)
        if self._last_mask is not None and self._last_mask[0] == key:
            return self._last_mask[1]
        mask = self._new_mask(scope)
        self._last_mask = (key, mask)
        return mask

    def _new_mask(self, scope: Scope) -> Any:
        import numpy as np

        mask = np.ones(self.count, dtype=bool)
        if scope.user_id is not None:
            mask &= self._arrays["users"] == self._codes["user"].get(scope.user_id, -1)
        if scope.session_id is not None:
            mask &= self._arrays["sessions"] == self._codes["session"].get(scope.session_id, -1)
        if scope.since is not None:
            mask &= self._arrays["times"] >= sql.unix_ms(scope.since)
        if scope.until is not None:
            mask &= self._arrays["times"] < sql.unix_ms(scope.until)
        return None if bool(mask.all()) else mask

    def _rows(self, query: Any, want: int, mask: Any, total: int) -> tuple[Any, Any]:
        import faiss
        import numpy as np

        ivf = isinstance(self.index, faiss.IndexIVF)
        if mask is None and not ivf:
            scores, rows = self.index.search(query, want)
            return scores[0], rows[0]
        selector = None
        if mask is not None:
            if self._bitmap is None or self._bitmap[0] is not mask:
                self._bitmap = (mask, np.packbits(mask.astype(np.uint8), bitorder="little"))
            selector = faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(self._bitmap[1]))
        if ivf:
            # A narrow filter leaves few messages in the nearest lists: visit them all.
            nlist = self.index.nlist
            probe = nlist if total < self.count // 20 else min(NPROBE, nlist)
            params: Any = faiss.SearchParametersIVF(sel=selector, nprobe=probe)  # type: ignore[call-arg]
        else:
            params = faiss.SearchParameters(sel=selector)  # type: ignore[call-arg]
        scores, rows = self.index.search(query, want, params=params)
        return scores[0], rows[0]


def index_health(store: Any, index_dir: str | Path | None = None) -> tuple[str, str, Path] | None:
    """What is wrong with a database's index files, without loading them: ("damaged", why,
    path) when they cannot be used as they are (incomplete, unreadable, a checksum that does
    not match: the next search rebuilds them from the database), ("stale", why, path) when
    vectors were added or deleted since they were written (the next search brings them up to
    date); None when they are sound, or there are none (pgvector, in memory only)."""
    if sql.has_pgvector(store):
        return None
    files = MessageVectors(store, "", index_dir)
    path, arrays, meta = files.file("faiss"), files.file("npz"), files.file("json")
    if path is None or arrays is None or meta is None:
        return None
    if not meta.exists():
        if path.exists() or arrays.exists():
            return "damaged", "incomplete (no description: a write was interrupted)", path
        return None
    try:
        info = json.loads(meta.read_text())
        if info.get("format") != FORMAT:
            return "stale", f"an older format ({info.get('format')}, now {FORMAT})", path
        if _file_crc(arrays) != info["crc_npz"]:
            return "damaged", f"{arrays.name} does not match its checksum", arrays
        if not info.get("ivf") and _file_crc(path) != info["crc_faiss"]:
            return "damaged", f"{path.name} does not match its checksum", path
        added, deleted = vsql.vector_stats(store, str(info["model"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return "damaged", f"unreadable ({exc})", path
    if (added, deleted) != (info["added"], info["deleted"]):
        behind = f"{added - info['added']} vectors added, {deleted - info['deleted']} deleted"
        return "stale", f"{behind} since it was written", path
    return None


def _crc(data: Any) -> int:
    import zlib

    return zlib.crc32(data)


def _file_crc(path: Path) -> int:
    import zlib

    crc = 0
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def _write(path: Path, data: Any) -> None:
    """Replace a file durably: a temporary file written and flushed to disk, renamed over it, and
    the rename flushed to disk (the directory)."""
    # Its own name per process and thread: two stores of one process may write the same index.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    try:
        folder = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return  # a platform that cannot open a directory (Windows)
    try:
        os.fsync(folder)
    except OSError:
        pass
    finally:
        os.close(folder)


def _new_index(matrix: Any) -> Any:
    """An exact index for a small matrix; a trained IVF index of 8-bit vectors for a big one."""
    import faiss
    import numpy as np

    n, dim = matrix.shape
    if n < IVF_FROM:
        return faiss.IndexFlatIP(dim)
    nlist = int(n**0.5)
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFScalarQuantizer(
        quantizer, dim, nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
    )
    # Each dimension's range is learnt from the sample, widened by half on each side so that
    # vectors added later rarely fall outside it (a value outside is clipped to the range).
    index.sq.rangestat = faiss.ScalarQuantizer.RS_minmax
    index.sq.rangestat_arg = 0.5
    sample = matrix[np.random.default_rng(0).permutation(n)[: nlist * 40]]
    index.train(np.ascontiguousarray(sample))
    index.nprobe = min(NPROBE, nlist)
    return index


def remove_index_files(store: Any, index_dir: str | Path | None = None) -> None:
    """Remove the index files of `store`'s database (beside a SQLite file; under `index_dir`
    for a PostgreSQL one), after a delete for good: they hold the deleted messages' vectors and
    session and user names. The next search rebuilds them from the database."""
    faiss_file = MessageVectors(store, "", index_dir).file("faiss")
    if faiss_file is None:
        return
    prefix = faiss_file.name.removesuffix("faiss")  # `<db>.retrieval.` or `retrieval.`
    if faiss_file.parent.is_dir():
        for path in faiss_file.parent.glob(prefix + "*"):
            path.unlink(missing_ok=True)


def finish_deletes(
    store: Any, index_dir: str | Path | None = None, *, deleted: bool = False
) -> int:
    """Finish the deletes for good whose cleanup did not run (the process was stopped between a
    delete's commit and its cleanup: `memcli.store.forget`): purge the database's files, remove
    the index files (they may hold the deleted messages' vectors); return how many there were.
    `deleted`: called right after a delete (purged already): remove the index files whether or
    not one is recorded. Inside a write transaction (a purge cannot run there) or on a read-only
    database, nothing is done."""
    from memcli.store import forget

    if store.transaction_depth or store.read_only:
        return 0
    pending = forget.unfinished_deletes(store)
    if not pending and not deleted:
        return 0
    if pending and not deleted:
        store.purge()
    remove_index_files(store, index_dir)
    if pending:
        with store.transaction():
            forget.clear_unfinished(store, pending[-1])
    return len(pending)
