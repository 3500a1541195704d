"""SQL of the message vectors: which messages of a scope wait for theirs, the embedding claims,
storing vectors, and reading them back (`memcli.search.retriever` and `memcli.search.dense`).

Which messages are embedded. A message is embedded when it has a vector row for the model (or it
has no text: it gets none), and it is not in `retrieval_redo` (its text changed since). Marks
say up to which message id every message of a scope is embedded, so that a search looks only
at the messages after its scope's mark:

- `embedded:MODEL` in `retrieval_state`: every message of the store (moved by an embedding of
  the whole store);
- `retrieval_marks` (migration 21; PostgreSQL 25): per model, every message of a user
  (`user:ID`) or of a session (`session:ID`), moved by an embedding of that scope alone. A mark
  goes with its session, a user's with the user's last session.

The messages a scope still waits for are its messages past the highest mark that covers them
(the store's, its user's, its session's) that have no vector row, and its changed ones: found
through `messages_session_id` (session, id) and the vectors' key, so that embedding one user's
messages reads and embeds none of another user's, and the store's mark stays true (it moves
only when the whole store is embedded in id order).

How a vector is stored. Each vector is stored once, in `retrieval_vectors.vector`: the database is
the only copy the dense index reads (`memcli.search.dense`; a flat index keeps no vector file).
SQLite stores it as float16 (2 bytes a dimension: a row of the default model fills a quarter of a
page, where float32 rows filled 3/4 of a half); PostgreSQL as float32 (pgvector's column is
filled from them). `STORED` is that choice, `encode` makes the stored bytes, and the readers take
either size (`fits`, `to_matrix`), so a row copied from the other backend reads the same.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memcli.errors import StoreDamaged

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from memcli.store.base import SQLStore
    from memcli.store.scope import Scope


#: The dtype each backend stores a vector's values in (`encode`); the one place they differ.
STORED = {"sqlite": "float16", "postgresql": "float32"}


def encode(dialect: str, vector: bytes, dim: int) -> bytes:
    """A vector's bytes (float32, or float16) as a store of `dialect` stores them (`STORED`)."""
    import numpy as np

    want = np.dtype(STORED.get(dialect, "float32"))
    if len(vector) == dim * want.itemsize:
        return bytes(vector)
    return to_matrix([vector], dim)[0].astype(want).tobytes()


def fits(vector: Any, dim: int) -> bool:
    """Whether stored bytes are a vector of `dim` values (float16 or float32)."""
    return isinstance(vector, bytes | bytearray | memoryview) and len(vector) in (2 * dim, 4 * dim)


def to_matrix(vectors: Sequence[Any], dim: int) -> Any:
    """Stored vectors (each float16 or float32 bytes of `dim` values: `fits`) as one float32
    matrix, a row each."""
    import numpy as np

    if all(len(v) == 2 * dim for v in vectors):
        half = np.frombuffer(b"".join(vectors), dtype=np.float16)
        return half.astype(np.float32).reshape(len(vectors), dim)
    if all(len(v) == 4 * dim for v in vectors):
        return np.frombuffer(b"".join(vectors), dtype=np.float32).reshape(len(vectors), dim)
    out = np.empty((len(vectors), dim), dtype=np.float32)
    for row, vector in enumerate(vectors):
        out[row] = np.frombuffer(vector, dtype=np.float16 if len(vector) == 2 * dim else np.float32)
    return out


def embedded_through(store: SQLStore, model: str) -> int:
    """Every message with an id up to this one has its vectors for `model` (the store's mark)."""
    row = store.execute(
        "SELECT value FROM retrieval_state WHERE key = ?", (f"embedded:{model}",)
    ).fetchone()
    return int(row[0]) if row else 0


def mark_key(scope: Scope | None) -> str | None:
    """The key of a scope's mark in `retrieval_marks` (`session:ID`, `user:ID`); None for the
    whole store (`embedded:MODEL`). A session scope is the session's, whatever its user."""
    if scope is None:
        return None
    if scope.session_id is not None:
        return f"session:{scope.session_id}"
    if scope.user_id is not None:
        return f"user:{scope.user_id}"
    return None


