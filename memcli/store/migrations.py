"""The database schema: numbered migrations, each run once, in order, in one write transaction.

A database records in `migrations` the versions applied. Opening one reads the highest version
first, outside any write transaction, and takes the write lock only when some are pending: a
reading command never waits for a writer to finish. tests/data/schema.sql holds the schema a new
database gets; a change to the schema comes as a new migration (and a new snapshot).

The statements are plain SQL on sqlite3. sqlite-utils is imported only by a migration that
rebuilds a table (what SQLite cannot ALTER), so opening a current database never pays for it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime

from memcli.fold import sqlite_rows
from memcli.messages import format_time

#: A migration runs its statements on the connection, inside the migrating transaction.
Migration = Callable[[sqlite3.Connection], None]

FTS_TOKENIZER = "porter unicode61 remove_diacritics 2"

# Sessions, messages, flushes.
_SCHEMA_1 = (
    """CREATE TABLE "sessions" (
   "id" TEXT PRIMARY KEY,
   "user_id" TEXT NOT NULL,
   "token_limit" INTEGER NOT NULL,
   "ratio" REAL NOT NULL,
   "flush_size" INTEGER NOT NULL,
   "created_at" TEXT NOT NULL,
   "updated_at" TEXT NOT NULL,
   "version" INTEGER DEFAULT 0,
   "active_messages" INTEGER DEFAULT 0,
   "archived_messages" INTEGER DEFAULT 0,
   "active_tokens" INTEGER DEFAULT 0,
   "flushes" INTEGER DEFAULT 0
)""",
    """CREATE TABLE "flushes" (
   "id" INTEGER PRIMARY KEY,
   "session_id" TEXT NOT NULL REFERENCES "sessions"("id"),
   "created_at" TEXT NOT NULL,
   "messages" INTEGER NOT NULL,
   "tokens" INTEGER NOT NULL,
   "first_message_id" INTEGER,
   "last_message_id" INTEGER,
   "reason" TEXT
)""",
    """CREATE TABLE "messages" (
   "id" INTEGER PRIMARY KEY,
   "session_id" TEXT NOT NULL REFERENCES "sessions"("id"),
   "seq" INTEGER NOT NULL,
   "role" TEXT NOT NULL,
   "content" TEXT NOT NULL,
   "name" TEXT,
   "metadata" TEXT,
   "tokens" INTEGER NOT NULL,
   "status" TEXT NOT NULL,
   "flush_id" INTEGER REFERENCES "flushes"("id"),
   "timestamp" TEXT,
   "created_at" TEXT NOT NULL
)""",
    # The active window is read through this index alone: archived history is never scanned.
    """CREATE INDEX "messages_window"
    ON "messages" ("session_id", "status", "seq")""",
    """CREATE UNIQUE INDEX "messages_order"
    ON "messages" ("session_id", "seq")""",
    """CREATE INDEX "messages_flush"
    ON "messages" ("flush_id")""",
    """CREATE INDEX "flushes_session"
    ON "flushes" ("session_id", "id")""",
    """CREATE INDEX "sessions_user"
    ON "sessions" ("user_id")""",
    # High-water marks, so that ids of deleted rows are never given out again.
    """CREATE TABLE "counters" (
   "name" TEXT PRIMARY KEY,
   "value" INTEGER NOT NULL
)""",
)


# Block state: processed flushes, a custom block's own value, facts with their history. (As
# first shipped, this migration also made the batch-level vector tables and left the block tables'
# keys nullable; migration 11 brings such databases to this form.)
_SCHEMA_2 = (
    """CREATE TABLE "block_flushes" (
   "block" TEXT NOT NULL,
   "scope_key" TEXT NOT NULL,
   "flush_id" INTEGER NOT NULL,
   "status" TEXT NOT NULL,
   "error" TEXT,
   "updated_at" TEXT NOT NULL,
   PRIMARY KEY ("block", "scope_key", "flush_id")
)""",
    """CREATE TABLE "block_state" (
   "block" TEXT NOT NULL,
   "scope_key" TEXT NOT NULL,
   "value" TEXT NOT NULL,
   "updated_at" TEXT NOT NULL,
   PRIMARY KEY ("block", "scope_key")
)""",
    """CREATE TABLE "facts" (
   "id" INTEGER PRIMARY KEY,
   "block" TEXT NOT NULL,
   "scope_key" TEXT NOT NULL,
   "text" TEXT NOT NULL,
   "norm" TEXT NOT NULL,
   "origin" TEXT NOT NULL,
   "session_id" TEXT,
   "flush_id" INTEGER,
   "message_ids" TEXT,
   "created_at" TEXT NOT NULL,
   "updated_at" TEXT NOT NULL,
   "deleted_at" TEXT
)""",
    """CREATE INDEX "facts_scope"
    ON "facts" ("block", "scope_key", "deleted_at")""",
    """CREATE TABLE "fact_history" (
   "id" INTEGER PRIMARY KEY,
   "fact_id" INTEGER NOT NULL,
   "block" TEXT NOT NULL,
   "scope_key" TEXT NOT NULL,
   "action" TEXT NOT NULL,
   "text" TEXT,
   "old_text" TEXT,
   "flush_id" INTEGER,
   "at" TEXT NOT NULL
)""",
    """CREATE INDEX "fact_history_scope"
    ON "fact_history" ("block", "scope_key")""",
)


# The message-level retrieval index.
_TABLES_10 = (
    """CREATE TABLE "retrieval_vectors" (
   "id" INTEGER PRIMARY KEY,
   "message_id" INTEGER NOT NULL,
   "piece" INTEGER NOT NULL,
   "model" TEXT NOT NULL,
   "dim" INTEGER NOT NULL,
   "vector" BLOB NOT NULL
)""",
    """CREATE INDEX "retrieval_vectors_msg"
    ON "retrieval_vectors" ("message_id")""",
    """CREATE TABLE "retrieval_state" (
   "key" TEXT PRIMARY KEY,
   "value" TEXT
)""",
    # Messages whose text changed after they were embedded: embedded again with the next batch.
    """CREATE TABLE "retrieval_redo" (
   "message_id" INTEGER PRIMARY KEY
)""",
)


def _run(statements: tuple[str, ...]) -> Callable[[sqlite3.Connection], None]:
    def migrate(conn: sqlite3.Connection) -> None:
        for statement in statements:
            conn.execute(statement)

    return migrate


def _migration_10(conn: sqlite3.Connection) -> None:
    """The FTS5 index over messages (speaker name and content), its triggers, the vectors table."""
    conn.execute(
        "CREATE VIRTUAL TABLE retrieval_fts USING fts5(name, content, content='messages',"
        f" content_rowid='id', tokenize='{FTS_TOKENIZER}')"
    )
    for statement in _TABLES_10:
        conn.execute(statement)
    # Deleted vectors are counted, so that an index file knows it must be rebuilt.
    conn.execute(
        "CREATE TRIGGER retrieval_vector_delete AFTER DELETE ON retrieval_vectors BEGIN"
        " INSERT INTO retrieval_state (key, value) VALUES ('vectors_deleted', '1')"
        " ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1;"
        " END"
    )
    # Messages reach the full-text index in bulk (`catch_up`, before every search), so a put
    # pays nothing for it; a message already indexed leaves the index with its row.
    indexed = "(SELECT COALESCE(MAX(CAST(value AS INTEGER)), 0) FROM retrieval_state"
    indexed += " WHERE key = 'fts_through')"
    conn.execute(
        "CREATE TRIGGER retrieval_delete AFTER DELETE ON messages BEGIN"
        " DELETE FROM retrieval_vectors WHERE message_id = old.id;"
        " END"
    )
    conn.execute(
        f"CREATE TRIGGER retrieval_fts_delete AFTER DELETE ON messages WHEN old.id <= {indexed}"
        " BEGIN INSERT INTO retrieval_fts (retrieval_fts, rowid, name, content)"
        " VALUES ('delete', old.id, old.name, old.content);"
        " END"
    )
    conn.execute(
        "CREATE TRIGGER retrieval_update AFTER UPDATE OF name, content ON messages BEGIN"
        " DELETE FROM retrieval_vectors WHERE message_id = old.id;"
        " INSERT OR IGNORE INTO retrieval_redo (message_id) VALUES (old.id);"
        " END"
    )
    conn.execute(
        "CREATE TRIGGER retrieval_fts_update AFTER UPDATE OF name, content ON messages"
        f" WHEN old.id <= {indexed} BEGIN"
        " INSERT INTO retrieval_fts (retrieval_fts, rowid, name, content)"
        " VALUES ('delete', old.id, old.name, old.content);"
        " INSERT INTO retrieval_fts (rowid, name, content) VALUES (new.id, new.name, new.content);"
        " END"
    )


#: Key columns that SQLite lets hold NULL (a PRIMARY KEY that is not an INTEGER one does), where
#: NULL keys never conflict, so an upsert would add a row instead of replacing one.
_NULLABLE_KEYS = {
    "block_flushes": ("block", "scope_key", "flush_id"),
    "block_state": ("block", "scope_key"),
}


def _migration_11(conn: sqlite3.Connection) -> None:
    """Drop the batch-level vector index (replaced by the message-level one of migration 10), and
    make the block tables' keys NOT NULL."""
    conn.execute('DROP TABLE IF EXISTS "vector_pieces"')  # its indexes go with it
    conn.execute('DROP TABLE IF EXISTS "vector_entries"')
    for table, keys in _NULLABLE_KEYS.items():
        nullable = {row[1] for row in conn.execute(f'PRAGMA table_info("{table}")') if not row[3]}
        if not nullable & set(keys):
            continue  # made by the current migration 2
        # SQLite cannot add NOT NULL to a column: sqlite-utils rebuilds the table (a new table,
        # the rows copied, the old one dropped, the new one renamed), inside this transaction.
        import sqlite_utils

        # A row with a NULL key was never found by a lookup (NULL equals nothing): it goes.
        conn.execute(f'DELETE FROM "{table}" WHERE ' + " OR ".join(f'"{k}" IS NULL' for k in keys))
        sqlite_utils.Database(conn).table(table).transform(not_null=set(keys))


