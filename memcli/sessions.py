"""Sessions as the commands and the chat open them: who a session belongs to, which budget it runs
under, a transcript imported into sessions, a session's report, and the blocks' view of a session
(or of none)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from memcli.errors import InputError, SessionNotFound, StoreError, UsageError
from memcli.flush import Budget
from memcli.messages import format_time
from memcli.transcripts import ImportResult

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from pathlib import Path

    from memcli.blocks.base import MemoryBlock
    from memcli.config import Settings
    from memcli.memory import Context, Flush, Memory
    from memcli.messages import Message
    from memcli.store.base import FlushRecord, SessionInfo, Store
    from memcli.tokens import Tokenizer
    from memcli.transcripts import Record


def require(store: Store, session_id: str, user: str | None = None) -> SessionInfo:
    """The stored session; SessionNotFound when there is none (with `user`, none of that user's:
    another user's session is not found for them)."""
    info = store.get_session(session_id)
    if info is None or (user is not None and info.user_id != user):
        raise SessionNotFound(session_id, user)
    return info


def check_owner(info: SessionInfo | None, user: str | None, hint: str) -> None:
    """Refuse a stored session of another user than `user` (None: any user may open it) with
    UsageError; `hint` says what to do instead, `{owner}` in it standing for the session's user."""
    if info is not None and user is not None and info.user_id != user:
        raise UsageError(
            f"session {info.id!r} belongs to user {info.user_id!r}, not {user!r}",
            hint.replace("{owner}", info.user_id),
        )


def owned(store: Store, session_id: str, user: str | None, hint: str) -> SessionInfo | None:
    """The stored session (None when it does not exist yet), once `check_owner` allows it."""
    info = store.get_session(session_id)
    check_owner(info, user, hint)
    return info


def budget_for(
    info: SessionInfo | None,
    default: tuple[int, float, int | None],
    token_limit: int | None = None,
    ratio: float | None = None,
    flush_size: int | None = None,
) -> Budget:
    """The budget the flags ask for: a stored session's own with the flags in place of its values
    (a new limit without a flush size: 10% of it); a new session takes the flags, else `default`
    (token limit, ratio, flush size: the settings)."""
    from memcli.memory import adjust_budget, stored_budget

    if info is not None:
        return adjust_budget(stored_budget(info), token_limit, ratio, flush_size)
    return Budget(
        token_limit if token_limit is not None else default[0],
        ratio if ratio is not None else default[1],
        flush_size if flush_size is not None else default[2],
    )


def budget_rule(
    default: tuple[int, float, int | None],
    token_limit: int | None = None,
    ratio: float | None = None,
    flush_size: int | None = None,
    *,
    given: Budget | None = None,
    rebudget: bool = False,
) -> Callable[[SessionInfo | None], Budget | None]:
    """The budget a writing command (import, chat) opens each session with, asked per session.

    A new session: the flags, else `given` (an export's session record), else `default`. A
    stored session: None (its stored budget) when the flags and `given` ask for nothing else;
    the budget asked for when `rebudget` (the caller stores it with `Memory.rebudget`);
    otherwise UsageError naming the stored budget and --rebudget. Budget options never change
    a session silently."""
    from memcli.memory import adjust_budget, budget_text, stored_budget

    flags_given = any(v is not None for v in (token_limit, ratio, flush_size))

    def rule(info: SessionInfo | None) -> Budget | None:
        if info is None:
            if given is None:
                return budget_for(None, default, token_limit, ratio, flush_size)
            return adjust_budget(given, token_limit, ratio, flush_size)
        if not flags_given and given is None:
            return None
        stored = stored_budget(info)
        wanted = adjust_budget(given or stored, token_limit, ratio, flush_size)
        if wanted == stored:
            return None
        if not rebudget:
            source = "the budget options ask" if flags_given else "the file's session record asks"
            raise UsageError(
                f"session {info.id!r} has the budget {budget_text(stored)}; {source} for"
                f" {budget_text(wanted)}",
                "Leave the budget options out to keep it, or add --rebudget to store the new"
                " one (it flushes what no longer fits)",
            )
        return wanted

    return rule


@dataclass(frozen=True)
class Opening:
    """How an import opens each session: as whom, with which budget flags, blocks and tokenizer.

    `rebudget`: a stored session whose budget differs from the flags' gets theirs (else that
    is an error)."""

    default_user: str
    default_budget: tuple[int, float, int | None]
    tokenizer: Tokenizer
    blocks: Sequence[MemoryBlock] = ()
    insert_method: str = "system"
    user: str | None = None  # given explicitly: a session of another user is refused
    token_limit: int | None = None
    ratio: float | None = None
    flush_size: int | None = None
    rebudget: bool = False

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        blocks: Sequence[MemoryBlock] = (),
        *,
        user: str | None = None,
        token_limit: int | None = None,
        ratio: float | None = None,
        flush_size: int | None = None,
        rebudget: bool = False,
    ) -> Opening:
        """As the settings say (user, budget, encoding, insert method); the flags as given."""
        from memcli.tokens import TiktokenTokenizer

        return cls(
            default_user=settings.user,
            default_budget=(settings.token_limit, settings.ratio, settings.flush_size),
            tokenizer=TiktokenTokenizer(settings.encoding),
            blocks=blocks,
            insert_method=settings.insert_method,
            user=user,
            token_limit=token_limit,
            ratio=ratio,
            flush_size=flush_size,
            rebudget=rebudget,
        )


