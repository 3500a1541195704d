"""The import pipeline, in one room: take a file read by `memcli.formats` (the format layer) as
its conversations (`from_source`: a transcript's records grouped by session), align them with
what is stored, put what is new through the engine (one transaction: all or nothing), then feed
the flushed batches to the long-term blocks. Each step calls lower layers only.

The unit is a `Conversation`: messages in order (as the source's records: one record, one put
call), the session it names (or none: a new one), and what a source says of it (its own id, a
title, record-level keys), so that a format holding many conversations gives one each.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from memcli.errors import InputError, StoreError
from memcli.flush import Budget, BudgetOverride
from memcli.formats.base import CONTENT_ID, Conversation, content_ids
from memcli.messages import (
    Message,
    format_time,
    new_session_id,
    session_name,
    validate_session_id,
)
from memcli.sessions import budget_rule, default_budget
from memcli.store.base import named
from memcli.transcripts import SessionRecord, plan_calls

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence
    from datetime import datetime

    from memcli.blocks.base import MemoryBlock
    from memcli.config import Settings
    from memcli.formats import Source
    from memcli.memory import Flush, Memory
    from memcli.store.base import SessionInfo, Store
    from memcli.tokens import Tokenizer
    from memcli.transcripts import Record

__all__ = ["Conversation", "Imported", "Opening", "conversations", "import_conversations"]

# -- what is imported -------------------------------------------------------------------------


def conversations(
    records: Iterable[Record],
    session_id: str | None = None,
    header: SessionRecord | None = None,
) -> list[Conversation]:
    """The conversations of a transcript's records: all of them in `session_id` when given, else
    one per session the records name, and one per conversation line (`{"messages": [...]}`)
    naming none; messages naming none go to the header's session, else to one new session; in
    the order they first appear. Each gets a source id from its first messages (`content_ids`),
    by which a second import finds it."""
    if session_id is not None:
        validate_session_id(session_id, "--session")
    default = header.id if header is not None else None
    out: dict[Any, Conversation] = {}
    for record in records:
        target = session_id or record.session or default
        key = ("line", record.line) if target is None and record.is_conversation else target
        conversation = out.get(key)
        if conversation is None:
            conversation = out[key] = Conversation([], target, keys=dict(record.keys or {}))
        conversation.records.append(record)
        conversation.dropped += record.dropped
    found = list(out.values())
    for c in found:  # (with `session_id`, the header's conversation is the one imported)
        if header is not None and c.session is not None and c.session in (header.id, session_id):
            c.title, c.source_id = header.title, header.source_id
            c.keys = {**(header.metadata or {}), **c.keys}
    return content_ids(found)


def from_source(source: Source, session_id: str | None = None) -> list[Conversation]:
    """The conversations of a file read by `memcli.formats.read`, without empty ones; with
    `session_id`, all of them as one conversation in that session."""
    if source.format == "transcript":
        return conversations(source.records, session_id, source.header)
    found = _once(source.name, [c for c in content_ids(source.conversations) if c.records])
    if session_id is None or not found:
        return found
    validate_session_id(session_id, "--session")
    merged = replace(found[0], session=session_id, records=[], dropped=0)
    for c in found:
        merged.records.extend(c.records)
        merged.dropped += c.dropped
    if len(found) > 1:
        merged.source_id = merged.title = None
    return [merged]


def _once(name: str, found: list[Conversation]) -> list[Conversation]:
    """An export's conversations, each once: a conversation given again with the same source id
    and messages (a split export whose parts overlap) is left out; given again with other
    messages, it is an InputError naming it (which of the two is the conversation?)."""
    seen: dict[str, Conversation] = {}
    out = []
    for c in found:
        first = seen.setdefault(c.source_id, c) if c.source_id is not None else c
        if first is c:
            out.append(c)
        elif first.messages != c.messages:
            raise InputError(
                f"{name}: conversation {c.source_id} is in it twice, with other messages",
                "Give each conversation once (the newest export holds the newest version)",
            )
    return out


# -- how sessions are opened ------------------------------------------------------------------


@dataclass(frozen=True)
class Opening:
    """How an import opens each session: as whom, with which budget, blocks and tokenizer.

    `budget` holds what the flags ask for; `default_budget` is what new sessions get otherwise.
    `rebudget`: a stored session whose budget differs from the flags' gets theirs (else that
    is an error)."""

    tokenizer: Tokenizer
    default_user: str = "default"
    default_budget: BudgetOverride = field(default_factory=BudgetOverride)
    blocks: Sequence[MemoryBlock] = ()
    insert_method: str = "system"
    user: str | None = None  # given explicitly: a session of another user is refused
    budget: BudgetOverride = field(default_factory=BudgetOverride)
    rebudget: bool = False

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        blocks: Sequence[MemoryBlock] = (),
        *,
        user: str | None = None,
        budget: BudgetOverride | None = None,
        rebudget: bool = False,
    ) -> Opening:
        """As the settings say (user, budget, encoding, insert method); the flags as given."""
        from memcli.tokens import TiktokenTokenizer

        return cls(
            tokenizer=TiktokenTokenizer(settings.encoding),
            default_user=settings.user,
            default_budget=default_budget(settings),
            blocks=blocks,
            insert_method=settings.insert_method,
            user=user,
            budget=budget or BudgetOverride(),
            rebudget=rebudget,
        )


# -- what an import did -----------------------------------------------------------------------


@dataclass
class Imported:
    """What an import did: the messages stored by session (`sessions`, new ones also in
    `new_sessions`), the put calls, flushes and archived messages (a budget change's included),
    the blocks' batches done and pending, how many of its messages were already stored
    (`already_stored`, by session in `skipped`), and the budgets it changed."""

    sessions: dict[str, int] = field(default_factory=dict)
    new_sessions: list[str] = field(default_factory=list)
    messages: int = 0
    calls: int = 0
    flushes: int = 0
    archived: int = 0
    blocks_done: int = 0
    blocks_pending: int = 0
    already_stored: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    #: Of those, how many are stored without the timestamp the file gives them (recognised by
    #: `same_message`; kept as stored).
    undated: int = 0
    rebudgets: dict[str, Rebudget] = field(default_factory=dict)
    #: Non-text parts (images, audio, files) left out of the messages.
    dropped_parts: int = 0
    #: The conversations' titles, by session.
    titles: dict[str, str] = field(default_factory=dict)
    #: Nothing was written: what an import would store (`dry_run`).
    dry_run: bool = False
    #: The store's key of each session (by its name) that messages were put into.
    keys: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Rebudget:
    """A session's budget changed on purpose (--rebudget): from what, to what, and what the
    change flushed at once."""

    old: Budget
    new: Budget
    flushes: int
    archived: int

    def to_dict(self) -> dict[str, Any]:
        def budget(b: Budget) -> dict[str, Any]:
            return {
                "token_limit": b.token_limit,
                "ratio": b.chat_history_token_ratio,
                "flush_size": b.flush_size,
            }

        return {
            "from": budget(self.old),
            "to": budget(self.new),
            "flushes": self.flushes,
            "archived_messages": self.archived,
        }


# -- the pipeline -----------------------------------------------------------------------------


def import_conversations(
    store: Store,
    found: Sequence[Conversation],
    opening: Opening,
    *,
    session_record: SessionRecord | None = None,
    again: bool = False,
    put: str = "call",
    feed_blocks: bool = True,
    progress: Callable[[int], None] | None = None,
    block_total: Callable[[int], None] | None = None,
    block_progress: Callable[[int], None] | None = None,
    dry_run: bool = False,
) -> Imported:
    """Import conversations, each into its session, all or nothing: every session opened as
    `opening` says (a session of another user than `opening.user` is refused before anything is
    stored), the messages put through the engine in one transaction (`put`: the calls, see
    `plan_calls`), then, with `feed_blocks`, the flushed batches handed to the blocks in bulk.

    Importing is idempotent: the messages of a conversation already stored in its session, in
    order, at its end, are skipped (see `stored_overlap`), unless `again` imports a second copy
    on purpose. A stored session whose budget differs from the one asked for follows
    `budget_rule`; new sessions take `session_record`'s budget and user when the flags give none.

    `progress(n)` is told how many messages were just put; `block_total(n)` how many (block,
    batch) pairs the blocks are handed and `block_progress(n)` how many were just handed over. A
    block that fails leaves its batches unprocessed; `memcli blocks backfill` catches up.

    A conversation without a session but with a source id goes to the session of `opening`'s
    user that an import stored it in (`Store.find_sources`), else to a new session named after
    its title (or first words) and source id. `dry_run`: what would be stored, nothing written.
    """
    o = opening
    header = session_record or SessionRecord()
    rule = budget_rule(o.default_budget, o.budget, given=header.budget, rebudget=o.rebudget)
    new_user = o.user or header.user or o.default_user
    # Whose sessions the conversations' names are: the user given (or the export's), else any
    # user's (a name that several users have: UsageError naming them).
    owner = o.user or header.user
    for _attempt in range(_ATTEMPTS):
        plan = align(store, resolve(store, found, new_user, again), owner, again, new_user)
        if dry_run:
            return _dry(plan)
        try:
            result, to_feed = _put(store, plan, o, rule, owner, new_user, put, progress)
        except _SessionChanged:
            continue  # another process wrote to a session since it was read: align again
        _feed(result, to_feed if feed_blocks else [], block_total, block_progress)
        return result
    raise StoreError(
        "the sessions kept changing while importing", "Try again when other writers are done"
    )


_ATTEMPTS = 5


class _SessionChanged(Exception):
    """A session changed between reading it for the alignment and the import's transaction."""


@dataclass
class Plan:
    """The conversations left to import once what is already stored is skipped; the version of
    each stored session when it was read (-1: it does not exist yet); how many messages each
    session already held."""

    conversations: list[Conversation]
    versions: dict[str, int]
    skipped: dict[str, int]
    undated: int = 0


def resolve(
    store: Store, found: Sequence[Conversation], user: str, again: bool = False
) -> list[Conversation]:
    """Give each conversation with a source id but no session its session: the one of `user`
    an import stored it in, else (and with `again`, a second copy) a new one. A source id made
    from the content (`content_ids`) only finds a session whose messages the conversation
    continues, or which continues the conversation: two conversations that start alike are not
    one. Reads only."""
    out = []
    for c in found:
        if c.session is None and c.source_id is not None:
            stored = None
            if not again:
                by_content = c.source_id.startswith(CONTENT_ID)
                stored = next(
                    (
                        s
                        for s in store.find_sources(user, c.source_id)
                        if not by_content or _continues(_stored(store, s, c.messages), c.messages)
                    ),
                    None,
                )
            c = replace(
                c,
                session=session_name(stored) if stored else _new_id(store, c, user, again),
                matched=stored is not None,
                user=user,
            )
        out.append(c)
    return out


def _continues(stored: Iterable[Message], messages: Sequence[Message]) -> bool:
    """Whether a session's messages and a conversation's agree as far as both go (one is the
    other's start)."""
    stored = list(stored)
    return _common_start(stored, messages) == min(len(stored), len(messages))


def _common_start(stored: Iterable[Message], messages: Sequence[Message]) -> int:
    """How many messages a session and a conversation start with alike (`same_message`)."""
    n = 0
    for a, b in zip(stored, messages, strict=False):
        if not same_message(a, b):
            break
        n += 1
    return n


def _new_id(store: Store, c: Conversation, user: str, again: bool) -> str:
    """A session id people can tell apart in `memcli sessions`: the conversation's title (or
    its first user words) as a slug, and a hash of its user and source id."""
    words = c.title or next((m.content for m in c.messages if m.role == "user"), "")
    slug = "-".join(re.findall(r"[^\W_]+", words.lower()))[:40].strip("-") or "conversation"
    digest = hashlib.sha256(f"{user}\0{c.source_id}".encode()).hexdigest()[:6]
    target = f"{slug}-{digest}"
    if again or named(store, target, user) is not None:
        target = f"{slug}-{new_session_id()[:8]}"
    return target


def _dry(plan: Plan) -> Imported:
    """What `plan` would store, as an import's result (nothing was written)."""
    result = Imported(
        already_stored=sum(plan.skipped.values()),
        skipped=plan.skipped,
        undated=plan.undated,
        dry_run=True,
    )
    for c in plan.conversations:
        target = c.session or new_session_id()
        count = len(c.messages)
        result.sessions[target] = result.sessions.get(target, 0) + count
        result.messages += count
        result.calls += sum(1 for r in c.records if r.messages)
        result.dropped_parts += c.dropped
        if c.title:
            result.titles[target] = c.title
        if plan.versions.get(target, -1) < 0 and target not in result.new_sessions:
            result.new_sessions.append(target)
    return result


def align(
    store: Store,
    found: Sequence[Conversation],
    user: str | None,
    again: bool = False,
    new_user: str | None = None,
) -> Plan:
    """Skip, per stored session, the messages its conversation holds that are already stored
    there, or were and were deleted for good (all of them with `again`: nothing is skipped).
    A conversation's session is `user`'s of its name (None: any user's, `store.base.named`);
    none is a new one.
    A message with a source id deleted for good from any session of the user (`new_user` for
    new sessions) is skipped too, into whichever session it is imported. Reads only.

    Which those are: a message with an id in its source (`metadata["source_id"]`, which the
    format readers set) is known by it: stored with that id, or deleted (`deleted_sources`).
    Besides, and for messages without one (a transcript's; those stored before memcli kept
    source ids), the run of the conversation's first messages that the session ends with
    (`stored_overlap`; for a conversation found by its source id, also what it shares with the
    session's start), in which a message deleted for good still stands, known by its hash: a
    deleted message does not come back, nor does what followed it come twice."""
    from memcli.store import forget

    plan = Plan([], {}, {})
    deleted_ids: dict[str, set[str]] = {}  # (per user, read once)

    def deleted_of(owner: str) -> set[str]:
        if owner not in deleted_ids:
            deleted_ids[owner] = forget.deleted_source_ids(store, owner)
        return deleted_ids[owner]

    for conversation in found:
        target = conversation.session
        plan.conversations.append(conversation)
        messages = conversation.messages
        has_ids = any(forget.source_id(m) is not None for m in messages)
        info = None if target is None else named(store, target, conversation.user or user)
        version = -1 if info is None else store.session_version(info.id)
        if target is not None:
            plan.versions[target] = version
        if again:
            continue  # a second copy on purpose
        known: set[str] = set()
        k = 0
        if version < 0:  # a new session: only what the user deleted elsewhere is skipped
            if has_ids and new_user is not None:
                known = deleted_of(new_user)
        else:
            assert info is not None
            k = stored_overlap(messages, _stored(store, info.id, messages))
            if conversation.matched:  # the same conversation: what it shares with its start
                k = max(k, _common_start(_stored(store, info.id, messages), messages))
            if has_ids:
                known.update(deleted_of(info.user_id))
                known.update(
                    h
                    for _, h in forget.deleted_sources(store, info.id)
                    if h.startswith(forget.BY_ID)
                )
                known.update(
                    forget.source_hash(m)
                    for m in store.iter_messages(info.id)
                    if forget.source_id(m) is not None
                )
        skip = {
            i
            for i, m in enumerate(messages)
            if i < k or (forget.source_id(m) is not None and forget.source_hash(m) in known)
        }
        if not skip:
            continue
        if info is not None:
            plan.undated += _undated(store, info.id, [messages[i] for i in sorted(skip)])
        if target is None:  # (a new session's id is made when it is put: name it now)
            target = new_session_id()
            conversation = replace(conversation, session=target)
            plan.conversations[-1] = conversation
        plan.skipped[target] = plan.skipped.get(target, 0) + len(skip)
        records, i = [], 0
        for record in conversation.records:
            kept = [m for j, m in enumerate(record.messages, i) if j not in skip]
            i += len(record.messages)
            records.append(record._replace(messages=kept))
        plan.conversations[-1] = replace(conversation, records=records)
    return plan


def _undated(store: Store, session: str, skipped: Sequence[Message]) -> int:
    """How many of `skipped` (messages of a conversation recognised as stored in the session)
    are dated but stored without a timestamp: those with no stored message alike at their time
    but one alike without a time (one deleted for good has neither). The session is read only
    when one of them is dated."""
    dated = [m for m in skipped if m.timestamp is not None]
    if not dated:
        return 0
    timed: Counter[tuple[Any, ...]] = Counter()
    untimed: Counter[tuple[Any, ...]] = Counter()
    for m in store.iter_messages(session):
        if m.timestamp is None:
            untimed[_key(m)] += 1
        else:
            timed[(*_key(m), format_time(m.timestamp))] += 1
    undated = 0
    for m in dated:
        assert m.timestamp is not None
        key = (*_key(m), format_time(m.timestamp))
        if timed[key]:
            timed[key] -= 1
        elif untimed[_key(m)]:
            untimed[_key(m)] -= 1
            undated += 1
    return undated


def _stored(store: Store, session: str, messages: Sequence[Message]) -> Iterator[Message]:
    """A session's messages in order, each message deleted for good standing in its place as
    the message of `messages` that has its source hash (as a placeholder no message equals
    when none has): read as they are needed."""
    from memcli.store import forget

    deleted = forget.deleted_sources(store, session)
    stored = store.iter_messages(session)
    if not deleted:
        yield from stored
        return
    by_hash: dict[str, Message] = {}
    for m in messages:
        by_hash.setdefault(forget.source_hash(m), m)
        if forget.source_id(m) is not None:  # (stored before by its content, then deleted)
            by_hash.setdefault(forget.source_hash(_without_source(m)), m)
    gone = iter(deleted)
    next_gone = next(gone, None)
    for m in stored:
        while next_gone is not None and m.id is not None and next_gone[0] < m.id:
            yield by_hash.get(next_gone[1], _DELETED)
            next_gone = next(gone, None)
        yield m
    while next_gone is not None:
        yield by_hash.get(next_gone[1], _DELETED)
        next_gone = next(gone, None)


#: Stands for a deleted message that no message of the conversation is.
_DELETED = Message.plain("system", "\0deleted")


def _without_source(m: Message) -> Message:
    meta = {k: v for k, v in (m.metadata or {}).items() if k != "source_id"}
    return replace(m, metadata=meta or None)


def _put(
    store: Store,
    plan: Plan,
    o: Opening,
    rule: Callable[[SessionInfo | None], Budget | None],
    owner: str | None,
    new_user: str,
    put: str,
    progress: Callable[[int], None] | None,
) -> tuple[Imported, list[tuple[Memory, list[Flush]]]]:
    """Put the plan's conversations, in one transaction; what was stored, and the flushes each
    session's blocks are to be fed (a budget change's last). _SessionChanged when a stored
    session is not as the plan read it."""
    from memcli.memory import Memory

    result = Imported(
        already_stored=sum(plan.skipped.values()), skipped=plan.skipped, undated=plan.undated
    )
    to_feed: list[tuple[Memory, list[Flush]]] = []
    rebudgeted: list[tuple[Memory, list[Flush]]] = []
    with store.transaction():
        for conversation in plan.conversations:
            target = conversation.session or new_session_id()
            info = named(store, target, conversation.user or owner)
            version = -1 if info is None else store.session_version(info.id)
            if version != plan.versions.get(target, -1):
                raise _SessionChanged(target)
            if info is None:
                result.new_sessions.append(target)
            wanted = rule(info)
            memory = Memory(
                store,
                target,
                user_id=new_user if info is None else info.user_id,
                budget=wanted if info is None else None,
                tokenizer=o.tokenizer,
                memory_blocks=o.blocks,
                insert_method=o.insert_method,
            )
            if info is not None and wanted is not None:
                old = memory.budget
                flushes = memory.rebudget(wanted, feed_blocks=False)
                archived = sum(len(f.message_ids) for f in flushes)
                result.rebudgets[target] = Rebudget(old, wanted, len(flushes), archived)
                rebudgeted.append((memory, flushes))
            calls = plan_calls(conversation.records, put)
            fed: list[Flush] = []
            for flushes in memory.put_calls(calls, feed_blocks=False, progress=progress):
                fed.extend(flushes)
                result.flushes += len(flushes)
                result.archived += sum(len(f.message_ids) for f in flushes)
            if fed:
                to_feed.append((memory, fed))
            if info is None or (info.source_id is None and conversation.source_id):
                store.describe_session(
                    memory.session_key,
                    source_id=conversation.source_id,
                    title=conversation.title,
                    metadata=conversation.keys or None,
                )
            if conversation.title:
                result.titles[target] = conversation.title
            result.dropped_parts += conversation.dropped
            count = sum(len(call) for call in calls)
            result.calls += len(calls)
            result.sessions[target] = count
            result.keys[target] = memory.session_key
            result.messages += count
    for change in result.rebudgets.values():
        result.flushes += change.flushes
        result.archived += change.archived
    return result, to_feed + [(m, fs) for m, fs in rebudgeted if fs]


def _feed(
    result: Imported,
    to_feed: list[tuple[Memory, list[Flush]]],
    block_total: Callable[[int], None] | None,
    block_progress: Callable[[int], None] | None,
) -> None:
    """Hand each session's flushed batches to its blocks, in bulk (one embedding call for many
    batches), counting what they did into `result`."""
    to_feed = [(m, fs) for m, fs in to_feed if m.memory_blocks]
    if block_total is not None:
        block_total(
            sum(len(fs) for m, fs in to_feed for b in m.memory_blocks if b.receives_flushes)
        )
    for memory, flushes in to_feed:
        fed = memory.feed_blocks_many(flushes, progress=block_progress)
        result.blocks_done += sum(fed.done.values())
        result.blocks_pending += sum(fed.pending.values())


def stored_overlap(messages: Sequence[Message], stored: Iterable[Message]) -> int:
    """How many of `messages`, from the first, are already stored in order at the end of a
    session whose messages `stored` yields in order: the longest run of `messages` from its
    start that equals the session's last messages.

    Why the end: an import appends, so a re-run of the same import (after it committed, even
    if the process was then killed), a grown transcript (the old part is stored, the new part
    follows) and a session's own export (`--all`, or its active tail) each find their stored
    part there; what is not stored comes after it. A global set of hashes would instead drop
    an "ok" that the conversation says twice. Messages compare as `same_message` says.
    `stored` is read once, in order (Knuth-Morris-Pratt over the messages without their
    timestamps), holding only the last `len(messages)` timestamps of it; of the runs found
    alike so, the longest whose timestamps agree is the overlap (the shorter ones are the
    failure links of the longest: each is checked from its first message to its first
    disagreement).
    """
    if not messages:
        return 0
    pattern = [_key(m) for m in messages]
    # fail[i]: the longest proper prefix of pattern[: i + 1] that is also its suffix.
    fail = [0] * len(pattern)
    q = 0
    for i in range(1, len(pattern)):
        while q and pattern[i] != pattern[q]:
            q = fail[q - 1]
        if pattern[i] == pattern[q]:
            q += 1
        fail[i] = q
    q = 0
    times: deque[datetime | None] = deque(maxlen=len(pattern))
    for m in stored:
        key = _key(m)
        times.append(m.timestamp)
        while q and (q == len(pattern) or pattern[q] != key):
            q = fail[q - 1]
        if pattern[q] == key:
            q += 1
    tail = list(times)
    while q and not all(
        _same_time(a.timestamp, b) for a, b in zip(messages[:q], tail[-q:], strict=True)
    ):
        q = fail[q - 1]
    return q


def same_message(stored: Message, given: Message) -> bool:
    """The alignment rule, for every format: a message given to an import is one already stored
    when their role, content, name and metadata (without the source id: one stored before
    memcli kept them is the same message) are the same, and their timestamps where both have
    one (what an export round-trips; status is the engine's). A message stored without a
    timestamp (by a transcript without them, or a reader that did not date that format's
    messages yet) is the same as one given with any, and the other way round: a file dated
    since is recognised, not stored twice; the stored message is kept as it was stored."""
    return _key(stored) == _key(given) and _same_time(stored.timestamp, given.timestamp)


def _same_time(a: datetime | None, b: datetime | None) -> bool:
    """Whether two messages' timestamps agree: the same, or one of them has none."""
    return a is None or b is None or format_time(a) == format_time(b)


def _key(m: Message) -> tuple[Any, ...]:
    """What an export round-trips of a message, as stored, but its timestamp (metadata as its
    JSON, without the source id)."""
    given = m.metadata
    if given and "source_id" in given:
        given = {k: v for k, v in given.items() if k != "source_id"}
    meta = json.dumps(given, ensure_ascii=False, sort_keys=True) if given else None
    return (m.role, m.content, m.name, meta)