def _migration_13(conn: sqlite3.Connection) -> None:
    """Back-off for failed block work: per processed flush, how many times the block failed on it
    (`attempts`) and the flush id from which it may be retried automatically (`retry_after`)."""
    conn.execute('ALTER TABLE "block_flushes" ADD COLUMN "attempts" INTEGER NOT NULL DEFAULT 0')
    conn.execute('ALTER TABLE "block_flushes" ADD COLUMN "retry_after" INTEGER')
    # A batch already pending failed at least once, and is due at the next flush.
    conn.execute("UPDATE block_flushes SET attempts = 1, retry_after = 0 WHERE status = 'pending'")


def _migration_14(conn: sqlite3.Connection) -> None:
    """A message's vector piece is stored once per model: the duplicates that two processes
    embedding at once could store are deleted (the first kept; the delete trigger counts them, so
    index files are rebuilt), then a unique key makes another impossible. It also serves lookups
    by message id, so the index on that column alone goes."""
    conn.execute(
        "DELETE FROM retrieval_vectors WHERE id NOT IN"
        " (SELECT MIN(id) FROM retrieval_vectors GROUP BY message_id, piece, model)"
    )
    conn.execute('DROP INDEX IF EXISTS "retrieval_vectors_msg"')
    conn.execute(
        'CREATE UNIQUE INDEX "retrieval_vectors_key"'
        '\n    ON "retrieval_vectors" ("message_id", "piece", "model")'
    )


