"""simonw/llm's logs: its `logs.db` (read-only: the file is never written) in either schema,
and the output of `llm logs --json`. One conversation per llm conversation (thread), its id
as the source id (`llm:ID`, the same in the database and in the JSON), its name as the title.
Each message's source id (`metadata["source_id"]`): its response's (turn's) id and its role
(`ID:user`, `ID:assistant`, `ID:system`), the same in the database and in the JSON.

- the schema up to llm 0.27: `conversations` and `responses` (each a prompt, its system
  prompt, the response, a time); a system prompt is a system message where it first appears
  or changes;
- the newer schema: `threads` whose `tip_message_hash` ends a chain of `messages` (by
  `parent_hash`) holding `parts`; times from the `turns`. Text parts are the content; other
  parts (tool calls, attachments) are left out and counted. A part that used fragments
  (`llm -f`) holds no text but a `text_ref` payload, fragments and literals in order: it is
  read with the fragments' text.

A prompt's fragments (`prompt_fragments` in the JSON and the old schema) are part of its user
message, as llm sends them; the system fragments of its system prompt. Each message's
`metadata["source_id"]` is its response (turn) id and role, `ID:user`, the same in the
database and the JSON, so that importing one after the other stores nothing twice.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from memcli.errors import InputError
from memcli.formats.base import LIMITS, Conversation, Limits, clean_text, message, records
from memcli.formats.reader import Input, Reader, Source

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Iterator

    from memcli.messages import Message

_HINT = "Give llm's logs.db (`llm logs path`) or the output of `llm logs --json`"


def detect(source: Input) -> bool:
    """A database (llm's is the one memcli reads), or `llm logs --json`'s responses."""
    first = source.first
    return source.is_database or (
        first is not None
        and "prompt" in first
        and "response" in first
        and "conversation_id" in first
    )


def read(source: Input) -> Source:
    if source.is_database:  # the file opened where it is, else (stdin) its bytes
        data = None if source.path is not None else source.data
        return Source(read_db(data, source.name, source.path, source.limits))
    return Source(read_json(source.items(), source.name))


def read_db(
    data: bytes | None, name: str, path: str | None, limits: Limits = LIMITS
) -> list[Conversation]:
    """The conversations of a logs.db: the file at `path` opened read-only (its WAL included),
    else (stdin) `data` in memory. Only tables are read (a view, which llm never makes, could
    take forever), and only stored values (a table with a generated column is refused before
    any row is read; no value is made longer than `max_bytes`), within `limits`: rows per
    table, bytes of text, seconds."""
    import sqlite3

    db: _Reader | None = None
    try:
        if path is not None:
            from urllib.parse import quote

            conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True)
        else:
            conn = sqlite3.connect(":memory:")
            conn.deserialize(data or b"")
        db = _Reader(conn, name, limits)
        try:
            conn.execute("PRAGMA trusted_schema = OFF")
            # No value longer than the text a database may hold at all: SQLite refuses to make
            # one ("string or blob too big") rather than holding it in memory.
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_bytes + 1)
            kinds = {n: (k, sql) for n, k, sql in conn.execute(_SCHEMA)}
            tables = {n for n, (k, sql) in kinds.items() if k == "table" and not _virtual(sql)}
            for wanted in ("threads", "messages", "parts", "turns", "conversations", "responses"):
                if wanted in kinds and wanted not in tables:
                    raise InputError(
                        f"{name}: {wanted} is a {kinds[wanted][0]}, not a table: not llm's logs.db",
                        _HINT,
                    )
            _refuse_generated(conn, name, tables & set(_READ))
            if {"threads", "messages", "parts"} <= tables and _count(conn, "threads"):
                return _threads(db, name)
            if {"conversations", "responses"} <= tables:
                return _responses(db, name)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if db is not None and db.timed_out:
            raise InputError(
                f"{name}: reading the database took more than {limits.max_seconds:g} s", _HINT
            ) from None
        if "too big" in str(exc):
            raise InputError(
                f"{name}: a value of more than {limits.max_bytes:,} bytes of text",
                "Import a smaller logs.db (or `llm logs --json` of part of it)",
            ) from None
        raise InputError(f"{name}: cannot read the database ({exc})", _HINT) from None
    raise InputError(f"{name}: an SQLite database that is not llm's logs.db", _HINT)


_SCHEMA = "SELECT name, type, sql FROM sqlite_master WHERE type IN ('table', 'view')"


#: The tables memcli reads, in either schema.
_READ = (
    "threads",
    "messages",
    "parts",
    "turns",
    "fragments",
    "conversations",
    "responses",
    "prompt_fragments",
    "system_fragments",
)


def _refuse_generated(conn: sqlite3.Connection, name: str, tables: set[str]) -> None:
    """InputError naming the first generated column (`GENERATED ALWAYS AS ...`: hidden 2 or 3
    in `PRAGMA table_xinfo`) of the tables memcli reads, before any row is: its values are
    computed as they are read, so a small file could make gigabytes of them; llm makes none."""
    for table in sorted(tables):
        for column in conn.execute("SELECT name, hidden FROM pragma_table_xinfo(?)", (table,)):
            if column[1] in (2, 3):
                raise InputError(
                    f"{name}: table {table} has a generated column {column[0]!r} (values"
                    " computed as they are read): not llm's logs.db",
                    _HINT,
                )


def _virtual(sql: Any) -> bool:
    return isinstance(sql, str) and sql.lstrip()[:14].upper() == "CREATE VIRTUAL"


class _Reader:
    """Rows of a database's tables read within the limits: at most `max_rows` a query, at most
    `max_bytes` of text in all, at most `max_seconds` (SQLite's progress handler stops a query
    past it)."""

    def __init__(self, conn: sqlite3.Connection, name: str, limits: Limits) -> None:
        self.conn, self.name, self.limits = conn, name, limits
        self.bytes = 0
        self.timed_out = False
        deadline = time.monotonic() + limits.max_seconds

        def past_deadline() -> int:
            self.timed_out = self.timed_out or time.monotonic() > deadline
            return int(self.timed_out)

        conn.set_progress_handler(past_deadline, 10_000)

    def rows(self, sql: str, table: str) -> Iterator[Any]:
        limit = self.limits.max_rows
        for n, row in enumerate(self.conn.execute(f"{sql} LIMIT ?", (limit + 1,))):
            if n == limit:
                raise InputError(
                    f"{self.name}: table {table} has more than {limit:,} rows",
                    "Import a smaller logs.db (or `llm logs --json` of part of it)",
                )
            self.count(sum(len(v) for v in row if isinstance(v, str | bytes)))
            yield row

    def count(self, size: int) -> None:
        """Count `size` more bytes of text read (or made: a fragment's text in each part that
        refers to it); InputError past `max_bytes`."""
        self.bytes += size
        if self.bytes > self.limits.max_bytes:
            raise InputError(
                f"{self.name}: more than {self.limits.max_bytes:,} bytes of text",
                "Import a smaller logs.db (or `llm logs --json` of part of it)",
            )


def _count_table(conn: sqlite3.Connection, table: str) -> bool:
    """Whether `table` is a table of the database."""
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    return found is not None


def _count(conn: sqlite3.Connection, table: str) -> int:
    return int(conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0])


def _responses(db: _Reader, name: str) -> list[Conversation]:
    import sqlite3

    db.conn.row_factory = sqlite3.Row
    rows = [dict(row) for row in db.rows("SELECT * FROM responses", "responses")]
    names = {
        row["id"]: row["name"]
        for row in db.rows("SELECT id, name FROM conversations", "conversations")
    }
    for row in rows:
        row["conversation_name"] = names.get(row["conversation_id"])
    tables = {n for (n,) in db.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if {"fragments", "prompt_fragments", "system_fragments"} <= tables:
        by_response: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for kind in ("prompt", "system"):
            for response, content in db.rows(
                f"SELECT r.response_id, f.content FROM {kind}_fragments r JOIN fragments f"
                f' ON f.id = r.fragment_id ORDER BY r.response_id, r."order"',
                f"{kind}_fragments",
            ):
                by_response[(kind, response)].append({"content": content})
        for row in rows:
            for kind in ("prompt", "system"):
                row[f"{kind}_fragments"] = by_response.get((kind, row["id"]), [])
    return read_json(rows, name)


def _with_fragments(text: Any, fragments: Any) -> Any:
    """A prompt (or system prompt) with its fragments' text, as llm sends it: the fragments
    joined with newlines before it (unless it holds them already, as llm 0.36's JSON does)."""
    texts = [
        f["content"]
        for f in (fragments if isinstance(fragments, list) else [])
        if isinstance(f, dict) and isinstance(f.get("content"), str)
    ]
    if not texts or (isinstance(text, str) and all(t.strip() in text for t in texts)):
        return text
    return "\n".join([*texts, *([text] if isinstance(text, str) and text else [])])


def read_json(items: list[Any], name: str) -> list[Conversation]:
    """Responses as `llm logs --json` writes them (or the old schema's rows), grouped by
    conversation, in time order."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("conversation_id"), str):
            raise InputError(f"{name}: response {i} has no conversation_id", _HINT)
        clean_text(item["conversation_id"], f"{name}: response {i}", "conversation_id")
        groups[item["conversation_id"]].append(item)
    found = []
    for ident, rows in groups.items():
        rows.sort(key=lambda r: (str(r.get("datetime_utc") or ""), str(r.get("id") or "")))
        messages: list[Message] = []
        system = None
        for row in rows:
            at = f"{name}: response {row.get('id')}"
            when = row.get("datetime_utc")
            ids = _ids(row.get("id"))
            prompt = _with_fragments(row.get("prompt"), row.get("prompt_fragments"))
            own_system = _with_fragments(row.get("system"), row.get("system_fragments"))
            if own_system and own_system != system:
                system = own_system
                messages.append(
                    message(at, "system", system, timestamp=when, metadata=ids("system"))
                )
            if prompt:
                messages.append(message(at, "user", prompt, timestamp=when, metadata=ids("user")))
            if row.get("response"):
                messages.append(
                    message(
                        at, "assistant", row["response"], timestamp=when, metadata=ids("assistant")
                    )
                )
        title = clean_text(rows[0].get("conversation_name"), f"{name}: {ident}", "its name")
        found.append((rows[0].get("datetime_utc") or "", ident, messages, title))
    found.sort(key=lambda f: str(f[0]))
    return [Conversation(records(m), source_id=f"llm:{i}", title=t) for _, i, m, t in found]


def _ids(response: Any) -> Any:
    """The `metadata` of a message of response (turn) `response`, by its role."""

    def of(role: str) -> dict[str, Any] | None:
        return {"source_id": f"{response}:{role}"} if isinstance(response, str | int) else None

    return of


def _part_text(
    kind: Any, text: Any, payload: Any, fragments: dict[Any, str], db: _Reader
) -> str | None:
    """A part's text: its `text`, or the fragments and literals of its `text_ref` payload
    joined (None: a part that is not text). Each fragment's text counts toward the database's
    bytes of text again where it is used: a fragment named many times is that much text."""
    if kind != "text":
        return None
    if isinstance(text, str):
        return text
    try:
        ref = json.loads(payload).get("text_ref") if isinstance(payload, str) else None
    except (ValueError, AttributeError, RecursionError):
        ref = None
    if not isinstance(ref, list):
        return None
    pieces = []
    for item in ref:
        if isinstance(item, dict) and isinstance(item.get("literal"), str):
            pieces.append(item["literal"])
        elif isinstance(item, dict) and item.get("fragment") in fragments:
            db.count(len(fragments[item["fragment"]]))
            pieces.append(fragments[item["fragment"]])
    return "".join(pieces)


def _threads(db: _Reader, name: str) -> list[Conversation]:
    roles = {
        h: (p, r) for h, p, r in db.rows("SELECT hash, parent_hash, role FROM messages", "messages")
    }
    fragments: dict[Any, str] = {}
    if _count_table(db.conn, "fragments"):
        fragments = {
            i: c
            for i, c in db.rows("SELECT id, content FROM fragments", "fragments")
            if isinstance(c, str)
        }
    parts: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for h, kind, text, payload in db.rows(
        "SELECT message_hash, type, text, payload FROM parts ORDER BY message_hash, position",
        "parts",
    ):
        parts[h].append((kind, _part_text(kind, text, payload, fragments, db)))
    times: dict[str, str] = {}
    turn_of: dict[str, Any] = {}
    for turn, parent, tip, when in db.rows(
        "SELECT id, parent_message_hash, tip_message_hash, datetime_utc FROM turns"
        " ORDER BY datetime_utc",
        "turns",
    ):
        times.setdefault(tip, when)
        turn_of.setdefault(tip, turn)
        if parent is not None:
            times.setdefault(parent, when)
            turn_of.setdefault(parent, turn)
    found = []
    for ident, title, tip, started in db.rows(
        "SELECT id, name, tip_message_hash, datetime_utc FROM threads ORDER BY datetime_utc, id",
        "threads",
    ):
        at = f"{name}: thread {ident}"
        if isinstance(ident, str):
            clean_text(ident, at, "its id")
        chain: list[str] = []
        seen: set[Any] = set()
        current = tip
        while current is not None:
            if current not in roles or current in seen:
                raise InputError(f"{at}: message {current} is missing or loops", _HINT)
            chain.append(current)
            seen.add(current)
            current = roles[current][0]
        chain.reverse()
        # A message outside any turn (the system prompt at the root) takes the time of the
        # next one that has one, as `llm logs --json` shows it with the first response.
        later, next_turn = started, None
        for h in reversed(chain):
            later = times.setdefault(h, later)
            next_turn = turn_of.setdefault(h, next_turn)
        messages, dropped = [], 0
        for h in chain:
            texts = [t for kind, t in parts[h] if kind == "text" and isinstance(t, str)]
            dropped += sum(1 for kind, _ in parts[h] if kind != "text")
            if "".join(texts).strip():
                role = roles[h][1]
                when = times.get(h, started)
                meta = _ids(turn_of.get(h))(role)
                messages.append(message(at, role, "\n".join(texts), timestamp=when, metadata=meta))
        found.append(
            Conversation(
                records(messages),
                source_id=f"llm:{ident}",
                title=clean_text(title, at, "its name"),
                dropped=dropped,
            )
        )
    return found


READER = Reader("llm", "simonw/llm's logs.db, or `llm logs --json`", False, detect, read)
