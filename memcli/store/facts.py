"""Facts: the SQL of a fact block's facts, their topics, entities and history.

Every statement here runs on an SQLStore (`store.execute`, `store.transaction`), SQLite or
PostgreSQL: portable SQL with `?` placeholders. Facts are kept per block name and scope key
(`user:ID` or `session:ID`); who may see or change which fact is `memcli.facts`' concern.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memcli.fold import fold
from memcli.messages import format_time, parse_time

if TYPE_CHECKING:
    from memcli.store.base import SQLStore


def _now() -> str:
    return format_time(datetime.now(tz=UTC))


@dataclass(frozen=True)
class Fact:
    """A stored fact and where it came from."""

    id: int
    block: str
    scope_key: str
    text: str
    origin: str  # see ORIGINS
    session_id: str | None
    flush_id: int | None
    message_ids: list[int]
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None = None
    topics: list[str] = field(default_factory=list)  # normalised, sorted
    state: str = "current"  # stored: current, superseded or retired (see `status`)
    superseded_by: int | None = None
    reason: str | None = None  # why it was retired (or superseded)
    valid_from: datetime | None = None  # since when it holds (made, or restored)
    expires_at: datetime | None = None
    entities: list[str] = field(default_factory=list)  # as written, sorted ignoring case

    def status(self, now: datetime | None = None) -> str:
        """What the fact is now: `deleted` (removed), `superseded`, `retired`, `expired` (its
        expiry passed) or `current`: only a current fact is in the context and the lists."""
        if self.deleted_at is not None:
            return "deleted"
        if self.state != "current":
            return self.state
        if self.expires_at is not None and self.expires_at <= (now or datetime.now(tz=UTC)):
            return "expired"
        return "current"


#: Where a fact, and each change to it, came from: the fact block's extraction (`extracted`)
#: and its condensing (`condensed`), `memcli facts add/edit/rm` (`manual`), the MCP server
#: (`mcp`), the chat's memory tools (`chat-tool`), or a Python caller that names none (`api`).
#: A fact's history also holds `unknown`, for edits made before memcli recorded origins.
ORIGINS = ("extracted", "condensed", "manual", "mcp", "chat-tool", "api")

#: A fact's `status`: the stored states, plus `expired` (a current fact whose expiry passed) and
#: `deleted` (removed by hand or a tool).
STATES = ("current", "superseded", "retired", "expired", "deleted")


@dataclass(frozen=True)
class FactChange:
    """One entry of a fact's history: what changed, by which path (`origin`, see ORIGINS), and
    the fact's text and topics after and before (None where the change has none, or the topics
    were not recorded: before memcli recorded them)."""

    id: int
    fact_id: int
    action: str  # added, condensed, edited, deleted, superseded, retired or restored
    text: str | None
    old_text: str | None
    flush_id: int | None
    at: datetime
    origin: str = "unknown"
    topics: list[str] | None = None
    old_topics: list[str] | None = None
    reason: str | None = None


def normalize_fact(text: str) -> str:
    """The form duplicates are compared in: case folded, white space collapsed."""
    return " ".join(text.split()).casefold()


#: The longest fact, in characters: every fact goes into every prompt of its scope. `add_facts`
#: leaves a longer text out (as it does an empty one: an extraction's runaway reply), `edit_fact`
#: refuses one, and the CLI and the memory tools refuse one with the limit
#: (`memcli.facts.check_fact_text`).
MAX_FACT_CHARS = 2000

#: The longest topic kept; a longer one is taken for a malformed reply and dropped.
MAX_TOPIC_CHARS = 60


def normalize_topics(topics: Sequence[str] | str | None) -> list[str]:
    """Topics as stored: each split at commas, lowercased, white space trimmed and collapsed;
    empty ones and ones over MAX_TOPIC_CHARS dropped; no duplicates; sorted."""
    if topics is None:
        return []
    if isinstance(topics, str):
        topics = [topics]
    found = set()
    for value in topics:
        for part in str(value).split(","):
            topic = " ".join(part.split()).lower()
            if topic and len(topic) <= MAX_TOPIC_CHARS:
                found.add(topic)
    return sorted(found)


_FACT_COLUMNS = (
    "id, block, scope_key, text, origin, session_id, flush_id, message_ids, created_at,"
    " updated_at, deleted_at,"
    " (SELECT json_group_array(topic) FROM fact_topics WHERE fact_id = facts.id),"
    " state, superseded_by, reason, valid_from, expires_at, entities"
)

#: The condition a current fact meets (the time it is now as the parameter).
_CURRENT = "deleted_at IS NULL AND state = 'current' AND (expires_at IS NULL OR expires_at > ?)"


def stamp(value: datetime) -> str:
    """A time as the expiry columns hold it: UTC with microseconds always, so that comparing the
    text compares the times."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _fact(row: Sequence[Any]) -> Fact:
    return Fact(
        id=row[0],
        block=row[1],
        scope_key=row[2],
        text=row[3],
        origin=row[4],
        session_id=row[5],
        flush_id=row[6],
        message_ids=json.loads(row[7]) if row[7] else [],
        created_at=parse_time(row[8]),
        updated_at=parse_time(row[9]),
        deleted_at=parse_time(row[10]) if row[10] else None,
        topics=sorted(json.loads(row[11])) if row[11] else [],
        state=row[12],
        superseded_by=row[13],
        reason=row[14],
        valid_from=parse_time(row[15]) if row[15] else None,
        expires_at=parse_time(row[16]) if row[16] else None,
        entities=json.loads(row[17]) if row[17] else [],
    )


