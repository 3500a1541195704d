"""Hybrid retrieval over every stored message: BM25 (SQLite's FTS5, or PostgreSQL's text search)
and dense vectors (FAISS, or pgvector), fused. (What differs between the backends is SQL in
`memcli.store.index` and `memcli.store.pg_index`, and `memcli.search.dense.vectors_for`.)

- Units: one vector per message, for the message and the one before it in its session
  (`vector_context`), so that a short reply carries what it answers. Each message's `Name: text`
  is embedded once (in pieces when longer than the model's window: nothing is cut off silently,
  and the message scores as its best piece; past `MAX_PIECES` pieces, that many spread evenly
  through it: `memcli.search.embedder.embedded_pieces`); its vector is the sum of its own and the earlier
  message's vectors, each weighted by its words, normalised. That is about what mean pooling over
  the two messages together gives, for half the model's work: each message is read once, not in
  two units.
- Lexical: an FTS5 index over every message (speaker name and text); messages stored since the
  last search are added to it in one statement before the next, so a put pays nothing.
- Dense: vectors are made in batches (`Retriever.index`, or at search time for what is missing
  in the search's scope: its user's or session's messages, never another user's), by one
  process at a time (a claim in the store), and stored in SQLite, the source of truth
  (each piece once: a unique key); a FAISS index in a file beside the database is loaded for
  queries and rebuilt from SQLite when it is missing, stale, unreadable or damaged.
- Fusion: weighted reciprocal rank fusion, `sum(weight / (rrf_k + rank))` over the two lists.
- Hits: best first, never repeating a message; a hit carries its neighbouring turns when they
  are short, up to a token allowance (a reply such as "Yes, last May!" means little alone). A
  long message (over `LONG_CHARS` characters) is shown as the stretch that matched.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memcli.errors import UsageError
from memcli.search.dense import vectors_for
from memcli.search.embedder import embedded_pieces
from memcli.search.lexical import Lexical
from memcli.search.ranking import (
    EXCERPT_CHARS,
    LONG_CHARS,
    demote_echoes,
    excerpt_at,
    fuse,
    lexical_excerpt,
    query_terms,
    query_words,
    without_words,
)
from memcli.search.speakers import naming_words, spoken_by
from memcli.search.types import (
    EMBED_RATE,
    FTS_RATE,
    MODES,
    Building,
    Hit,
    SearchOptions,
    SearchResult,
)
from memcli.search.when import TimeWindow, names_time, time_window
from memcli.store import index as sql
from memcli.store import vectors as vsql
from memcli.store.index import MessageRow, Scope

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from memcli.search.embedder import Embedder


def unit_text(name: str | None, role: str, content: str) -> str:
    """What a message's vector is made from: the speaker, then the text."""
    return f"{name or role}: {content}"


#: Query parts (messages) whose vectors a retriever keeps, the least recently used dropped first.
PART_VECTORS = 256
#: Characters of messages embedded in one batch (a longer message is a batch alone): memory stays
#: bounded however long the messages are.
BATCH_CHARS = 2_000_000
#: How long `index` waits for another process that is embedding the same model's messages, and how
#: often it looks whether that one is done.
CLAIM_WAIT = 60.0
CLAIM_POLL = 0.2
#: Pending message ids read at once by `index` (then embedded a batch at a time): a scope's
#: pending messages are found by one query per this many, not per batch.
QUEUE = 8192
#: A search says what it builds (`on_build`) when that should take at least this many seconds.
ANNOUNCE_SECONDS = 1.0
#: How many scopes' speakers' names a retriever keeps, and how many names each (see `search`).
SPEAKER_SCOPES, SPEAKER_NAMES = 64, 256


#: The most pieces of a long query that are embedded (spread evenly over it, the first and the
#: last among them): the vector of a 25 KB paste costs what 8 pieces cost, not 50.
QUERY_PIECES = 8