def floor(store: SQLStore, model: str, scope: Scope | None) -> int:
    """Every message of the scope with an id up to this one is embedded (unless changed since:
    `retrieval_redo`): the highest of the store's mark, the user's and the session's."""
    through = embedded_through(store, model)
    key = mark_key(scope)
    if key is None or scope is None:
        return through
    keys = [key]
    if scope.session_id is not None:
        user = scope.user_id
        if user is None:
            row = store.execute(
                "SELECT user_id FROM sessions WHERE id = ?", (scope.session_id,)
            ).fetchone()
            user = None if row is None else row[0]
        if user is not None:
            keys.append(f"user:{user}")
    row = store.execute(
        "SELECT MAX(through) FROM retrieval_marks WHERE model = ?"
        f" AND scope_key IN ({', '.join('?' * len(keys))})",
        (model, *keys),
    ).fetchone()
    return max(through, int(row[0] or 0))


def _in_scope(scope: Scope | None) -> tuple[str, str, list[Any]]:
    """(FROM, conditions, parameters) for the messages `m` of a scope (a user's, a session's, or
    the store's): a user's through their sessions, each session's from its mark on through
    `messages_session_id`."""
    if scope is None or (scope.user_id is None and scope.session_id is None):
        return "messages m", "", []
    if scope.session_id is not None:
        if scope.user_id is None:
            return "messages m", " AND m.session_id = ?", [scope.session_id]
        return (
            "messages m JOIN sessions s ON s.id = m.session_id",
            " AND m.session_id = ? AND s.user_id = ?",
            [scope.session_id, scope.user_id],
        )
    return (
        "sessions s JOIN messages m ON m.session_id = s.id",
        " AND s.user_id = ?",
        [scope.user_id],
    )


_NO_VECTOR = (
    " AND NOT EXISTS (SELECT 1 FROM retrieval_vectors v WHERE v.message_id = m.id AND v.model = ?)"
)


def pending_ids(
    store: SQLStore, model: str, scope: Scope | None, limit: int
) -> tuple[list[int], set[int]]:
    """The scope's next `limit` messages without vectors for `model`: its changed ones first
    (returned again as the second value), then in id order past the scope's mark (`floor`).

    Nothing while another process holds the write lock, or on a read-only database: their vectors
    could not be stored now, and a search must not wait (it searches the vectors there are; the
    messages stay pending for the next one)."""
    if limit <= 0 or not store.can_write_now():
        return [], set()
    source, where, params = _in_scope(scope)
    redo = [
        int(r[0])
        for r in store.execute(
            f"SELECT m.id FROM {source} WHERE m.id IN (SELECT message_id FROM retrieval_redo)"
            f"{where} ORDER BY m.id LIMIT ?",
            (*params, limit),
        )
    ]
    rows = store.execute(
        f"SELECT m.id FROM {source} WHERE m.id > ?{where}{_NO_VECTOR} ORDER BY m.id LIMIT ?",
        (floor(store, model, scope), *params, model, limit),
    ).fetchall()
    changed = set(redo)
    ids = redo + [int(r[0]) for r in rows if int(r[0]) not in changed]
    return ids[:limit], changed


def pending_count(store: SQLStore, model: str, scope: Scope | None = None) -> int:
    """How many messages of the scope (None: the store) have no vectors yet."""
    source, where, params = _in_scope(scope)
    mark = floor(store, model, scope)
    row = store.execute(
        f"SELECT (SELECT COUNT(*) FROM {source} WHERE m.id > ?{where}{_NO_VECTOR})"
        f" + (SELECT COUNT(*) FROM {source} WHERE m.id <= ?{where}"
        " AND m.id IN (SELECT message_id FROM retrieval_redo))",
        (mark, *params, model, mark, *params),
    ).fetchone()
    return int(row[0])


def settle(store: SQLStore, model: str, scope: Scope | None) -> bool:
    """Move a user's or session's mark to its last message when none of its messages past the
    mark waits for vectors (they were embedded by another scope's work), so that its next
    searches do not look at them again; True if it moved. Nothing on a database this process
    cannot write now."""
    key = mark_key(scope)
    if key is None:
        return False
    source, where, params = _in_scope(scope)
    mark = floor(store, model, scope)
    row = store.execute(
        f"SELECT MAX(m.id), SUM(CASE WHEN NOT EXISTS (SELECT 1 FROM retrieval_vectors v"
        f" WHERE v.message_id = m.id AND v.model = ?) THEN 1 ELSE 0 END)"
        f" FROM {source} WHERE m.id > ?{where}",
        (model, mark, *params),
    ).fetchone()
    if row is None or row[0] is None or (row[1] or 0) > 0:
        return False  # (the usual case: nothing past the mark, and no write lock taken)
    if not store.can_write_now():
        return False
    with store.transaction():
        _move_mark(store, model, key, int(row[0]))
    return True


