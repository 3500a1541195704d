"""The facts service: one user's facts as every front end reaches them.

`memcli facts`, the memory tools an agent calls (`AgentTools`: `memcli mcp`, `memcli chat
--memory-tools`), the chat's `/facts` and `Memory`'s fact methods go through `Facts` and nothing
else: list_facts, get, add, edit, delete, restore, history, entities, search (by words and
meaning; `find` by words), remember (a text, now) and extract. It checks what it is given (a fact's text and topics, an expiry, a search) and who owns
the fact an id names; the SQL is `memcli.store.facts`'.

Who may touch which fact is one explicit parameter, `owner`: a user's name (that user's facts
only; another user's fact is "no fact N", as an unknown session is not found; by default the
service's `user`), or None (any user's: `memcli facts` without `--user`). A fact belongs to a user when its scope is theirs
(`user:ID`) or one of their sessions' (`session:ID`). Lists, adds and searches address `user`'s
scope, or one session's.

`fact_record` and `change_record` are the shapes a fact and a change are shown in (`--json`,
MCP, the chat's tools).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memcli.errors import InputError, MemcliError, SessionNotFound, UsageError
from memcli.messages import check_text, format_time, session_name
from memcli.search.types import MAX_HITS
from memcli.search.types import MODES as SEARCH_MODES
from memcli.store import facts as fact_store
from memcli.store.facts import Fact, FactChange
from memcli.words import SET_MODEL

if TYPE_CHECKING:
    from memcli.blocks.base import MemoryBlock
    from memcli.blocks.conversations import ExtractionPlan
    from memcli.blocks.facts import FactBlock
    from memcli.blocks.feed import FeedResult
    from memcli.search.embedder import Embedder
    from memcli.search.facts import FactVectors
    from memcli.store.base import SessionInfo, Store
    from memcli.tokens import Tokenizer


@dataclass(frozen=True)
class Remembered:
    """What extracting the facts of a text changed (`Facts.remember`): the facts added, and
    those it superseded or retired (as they are now), each oldest first."""

    added: list[Fact]
    changed: list[Fact]


@dataclass(frozen=True)
class AddedFact:
    """A fact given to `add`: the fact stored, or the current one it duplicates (`added`
    False)."""

    fact: Fact
    added: bool


@dataclass(frozen=True)
class UpdatedFact:
    """A fact whose text was changed: as it was, and as it is."""

    before: Fact
    fact: Fact


@dataclass(frozen=True)
class RestoredFact:
    """An older version made current again, and the facts it superseded in turn."""

    fact: Fact
    superseded: list[Fact]


@dataclass(frozen=True)
class FactHistory:
    """A fact's versions (the facts it superseded and that superseded it, oldest first; none for
    a scope's whole history) and the changes to them, oldest first."""

    versions: list[Fact]
    changes: list[FactChange]


class _User:
    """The default `owner` of a Facts: its `user` (None means any user's)."""


_USER = _User()


