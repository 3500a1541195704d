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
import re
from typing import TYPE_CHECKING, Any

from memcli.blocks.base import BlockContext, Deferred, LLMBlock
from memcli.blocks.feed import FeedResult
from memcli.errors import ConfigError, ProviderError
from memcli.llm import LLMConfig
from memcli.store import longterm, work

if TYPE_CHECKING:
    from collections.abc import Sequence

    from memcli.messages import Message
    from memcli.store.base import SessionInfo
    from memcli.tokens import Tokenizer

EXTRACT_PROMPT = """You are a precise fact extraction system that finds key information in conversations.

INSTRUCTIONS:
1. Read the conversation segment in the next message.
2. Extract the specific, concrete facts the user disclosed, and important information discovered.
3. Focus on facts such as preferences, personal details, requirements, constraints and context.
4. Write each fact as a separate <fact> XML tag.
5. Give each fact one to three short topics (such as food, health, work, family, travel) in its
   topics attribute, lowercase and separated by commas.
6. No opinions, summaries or interpretations: only explicit information.
7. Do not repeat facts that are already in the existing facts.

<existing_facts>
{existing}
</existing_facts>

Answer ONLY with the new facts, in exactly this format:
<facts>
  <fact topics="topic a, topic b">Specific fact 1</fact>
  <fact topics="topic c">Specific fact 2</fact>
</facts>

If there are no new facts, answer: <facts></facts>"""

CONDENSE_PROMPT = """You are a precise fact condensing system.

INSTRUCTIONS:
1. Read the existing facts below.
2. Condense them into a shorter list of at most {max_facts} facts that keeps the important ones.
3. Focus on facts such as preferences, personal details, requirements, constraints and context.
4. Write each fact as a separate <fact> XML tag.
5. Keep the topics attribute of the facts you keep or merge.
6. No opinions, summaries or interpretations: only explicit information.
7. No duplicates.

<existing_facts>
{existing}
</existing_facts>

Answer ONLY with the complete condensed list, in exactly this format:
<facts>
  <fact topics="topic a, topic b">Specific fact 1</fact>
  <fact topics="topic c">Specific fact 2</fact>
</facts>"""

_FACTS = re.compile(r"<facts>(.*?)</facts>", re.S)
_FACT = re.compile(r"""\s*<fact(\s(?:[^<>"']|"[^"]*"|'[^']*')*)?>(.*?)</fact>\s*""", re.S)
_FACT_OPEN = re.compile(r"<fact[\s>]")
_TOPICS = re.compile(r"""^\s*topics\s*=\s*(?:"([^"]*)"|'([^']*)')\s*$""")
_COMMENT = re.compile(r"<!--.*?-->", re.S)


def _topics(attributes: str | None) -> list[str]:
    """The topics of a `<fact topics="a, b">` tag, normalised; none for any other attributes
    (a malformed attribute loses the topics, never the fact)."""
    if not attributes:
        return []
    match = _TOPICS.match(attributes)
    if match is None:
        return []
    return longterm.normalize_topics(html.unescape(match.group(1) or match.group(2) or ""))


def parse_fact_topics(reply: str) -> list[tuple[str, list[str]]] | None:
    """The facts of a `<facts><fact topics="...">...</fact></facts>` reply with their topics, or
    None when it is not one.

    Strict about the facts: exactly one `<facts>` element holding only `<fact>` elements (and
    white space or comments); each fact non-empty. Text around the `<facts>` element (a code
    fence, a preamble) is ignored. `<facts></facts>` and `<facts/>` are an empty list. Lenient
    about topics: a fact without them, or whose attributes are not `topics="a, b"`, has none.
    """
    text = reply.strip()
    if not text:
        return None
    blocks = _FACTS.findall(text)
    if not blocks:
        empty = re.fullmatch(r"(?s).*<facts\s*/>.*", text) and not _FACT_OPEN.search(text)
        return [] if empty else None
    if len(blocks) != 1:
        return None
    inner = _COMMENT.sub("", blocks[0])
    facts = []
    position = 0
    for match in _FACT.finditer(inner):
        if match.start() != position:
            return None
        position = match.end()
        fact = html.unescape(match.group(2)).strip()
        if not fact or "<fact" in fact or "</fact" in fact:
            return None
        facts.append((" ".join(fact.split()), _topics(match.group(1))))
    if inner[position:].strip():
        return None
    return facts


