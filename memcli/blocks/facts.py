"""FactBlock: an LLM extracts the facts the user disclosed from each flushed batch.

As the reference: the LLM is asked for concrete facts not already known, answered as
`<facts><fact>...</fact></facts>`; over `max_facts` it is asked for a condensed replacement list.
Beyond it: facts persist in the store with provenance and a history, duplicates are caught after
normalising case and white space, and a failed, empty or malformed reply never touches the facts:
the batch stays pending. After a later flush whose extraction worked, a pending batch is retried
with back-off: after 1, 2, 4, ... later flushes, at most `auto_retries` times; then it waits for
`extract_pending` (`memcli facts extract --pending`), which retries every pending batch.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from memcli.blocks.base import BlockContext, Deferred, LLMBlock
from memcli.blocks.fact_replies import (
    CONDENSE_PROMPT,
    EXTRACT_PROMPT,
    FACTS_SCHEMA,
    changes_of,
    check_reply,
    fact_prompt,
    parse_fact_reply,
)
from memcli.blocks.feed import FeedResult
from memcli.errors import ConfigError, ProviderError
from memcli.llm import LLMConfig
from memcli.search.facts import FactVectors, rank_facts
from memcli.store import facts as fact_store
from memcli.store import longterm, work
from memcli.template import neutralise

if TYPE_CHECKING:
    from collections.abc import Sequence

    from memcli.messages import Message
    from memcli.search.embedder import Embedder
    from memcli.store.base import SessionInfo
    from memcli.tokens import Tokenizer

#: The most tokens (cl100k) of facts a fact block shows by default: when the facts do not all
#: fit, those that bear most on the input (by words, entities and meaning) are shown.
FACT_TOKEN_BUDGET = 400


class FactBlock(LLMBlock):
    """Facts extracted by an LLM (through litellm), kept in the store, rendered as `<fact>` lines.

    A batch whose extraction failed is retried after later flushes whose extraction worked (the
    LLM answers again): up to `retry_pending` batches per flush, each at most `auto_retries`
    times, after 1, 2, 4, ... later flushes. Extra keyword arguments go to litellm as they are
    (temperature=0, ...).
    """

    name = "extracted_info"
    priority = 1
    KIND = "facts"
    TABLE_OPTIONS = {"temperature": (int, float)}
    OPTIONS = {
        **LLMBlock.OPTIONS,
        "max_facts": (int,),
        "candidates": (int,),
        "token_budget": (int,),
        **TABLE_OPTIONS,
    }
    SETTINGS = (*LLMBlock.SETTINGS, "embedder")
    task = "extract facts"

    def __init__(
        self,
        name: str | None = None,
        model: str | None = None,
        max_facts: int = 50,
        priority: int | None = None,
        api_base: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        scope: str | None = None,
        retry_pending: int = 3,
        auto_retries: int = 3,
        llm: LLMConfig | None = None,
        embedder: Embedder | None = None,
        candidates: int = 25,
        token_budget: int | None = None,
        **litellm_kwargs: Any,
    ) -> None:
        # Without a model the block shows the facts it holds (added by hand) and takes no
        # flushes; once a model is set, `blocks backfill` (or `facts extract`) hands it them all.
        super().__init__(
            name=name,
            model=model,
            priority=priority,
            api_base=api_base,
            api_key=api_key,
            timeout=timeout,
            scope=scope,
            retry_pending=retry_pending,
            auto_retries=auto_retries,
            llm=llm,
            **litellm_kwargs,
        )
        if not isinstance(max_facts, int) or isinstance(max_facts, bool) or max_facts < 1:
            raise ConfigError(
                f"block {self.name!r}: max_facts must be a whole number >= 1, not {max_facts!r}",
                "The default is 50",
            )
        self.max_facts = max_facts
        # The existing facts an extraction is shown: the `candidates` most related to the batch
        # (words, and meaning with an embedder), whatever the number of facts stored.
        if not isinstance(candidates, int) or isinstance(candidates, bool) or candidates < 1:
            raise ConfigError(
                f"block {self.name!r}: candidates must be a whole number >= 1, not {candidates!r}",
                "The default is 25",
            )
        self.candidates = candidates
        given_budget = token_budget
        token_budget = FACT_TOKEN_BUDGET if token_budget is None else token_budget
        if not isinstance(token_budget, int) or isinstance(token_budget, bool) or token_budget < 0:
            raise ConfigError(
                f"block {self.name!r}: token_budget must be a whole number >= 0, not"
                f" {token_budget!r}",
                f"The default is {FACT_TOKEN_BUDGET}; 0 shows every fact",
            )
        #: The most tokens of facts shown (0: every fact, as LlamaIndex's fact block).
        self.token_budget = token_budget
        self._budget_given = given_budget is not None
        self._vectors = FactVectors(embedder) if embedder is not None else None
        self._drop_order: list[int] = []  # set by `get` for `truncate`
        self._rendered: str | None = None

    def definition(self) -> dict[str, Any]:
        """kind "facts" with its model, API base, limits and the litellm options a table takes
        (temperature) and how calls are made (`model_table`); never the API key."""
        if type(self) is not FactBlock:
            return super().definition()
        table: dict[str, Any] = {
            "kind": self.KIND,
            "name": self.name,
            "priority": self.priority,
            "scope": self.scope,
            "max_facts": self.max_facts,
            "retry_pending": self.retry_pending,
            "auto_retries": self.auto_retries,
            **self.model_table(),
        }
        if self.candidates != 25:
            table["candidates"] = self.candidates
        if self.token_budget != FACT_TOKEN_BUDGET:
            table["token_budget"] = self.token_budget
        return table

    # -- receiving flushes ------------------------------------------------------------------------

    def put(self, batch: Sequence[Message], ctx: BlockContext) -> None:
        """Extract this batch (Deferred if that fails); when it worked, the LLM is answering again:
        retry up to `retry_pending` failed batches whose back-off has passed. Messages read
        while they were active (`memcli facts extract`) are not sent again."""
        batch = self.unread(batch, ctx)
        reason = self.extract(batch, ctx) if batch else None
        if reason is not None:
            raise Deferred(reason)
        if self.retry_pending and self.auto_retries:
            key = self.scope_key(ctx)
            due = longterm.pending_flushes(ctx.store, self.name, key, retries=self.auto_retries)
            due = [p for p in due if p[0] != ctx.flush_id]
            self.retry(ctx.store, key, ctx.tokenizer, due[: self.retry_pending])

    def retry(
        self,
        store: Any,
        scope_key: str,
        tokenizer: Tokenizer,
        flushes: Sequence[tuple[int, str]] | None = None,
    ) -> tuple[int, int]:
        """Extract again from these pending (flush id, session id) batches (default: every pending
        batch of the scope, whatever its back-off); return (now done, failed again)."""
        if flushes is None:
            flushes = longterm.pending_flushes(store, self.name, scope_key)
        done = failed = 0
        for flush_id, session_id in flushes:
            info = store.get_session(session_id)
            if info is None:
                continue
            ctx = BlockContext(session_id, info.user_id, store, tokenizer, flush_id)
            batch = self.unread(longterm.flush_messages(store, flush_id), ctx)
            reason = self.extract(batch, ctx) if batch else None
            status = "done" if reason is None else "pending"
            longterm.mark_flushes(store, self.name, scope_key, [flush_id], status, reason)
            done += reason is None
            failed += reason is not None
        return done, failed

    def unread(self, batch: Sequence[Message], ctx: BlockContext) -> list[Message]:
        """The batch's messages this block has not read while they were active."""
        ranges = longterm.read_ranges(ctx.store, self.name, self.scope_key(ctx), ctx.session_id)
        if not ranges:
            return list(batch)
        return [m for m in batch if m.id is None or not any(a <= m.id <= b for a, b in ranges)]

    def prompt_tokens(self, store: Any, key: str, tokenizer: Tokenizer) -> int:
        """The tokens of the prompt an extraction in scope `key` sends besides its batch (as
        `conversation_text`): with as many of the facts known now as it would be shown (the
        oldest, for the estimate: no search is run)."""
        known = fact_store.fact_texts(store, self.name, key)[: self.candidates]
        shown = fact_store.get_facts(store, [f.id for f in known])
        prompt = fact_prompt(EXTRACT_PROMPT, self.uses_schema, existing=self._render(shown, True))
        return tokenizer.count(prompt)

    def related(self, store: Any, scope_key: str, text: str) -> list[fact_store.Fact]:
        """The current facts an extraction of `text` is shown: all of them when they are at most
        `candidates`, else the `candidates` most related to it (oldest first)."""
        facts = fact_store.fact_texts(store, self.name, scope_key)
        if len(facts) > self.candidates:
            ranked = rank_facts(facts, text, self.candidates, self._vectors)
            facts = sorted((f for f, _ in ranked), key=lambda f: f.id)
        return fact_store.get_facts(store, [f.id for f in facts])

    def extract(
        self, batch: Sequence[Message], ctx: BlockContext, *, origin: str = "extracted"
    ) -> str | None:
        """Ask the LLM for the batch's new facts, shown the existing facts most related to it, and
        apply its answer (new facts, the ones they replace, the ones retired), recorded with
        `origin`; the reason it failed (nothing stored), or None. A batch of no session (a text
        given to `Facts.remember`: `ctx.session_id` empty) records none."""
        key = self.scope_key(ctx)
        shown = self.related(ctx.store, key, "\n".join(m.content for m in batch))
        as_json = self.uses_schema
        prompt = fact_prompt(EXTRACT_PROMPT, as_json, existing=self._render(shown, ids=True))
        try:
            reply = self.ask(prompt, batch, FACTS_SCHEMA)
        except ProviderError as error:
            return error.reason
        parsed = parse_fact_reply(reply)
        if parsed is None:
            return f"malformed reply: {reply.strip()[:200]!r}"
        problem = check_reply(parsed, shown)
        if problem is not None:
            return problem
        new, retire = changes_of(parsed)
        fact_store.change_facts(
            ctx.store,
            self.name,
            key,
            new,
            retire,
            origin=origin,
            session_id=ctx.session_id or None,
            flush_id=ctx.flush_id,
            message_ids=[m.id for m in batch if m.id is not None],
        )
        self.condense(ctx.store, key, ctx.flush_id)
        return None

    def condense(self, store: Any, scope_key: str, flush_id: int | None = None) -> bool:
        """Over max_facts, show the LLM the oldest `candidates` facts to merge (a merged fact
        supersedes the ones it names) and retire; nothing is deleted, the facts not named stay.
        A bad reply changes nothing; a failure, or a reply that leaves the facts over max_facts,
        is recorded (`memcli check` lists it) and tried again later. True when it changed facts."""
        count = fact_store.count_facts(store, self.name, scope_key)
        if self.llm is None or count <= self.max_facts:
            work.clear_condense_failure(store, self.name, scope_key)
            return False
        oldest = fact_store.fact_texts(store, self.name, scope_key)[: self.candidates]
        shown = fact_store.get_facts(store, [f.id for f in oldest])
        existing = self._render(shown, ids=True)
        prompt = fact_prompt(
            CONDENSE_PROMPT, self.uses_schema, max_facts=self.max_facts, existing=existing
        )
        try:
            reply = self.ask(prompt, schema=FACTS_SCHEMA)
        except ProviderError as error:
            return self._condense_failed(store, scope_key, error.reason, count)
        parsed = parse_fact_reply(reply)
        problem = "no facts" if parsed is None else check_reply(parsed, shown)
        if parsed is None or problem is not None:
            # (the reason names no fact text: it would outlive a forget)
            return self._condense_failed(store, scope_key, f"malformed reply ({problem})", count)
        new, retire = changes_of(parsed)
        changes = fact_store.change_facts(
            store,
            self.name,
            scope_key,
            new,
            retire,
            origin="condensed",
            action="condensed",
            flush_id=flush_id,
        )
        left = fact_store.count_facts(store, self.name, scope_key)
        if left > self.max_facts:  # applied, but not enough: tried again later
            reason = f"the reply left {left} facts, over max_facts ({self.max_facts})"
            self._condense_failed(store, scope_key, reason, left)
        else:
            work.clear_condense_failure(store, self.name, scope_key)
        return bool(changes.added or changes.superseded or changes.retired)

    def _condense_failed(self, store: Any, scope_key: str, reason: str, facts: int) -> bool:
        """Keep why condensing failed (`memcli check` lists it; the next extraction, or `memcli
        facts extract --pending`, tries again)."""
        work.record_condense_failure(store, self.name, scope_key, reason, facts, self.max_facts)
        return False

    # -- the context ------------------------------------------------------------------------------

    @staticmethod
    def _render(facts: Sequence[fact_store.Fact], ids: bool = False) -> str:
        """`<fact>` lines; with `ids`, each with its id, topics and entities (for the prompts).
        A fact's text cannot open or close the template's elements (`neutralise`)."""

        def line(f: fact_store.Fact) -> str:
            text = neutralise(f.text)
            if not ids:
                return f"<fact>{text}</fact>"
            attributes = f' id="{f.id}"'
            if f.topics:
                attributes += f' topics="{html.escape(", ".join(f.topics))}"'
            if f.entities:
                attributes += f' entities="{html.escape(", ".join(f.entities))}"'
            if f.expires_at is not None:
                attributes += f' expires="{f.expires_at.date().isoformat()}"'
            return f"<fact{attributes}>{text}</fact>"

        return "\n".join(line(f) for f in facts)

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        """The current facts as `<fact>` lines, oldest first: all of them when they fit
        `token_budget` (or it is 0), else those that bear most on the input (the last user
        message: by words and entities, and by meaning with an embedder) while they fit, then
        the newest others while they fit. When the context must be cut, truncation drops
        first the facts least related to the input."""
        self._tokenizer = ctx.tokenizer
        facts = fact_store.list_facts(ctx.store, self.name, self.scope_key(ctx))
        query = next((m.content for m in reversed(messages) if m.role == "user"), "")
        lines = [self._render([f]) for f in facts]
        costs = [ctx.tokenizer.count(line) + 1 for line in lines]  # and its newline
        fits = not self.token_budget or sum(costs) <= self.token_budget
        if fits:  # words and entities only: they say what truncation drops first
            ranked = rank_facts(facts, query, self.candidates) if query else []
        else:  # and meaning (one short embedding of the input; the facts' vectors are kept)
            vectors = None if self._embedder_preparing() else self._vectors
            ranked = rank_facts(facts, query, len(facts), vectors) if query else []
        position = {f.id: i for i, f in enumerate(facts)}
        related = [position[f.id] for f, _ in ranked]
        shown = list(range(len(facts)))
        if not fits:
            chosen = set(related)
            others = [i for i in reversed(shown) if i not in chosen]  # newest first
            shown, used = [], 0
            for i in [*related, *others]:
                if used + costs[i] <= self.token_budget:
                    shown.append(i)
                    used += costs[i]
            shown.sort()
        visible = set(shown)
        keep = [i for i in related if i in visible]
        kept = set(keep)
        order = [i for i in shown if i not in kept] + keep[::-1]
        at = {i: n for n, i in enumerate(shown)}
        self._drop_order = [at[i] for i in order]
        self._rendered = "\n".join(lines[i] for i in shown)
        return self._rendered

    def use_reference_defaults(self) -> bool:
        """Show every fact, as LlamaIndex's fact block, unless the block was given a
        `token_budget` (`MemcliMemory` does this). True when it changed the block."""
        if self._budget_given or not self.token_budget:
            return False
        self.token_budget = 0
        return True

    def _embedder_preparing(self) -> bool:
        """Whether the embedder still has its model to prepare (then facts are chosen by words
        and entities: a turn never waits for the model)."""
        embedder = self._vectors.embedder if self._vectors is not None else None
        return bool(getattr(embedder, "preparing", False))

    def truncate(self, content: str, tokens_over: int) -> str | None:
        """Drop facts until `tokens_over` tokens are gone: the oldest unrelated to the input
        first, the most related last; None when none are left."""
        lines = content.split("\n")
        count = self._tokenizer.count if self._tokenizer else (lambda t: len(t.split()))
        order = list(self._drop_order) if content == self._rendered else []
        order += [i for i in range(len(lines)) if i not in set(order)]
        dropped: set[int] = set()
        cut = 0
        for i in order:
            if cut >= tokens_over:
                break
            cut += count(lines[i])
            dropped.add(i)
        return "\n".join(line for i, line in enumerate(lines) if i not in dropped) or None


def extract_pending(
    store: Any,
    blocks: Sequence[FactBlock],
    sessions: Sequence[SessionInfo],
    tokenizer: Tokenizer,
) -> FeedResult:
    """Retry every pending batch of these sessions' scopes, whatever its back-off or attempts.

    Per block: how many batches are now done, how many are still pending afterwards, and the
    newest failure's reason.
    """
    result = FeedResult()
    for block in blocks:
        done = pending = 0
        for key in sorted({block.key_for(info.id, info.user_id) for info in sessions}):
            done += block.retry(store, key, tokenizer)[0]
            if work.condense_failures(store, block.name, key):
                block.condense(store, key)
            still = len(longterm.pending_flushes(store, block.name, key))
            if still:
                pending += still
                reason = longterm.pending_work(store, block.name, key)[1]
                if reason is not None:
                    result.errors.setdefault(block.name, reason)
        result.done[block.name] = done
        result.pending[block.name] = pending
    return result