class Facts:
    """The facts of `user` in `store`, for one front end.

    `blocks` are the long-term blocks (a list; or a function giving a session's, None: the
    user's, as the commands build them): a new fact goes to the first fact block (or the one
    named), `extract` and `remember` run the fact blocks with a model. `owner` is whose facts
    the methods taking a fact id may read and change: a user (by default `user`), or None for
    any user's (see the module docstring). `origin` is what the fact history records for the
    changes made here (`memcli.store.facts.ORIGINS`: manual, mcp, chat-tool, api). `embedder()` gives the model a search by meaning uses (made on
    the first such search); without one, a search ranks by words. `hint` ends a "no fact N"
    error: where to see the ids.
    """

    def __init__(
        self,
        store: Store,
        user: str,
        blocks: Callable[[str | None], Sequence[MemoryBlock]] | Sequence[MemoryBlock] = (),
        *,
        owner: str | None | _User = _USER,
        origin: str = "api",
        embedder: Callable[[], Embedder] | None = None,
        hint: str = "List the facts to see their ids",
    ) -> None:
        self.store = store
        self.user = user
        if not callable(blocks):
            given = list(blocks)
            blocks = lambda _session: given  # noqa: E731 (the same blocks for every session)
        self.blocks: Callable[[str | None], Sequence[MemoryBlock]] = blocks
        self.owner: str | None = user if isinstance(owner, _User) else owner
        self.origin = origin
        self.embedder = embedder
        self.hint = hint
        self._vectors: FactVectors | None = None

    def scope_key(self, session: str | None = None) -> str:
        """The scope a list, add or search addresses: the session's (`session` is its key, a
        `SessionInfo.id`: a stored one of the owner's, else SessionNotFound), else the user's."""
        if session is None:
            return f"user:{self.user}"
        return f"session:{self._session(session).id}"

    def _session(self, key: str) -> SessionInfo:
        """The session stored under `key`, when it is the owner's (with no owner: anyone's);
        SessionNotFound naming it otherwise (another user's is not told from none)."""
        info = self.store.get_session(key)
        if info is None or info.user_id != (self.owner or info.user_id):
            raise SessionNotFound(session_name(key), self.owner)
        return info

    # -- reading ----------------------------------------------------------------------------

    def list_facts(
        self,
        *,
        session: str | None = None,
        block: str | None = None,
        topic: str | None = None,
        entity: str | None = None,
        everything: bool = False,
    ) -> list[Fact]:
        """The current facts of the scope (of one block, topic or entity, or any), oldest
        first; with `everything`, the superseded, retired, expired and deleted ones too."""
        return fact_store.list_facts(
            self.store,
            block,
            self.scope_key(session),
            topic,
            everything=everything,
            entity=entity,
        )

    def of_blocks(self, session: str) -> list[tuple[str, list[Fact]]]:
        """Each fact block of the session with its current facts, each in
        the block's own scope (the user's, or the session's for a session-scoped block)."""
        return [
            (b.name, fact_store.list_facts(self.store, b.name, b.key_for(session, self.user)))
            for b in fact_blocks(self.blocks(session))
        ]

    def find(
        self,
        query: str,
        *,
        session: str | None = None,
        block: str | None = None,
        topic: str | None = None,
    ) -> list[Fact]:
        """The current facts whose text holds every word of `query`, ignoring case, oldest
        first."""
        if not query.split():
            raise UsageError("the query is empty", "Give the words to look for")
        return fact_store.find_facts(self.store, block, self.scope_key(session), query, topic)

    def search(
        self,
        query: str,
        k: int = 10,
        mode: str = "hybrid",
        *,
        session: str | None = None,
        block: str | None = None,
        entity: str | None = None,
    ) -> list[tuple[Fact, float]]:
        """The `k` current facts best matching `query` by words and meaning (`mode`: hybrid,
        lexical or vector; facts about an entity the query names first), best first, with
        their scores."""
        from memcli.search.facts import search_facts

        check_search(query, k, mode)
        key = self.scope_key(session)
        vectors = self.vectors() if mode != "lexical" else None
        return search_facts(self.store, key, query, k, vectors, mode, block=block, entity=entity)

    def vectors(self) -> FactVectors | None:
        """The facts' vectors (the embedder's model, loaded on first use), kept between calls;
        None without an embedder."""
        if self._vectors is None and self.embedder is not None:
            from memcli.search.facts import FactVectors

            self._vectors = FactVectors(self.embedder())
        return self._vectors

    def entities(
        self, *, session: str | None = None, block: str | None = None
    ) -> list[tuple[str, int]]:
        """The entities the current facts name, each with how many facts name it, most first."""
        return fact_store.entity_counts(self.store, self.scope_key(session), block)

    def get(self, fact_id: int) -> Fact:
        """The fact of that id, whatever its state, if the owner's (see `owner`)."""
        fact = fact_store.get_fact(self.store, fact_id)
        if fact is None or not self._owns(fact):
            raise self._no_fact(fact_id)
        return fact

    def history(self, fact_id: int | None = None, *, session: str | None = None) -> FactHistory:
        """Every change to the scope's facts, oldest first; for one fact (the owner's), the
        changes of all its versions, and the versions."""
        if fact_id is None:
            return FactHistory([], fact_store.fact_history(self.store, self.scope_key(session)))
        fact = self.get(fact_id)
        chain = fact_store.fact_chain(self.store, fact_id)
        ids = [f.id for f in chain]
        return FactHistory(chain, fact_store.fact_history(self.store, fact.scope_key, fact_ids=ids))

    # -- changing ---------------------------------------------------------------------------

    def add(
        self,
        text: str,
        *,
        session: str | None = None,
        block: str | None = None,
        topics: Sequence[str] | None = None,
        entities: Sequence[str] | None = None,
        expires: str | datetime | None = None,
    ) -> tuple[Fact, bool]:
        """Add a fact to the scope (to `block`, a fact block of the session's or user's, default
        the first), with its topics, entities and expiry (a date, an ISO time, or a datetime).
        Return it and whether it was added: a duplicate of a current fact (ignoring case and
        spaces) is not, and the known one is returned."""
        check_fact_text(text, "Give the fact's text", topics)
        for i, name in enumerate(entities or []):
            check_text(name, f"entity {i}")
        expires_at = parse_expiry(expires) if isinstance(expires, str) else expires
        key = self.scope_key(session)
        name = fact_block_name(self.blocks(session), block, strict=True)
        added = fact_store.add_facts(
            self.store,
            name,
            key,
            [text],
            origin=self.origin,
            topics=[list(topics or [])],
            entities=[list(entities or [])],
            expires_at=expires_at,
        )
        if added:
            return added[0], True
        norm = fact_store.normalize_fact(text)
        known = next(
            f
            for f in fact_store.list_facts(self.store, name, key)
            if fact_store.normalize_fact(f.text) == norm
        )
        return known, False

    def edit(
        self, fact_id: int, text: str, topics: Sequence[str] | None = None
    ) -> tuple[Fact, Fact]:
        """Change the text of one of the owner's facts (and its topics, when given; else they
        stay); return it before and after. The old text and topics stay in its history."""
        check_fact_text(text, "Give the new text, or delete the fact", topics)
        self.live(fact_id)
        changed = fact_store.edit_fact(self.store, fact_id, text, topics, origin=self.origin)
        assert changed is not None  # (a live fact: `live` found it)
        return changed

    def delete(self, fact_ids: Sequence[int]) -> list[Fact]:
        """Delete the owner's facts of these ids, all or none (each kept in the history as
        deleted); return them as they are now."""
        removed = []
        with self.store.transaction():
            for fact_id in dict.fromkeys(fact_ids):
                self.live(fact_id)
                deleted = fact_store.delete_fact(self.store, fact_id, origin=self.origin)
                assert deleted is not None  # (a live fact: `live` found it)
                removed.append(deleted)
        return removed

    def delete_all(self, *, keep_history: bool = False) -> int:
        """Forget all the user's facts (theirs and their sessions'): gone with their history,
        or with `keep_history` marked deleted and kept in it. Return how many were live."""
        sessions = self.store.list_sessions(self.user)
        keys = [self.scope_key()] + [f"session:{i.id}" for i in sessions]
        return fact_store.forget_facts(
            self.store, keys, keep_history=keep_history, origin=self.origin
        )

    def restore(self, fact_id: int) -> tuple[Fact, list[Fact]]:
        """Make an older version of one of the owner's facts current again (a new change in its
        history); return it and the facts it superseded in turn (the one that superseded it)."""
        self.get(fact_id)
        return fact_store.restore_fact(self.store, fact_id, origin=self.origin)

    def extraction_plan(
        self, tokenizer: Tokenizer, session: str | None = None, *, dry_run: bool = False
    ) -> tuple[list[FactBlock], ExtractionPlan]:
        """The fact blocks with a model, and what they have not read of the user's stored
        conversations (or of one `session`): archived batches not processed and active messages
        never read, in batches, with the requests and `tokenizer` tokens (cl100k) extraction
        would send (`blocks.conversations.plan_extraction`). Nothing is sent. UsageError when no
        fact block with a model is configured (with `dry_run`, a fact block without one is
        planned for too: counting needs no model); SessionNotFound for a session not the user's."""
        from memcli.blocks.conversations import plan_extraction

        blocks, sessions = self._extracting(session, need_model=not dry_run)
        return blocks, plan_extraction(self.store, blocks, sessions, tokenizer)

    def extract(
        self,
        tokenizer: Tokenizer,
        *,
        pending: bool = False,
        session: str | None = None,
        plan: ExtractionPlan | None = None,
        progress: Callable[[int], None] | None = None,
        on_total: Callable[[int], None] | None = None,
    ) -> FeedResult:
        """Read what the fact blocks with a model have not read of the user's stored
        conversations (or of one `session`), active messages included, one request per batch,
        each recorded as it is done: a second run sends nothing, an interrupted one goes on
        where it stopped (`blocks.conversations.read_batches`). `plan`: the one
        `extraction_plan` returned (else made here); `on_total(n)` is told the batches first,
        `progress(1)` after each. With `pending`, only the batches whose extraction failed
        before are retried. UsageError when no fact block with a model is configured."""
        from memcli.blocks.conversations import read_batches
        from memcli.blocks.facts import extract_pending

        if pending:
            blocks, sessions = self._extracting(session)
            return extract_pending(self.store, blocks, sessions, tokenizer)
        if plan is None:
            plan = self.extraction_plan(tokenizer, session)[1]
        if on_total is not None:
            on_total(len(plan.batches))
        return read_batches(self.store, plan.blocks, plan, tokenizer, progress)

    def _extracting(
        self, session: str | None, *, need_model: bool = True
    ) -> tuple[list[FactBlock], list[SessionInfo]]:
        """The fact blocks with a model (of `session`'s blocks, else the user's), and the
        sessions to read: the user's, or `session` when it is theirs (with no owner: anyone's)."""
        if session is not None:
            sessions = [self._session(session)]
        else:
            sessions = self.store.list_sessions(self.user)
        blocks = fact_blocks(self.blocks(session))
        if not any(b.llm for b in blocks) and (need_model or not blocks):
            raise UsageError(
                "no fact block is configured" if not blocks else "no model is configured for facts",
                f'Set a model: {SET_MODEL}; or add a [[blocks]] kind = "facts" with a model',
            )
        return [b for b in blocks if b.llm or not need_model], sessions

    def remember(self, text: str, tokenizer: Tokenizer) -> Remembered:
        """Extract the facts in `text` now: each of the user's fact blocks that has a model (and
        is the user's, not a session's) reads it as one user message of no session, as it reads
        a flushed batch; the changes are recorded with this service's `origin`. Return the
        facts added and those superseded or retired. UsageError when no such block is
        configured; ProviderError when the model fails (nothing stored)."""
        from memcli.blocks.base import BlockContext
        from memcli.errors import ProviderError
        from memcli.messages import Message

        blocks = [b for b in fact_blocks(self.blocks(None)) if b.llm and b.scope != "session"]
        if not blocks:
            raise UsageError(
                "no fact block of the user's with a model is configured, so no facts can be"
                " extracted",
                "Add the facts yourself (add_fact), or configure a model for the fact blocks",
            )
        check_text(text, "the text")
        before = {f.id: f.status() for f in self.list_facts(everything=True)}
        batch = [Message("user", text)]
        for block in blocks:
            ctx = BlockContext("", self.user, self.store, tokenizer)
            reason = block.extract(batch, ctx, origin=self.origin)
            if reason is not None:
                raise ProviderError(f"the facts could not be extracted: {reason}", "Try again")
        after = self.list_facts(everything=True)
        return Remembered(
            added=[f for f in after if f.id not in before],
            changed=[f for f in after if f.id in before and f.status() != before[f.id]],
        )

    # -- ownership --------------------------------------------------------------------------

    def live(self, fact_id: int) -> Fact:
        """The fact of that id, not deleted, if the owner's; MemcliError (exit 1, as an unknown
        session) naming it otherwise. The owner's deleted fact is said to be deleted; another
        user's, deleted or not, is no fact."""
        fact = self.get(fact_id)
        if fact.deleted_at is not None:
            raise MemcliError(
                f"fact {fact_id}{self._of()} is deleted (its history stays)", self.hint
            )
        return fact

    def _owns(self, fact: Fact) -> bool:
        return self.owner is None or fact_owner(self.store, fact) == self.owner

    def _of(self) -> str:
        return f" of user {self.owner!r}" if self.owner is not None else ""

    def _no_fact(self, fact_id: int) -> MemcliError:
        return MemcliError(f"no fact {fact_id}{self._of()}", self.hint)