def _move_mark(store: SQLStore, model: str, key: str, through: int) -> None:
    store.execute(
        "INSERT INTO retrieval_marks (model, scope_key, through) VALUES (?, ?, ?)"
        " ON CONFLICT (model, scope_key) DO UPDATE SET through ="
        " CASE WHEN excluded.through > retrieval_marks.through THEN excluded.through"
        " ELSE retrieval_marks.through END",
        (model, key, through),
    )


@dataclass(frozen=True)
class UnitRow:
    """What a message's vector is made from: the message, and its previous one in the session."""

    id: int
    session_id: str
    seq: int
    role: str
    name: str | None
    content: str


def unit_rows(
    store: SQLStore, ids: Sequence[int], max_chars: int | None = None
) -> tuple[list[UnitRow], int]:
    """The messages of `ids`, in that order, as many as hold `max_chars` characters together (at
    least one), so that a batch of huge messages is not read into memory at once; and how many
    of `ids` that used up (a message deleted meanwhile is used up, and left out)."""
    sizes = dict(
        store.rows_for_ids("SELECT id, length(content) FROM messages WHERE id IN ({ids})", ids)
    )
    chosen: list[int] = []
    used = total = 0
    for item in ids:
        if item in sizes:
            total += sizes[item] or 0
            if chosen and max_chars is not None and total > max_chars:
                break
            chosen.append(item)
        used += 1
    found = store.rows_for_ids(
        "SELECT id, session_id, seq, role, name, content FROM messages WHERE id IN ({ids})", chosen
    )
    by_id = {r[0]: UnitRow(*r) for r in found}
    return [by_id[i] for i in chosen if i in by_id], used


#: How long a claim to embed a model's messages lasts unless renewed (each batch renews it).
CLAIM_SECONDS = 120.0


def claim_token() -> str:
    """A new holder's token for `claim_embedding`: unique, and naming the process (`ID/PID@HOST`)
    so that another process on the host can tell when the holder is dead."""
    import os
    import socket
    import uuid

    return f"{uuid.uuid4().hex}/{os.getpid()}@{socket.gethostname()}"


def holder_alive(holder: str) -> bool:
    """Whether the process a token names may still run: False only when it names a process of
    this host that is gone (a holder of another host, or an older token, counts as alive)."""
    import os
    import socket

    _, _, where = holder.partition("/")
    pid, _, host = where.partition("@")
    if not pid.isdigit() or host != socket.gethostname():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # (it exists, another user's)
    return True


def claim_embedding(store: SQLStore, model: str, token: str) -> bool:
    """Take or renew the right to embed messages for `model` (one process at a time, so that two
    do not spend the model on the same messages); False while another holder's claim is live: not
    expired, and its process (see `claim_token`) not known to be dead. A dead holder's claim is
    taken over at once."""
    key = f"embedding:{model}"
    now = time.time()
    with store.transaction():
        if store.dialect == "postgresql":  # (SQLite: its write transaction excludes other writers)
            from memcli.store import pg_index

            pg_index.lock_claim(store, key)
        row = store.execute("SELECT value FROM retrieval_state WHERE key = ?", (key,)).fetchone()
        if row is not None:
            holder, _, until = str(row[0]).rpartition(" ")
            try:
                live = float(until) > now
            except ValueError:
                live = False
            if holder != token and live and holder_alive(holder):
                return False
        store.execute(
            "INSERT INTO retrieval_state (key, value) VALUES (?, ?)"
            " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, f"{token} {now + CLAIM_SECONDS:.3f}"),
        )
    return True


def claim_holder(store: SQLStore, model: str) -> str | None:
    """Who holds the claim to embed `model`'s messages (`PID@HOST`, or the token), if anyone."""
    row = store.execute(
        "SELECT value FROM retrieval_state WHERE key = ?", (f"embedding:{model}",)
    ).fetchone()
    if row is None:
        return None
    holder = str(row[0]).rpartition(" ")[0]
    return holder.partition("/")[2] or holder


