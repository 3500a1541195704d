"""memcli's memory as tools an agent calls (`memcli mcp` serves them over MCP, `memcli chat
--memory-tools` offers them to the chat's model): search memory, list, add, update and delete a
user's facts, read a session's context, put messages into a session, and list and read sessions.
Each method takes JSON-ready arguments and returns JSON-ready data; a refusal is a MemcliError
(message and hint), and nothing is stored when one is raised.

`memcli.toolset` gives them as functions with their schemas, as MCP serves them and as a chat's
model calls them.

Everything runs as the commands run it: search through the same Retriever as `memcli search`,
facts through `memcli.store.longterm` in the user's scope (as `memcli facts`), the context as
`memcli dump context` shows it, puts through `Memory.put_messages` (flushes, then the blocks).
Only the user's own sessions and facts are visible: another user's session is not found.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memcli.errors import InputError, MemcliError, UsageError
from memcli.messages import Message, check_text, format_time, validate_session_id
from memcli.sessions import require, session_record

if TYPE_CHECKING:
    from memcli.blocks.base import MemoryBlock
    from memcli.config import Settings
    from memcli.search.retriever import Retriever
    from memcli.store.base import Store
    from memcli.store.longterm import Fact
    from memcli.tokens import Tokenizer

SEARCH_MODES = ("hybrid", "lexical", "vector")
#: The most hits one search returns.
MAX_HITS = 100


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
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _retriever: Retriever | None = field(default=None, repr=False)
    _tokenizer: Tokenizer | None = field(default=None, repr=False)

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
        if not query.strip():
            raise UsageError("the query is empty", "Give words to look for")
        if mode not in SEARCH_MODES:
            raise UsageError(
                f"unknown search mode {mode!r}", f"Use one of: {', '.join(SEARCH_MODES)}"
            )
        if not 1 <= k <= MAX_HITS:
            raise UsageError(f"k must be 1 to {MAX_HITS}, not {k}", "Ask for fewer hits")
        check_text(query, "the query")
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
        self, block: str | None = None, topic: str | None = None
    ) -> list[dict[str, Any]]:
        """The user's facts (of one block, or of every block; of one topic, or of any), oldest
        first."""
        from memcli.store import longterm

        with self._lock:
            return [
                fact_record(f)
                for f in longterm.list_facts(self.store, block, self.scope_key, topic)
            ]

    def add_fact(
        self, text: str, block: str | None = None, topics: list[str] | None = None
    ) -> dict[str, Any]:
        """Add a fact to the user's facts (to `block`, default the first fact block), with its
        `topics`; a duplicate (ignoring case and spaces) is not added: `added` is false and
        `fact` the known one."""
        from memcli.store import longterm

        _check_fact(text, "Give the fact's text", topics)
        with self._lock:
            name = fact_block_name(self.blocks(None), block)
            added = longterm.add_facts(
                self.store, name, self.scope_key, [text], origin=self.origin, topics=[topics or []]
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

        _check_fact(text, "Give the new text, or delete the fact", topics)
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
                fact = self._fact(fact_id)
                longterm.delete_fact(self.store, fact_id, origin=self.origin)
            return {"deleted": fact_record(fact)}

    def _fact(self, fact_id: int) -> Fact:
        """The live fact of that id, if it is the user's (theirs, or of one of their sessions)."""
        from memcli.store import longterm

        fact = longterm.get_fact(self.store, fact_id)
        if fact is None or fact.deleted_at is not None or fact_owner(self.store, fact) != self.user:
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
        from memcli.sessions import budget_for, owned

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
                budget=None if info is not None else budget_for(None, _default_budget(s)),
                tokenizer=self.tokenizer(),
                memory_blocks=self.blocks(session),
                insert_method=s.insert_method,
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

    def _session(self, session: str) -> Any:
        return require(self.store, session, self.user)


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


def fact_block_name(blocks: Sequence[MemoryBlock], block: str | None = None) -> str:
    """The named block, else the first fact block of `blocks`, else the default fact block's
    name (as `memcli facts add` picks it)."""
    from memcli.blocks.facts import FactBlock

    if block is not None:
        return block
    return next((b.name for b in blocks if isinstance(b, FactBlock)), FactBlock.name)


def fact_owner(store: Store, fact: Fact) -> str | None:
    """The user a fact belongs to: its user scope, or its session's user."""
    kind, _, key = fact.scope_key.partition(":")
    if kind == "user":
        return key
    info = store.get_session(key) if kind == "session" else None
    return None if info is None else info.user_id


def fact_record(f: Fact) -> dict[str, Any]:
    return {
        "id": f.id,
        "block": f.block,
        "text": f.text,
        "topics": f.topics,
        "origin": f.origin,
        "session": f.session_id,
        "created_at": format_time(f.created_at),
        "updated_at": format_time(f.updated_at),
    }


def _check_fact(text: str, hint: str, topics: list[str] | None) -> None:
    """A fact's text is not empty and, with its topics, valid Unicode (as `memcli facts` checks)."""
    if not text.strip():
        raise UsageError("the fact is empty", hint)
    check_text(text, "the fact's text")
    for i, topic in enumerate(topics or []):
        check_text(topic, f"topic {i}")


def _default_budget(s: Settings) -> tuple[int, float, int | None]:
    return (s.token_limit, s.ratio, s.flush_size)
