"""memcli's memory as tools an agent calls (`memcli mcp` serves them over MCP, `memcli chat
--memory-tools` offers them to the chat's model): search memory, list, add, update and delete a
user's facts, read a session's context, put messages into a session, and list and read sessions.

`AgentTools` holds them as methods: each takes JSON-ready arguments and returns JSON-ready data;
a refusal is a MemcliError (message and hint), and nothing is stored when one is raised.
`tool_functions` gives them as plain functions whose names, signatures and docstrings are the one
definition of the tools, from which the MCP SDK derives the schemas `memcli mcp` serves and
`ToolSet` the same schemas in OpenAI's format; `ToolSet.call` runs a model's tool call, its JSON
arguments checked first.

Everything runs as the commands run it: search through the same Retriever as `memcli search`,
facts through `memcli.store.longterm` in the user's scope (as `memcli facts`), the context as
`memcli dump context` shows it, puts through `Memory.put_messages` (flushes, then the blocks).
Only the user's own sessions and facts are visible: another user's session is not found.

The facts' helpers every front end (`memcli facts`, these tools, the chat's `/facts`) shares live
here too: `fact_record` (a fact as a dict), `fact_block_name` / `fact_blocks` (which fact block),
`check_fact_text` (a fact's text and topics are valid), `live_fact` (a fact that is a user's).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, get_type_hints

from memcli.errors import InputError, MemcliError, UsageError
from memcli.messages import Message, check_text, format_time, validate_session_id
from memcli.search.types import MAX_HITS
from memcli.search.types import MODES as SEARCH_MODES
from memcli.sessions import session_record
from memcli.store.base import require_session

if TYPE_CHECKING:
    from pydantic import Field

    from memcli.blocks.background import Background
    from memcli.blocks.base import MemoryBlock
    from memcli.blocks.facts import FactBlock
    from memcli.config import Settings
    from memcli.search.facts import FactVectors
    from memcli.search.retriever import Retriever
    from memcli.store.base import Store
    from memcli.store.longterm import Fact, FactChange
    from memcli.tokens import Tokenizer
    from memcli.tool_params import (
        BlockArg,
        EntitiesArg,
        EntityArg,
        ExpiresArg,
        FactId,
        FactText,
        Hits,
        Mode,
        Query,
        SessionArg,
        TopicsArg,
    )


def _check_search(query: str, k: int, mode: str) -> None:
    """A search's query, hit count and mode, as the search tools take them (UsageError)."""
    if not query.strip():
        raise UsageError("the query is empty", "Give words to look for")
    if mode not in SEARCH_MODES:
        raise UsageError(f"unknown search mode {mode!r}", f"Use one of: {', '.join(SEARCH_MODES)}")
    if not 1 <= k <= MAX_HITS:
        raise UsageError(f"k must be 1 to {MAX_HITS}, not {k}", "Ask for fewer hits")
    check_text(query, "the query")