def _set_topics(store: SQLStore, fact_id: int, topics: Sequence[str]) -> None:
    store.execute("DELETE FROM fact_topics WHERE fact_id = ?", (fact_id,))
    store.executemany(
        "INSERT INTO fact_topics (fact_id, topic) VALUES (?, ?)",
        [(fact_id, t) for t in normalize_topics(topics)],
    )


#: The longest entity name kept; a longer one is taken for a malformed reply and dropped.
MAX_ENTITY_CHARS = 80


def normalize_entities(entities: Sequence[str] | str | None) -> list[str]:
    """Entity names as stored: split at commas, white space trimmed and collapsed, the first
    spelling of each name (compared ignoring case) kept, empty and over-long ones dropped;
    sorted ignoring case."""
    if entities is None:
        return []
    if isinstance(entities, str):
        entities = [entities]
    found: dict[str, str] = {}
    for value in entities:
        for part in str(value).split(","):
            name = " ".join(part.split())
            if name and len(name) <= MAX_ENTITY_CHARS:
                found.setdefault(name.casefold(), name)
    return [found[key] for key in sorted(found)]


def list_facts(
    store: SQLStore,
    block: str | None,
    scope_key: str,
    topic: str | None = None,
    *,
    everything: bool = False,
    entity: str | None = None,
) -> list[Fact]:
    """The current facts of a scope (of one block, or of every block; of one topic, normalised
    as stored, or of any; about one entity, ignoring case, or any), oldest first. With
    `everything`, the superseded, retired, expired and deleted ones too (see `Fact.status`)."""
    sql = f"SELECT {_FACT_COLUMNS} FROM facts WHERE scope_key = ?"
    params: tuple[Any, ...] = (scope_key,)
    if not everything:
        sql += f" AND {_CURRENT}"
        params += (stamp(datetime.now(tz=UTC)),)
    if block is not None:
        sql += " AND block = ?"
        params += (block,)
    if topic is not None:
        sql += " AND id IN (SELECT fact_id FROM fact_topics WHERE topic = ?)"
        params += (" ".join(topic.split()).lower(),)
    facts = [_fact(row) for row in store.execute(sql + " ORDER BY id", params)]
    if entity is not None:
        key = " ".join(entity.split()).casefold()
        facts = [f for f in facts if key in {e.casefold() for e in f.entities}]
    return facts