def _migration_15(conn: sqlite3.Connection) -> None:
    """The block definitions a session's Memory was opened with (a JSON list of `[[blocks]]`
    tables), so that the CLI builds the blocks an application used; gone with the session."""
    conn.execute(
        'CREATE TABLE "block_definitions" (\n'
        '   "session_id" TEXT PRIMARY KEY,\n'
        '   "definitions" TEXT NOT NULL,\n'
        '   "updated_at" TEXT NOT NULL\n'
        ")"
    )
    conn.execute(
        'CREATE TRIGGER "block_definitions_gone" AFTER DELETE ON "sessions" BEGIN'
        " DELETE FROM block_definitions WHERE session_id = old.id; END"
    )


def _migration_16(conn: sqlite3.Connection) -> None:
    """Topics on facts: one row per (fact, topic), topics normalised (lowercase, trimmed); the
    primary key serves reading a fact's topics, the second index listing the facts of a topic.
    Facts are only ever marked deleted, so their topics stay with their history."""
    conn.execute(
        'CREATE TABLE "fact_topics" (\n'
        '   "fact_id" INTEGER NOT NULL,\n'
        '   "topic" TEXT NOT NULL,\n'
        '   PRIMARY KEY ("fact_id", "topic")\n'
        ") WITHOUT ROWID"
    )
    conn.execute('CREATE INDEX "fact_topics_topic"\n    ON "fact_topics" ("topic", "fact_id")')


