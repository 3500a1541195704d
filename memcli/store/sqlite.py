"""The SQLite store: one file (or memory) holds sessions, messages, flushes and block state."""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import quote

from memcli.errors import StoreBusy, StoreDamaged, StoreError
from memcli.store.check import (
    FULL_TEXT,
    Problem,
    check_database,
    check_full_text,
    full_text_damage,
    integrity_lines,
    rebuild_full_text,
)
from memcli.store.migrations import LATEST, needs_packing, schema_version, upgrade
from memcli.store.tables import TableStore

BUSY_TIMEOUT_MS = 10_000
#: How long a write waits its turn while other processes write, in all.
WRITE_WAIT_S = 60.0
#: The first write through a store runs `PRAGMA quick_check` on a file up to this size.
QUICK_CHECK_BYTES = 64 * 1024 * 1024
#: What SQLite says of a damaged file, whatever its error code.
_DAMAGE = "database disk image is malformed"


def _writable(path: Path) -> bool:
    """Whether memcli may write an existing database: the file and its directory (where the
    journal files go) are writable. (A new one is made, or fails to be, as usual.)"""
    if not path.exists():
        return True
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


@contextmanager
def removed_on_failure(path: str | Path) -> Iterator[None]:
    """What the block makes of a new database file at `path` is removed if the block fails: the
    file, its journals, and the directories made for it (left if not empty). A file that was
    there before is left as it is."""
    path = Path(path).expanduser()
    if path.exists():
        yield
        return
    made = []  # the directories the file needs that are not there, deepest first
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        made.append(parent)
        parent = parent.parent
    try:
        yield
    except BaseException:
        for end in ("", "-wal", "-shm", "-journal"):
            path.with_name(path.name + end).unlink(missing_ok=True)
        for directory in made:
            with suppress(OSError):
                directory.rmdir()
        raise


def _is_busy(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "database is locked" in str(exc)


def _use_wal(conn: sqlite3.Connection) -> None:
    """WAL mode (the file keeps it). Switching a new file to it needs the file to itself, and
    SQLite answers "locked" at once, without its busy timeout, while another connection opens
    it too (two processes or threads making one database): again after a growing, jittered
    pause, until WRITE_WAIT_S have gone by."""
    deadline = time.monotonic() + WRITE_WAIT_S
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 0.1)