@dataclass(frozen=True)
class FactText:
    """A current fact as search reads it: its id, its text and its entities."""

    id: int
    text: str
    entities: list[str]


def fact_texts(store: SQLStore, block: str | None, scope_key: str) -> list[FactText]:
    """The current facts of a scope (of one block, or of every block), oldest first, read
    lightly for ranking (`get_facts` reads the chosen ones whole)."""
    sql = f"SELECT id, text, entities FROM facts WHERE scope_key = ? AND {_CURRENT}"
    params: tuple[Any, ...] = (scope_key, stamp(datetime.now(tz=UTC)))
    if block is not None:
        sql += " AND block = ?"
        params += (block,)
    rows = store.execute(sql + " ORDER BY id", params)
    return [FactText(r[0], r[1], json.loads(r[2]) if r[2] else []) for r in rows]


def count_facts(store: SQLStore, block: str | None, scope_key: str) -> int:
    """How many current facts a scope has (of one block, or of every block)."""
    sql = f"SELECT COUNT(*) FROM facts WHERE scope_key = ? AND {_CURRENT}"
    params: tuple[Any, ...] = (scope_key, stamp(datetime.now(tz=UTC)))
    if block is not None:
        sql += " AND block = ?"
        params += (block,)
    return int(store.execute(sql, params).fetchone()[0])


def get_facts(store: SQLStore, ids: Sequence[int]) -> list[Fact]:
    """The facts of these ids (in any state), in the order of `ids`; unknown ids left out."""
    found: dict[int, Fact] = {}
    unique = list(dict.fromkeys(i for i in ids if -(2**63) <= i < 2**63))
    for start in range(0, len(unique), 500):
        part = unique[start : start + 500]
        sql = f"SELECT {_FACT_COLUMNS} FROM facts WHERE id IN ({', '.join('?' * len(part))})"
        found.update((f.id, f) for f in map(_fact, store.execute(sql, tuple(part))))
    return [found[i] for i in ids if i in found]


def entity_counts(
    store: SQLStore, scope_key: str, block: str | None = None
) -> list[tuple[str, int]]:
    """The entities of a scope's current facts, each with how many facts name it (names compared
    ignoring case, shown as first written), most facts first, then by name."""
    counts: dict[str, list[Any]] = {}
    for fact in list_facts(store, block, scope_key):
        for name in fact.entities:
            counts.setdefault(name.casefold(), [name, 0])[1] += 1
    return sorted(((n, c) for n, c in counts.values()), key=lambda p: (-p[1], p[0].casefold()))


def find_facts(
    store: SQLStore, block: str | None, scope_key: str, query: str, topic: str | None = None
) -> list[Fact]:
    """The current facts of a scope (and topic) whose text holds every word of `query`, folded
    (`memcli.fold`: case and accents aside, as grep -i would but for accents: a word may be part
    of a longer one), oldest first; none for no words."""
    words = fold(query).split()
    if not words:
        return []
    facts = list_facts(store, block, scope_key, topic)
    return [f for f in facts if all(w in fold(f.text) for w in words)]


def get_fact(store: SQLStore, fact_id: int) -> Fact | None:
    """The fact of that id (deleted or not), or None; None too for an id SQLite cannot hold."""
    if not -(2**63) <= fact_id < 2**63:
        return None
    row = store.execute(f"SELECT {_FACT_COLUMNS} FROM facts WHERE id = ?", (fact_id,)).fetchone()
    return _fact(row) if row else None