# -- imports ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionRecord:
    """The `{"type": "session", ...}` record `memcli export` writes first: the session's id,
    user and budget, so that an import recreates them."""

    id: str | None = None
    user: str | None = None
    budget: Budget | None = None

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"type": "session", "id": self.id, "user": self.user}
        if self.budget is not None:
            record["token_limit"] = self.budget.token_limit
            record["chat_history_token_ratio"] = self.budget.chat_history_token_ratio
            record["token_flush_size"] = self.budget.flush_size
        return record

    @classmethod
    def of(cls, info: SessionInfo) -> SessionRecord:
        """The session's record; a stored budget that is not valid (edited by hand) is left out,
        so that the session can still be exported."""
        from memcli.memory import stored_budget

        try:
            budget: Budget | None = stored_budget(info)
        except UsageError:
            budget = None
        return cls(info.id, info.user_id, budget)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> SessionRecord:
        """Read a session record; InputError naming `where` for a bad value."""
        id, user = data.get("id"), data.get("user")
        for key, value in (("id", id), ("user", user)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise InputError(f"{where}: session {key} must be a non-empty string", _EXPORT)
        budget = None
        values = [data.get(k) for k in _BUDGET_KEYS]
        if any(v is not None for v in values):
            if values[0] is None or values[1] is None:
                raise InputError(
                    f"{where}: a session record gives token_limit and chat_history_token_ratio",
                    _EXPORT,
                )
            try:
                budget = Budget(values[0], values[1], values[2])
            except UsageError as exc:
                raise InputError(f"{where}: {exc.message}", _EXPORT) from None
        return cls(id, user, budget)


_BUDGET_KEYS = ("token_limit", "chat_history_token_ratio", "token_flush_size")
_EXPORT = "Write it as `memcli export` does, or leave the session record out"


def read_import(
    source: str | Path, stdin: IO[bytes] | None = None
) -> tuple[SessionRecord | None, list[Record]]:
    """A transcript to import (`-` is stdin), validated whole, and the session record it starts
    with, if any (`memcli export` writes one; other transcripts need none)."""
    from memcli.transcripts import parse_transcript, read_source

    data, name = read_source(source, stdin)
    header, rest = split_session_record(data, name)
    return header, parse_transcript(rest, name)


def split_session_record(data: bytes, name: str = "<input>") -> tuple[SessionRecord | None, bytes]:
    """The session record on the first line of JSON Lines `data`, if there is one, and the
    data without it (its line left blank, so that errors still name the right lines)."""
    offset = 0
    line = 1
    while offset < len(data):
        end = data.find(b"\n", offset)
        end = len(data) if end < 0 else end
        raw = data[offset:end]
        if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if raw.strip():
            break
        offset, line = end + 1, line + 1
    else:
        return None, data
    if b'"session"' not in raw or not raw.lstrip().startswith(b"{"):
        return None, data
    try:
        obj = json.loads(raw)
    except ValueError:
        return None, data  # the transcript reader names the error
    if not isinstance(obj, dict) or obj.get("type") != "session":
        return None, data
    return SessionRecord.from_dict(obj, f"{name}:{line}"), data[:offset] + data[end:]


@dataclass
class Imported(ImportResult):
    """What an import did: what it stored (as `ImportResult`), how many of its messages were
    already stored (`already_stored`, by session in `skipped`), and the budgets it changed
    (their flushes are counted in `flushes` and `archived` too)."""

    already_stored: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    rebudgets: dict[str, Rebudget] = field(default_factory=dict)


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


class _SessionChanged(Exception):
    """A session changed between reading it for the alignment and the import's transaction."""


def import_transcript(
    store: Store,
    records: list[Record],
    opening: Opening,
    *,
    session_id: str | None = None,
    session_record: SessionRecord | None = None,
    again: bool = False,
    put: str = "call",
    feed_blocks: bool = True,
    progress: Callable[[int], None] | None = None,
    block_total: Callable[[int], None] | None = None,
    block_progress: Callable[[int], None] | None = None,
) -> Imported:
    """Import records into their sessions (or all into `session_id`), all or nothing, as
    `transcripts.import_records` does; each session is opened as `opening` says, a session of
    another user than `opening.user` refused before anything is stored.

    `session_record` (an export's first record) names the session of records that name none
    and gives new sessions their budget and user (flags and --user win); a stored session
    whose budget differs follows `budget_rule`.

    Importing is idempotent: the messages of a session's records that are already stored in
    it, in order, at its end, are skipped (see `already_stored`), unless `again` imports a
    second copy on purpose.
    """
    o = opening
    header = session_record or SessionRecord()
    if session_id is None and header.id is not None:
        records = [r if r.session else r._replace(session=header.id) for r in records]
    rule = budget_rule(
        o.default_budget,
        o.token_limit,
        o.ratio,
        o.flush_size,
        given=header.budget,
        rebudget=o.rebudget,
    )
    for _attempt in range(_ATTEMPTS):
        plan = _align(store, records, session_id, o.user, again)
        try:
            return _import_planned(
                store,
                plan,
                o,
                rule,
                o.user or header.user or o.default_user,
                session_id,
                put=put,
                feed_blocks=feed_blocks,
                progress=progress,
                block_total=block_total,
                block_progress=block_progress,
            )
        except _SessionChanged:
            continue  # another process wrote to a session since it was read: align again
    raise StoreError(
        "the sessions kept changing while importing", "Try again when other writers are done"
    )


def _import_planned(
    store: Store,
    plan: _Plan,
    o: Opening,
    rule: Callable[[SessionInfo | None], Budget | None],
    new_user: str,
    session_id: str | None,
    **imports: Any,
) -> Imported:
    """Import what the plan left, in one transaction (`import_records`); _SessionChanged when a
    stored session is not as the plan read it."""
    from memcli.memory import Memory
    from memcli.transcripts import import_records

    rebudgets: dict[str, tuple[Budget, Budget, list[Flush]]] = {}
    opened: dict[str, Memory] = {}

    def open_memory(target: str) -> Memory:
        if store.session_version(target) != plan.versions.get(target, -1):
            raise _SessionChanged(target)
        info = store.get_session(target)
        check_owner(info, o.user, _OTHER_USER)
        wanted = rule(info)
        memory = Memory(
            store,
            target,
            user_id=new_user,
            budget=wanted if info is None else None,
            tokenizer=o.tokenizer,
            memory_blocks=o.blocks,
            insert_method=o.insert_method,
        )
        if info is not None and wanted is not None:
            old = memory.budget
            rebudgets[target] = (old, wanted, memory.rebudget(wanted, feed_blocks=False))
        opened[target] = memory
        return memory

    result = import_records(
        plan.records, store=store, open_memory=open_memory, session_id=session_id, **imports
    )
    out = Imported(**vars(result), already_stored=sum(plan.skipped.values()), skipped=plan.skipped)
    for target, (old, new, flushes) in rebudgets.items():
        archived = sum(len(f.message_ids) for f in flushes)
        out.rebudgets[target] = Rebudget(old, new, len(flushes), archived)
        out.flushes += len(flushes)
        out.archived += archived
        memory = opened[target]
        if imports.get("feed_blocks") and flushes and memory.memory_blocks:
            fed = memory.feed_blocks_many(flushes, progress=imports.get("block_progress"))
            out.blocks_done += sum(fed.done.values())
            out.blocks_pending += sum(fed.pending.values())
    return out


_ATTEMPTS = 5
_OTHER_USER = "Import into another --session, or leave out --user"


@dataclass
class _Plan:
    """The records left to import once what is already stored is skipped; the version of each
    stored session when it was read; how many messages each session already held."""

    records: list[Record]
    versions: dict[str, int]  # -1: the session does not exist yet
    skipped: dict[str, int]


def _align(
    store: Store, records: list[Record], session_id: str | None, user: str | None, again: bool
) -> _Plan:
    """Skip, per stored session, the messages its records hold that are already stored there."""
    groups: dict[str, list[int]] = {}
    for i, record in enumerate(records):
        target = session_id or record.session
        if target is not None:  # records of no session go to a new one
            groups.setdefault(target, []).append(i)
    out = list(records)
    plan = _Plan(out, {}, {})
    for target, indexes in groups.items():
        version = plan.versions[target] = store.session_version(target)
        if version < 0 or again:
            continue  # a new session, or a second copy on purpose
        check_owner(store.get_session(target), user, _OTHER_USER)
        messages = [m for i in indexes for m in records[i].messages]
        k = stored_overlap(messages, store.iter_messages(target))
        if not k:
            continue
        plan.skipped[target] = k
        for i in indexes:
            record = out[i]
            cut = min(k, len(record.messages))
            out[i] = record._replace(messages=record.messages[cut:])
            k -= cut
            if not k:
                break
    return plan


def stored_overlap(messages: Sequence[Message], stored: Iterable[Message]) -> int:
    """How many of `messages`, from the first, are already stored in order at the end of a
    session whose messages `stored` yields in order: the longest run of `messages` from its
    start that equals the session's last messages.

    Why the end: an import appends, so a re-run of the same import (after it committed, even
    if the process was then killed), a grown transcript (the old part is stored, the new part
    follows) and a session's own export (`--all`, or its active tail) each find their stored
    part there; what is not stored comes after it. A global set of hashes would instead drop
    an "ok" that the conversation says twice. Messages compare by role, content, name,
    metadata and timestamp (what an export round-trips; status is the engine's, and a
    transcript without timestamps compares without them). `stored` is read once, in order
    (Knuth-Morris-Pratt over the messages), holding nothing of it.
    """
    if not messages:
        return 0
    timed = any(m.timestamp is not None for m in messages)
    pattern = [_key(m, timed) for m in messages]
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
    for m in stored:
        key = _key(m, timed)
        while q and (q == len(pattern) or pattern[q] != key):
            q = fail[q - 1]
        if pattern[q] == key:
            q += 1
    return q


def _key(m: Message, timed: bool) -> tuple[Any, ...]:
    """What an export round-trips of a message, as stored (metadata as its JSON)."""
    meta = json.dumps(m.metadata, ensure_ascii=False, sort_keys=True) if m.metadata else None
    when = format_time(m.timestamp) if timed and m.timestamp is not None else None
    return (m.role, m.content, m.name, meta, when)


def session_record(info: SessionInfo) -> dict[str, Any]:
    """A session's info as a JSON-ready record: `memcli inspect`'s summary, the agent tools'."""
    return {
        "session": info.id,
        "user": info.user_id,
        "active_messages": info.active_messages,
        "archived_messages": info.archived_messages,
        "active_tokens": info.active_tokens,
        "threshold": info.threshold,
        "token_limit": info.token_limit,
        "flush_size": info.token_flush_size,
        "ratio": info.chat_history_token_ratio,
        "flushes": info.flushes,
        "created_at": format_time(info.created_at),
        "updated_at": format_time(info.updated_at),
    }


@dataclass(frozen=True)
class Report:
    """A session as `memcli inspect` shows it: its info, its messages and its flushes."""

    info: SessionInfo
    messages: list[Message]
    flushes: list[FlushRecord]
    what_if: WhatIf | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "type": "summary",
            **session_record(self.info),
            "flushes": len(self.flushes),
            **({"what_if": self.what_if.to_dict()} if self.what_if else {}),
        }

    def records(self) -> list[dict[str, Any]]:
        """The messages, the flushes, then the summary, as JSON Lines records."""
        out: list[dict[str, Any]] = [
            {"type": "message", **m.to_dict(stored=True)} for m in self.messages
        ]
        out += [
            {
                "type": "flush",
                "id": f.id,
                "created_at": f.created_at,
                "messages": f.messages,
                "tokens": f.tokens,
                "first_message_id": f.first_message_id,
                "last_message_id": f.last_message_id,
                "reason": f.reason,
            }
            for f in self.flushes
        ]
        out.append(self.summary())
        return out