def fact_owner(store: Store, fact: Fact) -> str | None:
    """The user a fact belongs to: its user scope, or its session's user."""
    kind, _, key = fact.scope_key.partition(":")
    if kind == "user":
        return key
    info = store.get_session(key) if kind == "session" else None
    return None if info is None else info.user_id


# -- checks -----------------------------------------------------------------------------------


def check_search(query: str, k: int, mode: str) -> None:
    """A search's query, hit count and mode (UsageError): what the search tools and `memcli
    facts --query` take."""
    if not query.strip():
        raise UsageError("the query is empty", "Give the words to look for")
    if mode not in SEARCH_MODES:
        raise UsageError(f"unknown search mode {mode!r}", f"Use one of: {', '.join(SEARCH_MODES)}")
    if not 1 <= k <= MAX_HITS:
        raise UsageError(f"k must be 1 to {MAX_HITS}, not {k}", "Ask for fewer hits")
    check_text(query, "the query")


def check_fact_text(text: str, hint: str, topics: Sequence[str] | None = None) -> None:
    """A fact's text is not empty, at most MAX_FACT_CHARS characters and, with its topics, valid
    Unicode; UsageError (empty, too long) or InputError (naming the bad byte) otherwise. Text
    that was not UTF-8 reaches Python with its bad bytes as lone surrogates (U+DC80-U+DCFF, as
    `surrogateescape` decodes a command-line argument), which no store keeps."""
    _check_unicode(text)
    if not text.strip():
        raise UsageError("the fact is empty", hint)
    limit = fact_store.MAX_FACT_CHARS
    if len(text.strip()) > limit:
        raise UsageError(
            f"the fact is {len(text.strip()):,} characters long; at most {limit:,}",
            "Keep a fact to a sentence or two",
        )
    for i, topic in enumerate(topics or []):
        check_text(topic, f"topic {i}")