def _history(
    store: SQLStore,
    fact: Fact,
    action: str,
    origin: str,
    stamp: str,
    *,
    before: Fact | None = None,
    after: Fact | None = None,
    flush_id: int | None = None,
    reason: str | None = None,
) -> None:
    """Record a change to `fact`: its text and topics `after` and `before` it (None: none)."""

    def topics(f: Fact | None) -> str | None:
        return None if f is None else json.dumps(f.topics, ensure_ascii=False)

    store.execute(
        "INSERT INTO fact_history (fact_id, block, scope_key, action, text, old_text, flush_id,"
        " at, origin, topics, old_topics, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            fact.id,
            fact.block,
            fact.scope_key,
            action,
            None if after is None else after.text,
            None if before is None else before.text,
            flush_id,
            stamp,
            origin,
            topics(after),
            topics(before),
            reason,
        ),
    )


@dataclass(frozen=True)
class NewFact:
    """A fact to store: its text, topics, entities, expiry, and the ids of the current facts it
    replaces (they become `superseded` by it)."""

    text: str
    topics: Sequence[str] = ()
    entities: Sequence[str] = ()
    expires_at: datetime | None = None
    replaces: Sequence[int] = ()


@dataclass
class FactChanges:
    """What `change_facts` did: the facts added, superseded (by which) and retired."""

    added: list[Fact] = field(default_factory=list)
    superseded: list[tuple[Fact, int]] = field(default_factory=list)
    retired: list[Fact] = field(default_factory=list)


def change_facts(
    store: SQLStore,
    block: str,
    scope_key: str,
    new: Sequence[NewFact] = (),
    retire: Sequence[tuple[int, str]] = (),
    *,
    origin: str = "api",
    action: str = "added",
    session_id: str | None = None,
    flush_id: int | None = None,
    message_ids: Sequence[int] = (),
) -> FactChanges:
    """Add facts, supersede the ones they replace and retire (fact id, reason) ones, in one
    transaction. Nothing is deleted: a replaced fact keeps its row with `state` superseded and
    `superseded_by` the new fact; a retired one `state` retired and its reason. A new fact that
    is already a current fact (compared normalised) is not added again: the facts it replaces
    are superseded by the known one; one longer than MAX_FACT_CHARS is left out. Ids that are
    not current facts of the scope and block are skipped (the caller checks them first)."""
    now = datetime.now(tz=UTC)
    when = _now()
    changes = FactChanges()
    with store.transaction():
        store.hold_lock(f"facts {block} {scope_key}")  # two extractions at once add a fact once
        current = _current_facts(
            store,
            block,
            scope_key,
            [normalize_fact(n.text) for n in new],
            [i for n in new for i in n.replaces] + [i for i, _ in retire],
        )
        known = {normalize_fact(f.text): f for f in current.values()}
        for item in new:
            text = item.text.strip()
            norm = normalize_fact(text)
            if not norm or len(text) > MAX_FACT_CHARS:  # (what it would replace stays current)
                continue
            fact = known.get(norm)
            if fact is None:
                fact = _insert(
                    store,
                    block,
                    scope_key,
                    text,
                    norm,
                    item,
                    origin,
                    when,
                    now,
                    session_id,
                    flush_id,
                    message_ids,
                )
                _history(store, fact, action, origin, when, after=fact, flush_id=flush_id)
                known[norm] = current[fact.id] = fact
                changes.added.append(fact)
            for old_id in dict.fromkeys(item.replaces):
                old = current.get(old_id)
                if old is None or old.id == fact.id or old.state != "current":
                    continue
                _set_state(
                    store,
                    old,
                    "superseded",
                    when,
                    superseded_by=fact.id,
                    reason=f"superseded by fact {fact.id}",
                )
                _history(
                    store,
                    old,
                    "superseded",
                    origin,
                    when,
                    before=old,
                    after=fact,
                    flush_id=flush_id,
                    reason=f"superseded by fact {fact.id}",
                )
                current[old_id] = get_fact(store, old_id)  # type: ignore[assignment]
                changes.superseded.append((old, fact.id))
        for old_id, reason in retire:
            old = current.get(old_id)
            if old is None or old.state != "current":
                continue
            _set_state(store, old, "retired", when, reason=reason)
            _history(
                store, old, "retired", origin, when, before=old, flush_id=flush_id, reason=reason
            )
            current[old_id] = get_fact(store, old_id)  # type: ignore[assignment]
            changes.retired.append(old)
    return changes