def report(
    store: Store, session_id: str, *, archived: bool = False, budget: Budget | None = None
) -> Report:
    """A stored session's report: its active messages (every message with `archived`); with
    `budget`, what the session would flush under that budget now (nothing is stored)."""
    info = require(store, session_id)
    messages = store.get_messages(session_id, status=None if archived else "active")
    what_if = None
    if budget is not None:
        from memcli.flush import plan_flush

        window = store.active_window(session_id)
        batches = plan_flush(
            [e.role for e in window],
            [e.tokens for e in window],
            budget.threshold,
            budget.flush_size,
        )
        what_if = WhatIf(
            budget, len(batches), sum(b.count for b in batches), sum(b.tokens for b in batches)
        )
    return Report(info, messages, store.list_flushes(session_id), what_if)


@dataclass(frozen=True)
class WhatIf:
    """A budget a reading command was asked to show, and what the session would flush under it
    now: how many flushes, messages and tokens (`--rebudget` would do exactly that)."""

    budget: Budget
    flushes: int
    messages: int
    tokens: int

    def to_dict(self) -> dict[str, Any]:
        b = self.budget
        return {
            "token_limit": b.token_limit,
            "ratio": b.chat_history_token_ratio,
            "flush_size": b.flush_size,
            "threshold": b.threshold,
            "flushes": self.flushes,
            "messages": self.messages,
            "tokens": self.tokens,
        }