def _migration_17(conn: sqlite3.Connection) -> None:
    """The summary block's running summaries: one row per version of a session's summary (per
    block), with the batch it took in (its flush and first and last message ids) and its size in
    tokens. The current summary is the highest version; gone with the session."""
    conn.execute(
        'CREATE TABLE "summaries" (\n'
        '   "session_id" TEXT NOT NULL,\n'
        '   "block" TEXT NOT NULL,\n'
        '   "version" INTEGER NOT NULL,\n'
        '   "text" TEXT NOT NULL,\n'
        '   "tokens" INTEGER NOT NULL,\n'
        '   "flush_id" INTEGER,\n'
        '   "first_message_id" INTEGER,\n'
        '   "last_message_id" INTEGER,\n'
        '   "created_at" TEXT NOT NULL,\n'
        '   PRIMARY KEY ("session_id", "block", "version")\n'
        ")"
    )
    conn.execute(
        'CREATE TRIGGER "summaries_gone" AFTER DELETE ON "sessions" BEGIN'
        " DELETE FROM summaries WHERE session_id = old.id; END"
    )


def _migration_18(conn: sqlite3.Connection) -> None:
    """Provenance in the fact history: each change records its `origin`, the path that made it
    (the words of `facts.origin`: extracted, condensed, manual, mcp, chat-tool, api), and the
    fact's topics after and before the change (JSON arrays; NULL: not recorded). Changes made
    before this migration take their origin where it is known (an addition: its fact's origin; a
    condensing: condensed) and are `unknown` otherwise."""
    for column in (
        "\"origin\" TEXT NOT NULL DEFAULT 'unknown'",
        '"topics" TEXT',
        '"old_topics" TEXT',
    ):
        conn.execute(f'ALTER TABLE "fact_history" ADD COLUMN {column}')
    conn.execute("UPDATE fact_history SET origin = 'condensed' WHERE action = 'condensed'")
    conn.execute(
        "UPDATE fact_history SET origin = (SELECT f.origin FROM facts f"
        " WHERE f.id = fact_history.fact_id) WHERE action = 'added'"
        " AND fact_id IN (SELECT id FROM facts)"
    )


def _migration_19(conn: sqlite3.Connection) -> None:
    """Where a session came from: `source_id` (the id its conversation has in the file it was
    imported from, or a hash of its first messages), the conversation's `title`, and `metadata`
    (JSON: the record-level keys of its source, e.g. a fine-tuning line's `tools`). An import
    finds the session of a conversation it already stored by (user_id, source_id)."""
    for column in ('"source_id" TEXT', '"title" TEXT', '"metadata" TEXT'):
        conn.execute(f'ALTER TABLE "sessions" ADD COLUMN {column}')
    conn.execute('CREATE INDEX "sessions_source" ON "sessions" ("user_id", "source_id")')


