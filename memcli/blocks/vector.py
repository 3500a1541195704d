"""VectorBlock: flushed batches embedded and retrieved by similarity to the recent conversation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memcli.blocks.base import BlockContext, MemoryBlock
from memcli.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from memcli.embeddings import Embedder
    from memcli.messages import Message
    from memcli.vectors import Hit, VectorIndex


class VectorBlock(MemoryBlock):
    """One entry per flushed batch (its `<message role='ROLE'>TEXT</message>` lines), embedded in
    pieces that fit the model's window; `get` returns the `similarity_top_k` batches closest to the
    last `retrieval_context_window` messages plus the input, joined by a blank line.

    After each `get`, `last_hits` holds what was found (score, text, session_id, message_ids).
    The embedder defaults to the bundled all-MiniLM-L6-v2, loaded on first use.
    """

    name = "vector_memory"
    priority = 2

    def __init__(
        self,
        name: str | None = None,
        similarity_top_k: int = 2,
        retrieval_context_window: int = 5,
        priority: int | None = None,
        scope: str | None = None,
        embedder: Embedder | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name=name, priority=priority, scope=scope, **kwargs)
        for key, value in (
            ("similarity_top_k", similarity_top_k),
            ("retrieval_context_window", retrieval_context_window),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"block {self.name!r}: {key} must be a whole number >= 1, not {value!r}",
                    "See config.example.toml",
                )
        self.similarity_top_k = similarity_top_k
        self.retrieval_context_window = retrieval_context_window
        self._embedder = embedder
        self._indexes: dict[int, VectorIndex] = {}
        self.last_hits: list[Hit] = []

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            from memcli.embeddings import SentenceTransformerEmbedder

            self._embedder = SentenceTransformerEmbedder()
        return self._embedder

    def index(self, store: Any) -> VectorIndex:
        """The block's FAISS index over this store, kept loaded between calls."""
        from memcli.vectors import VectorIndex

        index = self._indexes.get(id(store))
        if index is None or index.store is not store:
            index = self._indexes[id(store)] = VectorIndex(store, self.name)
        return index

    def put(self, batch: Sequence[Message], ctx: BlockContext) -> None:
        self.put_many([(batch, ctx)])

    def put_many(self, items: Sequence[tuple[Sequence[Message], BlockContext]]) -> list[str | None]:
        """Store every batch, with all their pieces embedded in one model call."""
        from memcli.vectors import Batch, store_batches

        by_store: dict[int, tuple[Any, list[Batch]]] = {}
        for messages, ctx in items:
            batch = Batch(ctx.user_id, ctx.session_id, ctx.flush_id, list(messages))
            by_store.setdefault(id(ctx.store), (ctx.store, []))[1].append(batch)
        for store, batches in by_store.values():
            store_batches(store, self.embedder, self.name, batches)
        return [None] * len(items)

    def query_text(self, messages: Sequence[Message]) -> str:
        """The text of the last `retrieval_context_window` messages (the input among them)."""
        window = messages[-self.retrieval_context_window :]
        return "\n".join(m.content for m in window if m.content)

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        from memcli.vectors import search

        query = self.query_text(messages)
        self.last_hits = []
        if not query.strip():
            return ""
        if self.scope == "session":
            where = {"session_id": ctx.session_id}
        else:
            where = {"user_id": ctx.user_id}
        self.last_hits = search(
            ctx.store,
            self.embedder,
            query,
            k=self.similarity_top_k,
            block=self.name,
            index=self.index(ctx.store),
            **where,
        )
        return "\n\n".join(hit.text for hit in self.last_hits)

    def truncate(self, content: str, tokens_over: int) -> str | None:
        """Drop the weakest batches (the last ones) until enough is cut; None when none are left."""
        parts = content.split("\n\n<message role=")
        if len(parts) <= 1:
            return None
        kept = [parts[0]] + ["<message role=" + p for p in parts[1:]]
        cut = 0
        while len(kept) > 1 and cut < tokens_over:
            cut += len(kept.pop().split())
        if cut < tokens_over:
            return None
        return "\n\n".join(kept)