def blocks_view(
    store: Store,
    session_id: str | None,
    *,
    user: str,
    blocks: Sequence[MemoryBlock],
    tokenizer: Tokenizer,
    token_limit: int | None,
    insert_method: str = "system",
    input: str | None = None,
) -> Context:
    """What the blocks hold for a stored session, or with `session_id=None` for `user` with an
    empty chat history (nothing is stored): the context `get(input)` would assemble.

    `token_limit` is what the blocks are truncated to: for a stored session, None is its own
    and another is a what-if (nothing is stored); with no session it must be given."""
    from memcli.blocks.base import BlockContext
    from memcli.memory import assemble

    if session_id is not None:
        memory = open_stored(store, session_id, blocks, tokenizer, insert_method)
        if token_limit is None or token_limit == memory.token_limit:
            return memory.context(input)
        active = memory.get_all(status="active")
        return assemble(blocks, active, input, memory.block_context(), token_limit, insert_method)
    if token_limit is None:
        raise UsageError("a token limit is needed for the blocks of no session", "Pass one")
    return assemble(blocks, [], input, BlockContext("", user, store, tokenizer), token_limit)


def open_stored(
    store: Store,
    session_id: str,
    blocks: Sequence[MemoryBlock],
    tokenizer: Tokenizer,
    insert_method: str = "system",
) -> Memory:
    """The Memory of a stored session (SessionNotFound when there is none), as its user's."""
    from memcli.memory import Memory

    info = require(store, session_id)
    return Memory(
        store,
        session_id,
        user_id=info.user_id,
        tokenizer=tokenizer,
        memory_blocks=blocks,
        insert_method=insert_method,
    )
