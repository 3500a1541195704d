"""SummaryBlock: a running summary of the session, updated by an LLM with each flushed batch.

The LLM gets the previous summary and the batch and answers with the new summary as
`<summary>...</summary>`, in at most `max_tokens` tokens (memcli's tokenizer). Every version is
kept (memcli.store.summaries). A reply over the cap is cut at the last sentence end that fits (at
a word when no sentence does). A failed reply (an HTTP error, a timeout) or one that is not a
summary (empty, no single `<summary>` element, a refusal, the conversation echoed back) never
replaces the summary: the batch stays pending and is retried as the fact block retries, after 1,
2, 4, ... later flushes, at most `auto_retries` times (memcli.store.longterm.mark_flushes).

Batches are taken in in order: a batch whose session has an earlier one not taken in (pending,
or never handed to the block) waits for it. A later flush first retries the earliest waiting
batch when its back-off has passed (up to `retry_pending` batches per flush, in order), and
takes in its own batch only when none is left waiting. Each time a batch is handed to the block
and waits counts as one attempt of it. `memcli blocks backfill` takes in every waiting batch, in
order, whatever its back-off.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memcli.blocks.base import BlockContext, Deferred, LLMBlock, MemoryBlock
from memcli.errors import ConfigError, ProviderError
from memcli.llm import LLMConfig
from memcli.messages import session_name
from memcli.store import longterm, summaries
from memcli.template import neutralise

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from memcli.messages import Message
    from memcli.store.base import SessionInfo
    from memcli.tokens import Tokenizer

SUMMARY_PROMPT = """You keep a running summary of a conversation between a user and an assistant.

INSTRUCTIONS:
1. The summary so far is in <previous_summary> below (empty at the start).
2. The next part of the conversation is in <conversation>.
3. Write the new summary: the summary so far, updated with what the new part adds or changes.
4. Keep what still matters: who the user is, what they want, what was decided or done, what is
   still open. Drop what no longer matters.
5. Only what the conversation says: no advice, no commentary.
6. Plain prose, at most {max_words} words.

<previous_summary>
{previous}
</previous_summary>

