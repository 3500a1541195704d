"""The dense side of retrieval: a FAISS index over the message vectors stored in SQLite.

SQLite holds the vectors (the source of truth). The index lives in files beside the database:
`<db>.retrieval.faiss` (the vectors), `<db>.retrieval.npz` (per row: message id, session and user
codes, unix time in ms) and `<db>.retrieval.json` (what the files cover, written last). They are
loaded by a query, extended when vectors were only added since, and rebuilt from SQLite when they
are missing, stale or unreadable. An in-memory database keeps its index in memory only.

Up to `IVF_FROM` vectors the index is exact (a flat inner-product index). Above, an inverted-file
index (IVF, `nlist` about the square root of the count) with 8-bit scalar-quantised vectors (a
quarter of the bytes to read per query; the cosines move by about 0.001) is memory-mapped at query
time, so that a fresh process searches a million messages without reading them all: the search
visits the `nprobe` nearest lists (and every list when a filter leaves few messages in scope).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memcli.store import retrieval as sql

if TYPE_CHECKING:
    import numpy as np

    from memcli.store.retrieval import Scope

#: Bumped when the files' layout changes, so that older files are rebuilt.
FORMAT = 3
IVF_FROM = 200_000
NPROBE = 48
_KEYS = ("message_ids", "sessions", "users", "times")


class MessageVectors:
    """The FAISS index over one model's message vectors, kept in step with SQLite."""

    def __init__(self, store: Any, model: str) -> None:
        self.store = store
        self.model = model
        self.index: Any = None
        self.added = self.deleted = self.max_id = self.dim = 0
        self.rebuilt = False
        self._mapped = False  # whether the index is a read-only memory map of its file
        self._arrays: dict[str, Any] = {}
        self._codes: dict[str, dict[str, int]] = {"session": {}, "user": {}}
        self._last_mask: tuple[Any, Any] | None = None
        self._bitmap: tuple[Any, Any] | None = None  # the last mask packed for FAISS

    def file(self, suffix: str) -> Path | None:
        db = getattr(self.store, "path", None)
        return None if db is None else Path(f"{db}.retrieval.{suffix}")

    @property
    def count(self) -> int:
        return 0 if self.index is None else int(self.index.ntotal)

    def refresh(self) -> None:
        """Load the files, extend the index with new vectors, or rebuild it from SQLite."""
        added, deleted = sql.vector_stats(self.store, self.model)
        if self.index is not None and (added, deleted) == (self.added, self.deleted):
            return  # up to date (`rebuilt` still tells what the last change was)
        self.rebuilt = False
        if self.index is None:
            self._load()
            if self.index is not None and (added, deleted) == (self.added, self.deleted):
                return
        if self.index is not None and deleted == self.deleted and added > self.added:
            expected = added - self.added
            rows = list(sql.iter_vectors(self.store, self.model, self.max_id))
            if len(rows) == expected and all(r[5] == self.dim for r in rows):
                self._writable()
                self._append(rows)
                self.added = added
                self._save()
                return
        self._rebuild(added, deleted)

    def _rebuild(self, added: int, deleted: int) -> None:
        import numpy as np

        rows = list(sql.iter_vectors(self.store, self.model, 0))
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
        """Read the files if all three are there, readable and agree; else leave it empty."""
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
            flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if info.get("ivf") else 0
            index = faiss.read_index(str(path), flags)
            with np.load(str(arrays)) as data:
                loaded = {key: data[key] for key in _KEYS}
            if any(len(v) != index.ntotal for v in loaded.values()) or index.d != info["dim"]:
                return
            if index.ntotal != info["count"]:
                return
        except Exception:
            return  # missing or unreadable: rebuilt from SQLite
        self.index = index
        self._mapped = bool(info.get("ivf"))
        self._arrays = loaded
        self.added, self.deleted = info["added"], info["deleted"]
        self.max_id, self.dim = info["max_id"], info["dim"]
        self._codes = {"session": dict(info["sessions"]), "user": dict(info["users"])}

    def _save(self) -> None:
        """Write the files, each through a temporary name; the description last."""
        import faiss
        import numpy as np

        path, arrays, meta = self.file("faiss"), self.file("npz"), self.file("json")
        if path is None or arrays is None or meta is None:
            return
        tag = f".{os.getpid()}.tmp"
        try:
            if meta.exists():
                meta.unlink()  # the files are not valid together until the description is back
            if self.index is None:
                return
            faiss.write_index(self.index, str(path) + tag)
            os.replace(str(path) + tag, path)
            np.savez(str(arrays) + tag + ".npz", **self._arrays)
            os.replace(str(arrays) + tag + ".npz", arrays)
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
            }
            Path(str(meta) + tag).write_text(json.dumps(info))
            os.replace(str(meta) + tag, meta)
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
        active = sql.active_ids(self.store, scope) if scope.archived_only else set()
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
