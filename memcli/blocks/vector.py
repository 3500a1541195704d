"""VectorBlock: long-term memory retrieved by hybrid search (BM25 and vectors, memcli.search) over
everything the user said outside the session's own window (or, with `source = "flushed"`, over the
flushed messages only, as LlamaIndex's), shown with each message's time.

Two ways to retrieve: memcli's (the default) searches for the input every turn and gives what
fits `token_budget`; LlamaIndex's (when `similarity_top_k` or `retrieval_context_window` is
given, and in `MemcliMemory`) searches for the last messages of the window and gives a fixed
number of hits."""

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
    from memcli.search.retriever import Retriever, Retrievers
    from memcli.search.types import Hit, SearchOptions, SearchResult


#: The tokens (cl100k) of retrieved messages a vector block gives by default.
TOKEN_BUDGET = 600
#: LlamaIndex's VectorMemoryBlock defaults: hits kept, messages of the window queried.
SIMILARITY_TOP_K = 2
RETRIEVAL_CONTEXT_WINDOW = 5
#: Hits asked of the search per token of budget (600 tokens: 30 hits), to fill it.
HITS_PER_TOKEN = 1 / 20

#: What a vector block searches: "all" the stored messages of the user (or the session, with
#: `scope = "session"`) but the session's own window: other sessions' messages whether flushed or
#: not (an imported conversation, a chat still open) and every archived one; or only the
#: "flushed" (archived) ones, as LlamaIndex's VectorMemoryBlock (MemcliMemory's default).
SOURCES = ("all", "flushed")