def _migration_20(conn: sqlite3.Connection) -> None:
    """Facts that stay true: a fact's `state` (current, superseded, retired), the fact that
    superseded it, the reason it was retired, since when it holds (`valid_from`), when it stops
    holding (`expires_at`), and its entities (a JSON array of names); the history records the
    reason of each change. Existing facts are current since they were made."""
    for column in (
        "\"state\" TEXT NOT NULL DEFAULT 'current'",
        '"superseded_by" INTEGER',
        '"reason" TEXT',
        '"valid_from" TEXT',
        '"expires_at" TEXT',
        '"entities" TEXT',
    ):
        conn.execute(f'ALTER TABLE "facts" ADD COLUMN {column}')
    conn.execute('ALTER TABLE "fact_history" ADD COLUMN "reason" TEXT')
    conn.execute("UPDATE facts SET valid_from = created_at")


def _migration_21(conn: sqlite3.Connection) -> None:
    """What a block read of a session's messages outside any flush (`memcli facts extract` on
    active, never-flushed messages): per block, scope and session, the ranges of message ids
    read. Gone with the session (`ON DELETE CASCADE`)."""
    conn.execute(
        """CREATE TABLE "block_reads" (
   "block" TEXT NOT NULL,
   "scope_key" TEXT NOT NULL,
   "session_id" TEXT NOT NULL REFERENCES "sessions"("id") ON DELETE CASCADE,
   "first_message_id" INTEGER NOT NULL,
   "last_message_id" INTEGER NOT NULL,
   "messages" INTEGER NOT NULL,
   "read_at" TEXT NOT NULL,
   PRIMARY KEY ("block", "scope_key", "session_id", "first_message_id")
)"""
    )


def _migration_22(conn: sqlite3.Connection) -> None:
    """The tokens of `memcli mcp --http` (`memcli.store.tokens`): each decides which user a
    request acts as; only a token's SHA-256 is stored, never the token."""
    conn.execute(
        """CREATE TABLE "mcp_tokens" (
   "id" INTEGER PRIMARY KEY,
   "user_id" TEXT NOT NULL,
   "token_hash" TEXT NOT NULL UNIQUE,
   "created_at" TEXT NOT NULL
)"""
    )


_DELETES_23 = (
    # What a re-import skips of the messages deleted for good (`memcli.store.forget`): per
    # session, each deleted message's id and a hash of its id in its source (or of its role and
    # content): never its text.
    """CREATE TABLE "deleted_sources" (
   "session_id" TEXT NOT NULL,
   "message_id" INTEGER NOT NULL,
   "source_hash" TEXT NOT NULL,
   PRIMARY KEY ("session_id", "message_id")
)""",
    # A delete for good whose cleanup (the purge of the database's files, the index files) has
    # not run yet: written with the delete, removed once the cleanup is done.
    """CREATE TABLE "unfinished_deletes" (
   "id" INTEGER PRIMARY KEY,
   "created_at" TEXT NOT NULL
)""",
)


def _migration_24(conn: sqlite3.Connection) -> None:
    """Embedding scoped to a user or a session: per model, up to which message id every message
    of a user (`user:ID`) or session (`session:ID`) has its vectors (`memcli.store.vectors`),
    and an index on (session, id) that finds a scope's messages past its mark. A session's mark
    goes with it; a user's with the user's last session."""
    conn.execute(
        'CREATE TABLE "retrieval_marks" (\n'
        '   "model" TEXT NOT NULL,\n'
        '   "scope_key" TEXT NOT NULL,\n'
        '   "through" INTEGER NOT NULL,\n'
        '   PRIMARY KEY ("model", "scope_key")\n'
        ")"
    )
    conn.execute('CREATE INDEX "messages_session_id"\n    ON "messages" ("session_id", "id")')
    conn.execute(
        'CREATE TRIGGER "retrieval_marks_gone" AFTER DELETE ON "sessions" BEGIN'
        " DELETE FROM retrieval_marks WHERE scope_key = 'session:' || old.id"
        " OR (scope_key = 'user:' || old.user_id"
        " AND NOT EXISTS (SELECT 1 FROM sessions WHERE user_id = old.user_id)); END"
    )