def _current_facts(
    store: SQLStore, block: str, scope_key: str, norms: Sequence[str], ids: Sequence[int]
) -> dict[int, Fact]:
    """The current facts of the scope and block whose normalised text is one of `norms` or
    whose id is one of `ids` (what a change reads: not every fact of the user)."""
    now = stamp(datetime.now(tz=UTC))
    found: dict[int, Fact] = {}
    lookups: list[tuple[str, list[Any]]] = [
        ("norm", list(dict.fromkeys(norms))),
        ("id", [i for i in dict.fromkeys(ids) if -(2**63) <= i < 2**63]),
    ]
    for column, values in lookups:
        for start in range(0, len(values), 500):
            part = values[start : start + 500]
            sql = (
                f"SELECT {_FACT_COLUMNS} FROM facts WHERE scope_key = ? AND block = ?"
                f" AND {_CURRENT} AND {column} IN ({', '.join('?' * len(part))})"
            )
            rows = store.execute(sql, (scope_key, block, now, *part))
            found.update((f.id, f) for f in map(_fact, rows))
    return found


def _insert(
    store: SQLStore,
    block: str,
    scope_key: str,
    text: str,
    norm: str,
    item: NewFact,
    origin: str,
    when: str,
    now: datetime,
    session_id: str | None,
    flush_id: int | None,
    message_ids: Sequence[int],
) -> Fact:
    entities = normalize_entities(item.entities)
    cursor = store.execute(
        "INSERT INTO facts (block, scope_key, text, norm, origin, session_id, flush_id,"
        " message_ids, created_at, updated_at, valid_from, expires_at, entities)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (
            block,
            scope_key,
            text,
            norm,
            origin,
            session_id,
            flush_id,
            json.dumps(list(message_ids)),
            when,
            when,
            when,
            None if item.expires_at is None else stamp(item.expires_at),
            json.dumps(entities, ensure_ascii=False) if entities else None,
        ),
    )
    fact_id = cursor.fetchall()[0][0]
    _set_topics(store, fact_id, item.topics)
    fact = get_fact(store, fact_id)
    assert fact is not None
    return fact


def _set_state(
    store: SQLStore,
    fact: Fact,
    state: str,
    when: str,
    *,
    superseded_by: int | None = None,
    reason: str | None = None,
) -> None:
    store.execute(
        "UPDATE facts SET state = ?, superseded_by = ?, reason = ?, updated_at = ? WHERE id = ?",
        (state, superseded_by, reason, when, fact.id),
    )


def add_facts(
    store: SQLStore,
    block: str,
    scope_key: str,
    texts: Sequence[str],
    *,
    origin: str = "api",
    action: str = "added",
    session_id: str | None = None,
    flush_id: int | None = None,
    message_ids: Sequence[int] = (),
    topics: Sequence[Sequence[str]] | None = None,
    entities: Sequence[Sequence[str]] | None = None,
    expires_at: datetime | None = None,
) -> list[Fact]:
    """Store the facts that are not already current (compared normalised); return those added.
    `topics` and `entities`, when given, hold each text's (in the order of `texts`); `origin`
    (see ORIGINS) is the facts' and their history entries'; `expires_at` applies to them all."""
    for what, given in (("topics", topics), ("entities", entities)):
        if given is not None and len(given) != len(texts):
            raise ValueError(f"{what} must give one list of {what} per text")
    new = [
        NewFact(
            text,
            topics=topics[i] if topics is not None else (),
            entities=entities[i] if entities is not None else (),
            expires_at=expires_at,
        )
        for i, text in enumerate(texts)
    ]
    return change_facts(
        store,
        block,
        scope_key,
        new,
        origin=origin,
        action=action,
        session_id=session_id,
        flush_id=flush_id,
        message_ids=message_ids,
    ).added


