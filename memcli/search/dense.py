"""The dense side of retrieval: a FAISS index over the message vectors stored in the database, or
pgvector's own search on a PostgreSQL database that has it (`vectors_for` picks).

The database holds the vectors, the only copy of each (`memcli.store.vectors`). The index
lives in files beside a SQLite database: `<db>.retrieval.npz` (per row: message id, session and
user codes, unix time in ms), `<db>.retrieval.json` (what the files cover, written last) and, for
an IVF index only, `<db>.retrieval.faiss` (its 8-bit codes) and `<db>.retrieval.delta`; for a
PostgreSQL database without pgvector, as `retrieval.npz` (and so on) in
`<index_dir>/<hash of the server's host, port and database name>/`, where `index_dir` is the
folder the caller names (the CLI's: `$MEMCLI_HOME/indexes`; none: in memory only). They are
loaded by a query, extended when vectors were only added since, and rebuilt from the database
when they are missing, stale, unreadable or damaged: the description holds a CRC-32 of the other
files (checked at load; an IVF index, memory-mapped, is not read whole for it).

Up to `IVF_FROM` vectors the index is exact (a flat inner-product index of the float16 values
SQLite stores: `_flat`) and has no vector file: a process reads the vectors from the database
once (in vector id order, each row's message checked against the row file's), and grows the
index in memory with the rows added since; the row file is written again when a tenth of the
rows (at least DELTA_MIN, at most DELTA_MAX) are newer than it. Above, an inverted-file index
(IVF, `nlist` about the square root of the count) with 8-bit scalar-quantised vectors (a quarter
of the bytes to read per query; the cosines move by about 0.001) is memory-mapped at query time,
so that a fresh process searches a million messages without reading them all: the search visits
the `nprobe` nearest lists (and every list when a filter leaves few messages in scope); a sample
of its rows is compared with the vectors the database holds for their messages, and the rows
added since are in the delta file (`search/delta.py`), searched exactly beside it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import memcli.search.delta as deltafile
import memcli.search.scoped as scoped
from memcli.search.index_files import FORMAT, crc, file_crc, index_path, write_file
from memcli.search.index_files import finish_deletes as finish_deletes
from memcli.search.index_files import index_health as index_health
from memcli.search.index_files import remove_index_files as remove_index_files
from memcli.store import index as sql
from memcli.store import vectors as vsql

if TYPE_CHECKING:
    import numpy as np

    from memcli.store.index import Scope

#: Rows of a loaded index compared with SQLite's vectors, and by how much an IVF index's 8-bit
#: vectors may miss their own cosine of 1.
SAMPLE = 16
QUANTISED = 0.02
IVF_FROM = 200_000
NPROBE = 48
#: The delta file is folded into the index file when it holds more than a tenth of the index's
#: vectors, at least DELTA_MIN and at most DELTA_MAX (the rewrite of a million vectors, seconds,
#: then comes once every DELTA_MAX vectors added).
DELTA_MIN = 1024
DELTA_MAX = 16384
#: A scope of at most this many rows of an IVF index is searched exactly, over its own vectors
#: (read from the database by message id), not by an IVF search visiting every list.
EXACT_MAX = 10_000
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
    path = MessageVectors(store, "", index_dir).file("npz")
    if path is None:
        return "FAISS index in memory (built again by each process)"
    if store.dialect == "postgresql":
        return f"FAISS index files in {path.parent}"
    return f"FAISS index files beside the database ({path.name}, .json)"


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
        """Nothing: a search that reads pgvector's column (its index, or the whole store) copies
        the vectors stored since into it first; a small scope's search compares the ones not
        copied yet from their bytes, and leaves them to it (`pg_index.vector_search`)."""

    def to_fill(self, owner: Scope | None = None) -> tuple[int, float]:
        """How many stored vectors a search of `owner` (a user's or a session's scope; None:
        the store) adds to pgvector's index first, and about how many seconds that takes: none
        for a small scope, which does not wait for the index."""
        from memcli.store import pg_index

        connection = self._connection()
        if owner is not None and pg_index.searched_exactly(connection, owner):
            return 0, 0.0
        count = pg_index.unfilled(connection)
        return count, count / pg_index.FILL_RATE

    def search(self, vector: np.ndarray, scope: Scope, n: int) -> list[tuple[int, float]]:
        """(message id, cosine) of the best `n` messages in scope, each once, best first."""
        if n <= 0:
            return []
        return sql.vector_search(self._connection(), self.model, vector, scope, n)


class MessageVectors:
    """The FAISS index over one model's message vectors, kept in step with the database: a flat
    index read from the database's vectors and grown in memory; an IVF index's file, and the
    vectors added since in the delta file (`search/delta.py`), searched exactly beside it."""

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
        self._names: dict[str, list[str]] = {"session": [], "user": []}  # by code
        self._last_mask: tuple[Any, Any] | None = None
        self._bitmap: tuple[Any, Any] | None = None  # the last mask packed for FAISS
        self._groups: scoped.Groups | None = None
        self._last_exact: tuple[Any, tuple[list[int], Any]] | None = None
        # The delta in memory; the index file's generation and (added, max_id), which the
        # delta file's blocks extend.
        self._delta = deltafile.Rows()
        self._generation: str | None = None
        self._main_state = (0, 0)
        self._delta_bad = False  # the delta file is to be written again whole

    def close(self) -> None:
        """Free the index: a memory-mapped one (an IVF index's file) is unmapped and its file
        handle closed. The files stay; the next search reads them again."""
        self._reset()
        self._bitmap = None

    def file(self, suffix: str) -> Path | None:
        """Where the index keeps a file: beside a SQLite database; under `index_dir` for a
        PostgreSQL one; nowhere for an in-memory database (or a PostgreSQL one without
        `index_dir`)."""
        return index_path(self.store, self.index_dir, suffix)

    @property
    def count(self) -> int:
        """Vectors searched: the index file's and the delta's."""
        return self._main_count + self._delta.n

    @property
    def _main_count(self) -> int:
        return 0 if self.index is None else int(self.index.ntotal)

    def finish_deletes(self) -> None:
        """Finish a delete for good whose cleanup did not run (`finish_deletes`: the database
        purged, the index files removed), and forget the index held. The search calls it on its
        own thread before the dense search starts on another: a purge's VACUUM fails while a
        statement of the other thread is in progress on the connection."""
        if finish_deletes(self.store, self.index_dir):
            self._reset()

    def refresh(self) -> None:
        """Load the files, extend the index with new vectors (a flat index in memory, its row
        file written again once a tenth is newer; an IVF index's in the delta file, folded into
        the index file once it is big), or rebuild it from the database; first finish a delete
        that was stopped before it removed the files (`finish_deletes`)."""
        self.finish_deletes()
        added, deleted = vsql.vector_stats(self.store, self.model)
        if self.index is not None and (added, deleted) == (self.added, self.deleted):
            return  # up to date (`rebuilt` still tells what the last change was)
        self.rebuilt = False
        if self.index is None:
            self._load()
            if self.index is not None and (added, deleted) == (self.added, self.deleted):
                if self._delta_bad:
                    self._save_delta(None)  # a damaged delta: written again from what held
                return
        if self.index is not None and deleted == self.deleted and added > self.added:
            expected = added - self.added
            rows = list(vsql.iter_vectors(self.store, self.model, self.max_id))
            if len(rows) == expected and all(r[5] == self.dim for r in rows):
                if not self._ivf or self.file("delta") is None or self._generation is None:
                    self._writable()  # flat, or in memory only: the index itself grows
                    self._append(rows)
                    self.added = added
                    newer = self.added - self._main_state[0]
                    if self._generation is None or newer > _fold(self._main_count - newer):
                        self._save()
                    return
                before = (self.added, self.max_id)
                self._extend(rows)
                self.added = added
                if self._delta.n > _fold(self._main_count):
                    self._save()  # folds the delta into the index file
                else:
                    self._save_delta(self._block(before, len(rows)))
                return
        self._rebuild(added, deleted)

    @property
    def _ivf(self) -> bool:
        import faiss

        return isinstance(self.index, faiss.IndexIVF)

    def _rebuild(self, added: int, deleted: int) -> None:
        rows = list(vsql.iter_vectors(self.store, self.model, 0))
        dims = {r[5] for r in rows}
        if len(dims) > 1:  # vectors of two sizes under one model name: keep the latest size
            rows = [r for r in rows if r[5] == rows[-1][5]]
        self._reset()
        self.added, self.deleted = added, deleted
        self.rebuilt = True
        if rows:
            self.dim = rows[0][5]
            matrix = vsql.to_matrix([r[6] for r in rows], self.dim)
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
        self.index = None
        self._mapped = False
        self.added = self.deleted = self.max_id = self.dim = 0
        self._arrays = deltafile.empty_arrays()
        self._codes = {"session": {}, "user": {}}
        self._names = {"session": [], "user": []}
        self._last_mask = self._last_exact = None
        self._drop_delta()
        self._generation = None
        self._main_state = (0, 0)

    def _drop_delta(self) -> None:
        self._delta = deltafile.Rows()
        self._delta_bad = False

    def _code(self, kind: str, value: str) -> int:
        codes = self._codes[kind]
        code = codes.get(value)
        if code is None:
            code = codes[value] = len(codes)
            self._names[kind].append(value)
        return code

    def _row_arrays(self, rows: list[tuple[Any, ...]]) -> dict[str, Any]:
        import numpy as np

        return {
            "message_ids": np.asarray([r[1] for r in rows], dtype=np.int64),
            "sessions": np.asarray([self._code("session", r[2]) for r in rows], dtype=np.int32),
            "users": np.asarray([self._code("user", r[3]) for r in rows], dtype=np.int32),
            "times": np.asarray([r[4] for r in rows], dtype=np.int64),
        }

    def _append(self, rows: list[tuple[Any, ...]], matrix: Any = None) -> None:
        """Add (vector id, message id, session, user, time, dim, bytes) rows to the index."""
        import numpy as np

        if not rows:
            return
        if matrix is None:
            matrix = vsql.to_matrix([r[6] for r in rows], self.dim)
        if self.index is None:
            self.index = _flat(self.dim)
        self.index.add(np.ascontiguousarray(matrix))
        for key, values in self._row_arrays(rows).items():
            self._arrays[key] = np.concatenate([self._arrays[key], values])
        self.max_id = int(rows[-1][0])

    def _extend(self, rows: list[tuple[Any, ...]]) -> None:
        """Add rows to the delta (in memory)."""
        matrix = vsql.to_matrix([r[6] for r in rows], self.dim)
        self._delta.add(matrix, self._row_arrays(rows))
        self.max_id = int(rows[-1][0])

    def _block(self, before: tuple[int, int], last: int) -> deltafile.Block:
        """The delta's last `last` rows as a block extending `before`."""
        start = self._delta.n - last
        names = self._names
        return deltafile.Block(
            generation=self._generation or "",
            before=before,
            after=(self.added, self.max_id),
            dim=self.dim,
            message_ids=self._delta.arrays["message_ids"][start:],
            times=self._delta.arrays["times"][start:],
            sessions=[names["session"][int(c)] for c in self._delta.arrays["sessions"][start:]],
            users=[names["user"][int(c)] for c in self._delta.arrays["users"][start:]],
            vectors=self._delta.vectors(self.dim)[start:],
        )

    def _save_delta(self, block: deltafile.Block | None) -> None:
        """Append `block` to the delta file, flushed to disk; the whole delta, written to a
        temporary name and renamed, when the file is to be written again (it was damaged) or
        `block` is None. An empty delta: no file."""
        path = self.file("delta")
        if path is None or self._generation is None:
            return
        try:
            if block is not None and not self._delta_bad:
                deltafile.append(path, deltafile.encode(block))
            elif self._delta.n:
                whole = self._block(self._main_state, self._delta.n)
                write_file(path, deltafile.encode(whole))
            else:
                path.unlink(missing_ok=True)
            self._delta_bad = False
        except OSError:
            pass  # a cache: SQLite still has everything, and the next query brings it up to date

    def _load(self) -> None:
        """Read the files if they are there, readable, undamaged and agree with the database;
        else leave it empty (rebuilt from the database); then the delta's blocks that extend an
        IVF index.

        A flat index is made from the database's vectors up to the files' last vector id, each
        row's message checked against the row file's, a sample of rows' vectors against the
        description's checksum of them and their sessions, users and times against the database
        (another database's files, or rows deleted since, do not match). Damage: the description
        records a CRC-32 of each file as written; a file that no longer matches is not used. A
        memory-mapped IVF index (a big store) is not read whole to check it, but its arrays are,
        and a sample of its rows is compared with the vectors the database holds for their
        messages."""
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
            if file_crc(arrays) != info["crc_npz"]:
                return
            with np.load(str(arrays)) as npz:
                loaded = {key: npz[key] for key in _KEYS}
            if any(len(v) != info["count"] for v in loaded.values()):
                return
            if info.get("ivf"):
                index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
                if index.ntotal != info["count"] or index.d != info["dim"]:
                    return
                if not self._agrees(index, loaded["message_ids"]):
                    return
            else:
                ids, half = vsql.stored_vectors(self.store, self.model, info["max_id"], info["dim"])
                if not np.array_equal(ids, loaded["message_ids"]):
                    return
                index = _flat(info["dim"])
                index.add_sa_codes(half.view(np.uint8))  # (its codes are the float16 values)
                del half
                if info.get("crc_sample") != _sample_crc(index):
                    return
                if not self._places_agree(loaded, info):
                    return
        except Exception:
            return  # missing, unreadable or damaged: rebuilt from the database
        self.index = index
        self._mapped = bool(info.get("ivf"))
        self._arrays = loaded
        self.added, self.deleted = info["added"], info["deleted"]
        self.max_id, self.dim = info["max_id"], info["dim"]
        self._codes = {"session": dict(info["sessions"]), "user": dict(info["users"])}
        self._names = {k: sorted(c, key=c.__getitem__) for k, c in self._codes.items()}
        self._generation = str(info["generation"])
        self._main_state = (self.added, self.max_id)
        self._load_delta()

    def _load_delta(self) -> None:
        """Add the delta file's blocks that extend the index file; a damaged file, or blocks
        that do not agree with SQLite, are dropped (the rows are read from SQLite again) and
        the file is written again at the next refresh."""
        import numpy as np

        path = self.file("delta")
        if path is None or self._generation is None:
            return
        blocks, problem = deltafile.read(path)
        kept = deltafile.chain(blocks, self._generation, self._main_state)
        self._delta_bad = problem is not None
        for block in kept:
            if block.dim != self.dim:
                self._delta_bad = True
                break
            arrays = {
                "message_ids": np.asarray(block.message_ids, dtype=np.int64),
                "sessions": np.asarray([self._code("session", s) for s in block.sessions]),
                "users": np.asarray([self._code("user", u) for u in block.users]),
                "times": np.asarray(block.times, dtype=np.int64),
            }
            arrays["sessions"] = arrays["sessions"].astype(np.int32)
            arrays["users"] = arrays["users"].astype(np.int32)
            self._delta.add(block.vectors, arrays)
            self.added, self.max_id = block.after
        if self._delta.n and not self._delta_agrees():
            self.added, self.max_id = self._main_state
            self._drop_delta()
            self._delta_bad = True

    def _delta_agrees(self) -> bool:
        """Whether a few rows of the delta hold the vectors the database has for their
        messages."""
        n = self._delta.n
        rows = sorted({i * n // 4 for i in range(4)} | {n - 1})
        ids = [int(self._delta.arrays["message_ids"][r]) for r in rows]
        stored = vsql.message_vectors(self.store, self.model, ids)
        for row, message_id in zip(rows, ids, strict=True):
            pieces = [v for _, v in stored.get(message_id, []) if vsql.fits(v, self.dim)]
            if not pieces:
                return False
            matrix = vsql.to_matrix(pieces, self.dim)
            if not bool((matrix == self._delta.vectors(self.dim)[row]).all(axis=1).any()):
                return False
        return True

    def _places_agree(self, loaded: dict[str, Any], info: dict[str, Any]) -> bool:
        """Whether SAMPLE rows of a row file name the session, user and time the database has
        for their messages (the files of another database with the same message ids do not)."""
        n = len(loaded["message_ids"])
        rows = sorted({i * n // SAMPLE for i in range(SAMPLE)} | {n - 1}) if n else []
        names = {k: {c: v for v, c in info[k + "s"]} for k in ("session", "user")}
        places = vsql.message_places(self.store, [int(loaded["message_ids"][r]) for r in rows])
        for row in rows:
            place = places.get(int(loaded["message_ids"][row]))
            if place != (
                names["session"].get(int(loaded["sessions"][row])),
                names["user"].get(int(loaded["users"][row])),
                int(loaded["times"][row]),
            ):
                return False
        return True

    def _agrees(self, index: Any, message_ids: Any) -> bool:
        """Whether SAMPLE rows spread over an IVF index hold, to within QUANTISED (its vectors
        are 8-bit), vectors the database has for their messages."""
        import numpy as np

        n = int(index.ntotal)
        if n == 0:
            return True
        rows = sorted({i * n // SAMPLE for i in range(SAMPLE)} | {n - 1})
        ids = [int(message_ids[r]) for r in rows]
        stored = vsql.message_vectors(self.store, self.model, ids)
        for message_id in ids:
            pieces = [v for _, v in stored.get(message_id, []) if vsql.fits(v, index.d)]
            if not pieces:
                return False
            matrix = vsql.to_matrix(pieces, index.d)
            # The row's own list is the nearest to its vector: found among the first few.
            scores, found = index.search(np.ascontiguousarray(matrix), 8)
            if not any(
                r >= 0 and int(message_ids[r]) == message_id and s >= 1 - QUANTISED
                for r, s in zip(found.ravel(), scores.ravel(), strict=True)
            ):
                return False
        return True

    def _save(self) -> None:
        """Fold the delta into the index and write the files durably, each to a temporary name,
        flushed to disk and renamed; the description (with each file's checksum and a new
        generation, which a delta block must name) last, the old delta file removed first. A
        crash leaves either the old files or ones the description does not match, which are
        rebuilt. A flat index writes no vector file (its vectors are the database's): only its
        rows and the description."""
        import secrets

        import faiss
        import numpy as np

        if self._delta.n:
            self._writable()
            self.index.add(np.ascontiguousarray(self._delta.vectors(self.dim)))
            for key in _KEYS:
                self._arrays[key] = np.concatenate([self._arrays[key], self._delta.arrays[key]])
            self._drop_delta()
            self._last_mask = self._last_exact = None
        path, arrays, meta = self.file("faiss"), self.file("npz"), self.file("json")
        delta = self.file("delta")
        self._generation = None
        if path is None or arrays is None or meta is None or delta is None:
            return
        try:
            if meta.exists():
                meta.unlink()  # the files are not valid together until the description is back
            delta.unlink(missing_ok=True)
            if self.index is None:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            ivf = isinstance(self.index, faiss.IndexIVF)
            crc_faiss = crc_sample = None
            if ivf:
                data = faiss.serialize_index(self.index)  # a uint8 array
                crc_faiss = crc(data)
                write_file(path, data)
                del data
            else:
                path.unlink(missing_ok=True)  # (an IVF index's, or an older format's)
                crc_sample = _sample_crc(self.index)
            buffer = io.BytesIO()
            np.savez(buffer, **self._arrays)
            crc_npz = crc(buffer.getvalue())
            write_file(arrays, buffer.getvalue())
            generation = secrets.token_hex(8)
            info = {
                "model": self.model,
                "format": FORMAT,
                "generation": generation,
                "count": self.count,
                "added": self.added,
                "deleted": self.deleted,
                "max_id": self.max_id,
                "dim": self.dim,
                "ivf": ivf,
                "sessions": list(self._codes["session"].items()),
                "users": list(self._codes["user"].items()),
                "crc_faiss": crc_faiss,
                "crc_npz": crc_npz,
                "crc_sample": crc_sample,
            }
            write_file(meta, json.dumps(info).encode())
            self._generation = generation
            self._main_state = (self.added, self.max_id)
        except OSError:
            pass  # a cache: the database has everything, and the next query rebuilds it

    def search(self, vector: np.ndarray, scope: Scope, n: int) -> list[tuple[int, float]]:
        """(message id, cosine) of the best `n` messages in scope, each once, best first: the
        index's and the delta's hits merged by score; a small scope of an IVF index exactly."""
        import faiss
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
        # A message's status changes: asked of SQLite (the few in short-term memory), not the file.
        active = sql.active_ids(self.store, scope)
        query = np.ascontiguousarray(vector.reshape(1, -1), dtype=np.float32)
        delta_mask = scoped.new_mask(self._delta.arrays, self._codes, scope)
        if isinstance(self.index, faiss.IndexIVF):
            small = self._small(scope)
            if small is not None:
                owners, matrix = small
                picked = (
                    np.arange(self._delta.n) if delta_mask is None else np.flatnonzero(delta_mask)
                )
                owners = owners + self._delta.arrays["message_ids"][picked].tolist()
                matrix = np.concatenate([matrix, self._delta.vectors(self.dim)[picked]])
                return scoped.exact(query[0], owners, matrix, active, n)
        mask = self._mask(scope)
        sizes = [
            self._main_count if mask is None else int(mask.sum()),
            self._delta.n if delta_mask is None else int(delta_mask.sum()),
        ]
        total = sum(sizes)
        if total == 0:
            return []
        want = min(total, n * 2)
        while True:
            scores, rows = self._rows(query, want, (mask, delta_mask), sizes[0])
            best: dict[int, float] = {}
            for score, row in zip(scores, rows, strict=True):
                best.setdefault(self._message_id(int(row)), float(score))
            if active:
                best = {item: score for item, score in best.items() if item not in active}
            found = len(rows)
            if len(best) >= n or want >= total or found < want:  # found < want: no more there
                return list(best.items())[:n]
            want = min(total, want * 4)

    def _message_id(self, row: int) -> int:
        main = self._main_count
        if row < main:
            return int(self._arrays["message_ids"][row])
        return int(self._delta.arrays["message_ids"][row - main])

    def _main_key(self, scope: Scope) -> tuple[Any, ...]:
        return (self._main_count, self._generation, id(self.index), scope.user_id,
                scope.session_id, scope.since, scope.until)  # fmt: skip

    def _small(self, scope: Scope) -> tuple[list[int], Any] | None:
        """A small scope's rows of the index (a user's or a session's, at most EXACT_MAX): their
        messages (one per row) and vectors, read from SQLite by message id, exact (an IVF index
        holds 8-bit ones); kept for the next search of the same scope. None: not small."""
        import numpy as np

        key = self._main_key(scope)
        if self._last_exact is not None and self._last_exact[0] == key:
            return self._last_exact[1]
        if self._groups is None or self._groups.arrays["users"] is not self._arrays["users"]:
            self._groups = scoped.Groups(self._arrays)
        rows = self._groups.rows(scope, self._codes, EXACT_MAX)
        if rows is None:
            return None
        ids = np.unique(self._arrays["message_ids"][rows]).tolist()
        stored = vsql.message_vectors(self.store, self.model, ids)
        dim = self.dim
        owners = [m for m, pieces in stored.items() for _, v in pieces if vsql.fits(v, dim)]
        blobs = [v for pieces in stored.values() for _, v in pieces if vsql.fits(v, dim)]
        matrix = vsql.to_matrix(blobs, dim) if blobs else np.zeros((0, dim), dtype=np.float32)
        self._last_exact = (key, (owners, matrix))
        return owners, matrix

    def _mask(self, scope: Scope) -> Any:
        """The index's rows in scope (None: all), kept for the next search of the same scope."""
        key = self._main_key(scope)
        if self._last_mask is not None and self._last_mask[0] == key:
            return self._last_mask[1]
        mask = scoped.new_mask(self._arrays, self._codes, scope)
        self._last_mask = (key, mask)
        return mask

    def _rows(
        self, query: Any, want: int, masks: tuple[Any, Any], main_total: int
    ) -> tuple[Any, Any]:
        """The best `want` rows (scores, rows; the delta's numbered after the index's): the
        index's search and the delta's exact one, merged by score."""
        import numpy as np

        scores, rows = self._main_rows(query, want, masks[0], main_total)
        if self._delta.n:
            delta = self._delta.vectors(self.dim)
            picked = np.arange(self._delta.n) if masks[1] is None else np.flatnonzero(masks[1])
            extra = delta[picked] @ query[0]
            scores = np.concatenate([scores, extra])
            rows = np.concatenate([rows, picked + self._main_count])
        order = np.argsort(-scores, kind="stable")[:want]
        return scores[order], rows[order]

    def _main_rows(self, query: Any, want: int, mask: Any, total: int) -> tuple[Any, Any]:
        import faiss
        import numpy as np

        if self._main_count == 0 or total == 0:
            return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
        want = min(want, total)
        ivf = isinstance(self.index, faiss.IndexIVF)
        if mask is None and not ivf:
            scores, rows = self.index.search(query, want)
        else:
            selector = None
            if mask is not None:
                if self._bitmap is None or self._bitmap[0] is not mask:
                    self._bitmap = (mask, np.packbits(mask.astype(np.uint8), bitorder="little"))
                selector = faiss.IDSelectorBitmap(len(mask), faiss.swig_ptr(self._bitmap[1]))
            if ivf:
                # A narrow filter leaves few messages in the nearest lists: visit them all.
                nlist = self.index.nlist
                probe = nlist if total < self._main_count // 20 else min(NPROBE, nlist)
                params: Any = faiss.SearchParametersIVF(sel=selector, nprobe=probe)  # type: ignore[call-arg]
            else:
                params = faiss.SearchParameters(sel=selector)  # type: ignore[call-arg]
            scores, rows = self.index.search(query, want, params=params)
        keep = rows[0] >= 0
        return scores[0][keep], rows[0][keep]


def _sample_crc(index: Any) -> int:
    """A CRC-32 of SAMPLE rows spread over a flat index's vectors: the description records it,
    so that files written for another database's vectors, even with the same message ids,
    sessions and times, are not used with this one's."""
    n = int(index.ntotal)
    rows = sorted({i * n // SAMPLE for i in range(SAMPLE)} | {n - 1}) if n else []
    return crc(b"".join(index.reconstruct(r).tobytes() for r in rows))


def _flat(dim: int) -> Any:
    """An exact index of float16 vectors (inner product): the values SQLite stores, searched
    without a float32 copy (half the memory, and read from the database without conversion)."""
    import faiss

    return faiss.IndexScalarQuantizer(
        dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
    )


def _fold(rows: int) -> int:
    """How many rows newer than an index file of `rows` rows make it written again (the delta
    folded in): a tenth of them, at least DELTA_MIN, at most DELTA_MAX."""
    return min(DELTA_MAX, max(DELTA_MIN, rows // 10))


def _new_index(matrix: Any) -> Any:
    """An exact index for a small matrix; a trained IVF index of 8-bit vectors for a big one."""
    import faiss
    import numpy as np

    n, dim = matrix.shape
    if n < IVF_FROM:
        return _flat(dim)
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
