"""A Memory's fact methods (`FactMethods`, which `memcli.memory.Memory` inherits): the user's
facts through the facts service (`memcli.facts.Facts`, as `memcli facts` and the MCP tools),
owned by the memory's user (another user's fact is "no fact N"), each change recorded in the
fact history with the origin `api`. New facts go to the memory's first fact block (or the one
named); `remember` needs a fact block with a model. Each has its asyncio twin."""

from __future__ import annotations

import asyncio
import threading
from functools import partial
from typing import TYPE_CHECKING

from memcli.errors import UsageError
from memcli.writer import in_worker

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

    from memcli.blocks.base import MemoryBlock
    from memcli.facts import AddedFact, FactHistory, Facts, Remembered, RestoredFact, UpdatedFact
    from memcli.search.retriever import Retriever
    from memcli.store.base import Store
    from memcli.store.facts import Fact
    from memcli.tokens import Tokenizer


class FactMethods:
    """The fact methods of a Memory: what they use of it is declared here."""

    if TYPE_CHECKING:
        user_id: str
        memory_blocks: list[MemoryBlock]
        tokenizer: Tokenizer
        _searching: threading.Lock

        @property
        def store(self) -> Store: ...

        def retriever(self) -> Retriever: ...

    _facts: Facts | None = None  # the service, made at the first fact call

    def fact_service(self) -> Facts:
        """The facts service over the memory's store, user and blocks (made once); its search
        by meaning embeds with `search`'s model."""
        if self._facts is None:
            from memcli.facts import Facts

            self._facts = Facts(
                self.store,
                self.user_id,
                lambda _session: self.memory_blocks,  # (the memory's blocks, as they are then)
                owner=self.user_id,
                embedder=lambda: self.retriever().embedder,
            )
        return self._facts

    def remember(self, text: str) -> Remembered:
        """Extract the facts in `text` now, as MCP's `remember` does: each of the user's fact
        blocks with a model reads it as it reads a flushed batch, adding new facts and
        superseding or retiring those they replace. Returns the facts added and those changed.
        UsageError without such a block; ProviderError when the model fails (nothing stored)."""
        return self.fact_service().remember(text, self.tokenizer)

    def facts(
        self,
        query: str | None = None,
        *,
        k: int = 10,
        mode: str = "hybrid",
        topic: str | None = None,
        entity: str | None = None,
        everything: bool = False,
    ) -> list[Fact]:
        """The user's current facts, oldest first (of one `topic` or about one `entity`; with
        `everything`, the superseded, retired, expired and deleted ones too: `Fact.status()`);
        with a `query`, the `k` that best match it by words and meaning (`mode`: hybrid, lexical
        or vector), best first."""
        service = self.fact_service()
        if query is None:
            return service.list_facts(topic=topic, entity=entity, everything=everything)
        if topic is not None or everything:
            raise UsageError(
                "a fact search takes no topic and finds current facts only",
                "Leave topic and everything out, or the query",
            )
        with self._searching:  # (the embedding model is search's: one search at a time)
            return [fact for fact, _ in service.search(query, k, mode, entity=entity)]

    def get_fact(self, fact_id: int) -> Fact:
        """One of the user's facts by id, whatever its state."""
        return self.fact_service().get(fact_id)

    def add_fact(
        self,
        text: str,
        *,
        topics: Sequence[str] | None = None,
        entities: Sequence[str] | None = None,
        expires: str | datetime | None = None,
        block: str | None = None,
    ) -> AddedFact:
        """Add a fact about the user, with its topics, entities and expiry (a date, an ISO time
        or a datetime). A duplicate of a current fact (ignoring case and spaces) is not added:
        `added` is False and `fact` the one known."""
        from memcli.facts import AddedFact

        fact, added = self.fact_service().add(
            text, block=block, topics=topics, entities=entities, expires=expires
        )
        return AddedFact(fact, added)

    def update_fact(
        self, fact_id: int, text: str, *, topics: Sequence[str] | None = None
    ) -> UpdatedFact:
        """Change the text of one of the user's facts (and its topics, when given); the old
        text stays in its history. Returns it before and after."""
        from memcli.facts import UpdatedFact

        before, after = self.fact_service().edit(fact_id, text, topics)
        return UpdatedFact(before, after)

    def delete_fact(self, fact_id: int) -> Fact:
        """Delete one of the user's facts (kept in its history as deleted: `restore_fact` brings
        an older version back); returns it as it is now."""
        (deleted,) = self.fact_service().delete([fact_id])
        return deleted

    def fact_history(self, fact_id: int | None = None) -> FactHistory:
        """A fact's versions and every change to them, oldest first; without an id, every
        change to the user's facts."""
        return self.fact_service().history(fact_id)

    def restore_fact(self, fact_id: int) -> RestoredFact:
        """Make an older version of one of the user's facts current again (a new change in its
        history); returns it and the facts it superseded in turn."""
        from memcli.facts import RestoredFact

        fact, superseded = self.fact_service().restore(fact_id)
        return RestoredFact(fact, superseded)

    def delete_all_facts(self, *, keep_history: bool = False) -> int:
        """Forget all the user's facts (theirs and their sessions'): gone with their history, or
        with `keep_history` marked deleted and kept in it. Returns how many were not deleted
        before (current or older versions)."""
        return self.fact_service().delete_all(keep_history=keep_history)

    async def aremember(self, text: str) -> Remembered:
        """`remember`, for asyncio (in asyncio's default executor: the model holds no thread
        of the store's)."""
        return await asyncio.to_thread(self.remember, text)

    async def afacts(
        self,
        query: str | None = None,
        *,
        k: int = 10,
        mode: str = "hybrid",
        topic: str | None = None,
        entity: str | None = None,
        everything: bool = False,
    ) -> list[Fact]:
        """`facts`, for asyncio (a search in asyncio's default executor, as `asearch`)."""
        facts = partial(
            self.facts, query, k=k, mode=mode, topic=topic, entity=entity, everything=everything
        )
        if query is None:
            return await in_worker(self.store, facts)
        return await asyncio.to_thread(facts)

    async def aget_fact(self, fact_id: int) -> Fact:
        """`get_fact`, for asyncio."""
        return await in_worker(self.store, self.get_fact, fact_id)

    async def aadd_fact(
        self,
        text: str,
        *,
        topics: Sequence[str] | None = None,
        entities: Sequence[str] | None = None,
        expires: str | datetime | None = None,
        block: str | None = None,
    ) -> AddedFact:
        """`add_fact`, for asyncio."""
        add = partial(
            self.add_fact, text, topics=topics, entities=entities, expires=expires, block=block
        )
        return await in_worker(self.store, add)

    async def aupdate_fact(
        self, fact_id: int, text: str, *, topics: Sequence[str] | None = None
    ) -> UpdatedFact:
        """`update_fact`, for asyncio."""
        return await in_worker(self.store, partial(self.update_fact, fact_id, text, topics=topics))

    async def adelete_fact(self, fact_id: int) -> Fact:
        """`delete_fact`, for asyncio."""
        return await in_worker(self.store, self.delete_fact, fact_id)

    async def afact_history(self, fact_id: int | None = None) -> FactHistory:
        """`fact_history`, for asyncio."""
        return await in_worker(self.store, self.fact_history, fact_id)

    async def arestore_fact(self, fact_id: int) -> RestoredFact:
        """`restore_fact`, for asyncio."""
        return await in_worker(self.store, self.restore_fact, fact_id)

    async def adelete_all_facts(self, *, keep_history: bool = False) -> int:
        """`delete_all_facts`, for asyncio."""
        delete = partial(self.delete_all_facts, keep_history=keep_history)
        return await in_worker(self.store, delete)