def restore_fact(store: SQLStore, fact_id: int, *, origin: str = "api") -> tuple[Fact, list[Fact]]:
    """Make a superseded, retired, expired or deleted fact current again, as a new change in its
    history (`restored`; its expiry, when passed, is dropped): the current fact that superseded
    it is superseded by it in turn. Return the fact restored and the facts it superseded. A
    current fact, or one whose text is a current fact's, is refused (MemcliError)."""
    from memcli.errors import MemcliError

    fact = get_fact(store, fact_id)
    if fact is None:
        raise MemcliError(f"no fact {fact_id}", "Run `memcli facts --all` to see the ids")
    status = fact.status()
    if status == "current":
        raise MemcliError(f"fact {fact_id} is current", "Only an older version is restored")
    when = _now()
    with store.transaction():
        store.hold_lock(f"facts {fact.block} {fact.scope_key}")
        same = [
            f
            for f in list_facts(store, fact.block, fact.scope_key)
            if normalize_fact(f.text) == normalize_fact(fact.text)
        ]
        if same:
            raise MemcliError(
                f"fact {same[0].id} says the same and is current",
                f"Nothing to restore; see `memcli facts history {same[0].id}`",
            )
        expired = status == "expired"
        store.execute(
            "UPDATE facts SET state = 'current', superseded_by = NULL, reason = NULL,"
            " deleted_at = NULL, valid_from = ?, updated_at = ?"
            + (", expires_at = NULL" if expired else "")
            + " WHERE id = ?",
            (when, when, fact_id),
        )
        after = get_fact(store, fact_id)
        assert after is not None
        _history(
            store,
            after,
            "restored",
            origin,
            when,
            before=fact,
            after=after,
            reason=f"restored (was {status})",
        )
        displaced = []
        successor = get_fact(store, fact.superseded_by) if fact.superseded_by else None
        if successor is not None and successor.status() == "current":
            reason = f"superseded by fact {fact_id} (restored)"
            _set_state(store, successor, "superseded", when, superseded_by=fact_id, reason=reason)
            _history(
                store,
                successor,
                "superseded",
                origin,
                when,
                before=successor,
                after=after,
                reason=reason,
            )
            now_superseded = get_fact(store, successor.id)
            assert now_superseded is not None
            displaced.append(now_superseded)
    return after, displaced


def fact_chain(store: SQLStore, fact_id: int) -> list[Fact]:
    """The versions of a fact: the facts it superseded and that superseded it, followed both
    ways (bounded), oldest first; empty when there is no such fact."""
    seen: dict[int, Fact] = {}
    todo = [fact_id]
    while todo and len(seen) < 1000:
        current = todo.pop()
        if current in seen:
            continue
        fact = get_fact(store, current)
        if fact is None:
            continue
        seen[current] = fact
        if fact.superseded_by is not None:
            todo.append(fact.superseded_by)
        todo.extend(
            row[0]
            for row in store.execute("SELECT id FROM facts WHERE superseded_by = ?", (current,))
        )
    return sorted(seen.values(), key=lambda f: f.id)


def forget_facts(
    store: SQLStore, scope_keys: Sequence[str], *, keep_history: bool = False, origin: str = "api"
) -> int:
    """Forget every fact of these scopes; return how many were not deleted before. With
    `keep_history`, each is marked deleted (its history kept, as `rm` does); without, the facts,
    their topics and their history are gone from the database."""
    count = 0
    when = _now()
    with store.transaction():
        for key in scope_keys:
            facts = list_facts(store, None, key, everything=True)
            live = [f for f in facts if f.deleted_at is None]
            count += len(live)
            if keep_history:
                for fact in live:
                    store.execute(
                        "UPDATE facts SET deleted_at = ?, updated_at = ? WHERE id = ?",
                        (when, when, fact.id),
                    )
                    _history(store, fact, "deleted", origin, when, before=fact, reason="forget all")
                continue
            store.execute(
                "DELETE FROM fact_topics WHERE fact_id IN"
                " (SELECT id FROM facts WHERE scope_key = ?)",
                (key,),
            )
            store.execute("DELETE FROM fact_history WHERE scope_key = ?", (key,))
            store.execute("DELETE FROM facts WHERE scope_key = ?", (key,))
    return count