@dataclass
class AgentTools:
    """The tools, for one user of one store.

    `blocks(session)` builds the long-term blocks of a session (None: of the user), as the
    commands do; `retriever()` builds the search's Retriever (called once, on the first
    search). `origin` is what the fact history records for the changes made through these
    tools (`memcli.store.longterm.ORIGINS`: mcp, chat-tool; api for a Python caller). Calls are
    serialised: one store connection serves them all.
    """

    store: Store
    settings: Settings
    user: str
    blocks: Callable[[str | None], Sequence[MemoryBlock]] = field(default=lambda _: ())
    retriever: Callable[[], Retriever] | None = None
    origin: str = "api"
    #: Where put_messages hands the flushed batches (fed beside the calls); None: fed at once.
    background: Background | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _retriever: Retriever | None = field(default=None, repr=False)
    _tokenizer: Tokenizer | None = field(default=None, repr=False)
    _vectors: FactVectors | None = field(default=None, repr=False)

    @property
    def scope_key(self) -> str:
        return f"user:{self.user}"

    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            from memcli.tokens import TiktokenTokenizer

            self._tokenizer = TiktokenTokenizer(self.settings.encoding)
        return self._tokenizer

    # -- search -------------------------------------------------------------------------------

    def search(
        self, query: str, k: int = 5, session: str | None = None, mode: str = "hybrid"
    ) -> list[dict[str, Any]]:
        """The best `k` hits for `query` among the user's messages (or one session's), best
        first: `hybrid` (words and meaning), `lexical` (words only, no model) or `vector`."""
        _check_search(query, k, mode)
        with self._lock:
            if session is not None:
                validate_session_id(session)
                self._session(session)
            result = self._search_retriever().search(
                query,
                k=k,
                user_id=self.user,
                session_id=session,
                mode=mode,
            )
        return [hit.to_dict() for hit in result.hits]

    def prepare(self) -> None:
        """Load what the first search needs (its retriever and embedding model) now, ahead of
        it (a server calls this on a thread of its own at start)."""
        with self._lock:
            self._search_retriever().embedder.embed(["warm up"])

    def _search_retriever(self) -> Retriever:
        if self._retriever is None:
            if self.retriever is not None:
                self._retriever = self.retriever()
            else:
                from memcli.search import OnnxEmbedder, Retriever, SearchOptions

                self._retriever = Retriever(
                    self.store,
                    OnnxEmbedder(self.settings.home / "models"),
                    SearchOptions.from_settings(self.settings),
                    self.settings.home / "indexes",
                )
        return self._retriever

    # -- facts --------------------------------------------------------------------------------

    def list_facts(
        self,
        block: str | None = None,
        topic: str | None = None,
        entity: str | None = None,
        everything: bool = False,
    ) -> list[dict[str, Any]]:
        """The user's current facts (of one block, or of every block; of one topic, about one
        entity, or any), oldest first; with `everything`, the superseded, retired, expired and
        deleted ones too, each with its `state`."""
        from memcli.store import longterm

        with self._lock:
            return [
                fact_record(f)
                for f in longterm.list_facts(
                    self.store, block, self.scope_key, topic, everything=everything, entity=entity
                )
            ]

    def search_facts(
        self, query: str, k: int = 10, mode: str = "hybrid", entity: str | None = None
    ) -> list[dict[str, Any]]:
        """The user's current facts best matching `query` by words and meaning (facts whose
        entities the query names first), best first, each with its `score`."""
        from memcli.search.facts import search_facts

        _check_search(query, k, mode)
        with self._lock:
            vectors = self.fact_vectors() if mode != "lexical" else None
            found = search_facts(self.store, self.scope_key, query, k, vectors, mode, entity=entity)
            return [{**fact_record(f), "score": round(score, 6)} for f, score in found]

    def fact_vectors(self) -> FactVectors:
        """The facts' vectors (the bundled model, loaded on first use), kept between calls."""
        if self._vectors is None:
            from memcli.search import OnnxEmbedder
            from memcli.search.facts import FactVectors

            self._vectors = FactVectors(OnnxEmbedder(self.settings.home / "models"))
        return self._vectors

    def get_fact(self, fact_id: int) -> dict[str, Any]:
        """One of the user's facts, whatever its state (current, superseded, ...)."""
        with self._lock:
            return fact_record(self._any_fact(fact_id))

    def fact_history(self, fact_id: int) -> dict[str, Any]:
        """A fact's versions (the facts it superseded and that superseded it, oldest first) and
        every change to them, oldest first, each with its reason."""
        from memcli.store import longterm

        with self._lock:
            fact = self._any_fact(fact_id)
            chain = longterm.fact_chain(self.store, fact_id)
            changes = longterm.fact_history(
                self.store, fact.scope_key, fact_ids=[f.id for f in chain]
            )
            return {
                "versions": [fact_record(f) for f in chain],
                "changes": [change_record(c) for c in changes],
            }

    def restore_fact(self, fact_id: int) -> dict[str, Any]:
        """Make an older version of one of the user's facts current again (a new change in its
        history); the fact that superseded it is superseded by it in turn."""
        from memcli.store import longterm

        with self._lock:
            self._any_fact(fact_id)
            restored, displaced = longterm.restore_fact(self.store, fact_id, origin=self.origin)
            return {
                "fact": fact_record(restored),
                "superseded": [fact_record(f) for f in displaced],
            }

    def delete_all_facts(self, keep_history: bool = False) -> dict[str, Any]:
        """Forget all the user's facts (theirs and their sessions'): gone with their history, or
        with `keep_history` marked deleted and kept in it."""
        from memcli.store import longterm

        with self._lock:
            keys = [self.scope_key] + [
                f"session:{i.id}" for i in self.store.list_sessions(self.user)
            ]
            count = longterm.forget_facts(
                self.store, keys, keep_history=keep_history, origin=self.origin
            )
            return {"forgotten": count, "history_kept": keep_history}

    def list_entities(self) -> list[dict[str, Any]]:
        """The entities the user's current facts name, each with how many facts name it, most
        first."""
        from memcli.store import longterm

        with self._lock:
            return [
                {"entity": name, "facts": count}
                for name, count in longterm.entity_counts(self.store, self.scope_key)
            ]

    def add_fact(
        self,
        text: str,
        block: str | None = None,
        topics: list[str] | None = None,
        entities: list[str] | None = None,
        expires: str | None = None,
    ) -> dict[str, Any]:
        """Add a fact to the user's facts (to `block`, a configured fact block, default the
        first), with its `topics`, `entities` and expiry (`expires`: a date or an ISO time); a
        duplicate of a current fact (ignoring case and spaces) is not added: `added` is false
        and `fact` the known one."""
        from memcli.store import longterm

        check_fact_text(text, "Give the fact's text", topics)
        for i, name in enumerate(entities or []):
            check_text(name, f"entity {i}")
        expires_at = parse_expiry(expires) if expires is not None else None
        with self._lock:
            name = fact_block_name(self.blocks(None), block, strict=True)
            added = longterm.add_facts(
                self.store,
                name,
                self.scope_key,
                [text],
                origin=self.origin,
                topics=[topics or []],
                entities=[entities or []],
                expires_at=expires_at,
            )
            if added:
                return {"added": True, "fact": fact_record(added[0])}
            norm = longterm.normalize_fact(text)
            known = next(
                f
                for f in longterm.list_facts(self.store, name, self.scope_key)
                if longterm.normalize_fact(f.text) == norm
            )
            return {"added": False, "fact": fact_record(known)}

    def update_fact(
        self, fact_id: int, text: str, topics: list[str] | None = None
    ) -> dict[str, Any]:
        """Change the text of one of the user's facts (and its topics, when given; else they
        stay); the old text and topics stay in its history."""
        from memcli.store import longterm

        check_fact_text(text, "Give the new text, or delete the fact", topics)
        with self._lock:
            self._fact(fact_id)
            changed = longterm.edit_fact(
                self.store, fact_id, text, topics=topics, origin=self.origin
            )
            assert changed is not None
            return {"before": fact_record(changed[0]), "fact": fact_record(changed[1])}

    def delete_fact(self, fact_id: int) -> dict[str, Any]:
        """Delete one of the user's facts (kept in the history as deleted)."""
        from memcli.store import longterm

        with self._lock:
            with self.store.transaction():
                self._fact(fact_id)
                deleted = longterm.delete_fact(self.store, fact_id, origin=self.origin)
            assert deleted is not None  # (a live fact of the user's: `_fact` found it)
            return {"deleted": fact_record(deleted)}

    def _fact(self, fact_id: int) -> Fact:
        """The live fact of that id, if it is the user's (theirs, or of one of their sessions)."""
        return live_fact(self.store, fact_id, self.user, "List the facts to see their ids")

    def _any_fact(self, fact_id: int) -> Fact:
        """The fact of that id in any state, if it is the user's."""
        from memcli.store import longterm

        fact = longterm.get_fact(self.store, fact_id)
        if fact is None or fact_owner(self.store, fact) != self.user:
            raise MemcliError(
                f"no fact {fact_id} of user {self.user!r}", "List the facts to see their ids"
            )
        return fact

    # -- sessions -----------------------------------------------------------------------------

    def sessions(self) -> list[dict[str, Any]]:
        """The user's sessions, with their counts and budgets."""
        with self._lock:
            return [session_record(i) for i in self.store.list_sessions(self.user)]

    def session(self, session: str) -> dict[str, Any]:
        """One of the user's sessions: its info and its active messages, oldest first."""
        with self._lock:
            info = self._session(session)
            messages = self.store.get_messages(session, status="active")
            return {
                **session_record(info),
                "messages": [m.to_dict(stored=True) for m in messages],
            }

    def context(self, session: str, input: str | None = None) -> list[dict[str, Any]]:
        """The messages `Memory.get(input)` returns for the session (what `memcli dump context`
        shows): its active window with long-term memory inserted. Nothing is stored."""
        from memcli.sessions import blocks_view

        with self._lock:
            self._session(session)
            context = blocks_view(
                self.store,
                session,
                user=self.user,
                blocks=self.blocks(session),
                tokenizer=self.tokenizer(),
                token_limit=None,
                insert_method=self.settings.insert_method,
                input=input,
            )
            return [m.to_dict() for m in context.messages]

    def put_messages(self, messages: Any, session: str | None = None) -> dict[str, Any]:
        """Store messages (`{"role", "content"}` objects, optional name, metadata, timestamp)
        in the session, as one `Memory.put_messages` call: it flushes when over budget and feeds
        the flushed batches to the long-term blocks. A new session (or none given: a new id) is
        the user's, with the settings' budget. Every message is checked before anything is
        stored: a bad one is an InputError naming it."""
        from memcli.memory import Memory
        from memcli.sessions import budget_for, default_budget, owned

        parsed = parse_messages(messages)
        if session is not None:
            validate_session_id(session, "session")
        with self._lock:
            if session is not None:
                info = owned(
                    self.store, session, self.user, "Put the messages into another session"
                )
            else:
                info = None
            s = self.settings
            memory = Memory(
                self.store,
                session,
                user_id=self.user,
                budget=None if info is not None else budget_for(None, default_budget(s)),
                tokenizer=self.tokenizer(),
                memory_blocks=self.blocks(session),
                insert_method=s.insert_method,
                background=self.background,
            )
            flushes = memory.put_messages(parsed)
            info = memory.session()
            return {
                "session": memory.session_id,
                "stored": len(parsed),
                "flushes": len(flushes),
                "archived_messages": sum(len(f.message_ids) for f in flushes),
                "active_messages": info.active_messages,
                "active_tokens": info.active_tokens,
                "threshold": info.threshold,
            }

    # -- forgetting ---------------------------------------------------------------------------

    def forget_user(self, confirm: bool = False) -> dict[str, Any]:
        """Delete everything of the user for good (`memcli.forgetting.forget_user`): sessions,
        messages, facts and their history, summaries, block state, full-text rows, vectors and
        index files. Refused (UsageError) unless `confirm` is True."""
        from memcli.forgetting import forget_user

        if confirm is not True:
            raise UsageError(
                f"forgetting deletes every session, message and fact of user {self.user!r} for"
                " good, and was not confirmed",
                "Ask the user first; call again with confirm set to true",
            )
        with self._lock:
            forgotten = forget_user(self.store, self.user, self.settings.home / "indexes")
        return forgotten.to_dict()

    def _session(self, session: str) -> Any:
        return require_session(self.store, session, self.user)


