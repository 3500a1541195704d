"""What `memcli check` looks at: SQLite's integrity check, FTS5's check of the full-text index,
then memcli's own bookkeeping.

Each check reads; none writes. A database SQLite finds damaged is reported as such, and memcli's
checks still run as far as the file can be read (a check that fails to read says so). A damaged
full-text index (`check_full_text`) is the one problem memcli mends itself: it is rebuilt from
the messages (`SQLiteStore.repair`, `memcli check --repair`).

memcli's own checks are portable SQL (`TABLE_CHECKS`): on PostgreSQL they run as they are, with
the checks of its id sequences (`PG_CHECKS`) in place of SQLite's internals (integrity, foreign
keys: PostgreSQL enforces those itself; the `counters` high-water mark: a sequence is one).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from memcli.fold import fold
from memcli.messages import session_name

#: At most this many problems of one kind are listed (the count says how many there are).
MAX_PER_CHECK = 20

#: The check of the full-text index; its problems are mended by REBUILD.
FULL_TEXT = "full-text index"
#: What mends a damaged full-text index.
REBUILD = "memcli check --repair (rebuilds the full-text index from the messages)"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a database: which check found it, and what it found."""

    check: str
    message: str
    session: str | None = None  # (its key: `name` is what its user calls it)
    #: The command that mends it (None: restore a backup).
    fix: str | None = None

    @property
    def session_name(self) -> str | None:
        return None if self.session is None else session_name(self.session)

    def record(self) -> dict[str, Any]:
        return {
            "type": "problem",
            "check": self.check,
            "session": self.session_name,
            "message": self.message,
            "fix": self.fix,
        }


def check_database(conn: sqlite3.Connection) -> list[Problem]:
    """SQLite's `PRAGMA integrity_check`, then memcli's consistency checks (`CHECKS`)."""
    problems = list(_guarded("integrity", conn, _integrity, (sqlite3.Error,)))
    return problems + run_checks(conn, CHECKS, (sqlite3.Error,))


def run_checks(
    conn: Any, checks: tuple[tuple[str, Check], ...], errors: tuple[type[Exception], ...]
) -> list[Problem]:
    """Run checks on a connection (`conn.execute(sql)` gives rows); a check that fails with one of
    `errors` is reported as not run."""
    problems = []
    for name, run in checks:
        problems += _guarded(name, conn, run, errors)
    return problems


def _guarded(
    name: str, conn: Any, run: Check, errors: tuple[type[Exception], ...]
) -> list[Problem]:
    found: list[Problem] = []
    try:
        for problem in run(conn):
            found.append(problem)
            if len(found) > MAX_PER_CHECK:
                break
    except errors as exc:
        found.append(Problem(name, f"could not be run: {exc}"))
    return found


def _integrity(conn: sqlite3.Connection) -> Iterator[Problem]:
    for (text,) in conn.execute(f"PRAGMA integrity_check({MAX_PER_CHECK})"):
        yield from (Problem("integrity", line) for line in integrity_lines(text))


def integrity_lines(text: str) -> list[str]:
    """The problems in a row of SQLite's integrity check (none in "ok"; a row may hold several
    lines, under a "*** in database main ***" heading)."""
    return [
        line
        for line in text.splitlines()
        if line.strip() and line != "ok" and not line.startswith("*** in database")
    ]


def check_full_text(conn: sqlite3.Connection, read_only: bool = False) -> list[Problem]:
    """FTS5's integrity check of the full-text index of the messages (`retrieval_fts`): whether
    the index is sound in itself, and when every message is in it (none stored since the last
    search), whether it holds exactly the messages' words; then a sample of messages is looked up
    by their words (`_missed_words`), and an index written by another version of FTS5 is
    damage too (both are mended by a rebuild). Run outside a transaction: FTS5
    takes the write lock for its check (for as long as it runs; nothing is written). On a
    read-only connection, or while another process holds the write lock past the busy timeout,
    the whole index is read instead (an `fts5vocab` table over it, in `temp`), which finds
    damaged pages (not words changed within a sound page)."""
    try:
        damage = full_text_damage(conn, read_only)
    except sqlite3.Error as exc:
        return [Problem(FULL_TEXT, f"could not be run: {exc}")]
    if damage is None:
        return []
    return [
        Problem(
            FULL_TEXT, f"the full-text index of the messages is damaged ({damage})", fix=REBUILD
        )
    ]


