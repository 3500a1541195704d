"""VectorBlock: long-term memory retrieved by hybrid search (BM25 and vectors, memcli.search) over
everything the user said outside the session's own window (or, with `source = "flushed"`, over the
flushed messages only, as LlamaIndex's), shown with each message's time."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from memcli.blocks.base import BlockContext, MemoryBlock
from memcli.errors import ConfigError
from memcli.template import neutralise

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from memcli.messages import Message
    from memcli.search.embedder import Embedder
    from memcli.search.retriever import Retriever
    from memcli.search.types import Hit, SearchOptions


#: What a vector block searches: "all" the stored messages of the user (or the session, with
#: `scope = "session"`) but the session's own window: other sessions' messages whether flushed or
#: not (an imported conversation, a chat still open) and every archived one; or only the
#: "flushed" (archived) ones, as LlamaIndex's VectorMemoryBlock (MemcliMemory's default).
SOURCES = ("all", "flushed")


class VectorBlock(MemoryBlock):
    """Each flushed batch has its messages embedded (one vector per message, in one model call for
    many batches); `get` runs the hybrid search of `memcli search` with the last
    `retrieval_context_window` messages plus the input as the query over the user's messages (or
    the session's, with `scope = "session"`) that `source` names (SOURCES: by default "all" but
    the session's own window), and returns the `similarity_top_k` best hits (each a message with
    its short neighbouring turns) as `<message role='ROLE' time='2023-05-08T13:56'>TEXT</message>`
    lines, hits separated by a blank line.

    After each `get`, `last_hits` holds what was found (memcli.search.Hit: score, text,
    session_id, message_ids, ranks). The embedder, for the stored messages and the queries alike,
    defaults to the bundled all-MiniLM-L6-v2 run with ONNX Runtime (memcli.OnnxEmbedder, exported
    into `$MEMCLI_HOME/models` once), loaded on first use; `search_options` are the `[search]`
    settings. `index_dir` keeps the FAISS index files of a PostgreSQL database without pgvector
    (default `$MEMCLI_HOME/indexes`; a SQLite database keeps them beside it).
    """

    name = "vector_memory"
    priority = 2
    KIND = "vector"
    OPTIONS = {
        **MemoryBlock.OPTIONS,
        "source": (str,),
        "similarity_top_k": (int,),
        "retrieval_context_window": (int,),
        "search": (dict,),  # the `[search]` settings: `search_options`
    }
    SETTINGS = ("embedder", "index_dir")
    #: While the embedding model is being prepared (exported: seconds, once), `get` searches by
    #: words alone and starts the export in the background instead of waiting for it (the chat
    #: sets it: typing never waits for the model). Off: the first `get` waits.
    words_while_preparing = False
    #: A batch never handed to it loses nothing: the next search of its user (or a put of its
    #: session) embeds every message of it that has no vector (`memcli check` does not list
    #: such batches as unfinished).
    catches_up_itself = True
    #: Messages embedded per model call when batches are put: enough for the model's full
    #: mini-batches, few enough that an import's progress moves every few seconds.
    embed_batch = 128

    def __init__(
        self,
        name: str | None = None,
        similarity_top_k: int = 2,
        retrieval_context_window: int = 5,
        priority: int | None = None,
        scope: str | None = None,
        source: str | None = None,
        embedder: Embedder | None = None,
        search_options: SearchOptions | None = None,
        index_dir: str | Path | None = None,
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
        if source is not None and source not in SOURCES:
            raise ConfigError(
                f"block {self.name!r}: source must be one of {', '.join(SOURCES)}, not {source!r}",
                'Set source = "all" (every message but the session\'s window) or "flushed"',
            )
        #: Whether `source` was given (MemcliMemory makes one that was not "flushed").
        self.source_given = source is not None
        self.source = source or "all"
        self.similarity_top_k = similarity_top_k
        self.retrieval_context_window = retrieval_context_window
        self._embedder = embedder
        self.search_options = search_options
        self._index_dir = index_dir
        self._retrievers: dict[int, Retriever] = {}
        self.last_hits: list[Hit] = []

    def definition(self) -> dict[str, Any]:
        """kind "vector" with its settings, and its search options when it was given some (else
        the reader's `[search]` settings apply). The embedder is not recorded: the CLI uses its
        own (the bundled model)."""
        if type(self) is not VectorBlock:
            return super().definition()
        table: dict[str, Any] = {
            "kind": self.KIND,
            "name": self.name,
            "priority": self.priority,
            "scope": self.scope,
            "source": self.source,
            "similarity_top_k": self.similarity_top_k,
            "retrieval_context_window": self.retrieval_context_window,
        }
        if self.search_options is not None:
            table["search"] = dataclasses.asdict(self.search_options)
        return table

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            from memcli.search.onnx import OnnxEmbedder

            self._embedder = OnnxEmbedder(_home() / "models")
        return self._embedder

    def retriever(self, store: Any) -> Retriever:
        """The block's retriever over this store (its index stays loaded between calls)."""
        from memcli.search.retriever import Retriever

        for held in list(self._retrievers.values()):  # those over stores closed since
            if getattr(held.store, "closed", False):
                self.forget_store(held.store)
        retriever = self._retrievers.get(id(store))
        if retriever is None or retriever.store is not store:
            index_dir = self._index_dir if self._index_dir is not None else _home() / "indexes"
            retriever = Retriever(store, self.embedder, self.search_options, index_dir)
            self._retrievers[id(store)] = retriever
        return retriever

    def forget_store(self, store: Any) -> None:
        """Drop the retriever over `store` and free its index (a Memory closing the last store
        of its database calls this; a retriever over a store closed otherwise goes at the
        block's next search)."""
        retriever = self._retrievers.get(id(store))
        if retriever is not None and retriever.store is store:
            del self._retrievers[id(store)]
            retriever.vectors.close()

    def put(self, batch: Sequence[Message], ctx: BlockContext) -> None:
        self.put_many([(batch, ctx)])

    def put_many(
        self,
        items: Sequence[tuple[Sequence[Message], BlockContext]],
        progress: Callable[[int], None] | None = None,
    ) -> list[str | None]:
        """Embed every message not embedded yet of the batches' sessions (those of these batches
        among them; never another session's, nor another user's), `embed_batch` messages per
        model call; `progress(n)` is told after each call how many it embedded. A batch whose
        messages are not all embedded afterwards (another process held the embedding claim past
        the wait) stays pending, with the reason."""
        from memcli.store.index import Scope
        from memcli.store.vectors import unembedded

        stores = {id(ctx.store): ctx.store for _, ctx in items}
        missing: dict[int, set[int]] = {}
        reasons: dict[int, str] = {}
        for key, store in stores.items():
            retriever = self.retriever(store)
            holder = None
            sessions = dict.fromkeys(ctx.session_id for _, ctx in items if ctx.store is store)
            for session_id in sessions:
                scope = Scope(session_id=session_id)
                retriever.index(batch=self.embed_batch, progress=progress, scope=scope)
                holder = retriever.waited_for
                if holder:  # waited out once: the other sessions' batches stay pending too
                    break
            ids = [m.id for batch, ctx in items if ctx.store is store for m in batch if m.id]
            missing[key] = unembedded(store, retriever.model, ids)
            reasons[key] = (
                f"not embedded: process {holder} held the embedding claim past the wait"
                if holder
                else "not embedded"
            )
        out: list[str | None] = []
        for batch, ctx in items:
            left = missing[id(ctx.store)]
            todo = any(m.id in left for m in batch if m.id)
            out.append(reasons[id(ctx.store)] if todo else None)
        return out

    def preparing(self) -> bool:
        """Whether the embedding model is still to be prepared (`OnnxEmbedder.preparing`); if so,
        its export is started in the background. False for an embedder that needs none."""
        embedder = self.embedder
        if not getattr(embedder, "preparing", False):
            return False
        start = getattr(embedder, "prepare_in_background", None)
        if callable(start):
            start()
        return True

    def query_text(self, messages: Sequence[Message]) -> str:
        """The text of the last `retrieval_context_window` messages (the input among them)."""
        window = messages[-self.retrieval_context_window :]
        return "\n".join(m.content for m in window if m.content)

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        query = self.query_text(messages)
        self.last_hits = []
        if not query.strip():
            return ""
        by_session = self.scope == "session"
        window = messages[-self.retrieval_context_window :]
        result = self.retriever(ctx.store).search(
            query,
            mode="lexical" if self.words_while_preparing and self.preparing() else "hybrid",
            k=self.similarity_top_k,
            user_id=None if by_session else ctx.user_id,
            session_id=ctx.session_id if by_session else None,
            archived_only=self.source == "flushed",
            except_window=None if self.source == "flushed" else ctx.session_id,
            # Each message embedded once and kept: the next turn embeds only what is new.
            parts=[m.content for m in window if m.content.strip()],
        )
        self.last_hits = result.hits
        return "\n\n".join(render_hit(hit) for hit in self.last_hits)

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


def render_hit(hit: Hit) -> str:
    """A hit as `<message role='user' time='2023-05-08T13:56'>TEXT</message>` lines (UTC, to the
    minute; no time attribute for a message stored without one). A message's text cannot open or
    close the template's elements (`neutralise`)."""
    lines = []
    for m in hit.messages:
        when = f" time='{m.timestamp.strftime('%Y-%m-%dT%H:%M')}'" if m.timestamp else ""
        lines.append(f"<message role='{m.role}'{when}>{neutralise(m.content)}</message>")
    return "\n".join(lines)


def _home() -> Path:
    """memcli's home folder (`$MEMCLI_HOME`, else the platform's data folder), where a block
    made without an embedder or `index_dir` keeps the exported model and the index files, as the
    CLI does."""
    import os

    from memcli.config import default_home

    return default_home(os.environ)