def parse_messages(messages: Any) -> list[Message]:
    """The messages of a put, each checked (`Message.from_dict`); InputError naming the first
    bad one, or when there are none."""
    if not isinstance(messages, list):
        raise InputError(
            "messages must be a list of message objects",
            'Give [{"role": "user", "content": "..."}, ...]',
        )
    if not messages:
        raise InputError("no messages to put", "Give at least one message")
    out = []
    for i, data in enumerate(messages):
        try:
            out.append(Message.from_dict(data))
        except InputError as error:
            raise InputError(f"message {i}: {error.message}", error.hint) from None
    return out


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


def fact_owner(store: Store, fact: Fact) -> str | None:
    """The user a fact belongs to: its user scope, or its session's user."""
    kind, _, key = fact.scope_key.partition(":")
    if kind == "user":
        return key
    info = store.get_session(key) if kind == "session" else None
    return None if info is None else info.user_id


def live_fact(store: Store, fact_id: int, user: str | None, hint: str) -> Fact:
    """The fact of that id, not deleted; with `user`, only one of theirs (of their scope or of one
    of their sessions). MemcliError (exit 1, as an unknown session) naming it otherwise, with
    `hint`."""
    from memcli.store import longterm

    fact = longterm.get_fact(store, fact_id)
    owner = f" of user {user!r}" if user is not None else ""
    if fact is None or (user is not None and fact_owner(store, fact) != user):
        raise MemcliError(f"no fact {fact_id}{owner}", hint)
    if fact.deleted_at is not None:  # (another user's deleted fact stays "no fact" above)
        raise MemcliError(f"fact {fact_id}{owner} is deleted (its history stays)", hint)
    return fact


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
        "session": f.session_id,
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