class VectorBlock(MemoryBlock):
    """Each flushed batch has its messages embedded (one vector per message, in one model call for
    many batches); `get` runs the hybrid search of `memcli search` over the user's messages (or
    the session's, with `scope = "session"`) that `source` names (SOURCES: by default "all" but
    the session's own window) and returns hits as
    `<message role='ROLE' time='2023-05-08T13:56'>TEXT</message>` lines, groups of messages
    separated by a blank line. What it searches for, and how much it returns:

    - memcli's way (the default): the input (the last user message), refreshed every turn; a
      follow-up ("and her brother?", `memcli.search.packing.is_follow_up`) is searched together
      with the user message before it (the input alone would find anyone's brother). The hits that fit
      `token_budget` tokens (default TOKEN_BUDGET) are returned, each with its turn partner (the
      reply to a question, the question before an answer) when that fits too, ordered by time,
      never a message twice nor one whose text the window holds.
    - LlamaIndex's way, when `similarity_top_k` or `retrieval_context_window` is given (or
      `use_reference_defaults()` was called: `MemcliMemory` does): the last
      `retrieval_context_window` (5) messages plus the input as the query, the
      `similarity_top_k` (2) best hits (each a message with its short neighbouring turns), best
      first, as today's memcli and LlamaIndex's VectorMemoryBlock give them.

    `get` answers from what is indexed: it embeds the query (and the window's new messages),
    never the stored messages that have no vector yet (another process's import, a batch not
    fed), nor does it wait for another process's embedding claim; those messages are found by
    words until their importer, a put of their session or a `memcli search` embeds them.

    After each `get`, `last_hits` holds what was given (memcli.search.Hit: score, text,
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
        "token_budget": (int,),
        "search": (dict,),  # the `[search]` settings: `search_options`
    }
    SETTINGS = ("embedder", "index_dir")
    #: While the embedding model is being prepared (exported: seconds, once), `get` searches by
    #: words alone and starts the export in the background instead of waiting for it (the chat
    #: sets it: typing never waits for the model). Off: the first `get` waits.
    words_while_preparing = False
    #: A batch never handed to it loses nothing: the next `memcli search` of its user (or a put
    #: of its session) embeds every message of it that has no vector (`memcli check` does not
    #: list such batches as unfinished); meanwhile `get` finds its messages by words.
    catches_up_itself = True
    #: Messages embedded per model call when batches are put: enough for the model's full
    #: mini-batches, few enough that an import's progress moves every few seconds.
    embed_batch = 128
    #: Where the block gets its retriever over a store: None, one of its own per store; the CLI
    #: sets its process's `Retrievers`, so that the blocks of all the sessions it serves (and its
    #: search) share one per store, the store's index loaded once.
    retrievers: Retrievers | None = None

    def __init__(
        self,
        name: str | None = None,
        similarity_top_k: int | None = None,
        retrieval_context_window: int | None = None,
        priority: int | None = None,
        token_budget: int | None = None,
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
            ("token_budget", token_budget),
        ):
            if value is None:
                continue
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
        #: LlamaIndex's way (see the class): its parameters were given.
        self.reference = similarity_top_k is not None or retrieval_context_window is not None
        if self.reference and token_budget is not None:
            raise ConfigError(
                f"block {self.name!r}: token_budget is memcli's way of retrieving;"
                " similarity_top_k and retrieval_context_window are LlamaIndex's",
                "Give token_budget, or LlamaIndex's parameters, not both",
            )
        self.similarity_top_k = similarity_top_k or SIMILARITY_TOP_K
        self.retrieval_context_window = retrieval_context_window or RETRIEVAL_CONTEXT_WINDOW
        self.token_budget = token_budget or TOKEN_BUDGET
        self._budget_given = token_budget is not None
        self._embedder = embedder
        self.search_options = search_options
        self._index_dir = index_dir
        self._retrievers: dict[int, Retriever] = {}
        self.last_hits: list[Hit] = []
        self._groups: list[tuple[int, str]] = []  # memcli's way: (rank, text) as rendered
        self._rendered = ""

    def use_reference_defaults(self) -> None:
        """Retrieve LlamaIndex's way (its `similarity_top_k` 2 over the last 5 messages) unless
        the block was given a `token_budget`: `MemcliMemory`'s vector blocks behave as
        LlamaIndex's VectorMemoryBlock."""
        if not self._budget_given:
            self.reference = True

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
        }
        if self.reference:
            table["similarity_top_k"] = self.similarity_top_k
            table["retrieval_context_window"] = self.retrieval_context_window
        else:
            table["token_budget"] = self.token_budget
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
            if self.retrievers is not None:
                retriever = self.retrievers.get(
                    store, self.embedder, self.search_options, index_dir
                )
            else:
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
        self.last_hits = []
        if not self.reference:
            return self._get_budget(messages, ctx)
        query = self.query_text(messages)
        if not query.strip():
            return ""
        window = messages[-self.retrieval_context_window :]
        # Each message embedded once and kept: the next turn embeds only what is new.
        parts = [m.content for m in window if m.content.strip()]
        self.last_hits = self._search(query, ctx, self.similarity_top_k, parts).hits
        return "\n\n".join(render_hit(hit) for hit in self.last_hits)

    def _search(
        self, query: str, ctx: BlockContext, k: int, parts: Sequence[str] | None
    ) -> SearchResult:
        """The search both ways run: the block's scope and source, but the session's window."""
        by_session = self.scope == "session"
        return self.retriever(ctx.store).search(
            query,
            mode="lexical" if self.words_while_preparing and self.preparing() else "hybrid",
            k=k,
            user_id=None if by_session else ctx.user_id,
            session_id=ctx.session_id if by_session else None,
            archived_only=self.source == "flushed",
            except_window=None if self.source == "flushed" else ctx.session_id,
            parts=parts,
            embed=False,  # what is not embedded yet is found by words: see `get`
        )

    def _get_budget(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        """memcli's way (see the class): the input's hits packed into `token_budget`."""
        from memcli.search.packing import is_follow_up

        self._groups, self._rendered = [], ""
        asked = [m.content for m in messages if m.role == "user" and m.content.strip()]
        if not asked:
            return ""
        k = max(10, int(self.token_budget * HITS_PER_TOKEN))
        # A follow-up ("and her brother?") is about what the turn before asked: both are the
        # query (the input alone would find any brother).
        follow_up = len(asked) > 1 and is_follow_up(asked[-1])
        query = "\n".join(asked[-2:]) if follow_up else asked[-1]
        hits = self._search(query, ctx, k, None).hits
        window = {_same(m.content) for m in messages if m.content.strip()}
        packed = self._pack(hits, ctx, window)
        self.last_hits = [
            dataclasses.replace(hit, rank=at, messages=rows)
            for at, (_, hit, rows) in enumerate(packed, start=1)
        ]
        self._groups = [(rank, render_rows(rows, every_time=False)) for rank, _, rows in packed]
        self._rendered = "\n\n".join(text for _, text in self._groups)
        return self._rendered

    def _pack(
        self, hits: Sequence[Hit], ctx: BlockContext, window: set[str]
    ) -> list[tuple[int, Hit, list[Any]]]:
        """The hits that fit the budget (`memcli.search.packing.pack`), each with its turn
        partner; as (rank, the best hit, messages), in time order."""
        from memcli.search.packing import Candidate, pack, partner_of
        from memcli.store.index import session_span

        candidates = []
        for rank, hit in enumerate(hits, start=1):
            anchor = next(m for m in hit.messages if m.id == hit.anchor_id)
            partner = partner_of(anchor, hit.messages)
            if partner is None:
                span = session_span(ctx.store, anchor.session_id, anchor.seq - 1, anchor.seq + 1)
                partner = partner_of(anchor, span)
                if partner is not None and not self._may_show(partner, ctx):
                    partner = None
            candidates.append(Candidate(rank, anchor, partner))
        count = ctx.tokenizer.count
        packed = pack(
            candidates,
            self.token_budget,
            lambda rows: count(render_rows(rows, every_time=False)) + 1,  # and the blank line
            repeated=lambda m: _same(m.content) in window,
        )
        return [(rank, hits[rank - 1], rows) for rank, rows in packed]

    def _may_show(self, m: Any, ctx: BlockContext) -> bool:
        """Whether a neighbouring message may join a hit: not in the session's window (nor,
        with source "flushed", anywhere short-term)."""
        if m.status == "archived":
            return True
        return self.source != "flushed" and m.session_id != ctx.session_id

    def truncate(self, content: str, tokens_over: int) -> str | None:
        """Drop the weakest batches (memcli's way: the worst ranked; LlamaIndex's: the last
        ones) until enough is cut; None when none are left."""
        if not self.reference and content == self._rendered and self._groups:
            groups = list(self._groups)
            cut = 0
            for group in sorted(groups, key=lambda g: -g[0]):
                if cut >= tokens_over:
                    break
                groups.remove(group)
                cut += len(group[1].split())
            if cut < tokens_over or not groups:
                return None
            return "\n\n".join(text for _, text in groups)
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
    return render_rows(hit.messages)


def render_rows(rows: Sequence[Any], *, every_time: bool = True) -> str:
    """Messages (memcli.store.index.MessageRow) as `render_hit` shows them; without
    `every_time`, a message's time only when it differs from the one before it (to the minute):
    the time attribute is 13 of the 20 tokens of a message's markup."""
    lines = []
    last = None
    for m in rows:
        stamp = m.timestamp.strftime("%Y-%m-%dT%H:%M") if m.timestamp else None
        shown = stamp if every_time or stamp != last else None
        last = stamp
        when = f" time='{shown}'" if shown else ""
        lines.append(f"<message role='{m.role}'{when}>{neutralise(m.content)}</message>")
    return "\n".join(lines)


def _same(text: str) -> str:
    """A message's text as compared with the window's (case and spacing aside)."""
    return " ".join(text.casefold().split())


def _home() -> Path:
    """memcli's home folder (`$MEMCLI_HOME`, else the platform's data folder), where a block
    made without an embedder or `index_dir` keeps the exported model and the index files, as the
    CLI does."""
    import os

    from memcli.config import default_home

    return default_home(os.environ)