Answer ONLY with the new summary, in exactly this format:
<summary>The new summary.</summary>"""

#: The answer section of SUMMARY_PROMPT when the reply is JSON (structured output).
JSON_ANSWER = """Answer ONLY with the new summary, as a JSON object:
{{"summary": "The new summary."}}"""
#: The JSON schema of a reply (structured output).
SUMMARY_SCHEMA: tuple[str, dict[str, Any]] = (
    "summary",
    {
        "type": "object",
        "properties": {"summary": {"type": "string"}},
        "required": ["summary"],
        "additionalProperties": False,
    },
)

_SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.S)
_THINKING = re.compile(r"<think>.*?</think>", re.S)
_FENCE = re.compile(r"^```[A-Za-z]*\s*\n(.*?)\n?```$", re.S)
_REFUSAL = re.compile(
    r"^(i'?m sorry|i am sorry|sorry[,.!]|i can(?:'|no)t|i am unable|i'?m unable|as an ai)", re.I
)
_MARKUP = re.compile(r"</?(summary|previous_summary|conversation|message)\b", re.I)
_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*(?=\s|$)")
_WORD_END = re.compile(r"\S(?=\s|$)")


def parse_summary(reply: str) -> str | None:
    """The summary of a `<summary>...</summary>` reply (text around the element ignored, a
    `<think>` section too; the element repeated the same is read once; white space collapsed
    within each line, empty lines dropped), or of a JSON reply `{"summary": "..."}` (structured
    output, `SUMMARY_SCHEMA`; in a code fence or not). None when the reply is not one: no
    element, or different ones, an empty one, an unclosed one (a reply cut by its bound), markup
    of the prompt inside it (the conversation echoed back), or a refusal ("I'm sorry, ...")."""
    reply = _THINKING.sub("", reply).strip()
    fenced = _FENCE.match(reply)
    body = fenced.group(1).strip() if fenced else reply
    if body.startswith("{"):
        try:
            data = json.loads(body)
        except ValueError:
            return None
        if not isinstance(data, dict) or set(data) != {"summary"}:
            return None
        if not isinstance(data["summary"], str):
            return None
        found = [data["summary"]]
    else:
        found = _SUMMARY.findall(reply)
        if len({" ".join(f.split()) for f in found}) != 1:  # none, or different ones
            return None
    text = html.unescape(found[0])
    lines = [" ".join(line.split()) for line in text.splitlines()]
    text = "\n".join(line for line in lines if line)
    if not text or _MARKUP.search(text) or _REFUSAL.match(text):
        return None
    return text


def cap_text(text: str, max_tokens: int, tokenizer: Tokenizer) -> str:
    """`text` if it has at most `max_tokens` tokens; else its longest start that does and ends a
    sentence; else (no sentence fits) its longest start that ends a word; "" when none fits."""
    if tokenizer.count(text) <= max_tokens:
        return text
    for pattern in (_SENTENCE_END, _WORD_END):
        ends = [m.end() for m in pattern.finditer(text)]
        fits = _longest_fitting(text, ends, max_tokens, tokenizer)
        if fits:
            return fits
    return ""


def _longest_fitting(text: str, ends: list[int], max_tokens: int, tokenizer: Tokenizer) -> str:
    """The longest `text[:end]` (of `ends`, ascending) within `max_tokens`: a binary search (a
    prefix of a text counts no more tokens than the text, nearly always), then checked."""
    low, high = 0, len(ends)  # ends[:low] fit as far as known; ends[high:] do not
    while low < high:
        mid = (low + high) // 2
        if tokenizer.count(text[: ends[mid]]) <= max_tokens:
            low = mid + 1
        else:
            high = mid
    for end in reversed(ends[:low]):
        if tokenizer.count(text[:end]) <= max_tokens:
            return text[:end]
    return ""


class SummaryBlock(LLMBlock):
    """A running summary of the session, kept in the store with every version, rendered as is.

    `max_tokens` caps the summary (counted with memcli's tokenizer); the model's reply is bounded
    by `reply_tokens` (default: twice `max_tokens`, at least 256). `retry_pending` and
    `auto_retries` mean what they mean for FactBlock. Extra keyword arguments go to litellm as
    they are (temperature=0, ...). A summary is of one session: scope is always "session".
    """

    name = "session_summary"
    priority = 1
    scope = "session"
    KIND = "summary"
    TABLE_OPTIONS = {"temperature": (int, float)}
    OPTIONS = {**LLMBlock.OPTIONS, **TABLE_OPTIONS}  # (max_tokens: the summary's cap)
    task = "summarise"

    def __init__(
        self,
        name: str | None = None,
        model: str | None = None,
        max_tokens: int = 400,
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
        # Without a model the block shows the summary it holds and takes no flushes.
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
        if self.scope != "session":
            raise ConfigError(
                f"block {self.name!r}: scope must be 'session', not {self.scope!r}",
                "A summary is of one session; leave scope out",
            )
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 10:
            raise ConfigError(
                f"block {self.name!r}: max_tokens must be a whole number >= 10, not {max_tokens!r}",
                "It caps the summary, in tokens; the default is 400",
            )
        self.max_tokens = max_tokens

    def default_reply_tokens(self) -> int:
        """Twice the summary's cap (a model's tokens are not memcli's), at least 256."""
        return max(256, 2 * self.max_tokens)

    def definition(self) -> dict[str, Any]:
        """kind "summary" with its model, API base, cap and retry limits, and the litellm option
        a table takes (temperature); never the API key."""
        if type(self) is not SummaryBlock:
            return super().definition()
        table: dict[str, Any] = {
            "kind": self.KIND,
            "name": self.name,
            "priority": self.priority,
            "max_tokens": self.max_tokens,
            "retry_pending": self.retry_pending,
            "auto_retries": self.auto_retries,
            **self.model_table(),
        }
        return table

    # -- receiving flushes ------------------------------------------------------------------------

    def put(self, batch: Sequence[Message], ctx: BlockContext) -> None:
        """Take the batch in after any earlier one still waiting (Deferred when that or this
        fails, or an earlier one must wait longer)."""
        blocked = self._take_in(batch, ctx)
        if blocked is not None:
            raise Deferred(blocked[1])

    def put_many(
        self,
        items: Sequence[tuple[Sequence[Message], BlockContext]],
        progress: Callable[[int], None] | None = None,
    ) -> list[str | None]:
        """Take the batches in, in order; once one of a session stays pending, the session's
        later ones wait for it (not sent to the LLM). `progress` is told after each batch."""
        results: list[str | None] = []
        blocked: dict[str, int] = {}
        for batch, ctx in items:
            key = self.scope_key(ctx)
            if key in blocked:
                results.append(_waiting(blocked[key]))
            else:
                outcome = self._take_in(batch, ctx)
                if outcome is not None:
                    blocked[key] = outcome[0]
                results.append(None if outcome is None else outcome[1])
            if progress is not None:
                progress(len(batch))
        return results

    def _take_in(self, batch: Sequence[Message], ctx: BlockContext) -> tuple[int, str] | None:
        """Catch up on the session's waiting batches, then summarise this one; None when done,
        else (the flush that stays pending first, why this one is not done)."""
        if ctx.flush_id is not None:
            head = self.catch_up(ctx)
            if head is not None:
                return head, _waiting(head)
        reason = self.summarise(batch, ctx)
        return None if reason is None else (ctx.flush_id or 0, reason)

    def catch_up(self, ctx: BlockContext) -> int | None:
        """Take in the session's batches older than `ctx.flush_id` that are waiting, in order:
        when the oldest is due (never tried, or its back-off passed), up to `retry_pending` of
        them. The flush id of the oldest still waiting afterwards, or None."""
        assert ctx.flush_id is not None
        store, key = ctx.store, self.scope_key(ctx)
        latest = summaries.latest_summary(store, ctx.session_id, self.name)
        queue = summaries.unsummarised(
            store,
            self.name,
            key,
            ctx.session_id,
            before=ctx.flush_id,
            after_message=(latest.last_message_id or 0) if latest else 0,
            limit=self.retry_pending + 1,
        )
        if not queue:
            return None
        head, status = queue[0]
        if not (self.retry_pending and self.auto_retries):
            return head
        if status == "pending":
            due = longterm.pending_flushes(store, self.name, key, retries=self.auto_retries)
            if head not in {flush_id for flush_id, _ in due}:
                return head
        for flush_id, _ in queue[: self.retry_pending]:
            earlier = BlockContext(ctx.session_id, ctx.user_id, store, ctx.tokenizer, flush_id)
            reason = self.summarise(longterm.flush_messages(store, flush_id), earlier)
            if reason is not None:
                longterm.mark_flushes(store, self.name, key, [flush_id], "pending", reason)
                return flush_id
        return queue[self.retry_pending][0] if len(queue) > self.retry_pending else None

    def summarise(self, batch: Sequence[Message], ctx: BlockContext) -> str | None:
        """Ask the LLM for the summary updated with this batch and store it as the next version
        (the batch marked done with it); the reason it failed, or None."""
        store = ctx.store
        previous = summaries.latest_summary(store, ctx.session_id, self.name)
        template = SUMMARY_PROMPT
        if self.uses_schema:
            template = template.partition("\nAnswer ONLY")[0] + "\n" + JSON_ANSWER
        prompt = template.format(
            max_words=max(1, self.max_tokens * 3 // 4),
            previous=previous.text if previous else "",
        )
        try:
            reply = self.ask(prompt, batch, SUMMARY_SCHEMA)
        except ProviderError as error:
            return error.reason
        text = parse_summary(reply)
        if text is not None:
            text = cap_text(text, self.max_tokens, ctx.tokenizer) or None
        if text is None:
            return f"not a summary: {reply.strip()[:200]!r}"
        with store.transaction():
            added = summaries.add_summary(
                store,
                ctx.session_id,
                self.name,
                text,
                ctx.tokenizer.count(text),
                flush_id=ctx.flush_id,
                message_ids=[m.id for m in batch if m.id is not None],
                after=previous.version if previous else 0,
            )
            if added is None:
                return "the summary changed meanwhile (another process wrote one)"
            if ctx.flush_id is not None:
                longterm.mark_flushes(store, self.name, self.scope_key(ctx), [ctx.flush_id])
        return None

    # -- the context ------------------------------------------------------------------------------

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        self._tokenizer = ctx.tokenizer
        latest = summaries.latest_summary(ctx.store, ctx.session_id, self.name)
        return neutralise(latest.text) if latest else ""

    def truncate(self, content: str, tokens_over: int) -> str | None:
        """The summary cut at a sentence end (else a word) to lose `tokens_over` tokens; None
        when nothing is left."""
        if self._tokenizer is None:
            return None
        keep = self._tokenizer.count(content) - tokens_over
        if keep <= 0:
            return None
        return cap_text(content, keep, self._tokenizer) or None


def _waiting(flush_id: int) -> str:
    return f"waiting for the earlier batch of flush {flush_id} to be summarised"


# -- what `memcli summary` shows ------------------------------------------------------------------


@dataclass(frozen=True)
class SummaryReport:
    """A session's summary as one summary block holds it: the current version, every version
    (when asked for), and the batches still waiting with the last error."""

    session: SessionInfo
    block: str
    current: summaries.Summary | None
    history: list[summaries.Summary]
    pending: list[tuple[int, str | None]]

    @property
    def error(self) -> str | None:
        """Why the oldest waiting batch is not taken in (the later ones wait for it), or None."""
        return self.pending[0][1] if self.pending else None

    def records(self, history: bool = False) -> list[dict[str, Any]]:
        """JSON Lines records: the current version, or with `history` every version, oldest
        first; each with how many batches wait and why the oldest of them does."""
        shown = self.history if history else [self.current] if self.current else []
        return [
            {
                "type": "summary",
                **s.to_dict(),
                "current": self.current is not None and s.version == self.current.version,
                "pending_batches": len(self.pending),
                "error": self.error,
            }
            for s in shown
        ]


def summary_reports(
    store: Any,
    session_id: str,
    blocks: Sequence[MemoryBlock] = (),
    *,
    block: str | None = None,
    history: bool = False,
) -> list[SummaryReport]:
    """The session's summaries (SessionNotFound when there is no session): one report per
    summary block among `blocks` and per block that stored a summary of it, or only `block`'s;
    with `history`, every version."""
    from memcli.errors import SessionNotFound

    info = store.get_session(session_id)
    if info is None:
        raise SessionNotFound(session_name(session_id))
    names = set(summaries.summary_blocks(store, session_id))
    names |= {b.name for b in blocks if isinstance(b, SummaryBlock)}
    if block is not None:
        names = {block}
    reports = []
    for name in sorted(names):
        key = f"session:{session_id}"
        reports.append(
            SummaryReport(
                info,
                name,
                summaries.latest_summary(store, session_id, name),
                summaries.summary_history(store, session_id, name) if history else [],
                summaries.pending_batches(store, name, key),
            )
        )
    return reports