def edit_fact(
    store: SQLStore,
    fact_id: int,
    text: str,
    topics: Sequence[str] | None = None,
    *,
    origin: str = "api",
) -> tuple[Fact, Fact] | None:
    """Change a fact's text (and its topics, when given; else they stay); return (before, after),
    or None when there is no live fact of that id. The history records both texts and both
    topic lists, with `origin` (see ORIGINS); the fact's own origin becomes the edit's: it
    says who wrote the text it holds (an extracted fact edited by hand reads `manual`)."""
    if len(text.strip()) > MAX_FACT_CHARS:
        from memcli.errors import InputError

        raise InputError(
            f"the fact is {len(text.strip()):,} characters long; at most {MAX_FACT_CHARS:,}",
            "Keep a fact to a sentence or two",
        )
    before = get_fact(store, fact_id)
    if before is None or before.deleted_at is not None:
        return None
    stamp = _now()
    with store.transaction():
        store.execute(
            "UPDATE facts SET text = ?, norm = ?, origin = ?, updated_at = ? WHERE id = ?",
            (text.strip(), normalize_fact(text), origin, stamp, fact_id),
        )
        if topics is not None:
            _set_topics(store, fact_id, topics)
        after = get_fact(store, fact_id)
        assert after is not None
        _history(store, after, "edited", origin, stamp, before=before, after=after)
    return before, after


def delete_fact(
    store: SQLStore,
    fact_id: int,
    action: str = "deleted",
    flush_id: int | None = None,
    *,
    origin: str = "api",
) -> Fact | None:
    """Mark a fact deleted (kept for its history, with `origin`: see ORIGINS); return it as it
    is now (deleted), or None when there is none."""
    fact = get_fact(store, fact_id)
    if fact is None or fact.deleted_at is not None:
        return None
    stamp = _now()
    with store.transaction():
        store.execute(
            "UPDATE facts SET deleted_at = ?, updated_at = ? WHERE id = ?",
            (stamp, stamp, fact_id),
        )
        _history(store, fact, action, origin, stamp, before=fact, flush_id=flush_id)
    return get_fact(store, fact_id)


def fact_history(
    store: SQLStore,
    scope_key: str,
    block: str | None = None,
    fact_id: int | None = None,
    fact_ids: Sequence[int] | None = None,
) -> list[FactChange]:
    """The changes to a scope's facts (or to one fact, or to these facts), oldest first."""
    sql = (
        "SELECT id, fact_id, action, text, old_text, flush_id, at, origin, topics, old_topics,"
        " reason FROM fact_history WHERE scope_key = ?"
    )
    params: tuple[Any, ...] = (scope_key,)
    if block is not None:
        sql += " AND block = ?"
        params += (block,)
    if fact_id is not None:
        fact_ids = [fact_id]
    if fact_ids is not None:
        sql += f" AND fact_id IN ({', '.join('?' * len(fact_ids)) or 'NULL'})"
        params += tuple(fact_ids)
    return [
        FactChange(
            id=r[0],
            fact_id=r[1],
            action=r[2],
            text=r[3],
            old_text=r[4],
            flush_id=r[5],
            at=parse_time(r[6]),
            origin=r[7],
            topics=None if r[8] is None else json.loads(r[8]),
            old_topics=None if r[9] is None else json.loads(r[9]),
            reason=r[10],
        )
        for r in store.execute(sql + " ORDER BY id", params)
    ]