def _check_unicode(text: str) -> None:
    try:
        check_text(text, "the fact's text")
    except InputError as error:
        try:
            raw = text.encode("utf-8", "surrogateescape")
            raw.decode("utf-8")
        except UnicodeEncodeError:  # a surrogate no byte stands for: check_text's message
            raise error from None
        except UnicodeDecodeError as exc:
            raise InputError(
                f"the fact's text is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte"
                f" {exc.start})",
                "Give the text in UTF-8",
            ) from None
        raise


def parse_expiry(value: str) -> datetime:
    """An expiry as given: a date (YYYY-MM-DD: midnight UTC, when that day starts) or an ISO 8601
    time (a naive one taken as UTC); UsageError otherwise."""
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"not a date or time: {value!r}", "Give a date (2026-12-31) or an ISO 8601 time"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


# -- which block ------------------------------------------------------------------------------


def fact_blocks(blocks: Sequence[MemoryBlock]) -> list[FactBlock]:
    """The fact blocks among `blocks`, in order."""
    from memcli.blocks.facts import FactBlock

    return [b for b in blocks if isinstance(b, FactBlock)]


def fact_block_name(
    blocks: Sequence[MemoryBlock], block: str | None = None, *, strict: bool = False
) -> str:
    """Which fact block a new fact goes to: the named block, else the first fact block of
    `blocks`, else the default fact block's name. With `strict`, a named block must be one of
    the fact blocks of `blocks` (or, when there are none, the default's name): UsageError."""
    from memcli.blocks.facts import FactBlock

    names = [b.name for b in fact_blocks(blocks)]
    if block is not None:
        if strict and block not in (names or [FactBlock.name]):
            raise UsageError(
                f"no fact block {block!r}",
                f"The fact blocks are: {', '.join(names or [FactBlock.name])}",
            )
        return block
    return next(iter(names), FactBlock.name)


