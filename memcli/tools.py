"""memcli's memory as tools an agent calls (`memcli mcp` serves them over MCP, `memcli chat
--memory-tools` offers them to the chat's model): search memory, list, add, update and delete a
user's facts, read a session's context, put messages into a session, and list and read sessions.

`AgentTools` holds them as methods: each takes JSON-ready arguments and returns JSON-ready data;
a refusal is a MemcliError (message and hint), and nothing is stored when one is raised.
`memcli.tool_calls` gives them as the functions a model or an MCP client calls.

Everything runs as the commands run it: search through the same Retriever as `memcli search`,
facts through the facts service `memcli.facts.Facts` (as `memcli facts`), owned by the user, the
context as `memcli dump context` shows it, puts through `Memory.put_messages` (flushes, then the
blocks). Only the user's own sessions and facts are visible: another user's session or fact is
not found.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memcli.errors import InputError, UsageError
from memcli.facts import Facts, change_record, check_search, fact_record, parse_expiry
from memcli.messages import Message, format_time, validate_session_id, validate_user
from memcli.sessions import session_record
from memcli.store.base import require_session

if TYPE_CHECKING:
    from datetime import datetime

    from memcli.blocks.background import Background
    from memcli.blocks.base import MemoryBlock
    from memcli.config import Settings
    from memcli.search.retriever import Retriever
    from memcli.store.base import SessionInfo, Store
    from memcli.tokens import Tokenizer

#: What a tool's refusal tells an agent to call when it named an unknown session or fact.
SESSIONS_HINT = "Call list_sessions to see the user's sessions"
FACTS_HINT = "Call list_facts or search_facts to see the ids of the user's facts"


@dataclass
class AgentTools:
    """The tools, for one user of one store.

    `blocks(session)` builds the long-term blocks of a session (None: of the user), as the
    commands do; `retriever()` builds the search's Retriever (called once, on the first
    search). `origin` is what the fact history records for the changes made through these
    tools (`memcli.store.facts.ORIGINS`: mcp, chat-tool; api for a Python caller). Calls are
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
    #: Opens a connection of the tools' own for `remember`, whose model call then holds no lock
    #: the other calls wait for (None: it runs under the lock, on `store`).
    reopen: Callable[[], Store] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _retriever: Retriever | None = field(default=None, repr=False)
    _tokenizer: Tokenizer | None = field(default=None, repr=False)
    _facts: Facts | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.user = validate_user(self.user)  # the one rule for names (InputError)

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
        self,
        query: str,
        k: int = 5,
        session: str | None = None,
        mode: str = "hybrid",
        *,
        since: str | None = None,
        until: str | None = None,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        """The best `k` hits for `query` among the user's messages (or one session's), best
        first, after the first `offset` (`offset + k` at most MAX_HITS): `hybrid` (words and
        meaning), `lexical` (words only, no model) or `vector`; with `since`/`until` (a date or
        an ISO time), only the messages of that time (`until` excluded)."""
        from memcli.search.types import MAX_HITS

        check_search(query, k, mode)
        if offset < 0 or offset + k > MAX_HITS:
            raise UsageError(
                f"offset + k is {offset + k}; at most {MAX_HITS}",
                "Ask for fewer hits, or narrow the search with session, since or until",
            )
        start, end = time_window(since, until)
        with self._lock:
            key = self._session(session).id if session is not None else None
            result = self._search_retriever().search(
                query,
                k=offset + k,
                user_id=self.user,
                session_id=key,
                since=start,
                until=end,
                mode=mode,
            )
        return [hit.to_dict() for hit in result.hits[offset:]]

    def prepare(self) -> None:
        """Load what the first search needs (its retriever and embedding model) now, ahead of
        it (a server calls this on a thread of its own at start)."""
        with self._lock:
            retriever = self._search_retriever()
        retriever.embedder.embed(["warm up"])  # (the model loads under a lock of its own)

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

    # -- facts: through the facts service, owned by the user ----------------------------------

    @property
    def facts(self) -> Facts:
        """The user's facts (`memcli.facts.Facts`): only theirs, changes recorded as `origin`."""
        if self._facts is None:
            self._facts = self._facts_on(self.store)
        return self._facts

    def _facts_on(self, store: Store) -> Facts:
        def embedder() -> Any:
            from memcli.search import OnnxEmbedder

            return OnnxEmbedder(self.settings.home / "models")

        return Facts(
            store,
            self.user,
            self.blocks,
            owner=self.user,
            origin=self.origin,
            embedder=embedder,
            hint=FACTS_HINT,
        )

    def list_facts(
        self,
        block: str | None = None,
        topic: str | None = None,
        entity: str | None = None,
        everything: bool = False,
        *,
        since: str | None = None,
        until: str | None = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """The user's current facts (of one block, or of every block; of one topic, about one
        entity, or any), oldest first; with `everything`, the superseded, retired, expired and
        deleted ones too, each with its `state`. With `since`/`until`, only the facts made in
        that time (`until` excluded); a page of them: `limit` after the first `offset`."""
        start, end = time_window(since, until)
        with self._lock:
            found = self.facts.list_facts(
                block=block, topic=topic, entity=entity, everything=everything
            )
        found = [
            f
            for f in found
            if (start is None or f.created_at >= start) and (end is None or f.created_at < end)
        ]
        stop = None if limit is None else offset + limit
        return [fact_record(f) for f in found[offset:stop]]

    def search_facts(
        self, query: str, k: int = 10, mode: str = "hybrid", entity: str | None = None
    ) -> list[dict[str, Any]]:
        """The user's current facts best matching `query` by words and meaning (facts whose
        entities the query names first), best first, each with its `score`."""
        with self._lock:
            found = self.facts.search(query, k, mode, entity=entity)
            return [{**fact_record(f), "score": round(score, 6)} for f, score in found]

    def get_fact(self, fact_id: int) -> dict[str, Any]:
        """One of the user's facts, whatever its state (current, superseded, ...)."""
        with self._lock:
            return fact_record(self.facts.get(fact_id))

    def fact_history(self, fact_id: int) -> dict[str, Any]:
        """A fact's versions (the facts it superseded and that superseded it, oldest first) and
        every change to them, oldest first, each with its reason."""
        with self._lock:
            history = self.facts.history(fact_id)
            return {
                "versions": [fact_record(f) for f in history.versions],
                "changes": [change_record(c) for c in history.changes],
            }

    def restore_fact(self, fact_id: int) -> dict[str, Any]:
        """Make an older version of one of the user's facts current again (a new change in its
        history); the fact that superseded it is superseded by it in turn."""
        with self._lock:
            restored, displaced = self.facts.restore(fact_id)
            return {
                "fact": fact_record(restored),
                "superseded": [fact_record(f) for f in displaced],
            }

    def delete_all_facts(self, keep_history: bool = False) -> dict[str, Any]:
        """Forget all the user's facts (theirs and their sessions'): gone with their history, or
        with `keep_history` marked deleted and kept in it."""
        with self._lock:
            count = self.facts.delete_all(keep_history=keep_history)
            return {"forgotten": count, "history_kept": keep_history}

    def list_entities(self) -> list[dict[str, Any]]:
        """The entities the user's current facts name, each with how many facts name it, most
        first."""
        with self._lock:
            return [{"entity": name, "facts": count} for name, count in self.facts.entities()]

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
        with self._lock:
            fact, added = self.facts.add(
                text, block=block, topics=topics, entities=entities, expires=expires
            )
            return {"added": added, "fact": fact_record(fact)}

    def update_fact(
        self, fact_id: int, text: str, topics: list[str] | None = None
    ) -> dict[str, Any]:
        """Change the text of one of the user's facts (and its topics, when given; else they
        stay); the old text and topics stay in its history."""
        with self._lock:
            before, after = self.facts.edit(fact_id, text, topics)
            return {"before": fact_record(before), "fact": fact_record(after)}

    def delete_fact(self, fact_id: int) -> dict[str, Any]:
        """Delete one of the user's facts (kept in the history as deleted)."""
        with self._lock:
            (deleted,) = self.facts.delete([fact_id])
            return {"deleted": fact_record(deleted)}

    # -- sessions -----------------------------------------------------------------------------

    def sessions(self, offset: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """The user's sessions, with their titles, time spans, counts and budgets (a page of
        them: `limit` after the first `offset`)."""
        with self._lock:
            found = self.store.list_sessions(self.user)
            stop = None if limit is None else offset + limit
            return self._records(found[offset:stop])

    def _records(self, infos: Sequence[SessionInfo]) -> list[dict[str, Any]]:
        """Sessions as the tools show them: `session_record`, the title (an import's: None when
        it has none), and the conversation's own time span: its first and last message's time
        (None without messages), where `created_at` and `updated_at` are the session's own."""
        times = self.store.message_times([i.id for i in infos])
        out = []
        for info in infos:
            first, last = times.get(info.id, (None, None))
            out.append(
                {
                    **session_record(info),
                    "title": info.title,
                    "first_message_at": None if first is None else format_time(first),
                    "last_message_at": None if last is None else format_time(last),
                }
            )
        return out

    def read_session(self, session: str, offset: int = 0, limit: int = 50) -> dict[str, Any]:
        """One of the user's sessions: its info (as `sessions` gives it) and a page of its
        messages, active and archived, oldest first (`limit` after the first `offset`), each
        with its status; `next_offset` is where the next page starts (None: this is the
        last)."""
        from itertools import islice

        with self._lock:
            info = self._session(session)
            page = list(islice(self.store.iter_messages(info.id), offset, offset + limit + 1))
            (record,) = self._records([info])
        more = len(page) > limit
        return {
            **record,
            "messages": [m.to_dict(stored=True) for m in page[:limit]],
            "offset": offset,
            "next_offset": offset + limit if more else None,
        }

    def session(self, session: str) -> dict[str, Any]:
        """One of the user's sessions: its info and its active messages, oldest first."""
        with self._lock:
            info = self._session(session)
            messages = self.store.get_messages(info.id, status="active")
            return {
                **self._records([info])[0],
                "messages": [m.to_dict(stored=True) for m in messages],
            }

    def context(self, session: str, input: str | None = None) -> list[dict[str, Any]]:
        """The messages `Memory.get(input)` returns for the session (what `memcli dump context`
        shows): its active window with long-term memory inserted. Nothing is stored."""
        from memcli.sessions import blocks_view

        with self._lock:
            key = self._session(session).id
            context = blocks_view(
                self.store,
                key,
                user=self.user,
                blocks=self.blocks(key),
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
            check_session_id(session)
        with self._lock:
            # (the user's session of that name, else a new one: another user's is not theirs)
            info = owned(self.store, session, self.user) if session is not None else None
            s = self.settings
            memory = Memory(
                self.store,
                session,
                user_id=self.user,
                budget=None if info is not None else budget_for(None, default_budget(s)),
                tokenizer=self.tokenizer(),
                memory_blocks=self.blocks(info.id if info is not None else None),
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
        index files, and the chat's input history of the user (`memcli.input_history`). Refused
        (UsageError) unless `confirm` is True."""
        from memcli import input_history
        from memcli.forgetting import forget_user

        if confirm is not True:
            raise UsageError(
                f"forgetting deletes every session, message and fact of user {self.user!r} for"
                " good, and was not confirmed",
                "Ask the user first; call again with confirm set to true",
            )
        with self._lock:
            # Their typed lines in the chat's input history too (read from the store first).
            input_history.forget_user(self.settings.home, self.store, self.user)
            forgotten = forget_user(self.store, self.user, self.settings.home / "indexes")
        return forgotten.to_dict()

    def remember(self, text: str) -> dict[str, Any]:
        """Extract the facts in `text` now (`Facts.remember`: the user's fact blocks, with their
        model) and return what changed: the facts added, and those superseded or retired."""
        if self.reopen is None:
            with self._lock:
                return self._remember(self.facts, text)
        own = self.reopen()  # (the other calls go on while the model answers)
        try:
            return self._remember(self._facts_on(own), text)
        finally:
            own.close()

    def _remember(self, facts: Facts, text: str) -> dict[str, Any]:
        remembered = facts.remember(text, self.tokenizer())
        return {
            "added": [fact_record(f) for f in remembered.added],
            "changed": [fact_record(f) for f in remembered.changed],
        }

    def _session(self, session: str) -> Any:
        """The user's session; SessionNotFound, said in the tools' terms, when there is none
        (another user's session is not found either)."""
        check_session_id(session)
        return require_session(self.store, session, self.user, then=SESSIONS_HINT)


def check_session_id(session: Any) -> None:
    """A session id as an agent gives it: text, not blank, valid Unicode (InputError)."""
    try:
        validate_session_id(session, "session")
    except InputError as error:
        raise InputError(error.message, "Give a session id from list_sessions") from None


def time_window(since: str | None, until: str | None) -> tuple[datetime | None, datetime | None]:
    """`since` and `until` as given (a date or an ISO time, `parse_expiry`), `since` before
    `until`; UsageError otherwise."""
    start = parse_expiry(since) if since is not None else None
    end = parse_expiry(until) if until is not None else None
    if start is not None and end is not None and start >= end:
        raise UsageError("since must be before until", "Swap the two times")
    return start, end


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