#: A message's time in unix milliseconds (`m` a messages row, or the table itself): its own
#: timestamp, else when it was stored. Migration 25 indexes it per session.
TIME_MS = (
    "CAST(ROUND((julianday(COALESCE({m}timestamp, {m}created_at)) - 2440587.5) * 86400000.0)"
    " AS INTEGER)"
)


def _migration_25(conn: sqlite3.Connection) -> None:
    """The messages' times per session (an index on an expression: TIME_MS), so that the latest
    time of a session, or of a user through their sessions, is read from the index's last entry
    of each session (a 100,000-message user: 0.1 ms, where reading their messages took 22 ms
    warm and 130 ms cold). A search whose query names a time ("last week") counts back from it."""
    conn.execute(
        f'CREATE INDEX "messages_time" ON "messages" ("session_id", {TIME_MS.format(m="")})'
    )


def _migration_26(conn: sqlite3.Connection) -> None:
    """The embedding marks by their scope alone: a deleted session's trigger finds its marks
    (and its user's) through this index, where it read every mark (forgetting a user of 8,000
    sessions: 13.6 s, now 0.04 s)."""
    conn.execute('CREATE INDEX "retrieval_marks_scope" ON "retrieval_marks" ("scope_key")')


#: The messages as the full-text index reads them (from 27): folded (`memcli.fold`), so that the
#: index and a query (folded in Python) compare words by one rule.
FOLDED = "retrieval_folded"


def _fts_triggers(conn: sqlite3.Connection, indexed: str) -> None:
    """The triggers that take a deleted or changed message out of the full-text index (when it
    is in: `indexed`), its words given as the index read them (folded)."""
    old = sqlite_rows("(SELECT old.name AS name, old.content AS content)", ("name", "content"))
    delete = (
        "INSERT INTO retrieval_fts (retrieval_fts, rowid, name, content)"
        f" SELECT 'delete', old.id, name, content FROM {old};"
    )
    conn.execute(
        f"CREATE TRIGGER retrieval_fts_delete AFTER DELETE ON messages WHEN old.id <= {indexed}"
        f" BEGIN {delete} END"
    )
    conn.execute(
        "CREATE TRIGGER retrieval_fts_update AFTER UPDATE OF name, content ON messages"
        f" WHEN old.id <= {indexed} BEGIN {delete}"
        f" INSERT INTO retrieval_fts (rowid, name, content) SELECT id, name, content FROM {FOLDED}"
        " WHERE id = new.id; END"
    )


def _migration_27(conn: sqlite3.Connection) -> None:
    """One text rule for search (`memcli.fold`): the full-text index reads the messages through
    a view that folds the letters FTS5's tokenizer keeps (ø, æ, ł, ß ...), as a query is
    folded; the index is made again from every message."""
    conn.execute("DROP TRIGGER retrieval_fts_delete")
    conn.execute("DROP TRIGGER retrieval_fts_update")
    conn.execute("DROP TABLE retrieval_fts")
    rows = sqlite_rows("messages", ("name", "content"), ("id",))
    conn.execute(f"DROP VIEW IF EXISTS {FOLDED}")  # (a database a test took back before 27)
    conn.execute(f"CREATE VIEW {FOLDED} AS SELECT id, name, content FROM {rows}")
    conn.execute(
        f"CREATE VIRTUAL TABLE retrieval_fts USING fts5(name, content, content='{FOLDED}',"
        f" content_rowid='id', tokenize='{FTS_TOKENIZER}')"
    )
    indexed = "(SELECT COALESCE(MAX(CAST(value AS INTEGER)), 0) FROM retrieval_state"
    indexed += " WHERE key = 'fts_through')"
    _fts_triggers(conn, indexed)
    conn.execute("INSERT INTO retrieval_fts (retrieval_fts) VALUES ('rebuild')")
    # (the mark of what the rebuilt index holds; a database without messages keeps no mark, so
    # that a new database stays empty: `memcli copy` writes only into an empty one)
    conn.execute(
        "INSERT INTO retrieval_state (key, value)"
        " SELECT 'fts_through', CAST(MAX(id) AS TEXT) FROM messages HAVING COUNT(*) > 0"
        " ON CONFLICT(key) DO UPDATE SET value = excluded.value"
    )