def check_fact_text(text: str, hint: str, topics: Sequence[str] | None = None) -> None:
    """A fact's text is not empty, at most MAX_FACT_CHARS characters and, with its topics, valid
    Unicode; UsageError (empty, too long) or InputError (naming the bad byte) otherwise. Text that was not UTF-8 reaches Python with its
    bad bytes as lone surrogates (U+DC80-U+DCFF, as `surrogateescape` decodes a command-line
    argument), which no store keeps."""
    _check_unicode(text)
    if not text.strip():
        raise UsageError("the fact is empty", hint)
    from memcli.store.longterm import MAX_FACT_CHARS

    if len(text.strip()) > MAX_FACT_CHARS:
        raise UsageError(
            f"the fact is {len(text.strip()):,} characters long; at most {MAX_FACT_CHARS:,}",
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


# -- the tools as a model calls them ---------------------------------------------------------

#: The tools a chat's model is offered (`memcli chat --memory-tools`): its own session is the
#: chat, so reading a context and putting messages are left to the MCP server.
CHAT_TOOLS = (
    "search_memory",
    "list_facts",
    "search_facts",
    "add_fact",
    "update_fact",
    "delete_fact",
)


def tool_functions(tools: AgentTools) -> list[Callable[..., Any]]:
    """The tools, as functions over `tools`: each one's name, signature and docstring define the
    tool (its JSON schema is derived from them: the parameters' descriptions, enums and bounds
    are in their annotations). They raise MemcliError on a refusal."""

    def search_memory(
        query: Query, k: Hits = 5, session: SessionArg = None, mode: Mode = "hybrid"
    ) -> list[dict[str, Any]]:
        """Search the user's stored messages (or one session's) by words and meaning, best
        first. mode: hybrid (words and meaning), lexical (words only) or vector (meaning only)."""
        return tools.search(query, k=k, session=session, mode=mode)

    def list_facts(
        block: BlockArg = None,
        topic: Annotated[str | None, Field(description="Only the facts of this topic.")] = None,
        entity: EntityArg = None,
        include_old: Annotated[
            bool,
            Field(description="Also the superseded, retired, expired and deleted facts."),
        ] = False,
    ) -> list[dict[str, Any]]:
        """The facts long-term memory holds about the user, oldest first (with their ids,
        topics, entities and state); with `topic` or `entity`, only those facts."""
        return tools.list_facts(block, topic, entity, everything=include_old)

    def search_facts(
        query: Query, k: Hits = 10, mode: Mode = "hybrid", entity: EntityArg = None
    ) -> list[dict[str, Any]]:
        """The user's current facts that best match the query by words and meaning (such as
        "where does the user live"), best first; facts about an entity the query names first."""
        return tools.search_facts(query, k=k, mode=mode, entity=entity)

    def get_fact(fact_id: FactId) -> dict[str, Any]:
        """One of the user's facts by id, whatever its state (current, superseded, retired,
        expired, deleted), with what superseded it."""
        return tools.get_fact(fact_id)

    def fact_history(fact_id: FactId) -> dict[str, Any]:
        """A fact's versions (the facts it replaced and that replaced it) and every change to
        them, oldest first, each with its reason."""
        return tools.fact_history(fact_id)

    def list_entities() -> list[dict[str, Any]]:
        """The people, places, organisations and things the user's facts are about, each with
        its number of facts, most first."""
        return tools.list_entities()

    def add_fact(
        text: FactText,
        block: BlockArg = None,
        topics: TopicsArg = None,
        entities: EntitiesArg = None,
        expires: ExpiresArg = None,
    ) -> dict[str, Any]:
        """Remember a fact about the user, with its topics, entities and expiry (a duplicate is
        not added twice)."""
        return tools.add_fact(text, block, topics, entities, expires)

    def update_fact(fact_id: FactId, text: FactText, topics: TopicsArg = None) -> dict[str, Any]:
        """Change the text of one of the user's facts, and its topics when given (the old text
        and topics stay in its history)."""
        return tools.update_fact(fact_id, text, topics)

    def delete_fact(fact_id: FactId) -> dict[str, Any]:
        """Forget one of the user's facts (kept in the fact history as deleted)."""
        return tools.delete_fact(fact_id)

    def delete_all_facts(
        keep_history: Annotated[
            bool,
            Field(description="Keep the facts in the history, marked deleted (default: gone)."),
        ] = False,
    ) -> dict[str, Any]:
        """Forget every fact about the user. Without keep_history, the facts and their history
        are gone for good."""
        return tools.delete_all_facts(keep_history)

    def get_context(
        session: Annotated[str, Field(description="The session's id.")],
        input: Annotated[str | None, Field(description="The next user message, if any.")] = None,
    ) -> list[dict[str, Any]]:
        """The messages to send the model for a session: its short-term window with long-term
        memory inserted (for `input`, the next user message, if given). Nothing is stored."""
        return tools.context(session, input)

    def put_messages(
        messages: Annotated[
            list[dict[str, Any]],
            Field(description='Message objects: {"role": ..., "content": ...}.'),
        ],
        session: Annotated[
            str | None, Field(description="The session's id (default: a new session).")
        ] = None,
    ) -> dict[str, Any]:
        """Store messages ({"role": "user"|"assistant"|"system"|"tool", "content": "..."},
        optional name, metadata, timestamp) in a session (none given: a new one); the window
        flushes to long-term memory when over budget. A bad message stores nothing."""
        return tools.put_messages(messages, session)

    def forget_user(confirm: bool) -> dict[str, Any]:
        """Forget everything stored about the user, for good: every session and message,
        every fact and its history, summaries and search index entries. Cannot be undone: ask
        the user first, then call with confirm=true."""
        return tools.forget_user(confirm)

    functions: list[Callable[..., Any]] = [
        search_memory,
        list_facts,
        search_facts,
        get_fact,
        fact_history,
        list_entities,
        add_fact,
        update_fact,
        delete_fact,
        delete_all_facts,
        get_context,
        put_messages,
        forget_user,
    ]
    # The annotations are strings (postponed evaluation), and the schemas are derived from them:
    # resolved here against the parameter types, imported now rather than with this module.
    from memcli import tool_params

    for function in functions:
        hints = get_type_hints(function, localns=vars(tool_params), include_extras=True)
        function.__annotations__ = hints
    return functions


def strict(arg_model: Any) -> Any:
    """A tool's argument model that refuses arguments the tool does not take (the SDK's ignores
    them); its schema says so (`additionalProperties: false`)."""
    from pydantic import ConfigDict

    config = ConfigDict(**{**arg_model.model_config, "extra": "forbid"})  # type: ignore[typeddict-item]
    return type(arg_model.__name__, (arg_model,), {"model_config": config, "__module__": __name__})


def chat_tools(tools: AgentTools) -> ToolSet:
    """The tools a chat's model is offered (CHAT_TOOLS), over `tools` (give it origin chat-tool)."""
    return ToolSet([f for f in tool_functions(tools) if f.__name__ in CHAT_TOOLS])


def description(function: Callable[..., Any]) -> str:
    """A tool's description: its function's docstring, cleaned of indentation."""
    from inspect import cleandoc

    return cleandoc(function.__doc__ or "")


@dataclass(frozen=True)
class ToolResult:
    """One tool call a model made, and what came of it: `value` is the tool's JSON-ready result,
    or (when not `ok`) the reason it was refused, for the model to read and act on."""

    call_id: str
    name: str
    arguments: Any
    ok: bool
    value: Any

    def content(self) -> str:
        """The text given back to the model as the tool message."""
        import json

        data = self.value if self.ok else {"error": self.value}
        return json.dumps(data, ensure_ascii=False)


class ToolSet:
    """Tool functions as a model calls them: their schemas in OpenAI's format, derived by the MCP
    SDK's `func_metadata` (so the same as `memcli mcp` serves), and each call's arguments parsed
    from JSON and validated by the same model before the function runs."""

    def __init__(self, functions: Sequence[Callable[..., Any]]) -> None:
        self.functions = list(functions)
        self._loaded: dict[str, tuple[Callable[..., Any], Any]] | None = None
        self._schemas: list[dict[str, Any]] | None = None

    @property
    def _tools(self) -> dict[str, tuple[Callable[..., Any], Any]]:
        """Each tool's function and argument model, made on first use (importing the SDK's
        `func_metadata` takes a second)."""
        if self._loaded is None:
            try:
                from mcp.server.mcpserver.utilities.func_metadata import func_metadata
            except ImportError:  # mcp 1.x
                from mcp.server.fastmcp.utilities.func_metadata import (  # type: ignore[no-redef]
                    func_metadata,
                )

            loaded = {}
            for function in self.functions:
                meta = func_metadata(function)
                meta.arg_model = strict(meta.arg_model)
                loaded[function.__name__] = (function, meta)
            self._loaded = loaded
        return self._loaded

    def schemas(self) -> list[dict[str, Any]]:
        """The `tools` of a chat completion request (derived once)."""
        if self._schemas is None:
            self._schemas = [
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": description(function),
                        "parameters": meta.arg_model.model_json_schema(by_alias=True),
                    },
                }
                for name, (function, meta) in self._tools.items()
            ]
        return self._schemas

    def call(self, call_id: str, name: str, arguments: str) -> ToolResult:
        """Run one call (`arguments`: the JSON text the model wrote). An unknown tool, arguments
        that are not a JSON object or do not fit the tool, and a refusal (MemcliError) are a
        result that is not `ok`, with the reason: the model reads it, the chat goes on."""
        import json

        from pydantic import ValidationError

        def refused(reason: str, parsed: Any = None) -> ToolResult:
            return ToolResult(call_id, name, parsed, False, reason)

        if name not in self._tools:
            return refused(f"unknown tool {name!r}; the tools are: {', '.join(self._tools)}")
        function, meta = self._tools[name]
        try:
            parsed = json.loads(arguments or "{}")
        except ValueError as error:
            return refused(f"the arguments are not JSON ({error}); give a JSON object")
        if not isinstance(parsed, dict):
            return refused("the arguments must be a JSON object", parsed)
        try:
            bound = meta.arg_model.model_validate(meta.pre_parse_json(parsed))
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in error.errors()
            )
            return refused(f"invalid arguments: {problems}", parsed)
        try:
            value = function(**bound.model_dump_one_level())
        except MemcliError as error:
            return refused(str(error), parsed)
        return ToolResult(call_id, name, parsed, True, value)
