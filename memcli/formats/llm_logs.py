"""simonw/llm's logs: its `logs.db` (read-only: the file is never written) in either schema,
and the output of `llm logs --json`. One conversation per llm conversation (thread), its id
as the source id (`llm:ID`, the same in the database and in the JSON), its name as the title.

- the schema up to llm 0.27: `conversations` and `responses` (each a prompt, its system
  prompt, the response, a time); a system prompt is a system message where it first appears
  or changes;
- the newer schema: `threads` whose `tip_message_hash` ends a chain of `messages` (by
  `parent_hash`) holding `parts`; times from the `turns`. Text parts are the content; other
  parts (tool calls, attachments) are left out and counted.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from memcli.errors import InputError
from memcli.formats.base import Conversation, message, records

if TYPE_CHECKING:
    from memcli.messages import Message

_HINT = "Give llm's logs.db (`llm logs path`) or the output of `llm logs --json`"


def read_db(data: bytes, name: str, path: str | None) -> list[Conversation]:
    """The conversations of a logs.db: the file at `path` opened read-only (its WAL included),
    else (stdin) `data` in memory."""
    try:
        if path is not None:
            from urllib.parse import quote

            conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True)
        else:
            conn = sqlite3.connect(":memory:")
            conn.deserialize(data)
        try:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
            if {"threads", "messages", "parts"} <= tables and _count(conn, "threads"):
                return _threads(conn, name)
            if {"conversations", "responses"} <= tables:
                return _responses(conn, name)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise InputError(f"{name}: cannot read the database ({exc})", _HINT) from None
    raise InputError(f"{name}: an SQLite database that is not llm's logs.db", _HINT)


def _count(conn: sqlite3.Connection, table: str) -> int:
    return int(conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0])


def _responses(conn: sqlite3.Connection, name: str) -> list[Conversation]:
    conn.row_factory = sqlite3.Row
    rows = [dict(row) for row in conn.execute("SELECT * FROM responses")]
    names = {row["id"]: row["name"] for row in conn.execute("SELECT id, name FROM conversations")}
    for row in rows:
        row["conversation_name"] = names.get(row["conversation_id"])
    return read_json(rows, name)


def read_json(items: list[Any], name: str) -> list[Conversation]:
    """Responses as `llm logs --json` writes them (or the old schema's rows), grouped by
    conversation, in time order."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("conversation_id"), str):
            raise InputError(f"{name}: response {i} has no conversation_id", _HINT)
        groups[item["conversation_id"]].append(item)
    found = []
    for ident, rows in groups.items():
        rows.sort(key=lambda r: (str(r.get("datetime_utc") or ""), str(r.get("id") or "")))
        messages: list[Message] = []
        system = None
        for row in rows:
            at = f"{name}: response {row.get('id')}"
            when = row.get("datetime_utc")
            if row.get("system") and row["system"] != system:
                system = row["system"]
                messages.append(message(at, "system", system, timestamp=when))
            if row.get("prompt"):
                messages.append(message(at, "user", row["prompt"], timestamp=when))
            if row.get("response"):
                messages.append(message(at, "assistant", row["response"], timestamp=when))
        title = rows[0].get("conversation_name")
        found.append((rows[0].get("datetime_utc") or "", ident, messages, title))
    found.sort(key=lambda f: str(f[0]))
    return [
        Conversation(records(m), source_id=f"llm:{i}", title=t if isinstance(t, str) else None)
        for _, i, m, t in found
    ]


def _threads(conn: sqlite3.Connection, name: str) -> list[Conversation]:
    roles = {h: (p, r) for h, p, r in conn.execute("SELECT hash, parent_hash, role FROM messages")}
    parts: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for h, kind, text in conn.execute(
        "SELECT message_hash, type, text FROM parts ORDER BY message_hash, position"
    ):
        parts[h].append((kind, text))
    times: dict[str, str] = {}
    for parent, tip, when in conn.execute(
        "SELECT parent_message_hash, tip_message_hash, datetime_utc FROM turns ORDER BY datetime_utc"
    ):
        times.setdefault(tip, when)
        if parent is not None:
            times.setdefault(parent, when)
    found = []
    for ident, title, tip, started in conn.execute(
        "SELECT id, name, tip_message_hash, datetime_utc FROM threads ORDER BY datetime_utc, id"
    ):
        at = f"{name}: thread {ident}"
        chain: list[str] = []
        current = tip
        while current is not None:
            if current not in roles or current in chain:
                raise InputError(f"{at}: message {current} is missing or loops", _HINT)
            chain.append(current)
            current = roles[current][0]
        chain.reverse()
        # A message outside any turn (the system prompt at the root) takes the time of the
        # next one that has one, as `llm logs --json` shows it with the first response.
        later = started
        for h in reversed(chain):
            later = times.setdefault(h, later)
        messages, dropped = [], 0
        for h in chain:
            texts = [t for kind, t in parts[h] if kind == "text" and isinstance(t, str)]
            dropped += sum(1 for kind, _ in parts[h] if kind != "text")
            if "".join(texts).strip():
                role = roles[h][1]
                when = times.get(h, started)
                messages.append(message(at, role, "\n".join(texts), timestamp=when))
        found.append(
            Conversation(
                records(messages),
                source_id=f"llm:{ident}",
                title=title if isinstance(title, str) else None,
                dropped=dropped,
            )
        )
    return found