def full_text_damage(conn: sqlite3.Connection, read_only: bool = False) -> str | None:
    """What SQLite says of the damaged full-text index (see `check_full_text`); None when it
    is sound, or when the database has none. Other errors are raised."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'retrieval_fts'"
    ).fetchone()
    if exists is None:
        return None
    complete = conn.execute(
        "SELECT (SELECT COALESCE(MAX(id), 0) FROM messages) <= COALESCE((SELECT CAST(value AS"
        " INTEGER) FROM retrieval_state WHERE key = 'fts_through'), 0)"
    ).fetchone()[0]
    try:
        checked = False
        if not read_only:
            try:
                conn.execute(
                    "INSERT INTO retrieval_fts (retrieval_fts, rank) VALUES ('integrity-check', ?)",
                    (1 if complete else 0,),
                )
                checked = True
            except sqlite3.OperationalError as exc:
                name = getattr(exc, "sqlite_errorname", "") or ""
                if not name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_READONLY")):
                    raise
        if not checked:
            _read_full_text(conn)
        return _missed_words(conn)
    except sqlite3.DatabaseError as exc:
        name = getattr(exc, "sqlite_errorname", "") or ""
        text = str(exc)
        if name.startswith("SQLITE_CORRUPT") or "malformed" in text or "fts5 file format" in text:
            return text
        raise


#: How many messages `_missed_words` looks up by one of their words.
WORD_SAMPLE = 32
#: A word to look a message up by: letters and digits only (no tokenizer splits it), 3-40 long.
_WORD = re.compile(r"[^\W_]{3,40}")


def _missed_words(conn: sqlite3.Connection) -> str | None:
    """Look a sample of indexed messages up by a few of their words, the messages spread
    evenly over the ids the index holds: a message its own word does not find is damage that
    FTS5's check does not see (rows of the index's term index gone, say: every word search
    finds nothing while the structure is sound). None: each was found."""
    through = conn.execute(
        "SELECT COALESCE((SELECT CAST(value AS INTEGER) FROM retrieval_state"
        " WHERE key = 'fts_through'), 0)"
    ).fetchone()[0]
    low, high, count = conn.execute(
        "SELECT MIN(id), MAX(id), COUNT(*) FROM messages WHERE id <= ?", (through,)
    ).fetchone()
    if not count:
        return None
    step = max(1, (high - low + 1) // WORD_SAMPLE)
    rows = {
        row
        for start in range(low, high + 1, step)[:WORD_SAMPLE]
        for row in conn.execute(  # (the first message from each start: one index lookup)
            "SELECT id, content FROM messages WHERE id >= ? AND id <= ? ORDER BY id LIMIT 1",
            (start, high),
        )
    }
    for message_id, content in sorted(rows):
        words = sorted({fold(w) for w in _WORD.findall(content or "")})  # as indexed
        if not words:
            continue
        # (its first, middle and last word in the alphabet, and its longest: the index's pages
        # are ranges of terms, so the sample's words reach over all of them)
        picked = {words[0], words[len(words) // 2], words[-1], max(words, key=len)}
        for word in sorted(picked):
            found = conn.execute(
                "SELECT 1 FROM retrieval_fts WHERE retrieval_fts MATCH ? AND rowid = ?",
                (f'"{word}"', message_id),
            ).fetchone()
            if found is None:
                return f"message {message_id} is not found by its word {word!r}"
    return None


def rebuild_full_text(conn: sqlite3.Connection) -> None:
    """Inside the caller's write transaction: the full-text index rebuilt from the messages,
    however damaged (its pages are emptied first: FTS5 cannot open an index whose structure
    record is damaged, not even to rebuild it), every message in it after."""
    empty = sqlite3.connect(":memory:")
    try:
        empty.execute("CREATE VIRTUAL TABLE fts USING fts5(name, content)")
        rows = empty.execute("SELECT id, block FROM fts_data").fetchall()
        config = empty.execute("SELECT k, v FROM fts_config").fetchall()
    finally:
        empty.close()
    conn.execute("DELETE FROM retrieval_fts_data")
    conn.execute("DELETE FROM retrieval_fts_idx")
    conn.executemany("INSERT INTO retrieval_fts_data (id, block) VALUES (?, ?)", rows)
    # (the file format this SQLite's FTS5 writes: another version's index is rebuilt in it)
    conn.execute("DELETE FROM retrieval_fts_config WHERE k = 'version'")
    conn.executemany("INSERT INTO retrieval_fts_config (k, v) VALUES (?, ?)", config)
    conn.execute("INSERT INTO retrieval_fts (retrieval_fts) VALUES ('rebuild')")
    conn.execute(
        "INSERT INTO retrieval_state (key, value)"
        " SELECT 'fts_through', CAST(COALESCE(MAX(id), 0) AS TEXT) FROM messages"
        " WHERE true ON CONFLICT(key) DO UPDATE SET value = excluded.value"
    )


def _read_full_text(conn: sqlite3.Connection) -> None:
    """Read every entry of the full-text index (SQLite raises on a damaged page)."""
    conn.execute(
        "CREATE VIRTUAL TABLE IF NOT EXISTS temp.memcli_fts_check"
        " USING fts5vocab(main, retrieval_fts, 'instance')"
    )
    try:
        conn.execute("SELECT COUNT(*) FROM temp.memcli_fts_check").fetchone()
    finally:
        conn.execute("DROP TABLE temp.memcli_fts_check")


def _foreign_keys(conn: sqlite3.Connection) -> Iterator[Problem]:
    for table, rowid, parent, _ in conn.execute("PRAGMA foreign_key_check"):
        yield Problem("references", f"{table} row {rowid} points at a missing {parent} row")


def _session_counters(conn: Any) -> Iterator[Problem]:
    rows = conn.execute(
        "SELECT s.id, s.active_messages, s.archived_messages, s.active_tokens, s.flushes,"
        " COALESCE(m.active, 0), COALESCE(m.archived, 0), COALESCE(m.tokens, 0),"
        " (SELECT COUNT(*) FROM flushes f WHERE f.session_id = s.id)"
        " FROM sessions s LEFT JOIN (SELECT session_id,"
        " CAST(SUM(CASE WHEN status = 'active' THEN 1 ELSE 0 END) AS BIGINT) AS active,"
        " CAST(SUM(CASE WHEN status = 'archived' THEN 1 ELSE 0 END) AS BIGINT) AS archived,"
        " CAST(SUM(CASE WHEN status = 'active' THEN tokens ELSE 0 END) AS BIGINT) AS tokens"
        " FROM messages GROUP BY session_id) m ON m.session_id = s.id ORDER BY s.id"
    )
    names = ("active messages", "archived messages", "active tokens", "flushes")
    for row in rows:
        for name, recorded, actual in zip(names, row[1:5], row[5:9], strict=True):
            if recorded != actual:
                yield Problem(
                    "counters", f"the session counts {recorded} {name}, it holds {actual}", row[0]
                )


def _message_status(conn: Any) -> Iterator[Problem]:
    rows = conn.execute(
        "SELECT m.id, m.session_id, m.status, m.flush_id, f.session_id FROM messages m"
        " LEFT JOIN flushes f ON f.id = m.flush_id"
        " WHERE m.status NOT IN ('active', 'archived')"
        " OR (m.status = 'active' AND m.flush_id IS NOT NULL)"
        " OR (m.status = 'archived' AND (f.id IS NULL OR f.session_id != m.session_id))"
    )
    for message_id, session, status, flush_id, flush_session in rows:
        if status not in ("active", "archived"):
            what = f"has the unknown status {status!r}"
        elif status == "active":
            what = f"is active but belongs to flush {flush_id}"
        elif flush_id is None:
            what = "is archived by no flush"
        elif flush_session is None:
            what = f"is archived by flush {flush_id}, which does not exist"
        else:
            what = f"is archived by flush {flush_id} of session {session_name(flush_session)!r}"
        yield Problem("flush ids", f"message {message_id} {what}", session)


def _flush_counts(conn: Any) -> Iterator[Problem]:
    rows = conn.execute(
        "SELECT f.id, f.session_id, f.messages, COUNT(m.id) FROM flushes f"
        " LEFT JOIN messages m ON m.flush_id = f.id GROUP BY f.id"
        " HAVING f.messages != COUNT(m.id) ORDER BY f.id"
    )
    for flush_id, session, recorded, actual in rows:
        yield Problem(
            "flushes",
            f"flush {flush_id} records {recorded} messages, {actual} point at it",
            session,
        )


def _id_counter(conn: sqlite3.Connection) -> Iterator[Problem]:
    top, mark = conn.execute(
        "SELECT (SELECT MAX(id) FROM messages),"
        " (SELECT value FROM counters WHERE name = 'message_id')"
    ).fetchone()
    if top is not None and (mark is None or mark < top):
        yield Problem(
            "counters", f"the message id high-water mark ({mark}) is below the highest id ({top})"
        )


def _vectors(conn: sqlite3.Connection) -> Iterator[Problem]:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'retrieval_vectors'"
    ).fetchone()
    if exists is not None:
        yield from _orphan_vectors(conn)


def _orphan_vectors(conn: Any) -> Iterator[Problem]:
    count, sample = conn.execute(
        "SELECT COUNT(*), MIN(message_id) FROM retrieval_vectors v"
        " WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.id = v.message_id)"
    ).fetchone()
    if count:
        yield Problem(
            "vectors", f"{count} vectors belong to messages that are gone (e.g. message {sample})"
        )


#: Tables whose ids a PostgreSQL sequence gives out.
_SEQUENCES = ("messages", "flushes", "facts", "fact_history", "retrieval_vectors")


def _id_sequences(conn: Any) -> Iterator[Problem]:
    for table in _SEQUENCES:
        top, given = conn.execute(
            f"SELECT (SELECT MAX(id) FROM {table}), (SELECT CASE WHEN is_called THEN last_value"
            f" ELSE last_value - 1 END FROM {table}_id_seq)"
        ).fetchone()
        if top is not None and given < top:
            yield Problem(
                "counters",
                f"the id sequence of {table} ({given}) is below its highest id ({top}):"
                " PostgresStore.reset_sequences() mends it",
            )


Check = Callable[[Any], Iterator[Problem]]

#: memcli's own checks, after SQLite's, in order.
CHECKS: tuple[tuple[str, Check], ...] = (
    ("references", _foreign_keys),
    ("counters", _session_counters),
    ("counters", _id_counter),
    ("flush ids", _message_status),
    ("flushes", _flush_counts),
    ("vectors", _vectors),
)

#: memcli's own checks on PostgreSQL, in order.
PG_CHECKS: tuple[tuple[str, Check], ...] = (
    ("counters", _session_counters),
    ("counters", _id_sequences),
    ("flush ids", _message_status),
    ("flushes", _flush_counts),
    ("vectors", _orphan_vectors),
)