# -- the shapes they are shown in -------------------------------------------------------------


def fact_record(f: Fact) -> dict[str, Any]:
    """A fact as a JSON-ready dict: what `memcli facts --json`, MCP and the chat's tools show.
    `state` is its status now (current, superseded, retired, expired, deleted)."""

    def time(value: datetime | None) -> str | None:
        return None if value is None else format_time(value)

    return {
        "id": f.id,
        "block": f.block,
        "text": f.text,
        "topics": f.topics,
        "entities": f.entities,
        "state": f.status(),
        "superseded_by": f.superseded_by,
        "reason": f.reason,
        "valid_from": time(f.valid_from or f.created_at),
        "expires_at": time(f.expires_at),
        "origin": f.origin,
        "session": session_name(f.session_id) if f.session_id else None,
        "flush_id": f.flush_id,
        "message_ids": f.message_ids,
        "created_at": format_time(f.created_at),
        "updated_at": format_time(f.updated_at),
    }


def change_record(c: FactChange) -> dict[str, Any]:
    """One change of a fact's history as a JSON-ready dict (`memcli facts history --json`)."""
    return {
        "id": c.id,
        "fact_id": c.fact_id,
        "action": c.action,
        "text": c.text,
        "old_text": c.old_text,
        "topics": c.topics,
        "old_topics": c.old_topics,
        "reason": c.reason,
        "origin": c.origin,
        "flush_id": c.flush_id,
        "at": format_time(c.at),
    }