class SQLiteStore(TableStore):
    """The Store protocol over SQLite, WAL mode, with a busy timeout.

    Opening a database applies the pending migrations (`memcli.store.migrations`) in one write
    transaction, and takes no write lock when there are none; every statement is plain sqlite3,
    so that a command starts fast.

    Readers never wait for writers (WAL). A file that cannot be written (it, or its directory,
    is read-only) is opened read-only, and only reading works. Writers take turns: a write
    transaction waits for the lock (retries after a jittered, growing pause) up to WRITE_WAIT_S.
    A file SQLite reports damaged (any statement; and `PRAGMA quick_check` before a store's
    first write, for files up to QUICK_CHECK_BYTES) raises StoreDamaged and is never written to
    again through this store; `check()` says what is wrong.

    Threads may share a store: `lock` (reentrant) is held by a transaction for its whole length
    and by each read outside one, so that one thread's statements never run inside another
    thread's transaction. (`read_messages` holds it until its iterator is used up or closed:
    read that iterator in the thread that asked for it.)
    """

    #: Which SQL the shared helpers speak to it (see `SQLStore.dialect`).
    dialect = "sqlite"

    def __init__(self, path: str | Path | None = None, *, create: bool = True) -> None:
        """Open (or with `create`, make if missing: the file and its directories) the database
        at `path` (None or ":memory:": in memory). Without `create`, a file that is not there
        is a StoreError ("no database at PATH") and nothing is made."""
        self.path = None if path is None or str(path) == ":memory:" else Path(path)
        if not create and self.path is not None and not self.path.exists():
            raise StoreError(
                f"no database at {self.path}",
                "Import a conversation first (`memcli import FILE`) or pick one with --db",
            )
        #: Opened read-only: the file or its directory is not writable. Writing raises StoreError.
        self.read_only = self.path is not None and not _writable(self.path)
        #: SQLite reported the file damaged: nothing more is written to it (see `_error`).
        self.damaged = False
        #: The first write transaction checks the file first (`_check_before_writing`).
        self._write_checked = self.path is None
        try:
            if self.read_only:
                conn = self._connect_read_only()
            else:
                if self.path is not None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = self._connect(str(self.path) if self.path else ":memory:")
                if self.path is not None:
                    _use_wal(conn)
                    conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            raise self._error(exc, f"cannot open the database {self.where}") from None
        except OSError as exc:
            raise StoreError(
                f"cannot open the database {self.where}: {exc}",
                "Check the path and its permissions (--db or MEMCLI_DB)",
            ) from None
        self.conn = conn
        #: `close()` was called: the connection is closed.
        self.closed = False
        self._init_tables()
        self._turn = threading.Condition(self.lock)  # (never notified: a pause without the lock)
        #: The connection's busy timeout now: a write transaction starts with it at 0 (a write
        #: that waits does so in `_begin_waiting`, without the store's lock) and leaves it so (two
        #: PRAGMAs per write would cost ~5%); a statement outside a transaction that meets a lock
        #: meanwhile (in WAL mode reads hardly ever do) sets it back before running again.
        self._busy_ms = BUSY_TIMEOUT_MS
        #: The next message id, once a transaction has asked (`_new_message_ids`).
        self._next_id: int | None = None
        self._migrate()
        self._set_busy_timeout(BUSY_TIMEOUT_MS)  # (a migration's write set it to 0)

    @property
    def where(self) -> str:
        return str(self.path) if self.path else ":memory:"

    # -- plumbing ---------------------------------------------------------------------------------

    @staticmethod
    def _connect(target: str, uri: bool = False) -> sqlite3.Connection:
        conn = sqlite3.connect(
            target,
            uri=uri,
            isolation_level=None,
            check_same_thread=False,
            timeout=BUSY_TIMEOUT_MS / 1000,
        )
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        return conn

    def _connect_read_only(self) -> sqlite3.Connection:
        """`mode=ro`; in a directory where SQLite cannot make the WAL's shared-memory file, the
        file is opened immutable (nobody can be writing it there: its directory is read-only)."""
        assert self.path is not None
        base = "file:" + quote(str(self.path.resolve()))
        conn = self._connect(base + "?mode=ro", uri=True)
        try:
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorname", "") != "SQLITE_CANTOPEN":
                raise
            conn.close()
            conn = self._connect(base + "?immutable=1", uri=True)
        return conn

    DATABASE_ERRORS = (sqlite3.Error,)

    def _error(self, exc: Exception, what: str) -> StoreError:
        """The StoreError for a sqlite3 error; one that says the file is damaged marks the store
        damaged, and from then on it refuses to write."""
        name = getattr(exc, "sqlite_errorname", "") or ""
        if name.startswith("SQLITE_CORRUPT") or name == "SQLITE_NOTADB" or _DAMAGE in str(exc):
            self.damaged = True
            if name == "SQLITE_NOTADB" and not self._sqlite_header():
                return StoreDamaged(
                    f"{self.where} is not a memcli database: it is not a SQLite file ({exc})",
                    "Point --db (or MEMCLI_DB, or db in the config) at memcli's database; a new"
                    " file name makes a new one. Were it memcli's database, it is damaged: restore"
                    " it from a backup (`memcli backup`)",
                )
            return StoreDamaged(
                f"the database {self.where} is damaged ({exc})",
                "Nothing more is written to it. Run `memcli check` to see what is wrong, and "
                "restore it from a backup (`memcli backup`)",
            )
        if name.startswith("SQLITE_READONLY"):
            return StoreError(
                f"{what}: the database {self.where} is read-only ({exc})",
                "Reading commands work on it; make the file and its directory writable to write",
            )
        return StoreError(f"{what}: {exc}", "Check the database file (`memcli check`)")

    def _sqlite_header(self) -> bool:
        """Whether the file starts as every SQLite database does (False: another kind of file,
        or one damaged from its first bytes)."""
        try:
            with open(self.path or "", "rb") as file:
                return file.read(16) == b"SQLite format 3\x00"
        except OSError:
            return True  # unreadable here: SQLite's own word stands

    def _migrate(self) -> None:
        try:
            version = schema_version(self.conn)
        except sqlite3.Error as exc:
            raise self._error(exc, f"cannot read the database {self.where}") from None
        if version >= LATEST:
            return  # read outside any transaction: no write lock when the schema is current
        if self.read_only:
            raise StoreError(
                f"the database {self.where} is read-only and has an older schema",
                "Open it once with write access (any memcli command) to bring it up to date",
            )
        with self.transaction():
            try:
                applied = upgrade(self.conn)
            except sqlite3.Error as exc:
                raise StoreError(
                    f"cannot bring the database {self.where} to the current schema: {exc}",
                    "Check the database file (`sqlite3 FILE 'PRAGMA integrity_check'`)",
                ) from None
        # The rows a migration rewrote smaller left their pages part empty: packed again
        # (VACUUM, outside the transaction). A database busy with another process's read stays
        # as it is (new rows fill the room; the next delete for good compacts it).
        with self.lock:
            try:
                if needs_packing(self.conn, applied):
                    self.conn.execute("VACUUM")
            except sqlite3.Error:
                pass

    def _begin(self, wait: bool = True) -> None:
        if self._depth:
            self._depth += 1
            return
        if self.damaged:
            raise StoreDamaged(
                f"the database {self.where} is damaged: memcli does not write to it",
                "Run `memcli check` to see what is wrong, and restore it from a backup",
            )
        if self.read_only:
            if not wait:
                raise StoreBusy(f"the database {self.where} is read-only")
            raise StoreError(
                f"cannot write to {self.where}: the file or its directory is read-only",
                "Reading commands work on it; make the file and its directory writable to write",
            )
        if wait:
            self._begin_waiting()
        else:
            if self.path is not None:  # (no other process can hold an in-memory database)
                self._set_busy_timeout(0)
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if _is_busy(exc):
                    raise StoreBusy(f"another process is writing to {self.where}") from None
                raise self._error(exc, f"cannot write to {self.where}") from None
        self._depth = 1
        self.txn_serial += 1
        if not self._write_checked:
            self._check_before_writing()

    def can_write_now(self) -> bool:
        """Whether a write transaction would start without waiting: True inside one; else the
        write lock is taken and given back at once (nothing is written)."""
        if self._depth:
            return True
        try:
            with self.transaction(wait=False):
                return True
        except (StoreBusy, StoreDamaged):  # a damaged file is read, never written
            return False

    def _begin_waiting(self) -> None:
        """BEGIN IMMEDIATE; while another process holds the lock, again after a growing, jittered
        pause, until WRITE_WAIT_S have gone by. The store's lock is given back during each pause
        (not held through SQLite's busy timeout): this process's other threads go on reading,
        and writing if the lock becomes theirs first, while this one waits."""
        if self.path is not None:  # (no other process can hold an in-memory database)
            self._set_busy_timeout(0)
        deadline = time.monotonic() + WRITE_WAIT_S
        pause = 0.001
        while True:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                left = deadline - time.monotonic()
                if not _is_busy(exc):
                    raise self._error(exc, f"cannot write to {self.where}") from None
                if left <= 0:
                    raise StoreError(
                        f"cannot write to {self.where}: {exc}",
                        f"Another process held it for over {WRITE_WAIT_S:.0f} s; try again",
                    ) from None
                # Waits with the lock released (all its levels), then takes it again.
                self._turn.wait(min(left, pause * random.uniform(0.5, 1.5)))
                pause = min(pause * 2, 0.1)
            except sqlite3.Error as exc:
                raise self._error(exc, f"cannot write to {self.where}") from None

    def _set_busy_timeout(self, ms: int) -> None:
        if self._busy_ms != ms:
            self.conn.execute(f"PRAGMA busy_timeout = {ms}")
            self._busy_ms = ms

    def _check_before_writing(self) -> None:
        """Before the first write through this store: `PRAGMA quick_check` of a file up to
        QUICK_CHECK_BYTES (a damaged file is left as it is); above that size, only SQLite's own
        errors tell (and `memcli check`)."""
        self._write_checked = True
        assert self.path is not None
        try:
            if self.path.stat().st_size > QUICK_CHECK_BYTES:
                return
            rows = self.conn.execute("PRAGMA quick_check(1)").fetchall()
        except OSError:
            return
        except sqlite3.Error as exc:
            self._rollback()
            raise self._error(exc, f"cannot check {self.where}") from None
        found = [line for (text,) in rows for line in integrity_lines(text)]
        if found:
            self._rollback()
            self.damaged = True
            raise StoreDamaged(
                f"the database {self.where} is damaged ({found[0]})",
                "Nothing was written to it. Run `memcli check` to see what is wrong, and "
                "restore it from a backup",
            )

    def _finish(self, failed: bool) -> None:
        if self._depth > 1:
            self._depth -= 1
            return
        if not failed:
            try:
                self._apply_touches()
                self._write_buffer()
                if self._next_id is not None:
                    self.execute(
                        "INSERT INTO counters (name, value) VALUES ('message_id', ?)"
                        " ON CONFLICT(name) DO UPDATE SET value = MAX(value, excluded.value)",
                        (self._next_id - 1,),
                    )
            except BaseException:
                self._rollback()
                raise
            self._depth = 0
            self._end_transaction()
            try:
                self.conn.execute("COMMIT")
            except sqlite3.Error as exc:
                error = self._error(exc, f"cannot commit to {self.where}")
                self._quiet_rollback()
                raise error from None
            return
        self._rollback()

    def _new_message_ids(self, count: int) -> list[int]:
        """The next ids after every message id the database gave out (deleted ones too: the
        `counters` high-water mark, written at commit, remembers them)."""
        if self._next_id is None:
            row = self._query_one(
                "SELECT MAX(COALESCE((SELECT MAX(id) FROM messages), 0),"
                " COALESCE((SELECT value FROM counters WHERE name = 'message_id'), 0))"
            )
            self._next_id = row[0] + 1
        first = self._next_id
        self._next_id += count
        return list(range(first, first + count))

    def _end_transaction(self) -> None:
        super()._end_transaction()
        self._next_id = None

    def _rollback(self) -> None:
        self._depth = 0
        self._end_transaction()
        self._quiet_rollback()

    def _quiet_rollback(self) -> None:
        """ROLLBACK, if a transaction is still open (SQLite ends one itself on some errors)."""
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def _waits_again(self, exc: sqlite3.Error) -> bool:
        """Whether a statement outside a transaction met a lock while the busy timeout was 0 (left
        so by a write that did not wait): then the timeout is back, to run it again."""
        if self._busy_ms == BUSY_TIMEOUT_MS or self._depth or not _is_busy(exc):
            return False
        self._set_busy_timeout(BUSY_TIMEOUT_MS)
        return True

    def _execute_now(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """Run one statement, leaving buffered inserts buffered."""
        with self.lock:
            try:
                return self.conn.execute(sql, params)
            except sqlite3.Error as exc:
                if not self._waits_again(exc):
                    raise self._error(exc, f"database error in {self.where}") from None
            try:
                return self.conn.execute(sql, params)
            except sqlite3.Error as exc:
                raise self._error(exc, f"database error in {self.where}") from None

    def _executemany_now(self, sql: str, rows: Iterable[Sequence[Any]]) -> sqlite3.Cursor:
        with self.lock:
            try:
                if not self._depth:  # (its rows may be an iterator: not run twice)
                    self._set_busy_timeout(BUSY_TIMEOUT_MS)
                return self.conn.executemany(sql, rows)
            except sqlite3.Error as exc:
                raise self._error(exc, f"database error in {self.where}") from None

    def close(self) -> None:
        """Close the connection (twice is harmless)."""
        with self.lock:  # not under a statement or a transaction of another thread
            self.closed = True
            self.conn.close()

    def prepare_delete(self) -> None:
        """Before a delete for good: a damaged full-text index refuses it (StoreDamaged, nothing
        deleted: the index could not give up the deleted text, nor `purge()` merge it); then the
        deleted rows' bytes are overwritten with zeros in the database and WAL pages that held
        them (`PRAGMA secure_delete`), from here on for this connection."""
        with self.lock:
            if self._depth:
                raise StoreError("prepare_delete inside a write transaction", "A bug in memcli")
            self._set_busy_timeout(BUSY_TIMEOUT_MS)
            try:
                damage = full_text_damage(self.conn, self.read_only)
            except sqlite3.Error as exc:
                raise self._error(exc, f"cannot check {self.where} before deleting") from None
            if damage is not None:
                raise StoreDamaged(
                    f"the full-text index of {self.where} is damaged ({damage}): nothing was"
                    " deleted",
                    "A delete for good takes the text out of that index too. Run `memcli check"
                    " --repair` to rebuild it from the messages, then delete again",
                )
            self._execute_now("PRAGMA secure_delete = ON")

    def purge(self) -> None:
        """After a delete for good: no copy of the deleted rows left in any file of the database.
        The full-text index is merged into one segment (`optimize`: deleted entries leave it),
        the database rebuilt (VACUUM, which also drops free pages), the WAL checkpointed and
        truncated to nothing, and the retrieval index files beside the database removed (they
        hold the deleted messages' vectors and session names; the next search rebuilds them
        from the database). Another process reading the database meanwhile keeps the WAL from
        being truncated: StoreError, the rows deleted, to run the deletion again once it ends.
        Once all is done, the deletes it finished are no longer unfinished (`unfinished_deletes`,
        which `memcli check` reports)."""
        import memcli.store.forget as forget

        if self._depth:
            raise StoreError("purge inside a write transaction", "A bug in memcli")
        with self.lock:
            pending = forget.unfinished_deletes(self._sql)
        with self.transaction():
            self.execute("INSERT INTO retrieval_fts (retrieval_fts) VALUES ('optimize')")
        with self.lock:
            try:
                self._set_busy_timeout(BUSY_TIMEOUT_MS)
                self.conn.execute("VACUUM")
                busy = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.Error as exc:
                raise self._error(exc, f"cannot compact {self.where} after deleting") from None
        if self.path is not None:
            for file in self.path.parent.glob(f"{self.path.name}.retrieval.*"):
                file.unlink(missing_ok=True)
        if busy and busy[0]:
            raise StoreError(
                f"deleted, but another process reading {self.where} keeps copies in its WAL",
                "Close the other memcli processes and run the same command again",
            )
        if pending:
            with self.transaction():
                forget.clear_unfinished(self._sql, pending[-1])
            with self.lock:
                self._execute_now("PRAGMA wal_checkpoint(TRUNCATE)")

    def check(self) -> list[Problem]:
        """What is wrong with the database: SQLite's integrity check and memcli's own (counters,
        flush ids, vectors against messages); empty when it is sound. Reads one snapshot."""
        with self.lock:
            return self._check()

    def _check(self) -> list[Problem]:
        if self._depth:
            raise StoreError("check inside a write transaction", "A bug in memcli")
        try:
            self._set_busy_timeout(BUSY_TIMEOUT_MS)
            self.conn.execute("BEGIN")
        except sqlite3.Error as exc:
            return [Problem("integrity", f"the database cannot be read: {exc}")]
        try:
            problems = check_database(self.conn)
        finally:
            self._quiet_rollback()
        if any(p.check == "integrity" for p in problems):
            self.damaged = True
        # (On its own, after the snapshot: FTS5 takes the write lock for its check.)
        return problems + check_full_text(self.conn, self.read_only)

    def repair(self) -> list[Problem]:
        """Mend what `check()` finds that memcli can mend without loss: a damaged full-text
        index, rebuilt from the messages (FTS5's 'rebuild'; every message is in it after), then
        `purge()` (no copy of a deleted message's text left in its old pages). Return the
        problems mended (empty: nothing to mend). Nothing is mended while the database has
        other problems (SQLite finds the file damaged, or memcli's bookkeeping is wrong):
        those call for a backup."""
        problems = self.check()
        mendable = [p for p in problems if p.check == FULL_TEXT and p.fix is not None]
        if not mendable or len(mendable) < len(problems):
            return []
        with self.transaction():
            try:
                rebuild_full_text(self.conn)
            except sqlite3.Error as exc:
                error = self._error(exc, f"cannot rebuild the full-text index of {self.where}")
                raise error from None
        self.purge()
        return mendable

    def backup(self, target: str | Path) -> list[Problem]:
        """Copy the database to `target` with SQLite's online backup (one consistent snapshot,
        while other processes go on writing), as one self-contained file (no WAL). The copy is
        made under a temporary name, checked, synced, then renamed; what the check found on the
        copy is returned (empty: a sound copy), and a damaged copy is not kept."""
        target = Path(target)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.partial")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)  # `backup ~/backups/x.db` just works
            copy = sqlite3.connect(str(temporary), isolation_level=None)
            try:
                with self.lock:  # no other thread's transaction half done in the copy
                    self._set_busy_timeout(BUSY_TIMEOUT_MS)
                    self.conn.backup(copy)  # all pages in one step: one snapshot
                copy.execute("PRAGMA journal_mode = DELETE")
                problems = check_database(copy)
            finally:
                copy.close()
            if problems:
                temporary.unlink()
                return problems
            with temporary.open("rb+") as handle:
                os.fsync(handle.fileno())
            os.replace(temporary, target)
            _sync_directory(target.parent)
        except sqlite3.Error as exc:
            temporary.unlink(missing_ok=True)
            raise self._error(exc, f"cannot back up {self.where}") from None
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise StoreError(f"cannot write the backup {target}: {exc}", "Check the path") from None
        return []


def _sync_directory(directory: Path) -> None:
    """fsync a directory, so that a rename in it survives a crash (where the system allows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