class FactBlock(LLMBlock):
    """Facts extracted by an LLM (through litellm), kept in the store, rendered as `<fact>` lines.

    A batch whose extraction failed is retried after later flushes whose extraction worked (the
    LLM answers again): up to `retry_pending` batches per flush, each at most `auto_retries`
    times, after 1, 2, 4, ... later flushes. Extra keyword arguments go to litellm as they are
    (temperature=0, ...).
    """

    name = "extracted_info"
    priority = 1
    TABLE_OPTIONS = ("temperature", "max_tokens")
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

    def definition(self) -> dict[str, Any]:
        """kind "facts" with its model, API base, limits and the litellm options a table takes
        (temperature, max_tokens); never the API key."""
        if type(self) is not FactBlock:
            return super().definition()
        table: dict[str, Any] = {
            "kind": "facts",
            "name": self.name,
            "priority": self.priority,
            "scope": self.scope,
            "max_facts": self.max_facts,
            "retry_pending": self.retry_pending,
            "auto_retries": self.auto_retries,
            **self.model_table(),
        }
        return table

    # -- receiving flushes ------------------------------------------------------------------------

    def put(self, batch: Sequence[Message], ctx: BlockContext) -> None:
        """Extract this batch (Deferred if that fails); when it worked, the LLM is answering again:
        retry up to `retry_pending` failed batches whose back-off has passed."""
        reason = self.extract(batch, ctx)
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
            reason = self.extract(longterm.flush_messages(store, flush_id), ctx)
            status = "done" if reason is None else "pending"
            longterm.mark_flushes(store, self.name, scope_key, [flush_id], status, reason)
            done += reason is None
            failed += reason is not None
        return done, failed

    def extract(self, batch: Sequence[Message], ctx: BlockContext) -> str | None:
        """Ask the LLM for the batch's new facts and store them; the reason it failed, or None."""
        key = self.scope_key(ctx)
        existing = longterm.list_facts(ctx.store, self.name, key)
        prompt = EXTRACT_PROMPT.format(existing=self._render(existing))
        try:
            reply = self.ask(prompt, batch)
        except ProviderError as error:
            return error.reason
        facts = parse_fact_topics(reply)
        if facts is None:
            return f"malformed reply: {reply.strip()[:200]!r}"
        longterm.add_facts(
            ctx.store,
            self.name,
            key,
            [text for text, _ in facts],
            origin="extracted",
            session_id=ctx.session_id,
            flush_id=ctx.flush_id,
            message_ids=[m.id for m in batch if m.id is not None],
            topics=[topics for _, topics in facts],
        )
        self.condense(ctx.store, key, ctx.flush_id)
        return None

    def condense(self, store: Any, scope_key: str, flush_id: int | None = None) -> bool:
        """Over max_facts, replace the facts with the LLM's condensed list; a bad reply is ignored."""
        from memcli.llm import complete

        facts = longterm.list_facts(store, self.name, scope_key)
        if self.llm is None or len(facts) <= self.max_facts:
            work.clear_condense_failure(store, self.name, scope_key)
            return False
        existing = self._render(facts, topics=True)
        prompt = CONDENSE_PROMPT.format(max_facts=self.max_facts, existing=existing)
        try:
            reply = complete(self.llm, [{"role": "user", "content": prompt}])
        except ProviderError as error:
            return self._condense_failed(store, scope_key, error.reason, len(facts))
        parsed = parse_fact_topics(reply)
        if not parsed or len(parsed) > self.max_facts:
            found = "no facts" if not parsed else f"{len(parsed)} facts, over max_facts"
            reason = f"malformed reply ({found})"  # (no fact text: it would outlive a forget)
            return self._condense_failed(store, scope_key, reason, len(facts))
        work.clear_condense_failure(store, self.name, scope_key)
        condensed = [t for t, _ in parsed]
        keep = {longterm.normalize_fact(t) for t in condensed}
        have = {longterm.normalize_fact(f.text) for f in facts}
        with store.transaction():
            for fact in facts:
                if longterm.normalize_fact(fact.text) not in keep:
                    longterm.delete_fact(
                        store, fact.id, action="condensed", flush_id=flush_id, origin="condensed"
                    )
            longterm.add_facts(
                store,
                self.name,
                scope_key,
                [t for t, _ in parsed if longterm.normalize_fact(t) not in have],
                origin="condensed",
                action="condensed",
                flush_id=flush_id,
                topics=[topics for t, topics in parsed if longterm.normalize_fact(t) not in have],
            )
        return True

    def _condense_failed(self, store: Any, scope_key: str, reason: str, facts: int) -> bool:
        """Keep why condensing failed (`memcli check` lists it; the next extraction, or `memcli
        facts extract --pending`, tries again)."""
        work.record_condense_failure(store, self.name, scope_key, reason, facts, self.max_facts)
        return False

    # -- the context ------------------------------------------------------------------------------

    @staticmethod
    def _render(facts: Sequence[longterm.Fact], topics: bool = False) -> str:
        """`<fact>` lines; with `topics`, each with its topics attribute (for the condense prompt)."""
        return "\n".join(
            f'<fact topics="{html.escape(", ".join(f.topics))}">{f.text}</fact>'
            if topics and f.topics
            else f"<fact>{f.text}</fact>"
            for f in facts
        )

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        self._tokenizer = ctx.tokenizer
        return self._render(longterm.list_facts(ctx.store, self.name, self.scope_key(ctx)))

    def truncate(self, content: str, tokens_over: int) -> str | None:
        """Drop the oldest facts until `tokens_over` tokens are gone; None when none are left."""
        lines = content.split("\n")
        count = self._tokenizer.count if self._tokenizer else (lambda t: len(t.split()))
        cut = 0
        while lines and cut < tokens_over:
            cut += count(lines.pop(0))
        return "\n".join(lines) or None


def extract_pending(
    store: Any,
    blocks: Sequence[FactBlock],
    sessions: Sequence[SessionInfo],
    tokenizer: Tokenizer,
) -> FeedResult:
    """Retry every pending batch of these sessions' scopes, whatever its back-off or attempts.

    Per block: how many batches are now done, and how many are still pending afterwards.
    """
    result = FeedResult()
    for block in blocks:
        done = pending = 0
        for key in sorted({block.key_for(info.id, info.user_id) for info in sessions}):
            done += block.retry(store, key, tokenizer)[0]
            if work.condense_failures(store, block.name, key):
                block.condense(store, key)
            pending += len(longterm.pending_flushes(store, block.name, key))
        result.done[block.name] = done
        result.pending[block.name] = pending
    return result