class Retriever:
    """Hybrid search over a store's messages with an embedder (see the module docstring)."""

    def __init__(
        self,
        store: Any,
        embedder: Embedder,
        options: SearchOptions | None = None,
        index_dir: str | Path | None = None,
        on_build: Callable[[Building], None] | None = None,
    ) -> None:
        """`embedder` (the Embedder protocol) embeds the stored messages and the queries alike.
        `index_dir` keeps the FAISS index files of a database that has no file of its own (a
        PostgreSQL one without pgvector), each in a folder named after it; without it, such an
        index is kept in memory only (a SQLite database's files are beside it). `on_build` is
        told what a search is about to build when that takes a second or more (the full-text
        index after a bulk import, the vectors of the scope's pending messages), before it
        builds it."""
        self.store = store
        self.on_build = on_build
        self.embedder = embedder
        self.options = options or SearchOptions()
        # The vectors depend on the embedder (its name: the model and how it splits texts) and on
        # how units are made: both name them ("named+0": the message alone; "sum+N": summed with
        # the N before it). Vectors under another key are not searched, and the messages are
        # embedded again: older stores hold "named+N" vectors (the N messages and the message
        # embedded as one text) or vectors of plain "all-MiniLM-L6-v2" (two runtimes, two
        # splitters; now "all-MiniLM-L6-v2:onnx").
        context = self.options.vector_context
        self.model = f"{embedder.name}/{'sum' if context else 'named'}+{context}"
        self.vectors = vectors_for(store, self.model, index_dir)
        self._part_vectors: OrderedDict[str, Any] = OrderedDict()  # see `search(parts=...)`
        self.lexical = Lexical(store, self.options.lexical_budget)
        self._query: Any = None  # the last search's query vector
        # The speakers' names (lowercase) the hits of each owner scope (`_owner`) have shown.
        self._speakers: OrderedDict[Scope | None, set[str]] = OrderedDict()
        #: The claim's holder (`PID@HOST`) when the last `index` gave up waiting for it, else None.
        self.waited_for: str | None = None

    def pending(self, scope: Scope | None = None) -> int:
        """How many messages of the scope's user or session (`owner`; None: the store) have no
        vectors yet."""
        return vsql.pending_count(self.store, self.model, _owner(scope))

    def index(
        self,
        limit: int | None = None,
        batch: int = 512,
        progress: Callable[[int], None] | None = None,
        wait: float | None = None,
        scope: Scope | None = None,
    ) -> int:
        """Embed messages that have no vectors, `batch` at a time (fewer when they are long: at
        most BATCH_CHARS characters of messages in memory); return how many were done. With
        `scope`, only the messages of its user or session (`owner`): another user's wait for
        their own scope's search, or an `index` of the store.

        One process embeds a model's messages at a time (a claim in the store, renewed each
        batch): while another holds it, this one waits (up to `wait` seconds, default
        CLAIM_WAIT, then returns what it did; at once inside a write transaction; `waited_for`
        then names the holder) and takes up what is still missing when the other is done, so
        that two searches at once do not embed the same messages twice. A holder whose process
        is dead is taken over at once."""
        import time

        owner = _owner(scope)
        token = vsql.claim_token()
        wait = CLAIM_WAIT if wait is None else wait
        self.waited_for = None
        if getattr(self.store, "transaction_depth", 0):
            wait = 0.0  # this process holds the write lock: the claim's holder could not write
        claimed = False
        done = 0
        waiting_since: float | None = None
        queue: list[int] = []  # pending ids read under the claim, in the order they are done
        changed: set[int] = set()  # those of them changed since they were embedded
        try:
            while limit is None or done < limit:
                size = batch if limit is None else min(batch, limit - done)
                if not queue and not vsql.pending_ids(self.store, self.model, owner, 1)[0]:
                    if claimed:  # all done: the scope's next searches start past it
                        vsql.settle(self.store, self.model, owner)
                    break
                if not vsql.claim_embedding(self.store, self.model, token):
                    queue = []  # another holder may embed them meanwhile: read them again
                    now = time.monotonic()
                    waiting_since = now if waiting_since is None else waiting_since
                    if now - waiting_since >= wait:
                        self.waited_for = vsql.claim_holder(self.store, self.model) or "another"
                        break
                    time.sleep(CLAIM_POLL)
                    continue
                claimed, waiting_since = True, None
                if not queue:
                    # Read under the claim: what another process embedded meanwhile is not
                    # pending, and nobody else embeds while it is held.
                    left = QUEUE if limit is None else min(QUEUE, limit - done)
                    queue, changed = vsql.pending_ids(self.store, self.model, owner, left)
                    if not queue:
                        continue  # (settled above on the next turn)
                rows, used = vsql.unit_rows(self.store, queue[:size], BATCH_CHARS)
                queue = queue[used:]
                if not rows:
                    continue
                self._embed(rows, owner, changed)
                done += len(rows)
                if progress is not None:
                    progress(len(rows))
        finally:
            if claimed:
                vsql.release_embedding(self.store, self.model, token)
        return done

    def texts(self, rows: Sequence[vsql.UnitRow]) -> list[tuple[str, list[str]]]:
        """For each message: its own `Name: text` and those of the `vector_context` messages
        before it in its session (what its vector is made from)."""
        context = self.options.vector_context
        out = []
        for row in rows:
            before: list[str] = []
            if context:
                span = sql.session_span(self.store, row.session_id, row.seq - context, row.seq - 1)
                before = [unit_text(b.name, b.role, b.content) for b in span]
            out.append((unit_text(row.name, row.role, row.content), before))
        return out

    def _embed(self, rows: Sequence[vsql.UnitRow], scope: Scope | None, changed: set[int]) -> None:
        """Embed these pending messages of `scope` (its user's or session's, None: the store's)
        and move the scope's mark past them; `changed`: those that are not in id order (changed
        after they were embedded), which move no mark."""
        import numpy as np

        units = self.texts(rows)
        # Each text once (a message is also the one before the next), in pieces that fit; a
        # message with no text gets no vector, and is not given to the model.
        blank = {row.id for row in rows if not row.content.strip()}
        texts = list(
            dict.fromkeys(
                [
                    t
                    for row, (own, before) in zip(rows, units, strict=True)
                    if row.id not in blank
                    for t in (own, *before)
                ]
            )
        )
        weighted = dict(zip(texts, weighted_pieces(self.embedder, texts), strict=True))
        stored: list[tuple[int, int, int, bytes]] = []
        cleared: list[int] = []
        for row, (own, before) in zip(rows, units, strict=True):
            if row.id in blank:
                cleared.append(row.id)
                continue
            context = sum(
                (weighted[t].sum(axis=0) for t in before), np.zeros(self.embedder.dim, np.float32)
            )
            for i, piece in enumerate(weighted[own]):
                vector = (piece + context).astype(np.float32)
                vector /= max(float(np.linalg.norm(vector)), 1e-12)
                stored.append((row.id, i, len(vector), vector.tobytes()))
        through = max((r.id for r in rows if r.id not in changed), default=0)
        vsql.add_vectors(self.store, self.model, stored, through, cleared, scope)

    def search(
        self,
        query: str,
        *,
        k: int = 5,
        user_id: str | None = None,
        session_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        mode: str = "hybrid",
        archived_only: bool = False,
        except_window: str | None = None,
        parts: Sequence[str] | None = None,
        embed: bool = True,
    ) -> SearchResult:
        """The best `k` hits for `query` among the messages in scope, best first.

        `since`/`until` bound each message's time (its timestamp, else when it was stored;
        `until` excluded); `archived_only` leaves out what is still in short-term memory;
        `except_window`, what is still in that session's short-term memory.
        `parts`, when the query is several messages (a chat's window), are embedded one by one
        and summed, weighted by their words, as a stored message's vector is made with the one
        before it; each part's vector is kept, so the next turn's window embeds only its new
        messages.
        `embed=False` searches the vectors there are: the scope's messages not embedded yet
        (`result.pending`) are found by words only, and none is embedded, nor is another
        process's embedding claim waited for (a chat's turn: its importer, or the chat's own
        flushes, embed them; `memcli search` embeds them first).

        The steps: bring the full-text index up to date; add the time window the query names
        as a second scope; embed the scope's pending messages and start the dense search in a
        thread (`_start_dense`); meanwhile rank by BM25 on the query without the speakers'
        names it holds (`_without_speakers`), restarting the dense search when those names
        were not the ones guessed; fuse the lists (`_fuse`) and make hits of the best."""
        if mode not in MODES:
            raise UsageError(f"unknown search mode {mode!r}", f"Use one of: {', '.join(MODES)}")
        if since is not None and until is not None and since >= until:
            raise UsageError("--since must be before --until", "Swap the two times")
        result = SearchResult(hits=[])
        self._query = None
        if k <= 0 or not query.strip():
            return result
        scope = Scope(
            user_id=user_id,
            session_id=session_id,
            since=since,
            until=until,
            archived_only=archived_only,
            except_window=except_window,
        )
        o = self.options
        wants_lexical = mode != "vector" and o.lexical_weight > 0
        wants_dense = mode != "lexical" and o.vector_weight > 0
        self._catch_up_words(wants_lexical)
        scopes = self._scopes(query, scope, result)
        owner = _owner(scope)
        words = query_words(query) if o.speaker_weight > 0 else set()
        dense_job = guess = None
        if wants_dense:
            self._catch_up_vectors(owner, result, embed)
            guess, dense_job = self._start_dense(query, owner, words, scopes, parts)
        text, first = self._without_speakers(query, scope, owner, words)
        if dense_job is not None and not parts and guess != text:
            dense_job.result()  # (it holds the vectors' connection)
            dense_job = _Background(self._dense, text, scopes, o.candidates, parts)
        lexical: list[list[tuple[int, float]]] = [[] for _ in scopes]
        if wants_lexical:
            lexical = [
                first
                if at == 0 and text == query and first is not None
                else self.lexical.search(text, s, o.candidates)
                for at, s in enumerate(scopes)
            ]
        dense = dense_job.result() if dense_job is not None else [[] for _ in scopes]
        fused = self._fuse(query, mode, lexical, dense)
        # Earlier copies of a question (and replies that only restate it) go after the rest.
        fused = demote_echoes(fused, query, lambda ids: sql.message_rows(self.store, ids), k * 4)
        result.hits = self._hits(fused, lexical[0], dense[0], k, scope, query_terms(query))
        return result

    def _catch_up_words(self, wants_lexical: bool) -> None:
        """Add the messages stored since the last search to the full-text index; when BM25 ranks
        and that takes a second or more (after a bulk import), `on_build` is told first."""
        if self.on_build is not None and wants_lexical:
            behind = sql.fts_behind(self.store)
            if behind / FTS_RATE >= ANNOUNCE_SECONDS:
                self.on_build(Building("index", behind, behind, behind / FTS_RATE))
        sql.catch_up(self.store)

    def _scopes(self, query: str, scope: Scope, result: SearchResult) -> list[Scope]:
        """The scopes searched: the search's own, and, when the query names a time ("last May")
        and `window_weight` is set, the same within that window (`result.window`), whose lists
        join the fusion at `window_weight`."""
        scopes = [scope]
        if self.options.window_weight > 0:
            result.window = self._window(query, scope)
            if result.window is not None:
                scopes.append(
                    dataclasses.replace(scope, since=result.window.since, until=result.window.until)
                )
        return scopes

    def _catch_up_vectors(self, owner: Scope | None, result: SearchResult, embed: bool) -> None:
        """Embed what is missing in the scope's user or session (`owner`) first, up to
        `embed_limit`, never another user's messages (`result.embedded`, `result.pending`);
        `on_build` is told when that, or filling pgvector's index after a copy, takes a second
        or more. Without `embed`, only count what is missing (`result.pending`)."""
        o = self.options
        finish = getattr(self.vectors, "finish_deletes", None)  # (here, not in the dense thread)
        if finish is not None:
            finish()
        pending = self.pending(owner)
        if not embed:
            result.pending = pending
            return
        if pending:
            count = min(pending, o.embed_limit)
            if self.on_build is not None and count / EMBED_RATE >= ANNOUNCE_SECONDS:
                self.on_build(Building("vectors", count, pending, count / EMBED_RATE))
            result.embedded = self.index(limit=o.embed_limit, scope=owner)
            result.pending = self.pending(owner)  # another process may have embedded some
        else:  # (what another scope embedded past its mark is not looked at again)
            vsql.settle(self.store, self.model, owner)
        to_fill = getattr(self.vectors, "to_fill", None)  # pgvector's index, after a copy
        if self.on_build is not None and to_fill is not None:
            count, seconds = to_fill(owner)
            if seconds >= ANNOUNCE_SECONDS:
                self.on_build(Building("pgvector", count, count, seconds))

    def _start_dense(
        self,
        query: str,
        owner: Scope | None,
        words: set[str],
        scopes: Sequence[Scope],
        parts: Sequence[str] | None,
    ) -> tuple[str, _Background]:
        """The text the dense search starts on, and the search, running in a thread.

        A speaker's name in the query ("What pets does Melanie have?") says whose messages to
        prefer (the speaker fusion of `_fuse`), not what they say: BM25 and the query's vector
        are of the query without it. (Names are indexed and embedded with each message, so the
        name alone would match, and pull the vector toward, every message of that speaker.) The
        names are those of the speakers among the messages BM25 finds for the whole query
        (`_without_speakers`). The dense search does not wait for BM25 to name them: it starts
        at once on the query without the names this scope's hits have shown so far (a
        conversation has few speakers), and `search` starts it again, on the right text, only
        when BM25's names take out other words (so the first search of a scope that names a
        speaker searches twice). Embedding the query and the FAISS search (in a cold process,
        loading the model and the index) run in the thread while the database ranks BM25:
        neither holds the GIL. (A window's parts make the vector: the names do not change it.)
        """
        known = self._speakers.get(owner, set())
        guess = query if parts else _without(query, naming_words(known, words))
        return guess, _Background(self._dense, guess, scopes, self.options.candidates, parts)

    def _without_speakers(
        self, query: str, scope: Scope, owner: Scope | None, words: set[str]
    ) -> tuple[str, list[tuple[int, float]] | None]:
        """The query without the words that name speakers of the messages BM25 finds for it
        (remembered for the owner's next searches), and that BM25 list; with `speaker_weight`
        0, the query itself and no list."""
        if not self.options.speaker_weight > 0:
            return query, None
        first = self.lexical.search(query, scope, self.options.candidates)
        names = sql.speaker_names(self.store, [i for i, _ in first])
        if names:
            self._remember_speakers(owner, names)
        return _without(query, naming_words(names, words)), first

    def _fuse(
        self,
        query: str,
        mode: str,
        lexical: Sequence[list[tuple[int, float]]],
        dense: Sequence[list[tuple[int, float]]],
    ) -> list[tuple[int, float]]:
        """The lists fused by weighted reciprocal rank (the mode's weights; a time window's
        lists times `window_weight`); then the messages of a speaker the query names ("What did
        Caroline ...") move up: the fused order restricted to them joins the fusion again at
        `speaker_weight`."""
        o = self.options
        weights = {
            "hybrid": (o.lexical_weight, o.vector_weight),
            "lexical": (1.0, 0.0),
            "vector": (0.0, 1.0),
        }[mode]
        ranked = []
        for at, (lex, vec) in enumerate(zip(lexical, dense, strict=True)):
            factor = o.window_weight if at else 1.0
            ranked += [(weights[0] * factor, [i for i, _ in lex])]
            ranked += [(weights[1] * factor, [i for i, _ in vec])]
        fused = fuse(ranked, o.rrf_k)
        if o.speaker_weight > 0 and fused:
            named = spoken_by(self.store, [i for i, _ in fused], query_words(query))
            if named:
                fused = fuse([(1.0, [i for i, _ in fused]), (o.speaker_weight, named)], o.rrf_k)
        return fused

    def _remember_speakers(self, owner: Scope | None, names: set[str]) -> None:
        """Add names to those `owner`'s hits have shown (a bounded memory: SPEAKER_SCOPES
        scopes, SPEAKER_NAMES names each; the rest only costs a second dense search)."""
        known = self._speakers.setdefault(owner, set())
        self._speakers.move_to_end(owner)
        if len(known) + len(names) > SPEAKER_NAMES:
            known.clear()
        known |= set(list(names)[:SPEAKER_NAMES])
        while len(self._speakers) > SPEAKER_SCOPES:
            self._speakers.popitem(last=False)

    def _window(self, query: str, scope: Scope) -> TimeWindow | None:
        """The time window the query names within the scope's, or None (see `search.when`):
        relative times count back from the latest message of the scope's user or session,
        short-term memory included (now if there is none): the conversation's present."""
        if not names_time(query):
            return None
        present = Scope(user_id=scope.user_id, session_id=scope.session_id)
        reference = sql.latest_time(self.store, present) or datetime.now(UTC)
        window = time_window(query, reference)
        if window is None:
            return None
        since = window.since if scope.since is None else max(window.since, scope.since)
        until = window.until if scope.until is None else min(window.until, scope.until)
        if since >= until:
            return None
        return dataclasses.replace(window, since=since, until=until)

    def _dense(
        self, query: str, scopes: Sequence[Scope], n: int, parts: Sequence[str] | None = None
    ) -> list[list[tuple[int, float]]]:
        vector = self._parts_vector(parts) if parts else self._query_vector(query)
        self._query = vector  # for the best piece of a long message (see `_shorten`)
        self.vectors.refresh()
        return [self.vectors.search(vector, scope, n) for scope in scopes]

    def _parts_vector(self, parts: Sequence[str]) -> Any:
        """The normalised sum of the parts' vectors, each its pieces' vectors times their words."""
        import numpy as np

        cache = self._part_vectors
        missing = [p for p in dict.fromkeys(parts) if p not in cache]
        for text, rows in zip(missing, weighted_pieces(self.embedder, missing), strict=True):
            cache[text] = rows.sum(axis=0)
        total = sum((cache[p] for p in parts), np.zeros(self.embedder.dim, np.float32))
        for text in parts:
            cache.move_to_end(text)
        while len(cache) > PART_VECTORS:
            cache.popitem(last=False)
        return total / max(float(np.linalg.norm(total)), 1e-12)

    def _query_vector(self, query: str) -> Any:
        pieces = embedded_pieces(self.embedder, [query])[0]
        if len(pieces) > QUERY_PIECES:  # (a pasted page: pieces spread over it, first and last)
            last = len(pieces) - 1
            pieces = [pieces[round(i * last / (QUERY_PIECES - 1))] for i in range(QUERY_PIECES)]
        vectors = self.embedder.embed(pieces)
        if len(pieces) == 1:
            return vectors[0]
        mean = vectors.mean(axis=0)  # a long query: the normalised mean of its pieces
        return mean / max(float((mean**2).sum()) ** 0.5, 1e-12)

    def _hits(
        self,
        fused: list[tuple[int, float]],
        lexical: list[tuple[int, float]],
        dense: list[tuple[int, float]],
        k: int,
        scope: Scope,
        terms: Sequence[str] = (),
    ) -> list[Hit]:
        lex = {item: (rank, score) for rank, (item, score) in enumerate(lexical, start=1)}
        vec = {item: (rank, score) for rank, (item, score) in enumerate(dense, start=1)}
        rows = sql.message_rows(self.store, [item for item, _ in fused[: k * 4]])
        taken: set[int] = set()
        hits: list[Hit] = []
        for at, (item, score) in enumerate(fused):
            if len(hits) >= k:
                break
            if at and at % (k * 4) == 0:
                rows.update(sql.message_rows(self.store, [i for i, _ in fused[at : at + k * 4]]))
            row = rows.get(item)
            if row is None or item in taken:
                continue
            messages = self._with_context(row, taken, scope)
            taken.update(m.id for m in messages)
            how = "lexical" if item in lex else "vector" if item in vec else ""
            messages = [self._shorten(m, terms, how if m.id == item else "") for m in messages]
            hits.append(
                Hit(
                    rank=len(hits) + 1,
                    score=score,
                    session_id=row.session_id,
                    messages=messages,
                    anchor_id=item,
                    lexical_rank=lex.get(item, (None, None))[0],
                    lexical_score=lex.get(item, (None, None))[1],
                    vector_rank=vec.get(item, (None, None))[0],
                    vector_score=vec.get(item, (None, None))[1],
                )
            )
        return hits

    def _shorten(self, row: MessageRow, terms: Sequence[str], how: str) -> MessageRow:
        """A long message as the stretch that matched (see LONG_CHARS): found by its vector only,
        its best-scoring piece; else where the query's words occur most; else its beginning. Its
        tokens are the message's in proportion to the characters kept."""
        if len(row.content) <= LONG_CHARS:
            return row
        text = self._best_piece(row) if how == "vector" else None
        if text is None:
            text = lexical_excerpt(row.content, terms)
        if text is None:
            text = excerpt_at(row.content, 0, EXCERPT_CHARS)
        tokens = -(-row.tokens * len(text) // len(row.content))
        return dataclasses.replace(row, content=text, tokens=min(row.tokens, tokens))

    def _best_piece(self, row: MessageRow) -> str | None:
        """The text of the message's piece whose stored vector is nearest the query's."""
        import numpy as np

        query = getattr(self, "_query", None)
        stored = vsql.message_vectors(self.store, self.model, [row.id]).get(row.id)
        if query is None or not stored:
            return None
        stored = [(n, v) for n, v in stored if vsql.fits(v, len(query))]
        if not stored:
            return None
        matrix = vsql.to_matrix([v for _, v in stored], len(query))
        number = stored[int(np.argmax(matrix @ query))][0]
        own = unit_text(row.name, row.role, row.content)
        pieces = embedded_pieces(self.embedder, [own])[0]
        if number >= len(pieces):
            return None  # embedded under other rules (an older memcli): not found again
        piece = pieces[number].strip()
        prefix = own[: len(own) - len(row.content)]
        if own.startswith(piece):
            return excerpt_at(row.content, 0, min(len(piece) - len(prefix), EXCERPT_CHARS))
        at = row.content.find(piece)
        if at < 0:
            return None
        return excerpt_at(row.content, at, at + min(len(piece), EXCERPT_CHARS))

    def _with_context(self, row: MessageRow, taken: set[int], scope: Scope) -> list[MessageRow]:
        """The message plus its nearest neighbours, alternating before and after, while the
        hit stays within `context_tokens`; a message already in an earlier hit, or out of the
        search's scope, stops that side."""
        o = self.options
        if (o.context_before == 0 and o.context_after == 0) or row.tokens >= o.context_tokens:
            return [row]
        span = sql.session_span(
            self.store, row.session_id, row.seq - o.context_before, row.seq + o.context_after
        )
        before = [m for m in span if m.seq < row.seq][::-1]
        after = [m for m in span if m.seq > row.seq]
        chosen = [row]
        total = row.tokens
        sides = [before, after]
        open_sides = [True, True]
        for step in range(max(len(before), len(after))):
            for side in (0, 1):
                if not open_sides[side] or step >= len(sides[side]):
                    continue
                m = sides[side][step]
                if m.id in taken or total + m.tokens > o.context_tokens or not _within(m, scope):
                    open_sides[side] = False
                    continue
                chosen.append(m)
                total += m.tokens
        return sorted(chosen, key=lambda m: m.seq)


class Retrievers:
    """Retrievers shared by everything in a process that searches a store alike: one per store
    (connection), embedder (the name of its vectors), options and index folder, made on first
    `get`. A Retriever holds its store's index (the FAISS index and the vectors not in it yet):
    an MCP server whose sessions' vector blocks each made their own loaded it once per session
    served (30 sessions: +28 MB on a store of 720 messages, and as many copies of a big store's
    index), beside the copy its search tool held. Those sharing one must use its store one call
    at a time, as they must use the store (a server's calls hold one lock; each background
    thread has its own connection, hence its own retriever)."""

    def __init__(self) -> None:
        import threading

        self._held: dict[tuple[Any, ...], Retriever] = {}
        self._lock = threading.Lock()

    def get(
        self,
        store: Any,
        embedder: Embedder,
        options: SearchOptions | None = None,
        index_dir: str | Path | None = None,
    ) -> Retriever:
        """The retriever over `store` with these embedder, options and index folder (made now
        when there is none). Those over stores closed since are let go."""
        options = options or SearchOptions()
        key = (id(store), embedder.name, options, None if index_dir is None else str(index_dir))
        with self._lock:
            for held_key, held in list(self._held.items()):
                if getattr(held.store, "closed", False):
                    del self._held[held_key]
            retriever = self._held.get(key)
            if retriever is None or retriever.store is not store:  # (an id used again)
                retriever = Retriever(store, embedder, options, index_dir)
                self._held[key] = retriever
            return retriever


def _owner(scope: Scope | None) -> Scope | None:
    """The scope whose messages a search of `scope` embeds: its user's or its session's (whatever
    its time range or status), None for the store."""
    return None if scope is None else sql.owner(scope)


def weighted_pieces(embedder: Embedder, texts: Sequence[str]) -> list[Any]:
    """Per text, its pieces' vectors (one model call for all), each times the piece's words: a
    message's vector, and a query's in parts, are sums of these, normalised."""
    import numpy as np

    if not texts:
        return []
    pieces = embedded_pieces(embedder, texts)
    vectors = embedder.embed([p for ps in pieces for p in ps])
    out = []
    at = 0
    for ps in pieces:
        words = np.array([max(1, len(p.split())) for p in ps], dtype=np.float32)
        out.append(vectors[at : at + len(ps)] * words[:, None])
        at += len(ps)
    return out


def _without(query: str, names: set[str]) -> str:
    """The query without the words that name speakers (the query itself when nothing is left)."""
    return (without_words(query, names) if names else None) or query


def _within(m: MessageRow, scope: Scope) -> bool:
    """Whether a neighbouring message may join a hit under the search's scope."""
    if scope.archived_only and m.status != "archived":
        return False
    if scope.except_window == m.session_id and m.status == "active":
        return False
    if m.timestamp is not None:
        if scope.since is not None and m.timestamp < scope.since:
            return False
        if scope.until is not None and m.timestamp >= scope.until:
            return False
    return True


class _Background:
    """Run a function in a thread; `result()` waits for it and re-raises what it raised."""

    def __init__(self, function: Callable[..., Any], *args: Any) -> None:
        import threading

        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = function(*args)
            except BaseException as exc:  # handed to the caller
                self._error = exc

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