def release_embedding(store: SQLStore, model: str, token: str) -> None:
    """Give up a claim taken with `token` (a claim left by a killed process expires, or is taken
    over by the next process of its host at once)."""
    store.execute(
        "DELETE FROM retrieval_state WHERE key = ? AND substr(value, 1, ?) = ?",
        (f"embedding:{model}", len(token) + 1, f"{token} "),
    )


def unembedded(store: SQLStore, model: str, ids: Sequence[int]) -> set[int]:
    """Those of these messages that have no vectors for `model` yet (still pending): changed
    ones, and those past the store's mark with no vector row and some text."""
    mark = embedded_through(store, model)
    rows = store.rows_for_ids(
        "SELECT message_id FROM retrieval_redo WHERE message_id IN ({ids})", ids
    )
    out = {int(r[0]) for r in rows}
    later = [i for i in ids if i > mark and i not in out]
    if later:
        rows = store.rows_for_ids(
            "SELECT m.id, m.content FROM messages m WHERE NOT EXISTS (SELECT 1"
            " FROM retrieval_vectors v WHERE v.message_id = m.id AND v.model = ?)"
            " AND m.id IN ({ids})",
            later,
            (model,),
        )
        out |= {int(i) for i, content in rows if content.strip()}
    return out


def add_vectors(
    store: SQLStore,
    model: str,
    rows: Sequence[tuple[int, int, int, bytes]],
    through: int,
    cleared: Sequence[int] = (),
    scope: Scope | None = None,
) -> int:
    """Store (message id, piece, dim, float32 bytes) rows (as the store keeps them: `encode`)
    and move the scope's mark to `through` (None: the store's `embedded:MODEL`; a user's or
    session's in `retrieval_marks`): every message of the scope up to it is then embedded
    (`cleared`: messages handled that got no vector, e.g. empty ones). A piece already stored
    (by another process that embedded the message meanwhile) is kept, not stored twice; return
    how many rows were added."""
    key = mark_key(scope)
    with store.transaction():
        if key is not None:
            _move_mark(store, model, key, through)
        else:
            store.execute(
                "INSERT INTO retrieval_state (key, value) VALUES (?, ?)"
                " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (f"embedded:{model}", str(max(through, embedded_through(store, model)))),
            )
        added = store.executemany(
            "INSERT INTO retrieval_vectors (message_id, piece, model, dim, vector)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (message_id, piece, model) DO NOTHING",
            [(m, p, model, d, encode(store.dialect, v, d)) for m, p, d, v in rows],
        ).rowcount
        added = max(int(added), 0)
        store.execute(
            "INSERT INTO retrieval_state (key, value) VALUES (?, ?)"
            " ON CONFLICT(key) DO UPDATE SET value = CAST(CAST(retrieval_state.value AS INTEGER)"
            " + CAST(excluded.value AS INTEGER) AS TEXT)",
            (f"vectors_added:{model}", str(added)),
        )
        done = sorted({r[0] for r in rows} | set(cleared))
        store.execute_for_ids("DELETE FROM retrieval_redo WHERE message_id IN ({ids})", done)
    return added


def vector_stats(store: SQLStore, model: str) -> tuple[int, int]:
    """(vectors ever added for `model`, vectors ever deleted): an index file built when both
    were the same is up to date; one built when only fewer were added can be extended."""
    rows = dict(
        store.execute(
            "SELECT key, value FROM retrieval_state WHERE key IN (?, 'vectors_deleted')",
            (f"vectors_added:{model}",),
        ).fetchall()
    )
    return int(rows.get(f"vectors_added:{model}", 0)), int(rows.get("vectors_deleted", 0))


def vector_models(store: SQLStore) -> list[str]:
    """The models this store has ever added vectors for (their `vectors_added` counters), sorted:
    a caller tells a store embedded with another model (another precision of it) by them."""
    rows = store.execute(
        "SELECT key FROM retrieval_state WHERE key LIKE ?", ("vectors_added:%",)
    ).fetchall()
    return sorted(str(r[0]).removeprefix("vectors_added:") for r in rows)