def _migration_29(conn: sqlite3.Connection) -> None:
    """Each vector stored once, at float16 (`memcli.store.vectors.STORED`): the float32 rows are
    written again at half the size (a row of the default model then fills a quarter of a page;
    float32 rows filled 3/4 of a half), in batches; the database is packed after it
    (`needs_packing`). The flat index's vector file goes with the index files' new format
    (`search/index_files.FORMAT`): its next search reads the vectors from here. On 100,000
    vectors: 2.4 s with the VACUUM (the database 262 MB -> 156 MB)."""
    after = 0
    while True:
        rows = conn.execute(
            "SELECT id, dim, vector FROM retrieval_vectors WHERE id > ? ORDER BY id LIMIT 5000",
            (after,),
        ).fetchall()
        if not rows:
            return
        import numpy as np  # (only with vectors to rewrite: a new database opens without it)

        after = rows[-1][0]
        conn.executemany(
            "UPDATE retrieval_vectors SET vector = ? WHERE id = ?",
            [
                (np.frombuffer(vector, dtype=np.float32).astype(np.float16).tobytes(), id_)
                for id_, dim, vector in rows
                if isinstance(dim, int) and isinstance(vector, bytes) and len(vector) == 4 * dim
            ],
        )


#: Numbered migrations; a database records the highest one applied. Append, never edit (except
#: to make the same schema more directly, as migration 2 now does).
MIGRATIONS: list[tuple[int, Migration]] = [
    (1, _run(_SCHEMA_1)),
    (2, _run(_SCHEMA_2)),
    (10, _migration_10),
    (11, _migration_11),
    (13, _migration_13),
    (14, _migration_14),
    (15, _migration_15),
    (16, _migration_16),
    (17, _migration_17),
    (18, _migration_18),
    (19, _migration_19),
    (20, _migration_20),
    (21, _migration_21),
    (22, _migration_22),
    (23, _run(_DELETES_23)),
    (24, _migration_24),
    (25, _migration_25),
    (26, _migration_26),
    (27, _migration_27),
    (29, _migration_29),
]

LATEST = MIGRATIONS[-1][0]


def needs_packing(conn: sqlite3.Connection, applied: list[int]) -> bool:
    """Whether the migrations just applied rewrote rows smaller (29: the vectors), so that the
    database is to be packed again (VACUUM, outside the migrating transaction: `SQLiteStore`
    runs it). A database with nothing rewritten is left as it is."""
    if 29 not in applied:
        return False
    return conn.execute("SELECT 1 FROM retrieval_vectors LIMIT 1").fetchone() is not None


def schema_version(conn: sqlite3.Connection) -> int:
    """The highest migration applied (0 for a new database): a read, no write lock."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'migrations'"
    ).fetchone()
    if exists is None:  # a new database
        return 0
    return int(conn.execute("SELECT MAX(version) FROM migrations").fetchone()[0] or 0)


def upgrade(conn: sqlite3.Connection) -> list[int]:
    """Apply the pending migrations; return their versions. Call inside a write transaction (the
    version is read again there: another process may have migrated since the first read)."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS migrations (version INTEGER PRIMARY KEY, applied_at TEXT)"
    )
    current = schema_version(conn)
    applied = []
    for version, migrate in MIGRATIONS:
        if version > current:
            migrate(conn)
            conn.execute(
                "INSERT INTO migrations (version, applied_at) VALUES (?, ?)",
                (version, format_time(datetime.now(tz=UTC))),
            )
            applied.append(version)
    return applied