def iter_vectors(store: SQLStore, model: str, after: int) -> Iterator[tuple[Any, ...]]:
    """(vector id, message id, session, user, unix ms, dim, bytes) after a vector id, in order
    (the bytes as stored: `to_matrix` reads them). A row the database cannot read, or that is
    not such a row (a damaged page), raises StoreDamaged (StoreError on another failure)."""
    from memcli.store.index import message_time_ms

    cursor = store.execute(
        "SELECT v.id, v.message_id, m.session_id, s.user_id,"
        f" {message_time_ms(store)}, v.dim, v.vector"
        " FROM retrieval_vectors v JOIN messages m ON m.id = v.message_id"
        " JOIN sessions s ON s.id = m.session_id WHERE v.model = ? AND v.id > ? ORDER BY v.id",
        (model, after),
    )
    errors: tuple[type[Exception], ...] = getattr(store, "DATABASE_ERRORS", ())
    try:
        for row in cursor:
            if not _vector_row(row):
                raise StoreDamaged(
                    f"the stored vectors are damaged (vector {row[0]!r} of message {row[1]!r}"
                    " is not a vector)",
                    "Run `memcli check` to see what is wrong, and restore the database from a"
                    " backup (`memcli backup`)",
                )
            yield row
    except errors as exc:
        raise _translate(store, exc, "cannot read the stored vectors") from None


def _vector_row(row: Sequence[Any]) -> bool:
    dim, vector = row[5], row[6]
    return (
        isinstance(row[0], int)
        and isinstance(row[1], int)
        and isinstance(dim, int)
        and dim > 0
        and fits(vector, dim)
    )


def _translate(store: SQLStore, exc: Exception, what: str) -> Exception:
    """The store's own error for a driver error met while reading a cursor."""
    error = getattr(store, "_error", None)
    if callable(error):
        return error(exc, what)  # type: ignore[no-any-return]
    from memcli.errors import StoreError

    return StoreError(f"{what}: {exc}", "Run `memcli check`")


def message_vectors(
    store: SQLStore, model: str, ids: Sequence[int]
) -> dict[int, list[tuple[int, bytes]]]:
    """Per message id, its stored (piece, bytes) vectors for `model`, in piece order (the bytes
    as stored: `to_matrix` reads them)."""
    out: dict[int, list[tuple[int, bytes]]] = {}
    rows = store.rows_for_ids(
        "SELECT message_id, piece, vector FROM retrieval_vectors"
        " WHERE model = ? AND message_id IN ({ids}) ORDER BY message_id, piece",
        list(ids),
        (model,),
    )
    for message_id, piece, vector in rows:
        out.setdefault(int(message_id), []).append((int(piece), bytes(vector)))
    return out


def stored_vectors(store: SQLStore, model: str, through: int, dim: int) -> tuple[Any, Any]:
    """(message ids, float16 matrix) of `model`'s vectors of `dim` values up to a vector id, in
    vector id order: what a flat index holds (float16, as SQLite stores them: no conversion),
    read from the one copy (no join: the index's own file gives each row's session, user and
    time). A damaged row raises as `iter_vectors`."""
    import numpy as np

    errors: tuple[type[Exception], ...] = getattr(store, "DATABASE_ERRORS", ())
    try:
        rows = store.execute(
            "SELECT message_id, vector FROM retrieval_vectors WHERE model = ? AND id <= ?"
            " AND dim = ? ORDER BY id",
            (model, through, dim),
        ).fetchall()
    except errors as exc:
        raise _translate(store, exc, "cannot read the stored vectors") from None
    ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    vectors = [r[1] for r in rows]
    del rows
    if all(isinstance(v, bytes) and len(v) == 2 * dim for v in vectors):  # (the usual case)
        return ids, np.frombuffer(b"".join(vectors), dtype=np.float16).reshape(-1, dim)
    if not all(fits(v, dim) for v in vectors):
        raise StoreDamaged(
            "the stored vectors are damaged (a vector is not a vector)",
            "Run `memcli check` to see what is wrong, and restore the database from a"
            " backup (`memcli backup`)",
        )
    return ids, to_matrix(vectors, dim).astype(np.float16)


def message_places(store: SQLStore, ids: Sequence[int]) -> dict[int, tuple[str, str, int]]:
    """Per message id, its (session, user, unix ms), as an index's rows record them."""
    from memcli.store.index import message_time_ms

    rows = store.rows_for_ids(
        f"SELECT m.id, m.session_id, s.user_id, {message_time_ms(store)} FROM messages m"
        " JOIN sessions s ON s.id = m.session_id WHERE m.id IN ({ids})",
        list(ids),
    )
    return {int(r[0]): (str(r[1]), str(r[2]), int(r[3])) for r in rows}
