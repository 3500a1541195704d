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
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memcli.blocks.base import BlockContext, Deferred, LLMBlock
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

EXTRACT_PROMPT = """You are a precise fact extraction system that finds key information in conversations.

INSTRUCTIONS:
1. Read the conversation segment in <conversation>.
2. Extract the specific, concrete facts the user disclosed, and important information discovered.
3. Focus on facts such as preferences, personal details, requirements, constraints and context.
4. Write each fact as a separate <fact> XML tag.
5. Give each fact one to three short topics (such as food, health, work, family, travel) in its
   topics attribute, lowercase and separated by commas.
6. Name the people, places, organisations and things a fact is about in its entities attribute
   (entities="Name, Other"), when it is about any.
7. A fact that only holds until a date ("this week", "until Friday") gets expires="YYYY-MM-DD".
8. No opinions, summaries or interpretations: only explicit information.
9. The existing facts below are the known facts most related to this conversation, each with
   its id. Do not repeat one. When a new fact changes or corrects one (the user moved, changed
   their mind), write it with replaces="ID", the id of the fact it replaces. When an existing
   fact is no longer true and no new fact replaces it, write <retire id="ID">why</retire>.

<existing_facts>
{existing}
</existing_facts>

Answer ONLY with the new facts and the retired ones, in exactly this format:
<facts>
  <fact topics="topic a, topic b" entities="Name">Specific fact 1</fact>
  <fact topics="topic c" replaces="12">A fact that replaces fact 12</fact>
  <retire id="7">Why fact 7 is no longer true</retire>
</facts>

If there are no new facts, answer: <facts></facts>"""

CONDENSE_PROMPT = """You are a precise fact condensing system.

INSTRUCTIONS:
1. The user has more than {max_facts} facts. Read the existing facts below, each with its id.
2. Merge facts that say the same thing, or belong together, into one fact, written with
   replaces="ID, ID": the ids of every fact it merges.
3. A fact that is no longer true (a later fact contradicts it): <retire id="ID">why</retire>.
4. The facts you do not mention stay as they are: do not repeat them.
5. Keep the topics and entities attributes of the facts you merge.
6. No opinions, summaries or interpretations: only explicit information.

<existing_facts>
{existing}
</existing_facts>

Answer ONLY with the merged and retired facts, in exactly this format:
<facts>
  <fact topics="topic a" replaces="3, 4">The fact that merges facts 3 and 4</fact>
  <retire id="7">Why fact 7 is no longer true</retire>
</facts>

If nothing is to merge or retire, answer: <facts></facts>"""

#: A JSON reply in place of the tags, asked for with structured output (`FACTS_SCHEMA`).
JSON_ANSWER = """Answer ONLY with a JSON object of the {what}: "facts", a list of objects with
"text" (the fact), "topics" (a list), "entities" (a list), "replaces" (the list of ids it
replaces, or []) and "expires" ("YYYY-MM-DD", or ""); and "retire", a list of objects with "id"
and "reason". For example:
{{"facts": [{{"text": "Specific fact 1", "topics": ["topic a"], "entities": ["Name"],
"replaces": [], "expires": ""}}], "retire": [{{"id": "7", "reason": "Why fact 7 is no longer true"}}]}}

If there are none, answer: {{"facts": [], "retire": []}}"""

_TEXTS = {"type": "array", "items": {"type": "string"}}
#: The JSON schema of a reply (structured output): the facts and the facts retired.
FACTS_SCHEMA: tuple[str, dict[str, Any]] = (
    "facts",
    {
        "type": "object",
        "properties": {
            "facts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string"},
                        "topics": _TEXTS,
                        "entities": _TEXTS,
                        "replaces": _TEXTS,
                        "expires": {"type": "string"},
                    },
                    "required": ["text", "topics", "entities", "replaces", "expires"],
                    "additionalProperties": False,
                },
            },
            "retire": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"id": {"type": "string"}, "reason": {"type": "string"}},
                    "required": ["id", "reason"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["facts", "retire"],
        "additionalProperties": False,
    },
)


def fact_prompt(template: str, as_json: bool, **values: Any) -> str:
    """A prompt (EXTRACT_PROMPT, CONDENSE_PROMPT) with these values; `as_json`: answered as
    JSON (`JSON_ANSWER`) rather than in tags."""
    if as_json:
        head, _, tail = template.partition("\nAnswer ONLY with the ")
        what = tail.split(",", 1)[0]
        template = head + "\n" + JSON_ANSWER.replace("{what}", what)
    return template.format(**values)


#: The example facts of the prompts: a reply that holds one echoed the prompt back.
_EXAMPLES = {
    "Specific fact 1",
    "A fact that replaces fact 12",
    "The fact that merges facts 3 and 4",
    "Why fact 7 is no longer true",
}
_FACTS = re.compile(r"<facts>(.*?)</facts>", re.S)
_FACTS_OPEN = re.compile(r"<facts>")
_ITEM = re.compile(r"""<(fact|retire)(\s(?:[^<>"']|"[^"]*"|'[^']*')*)?>(.*?)</\1>""", re.S)
#: Between items: white space, and list markers at the start of a line ("-", "*", "1.").
_GAP = re.compile(r"(?:\s|(?<![^\n])[ \t]*(?:[-*•]|\d{1,3}[.)])[ \t]+)*")
_FACT_OPEN = re.compile(r"<fact[\s>]")
_ATTRIBUTE = re.compile(r"""\s*([A-Za-z_]+)\s*=\s*(?:"([^"]*)"|'([^']*)')\s*""")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_THINKING = re.compile(r"<think>.*?</think>", re.S)
_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n(.*?)\n?```", re.S)
_FACT_ATTRIBUTES = ("topics", "entities", "replaces", "expires")


@dataclass(frozen=True)
class ParsedFact:
    """A `<fact>` of a reply: its text, topics, entities, the ids it replaces (as written) and
    its expiry."""

    text: str
    topics: list[str] = field(default_factory=list)
    entities: list[str] = field(default_factory=list)
    replaces: list[str] = field(default_factory=list)
    expires_at: datetime | None = None


@dataclass(frozen=True)
class FactReply:
    """A reply in the facts protocol: the facts, and the (id as written, reason) retired."""

    facts: list[ParsedFact]
    retire: list[tuple[str, str]]


def _attributes(text: str | None, allowed: Sequence[str]) -> dict[str, str] | None:
    """The attributes of a tag, unescaped; None when they are malformed, repeated or unknown."""
    found: dict[str, str] = {}
    position = 0
    text = text or ""
    for match in _ATTRIBUTE.finditer(text):
        name = match.group(1)
        if match.start() != position or name not in allowed or name in found:
            return None
        found[name] = html.unescape(
            match.group(2) if match.group(2) is not None else match.group(3)
        )
        position = match.end()
    return found if not text[position:].strip() else None


def _expiry(value: str | None) -> datetime | None:
    """A date (midnight UTC, the start of that day) or an ISO time; None when it is neither."""
    if not value or not value.strip():
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def parse_fact_reply(reply: str) -> FactReply | None:
    """A reply in the facts protocol: its facts (with their attributes) and retired facts, or
    None when it is not one. Nothing is stored from a reply that is None.

    Tags: `<facts>` holding `<fact>` and `<retire id="ID">` elements, separated by white space,
    comments or list markers. Read as well: text around the element (a code fence, a preamble, a
    `<think>` section), bare `<fact>` elements without `<facts>`, a `<facts>` element repeated
    (the facts of each, once), and one left unclosed (a reply cut by its token bound: the
    complete elements are kept, the cut one dropped). `<facts></facts>` and `<facts/>` are
    empty. Refused: no element, an element holding anything else (stray text, other tags, an
    empty fact, a retire without exactly an `id`), several runs of bare elements, the prompt's
    example echoed. Lenient about a fact's attributes: malformed, repeated or unknown ones lose
    them all (its topics, entities, replaces, expiry), never the fact.

    JSON (structured output, `FACTS_SCHEMA`), when the reply has no such element: `{"facts":
    [...], "retire": [...]}` (in a code fence, or the reply's outermost braces, text around it
    ignored), each fact an object with a non-empty "text" (or the text itself).
    """
    text = _THINKING.sub("", _COMMENT.sub("", reply)).strip()
    if not text or text.startswith("<think>"):  # nothing, or cut while thinking
        return None
    if "<fact" not in text and "<retire" not in text and "{" in text:
        fenced = _FENCE.search(text)
        body = fenced.group(1) if fenced else text[text.index("{") : text.rindex("}") + 1]
        try:
            return _json_reply(json.loads(body))
        except ValueError:  # not JSON (a cut one too)
            return None
    replies: list[FactReply] = []
    end = 0
    for block in _FACTS.finditer(text):
        parsed = _items(block.group(1), closed=True)
        if parsed is None:
            return None
        replies.append(parsed)
        end = block.end()
    rest = text[end:]
    unclosed = _FACTS_OPEN.search(rest)
    if unclosed is not None:  # cut before </facts>
        parsed = _items(rest[unclosed.end() :], closed=False)
        if parsed is None:
            return None
        replies.append(parsed)
    elif not replies:
        if re.search(r"<facts\s*/>", text) and not _FACT_OPEN.search(text):
            return FactReply([], [])
        first = re.search(r"<(fact|retire)[\s>]", text)
        if first is None:
            return None
        parsed = _items(text[first.start() :], closed=False)
        if parsed is None or (not parsed.facts and not parsed.retire):
            return None
        replies.append(parsed)
    if any(_echoes_example(r) for r in replies):
        return None
    return _merged(replies)


def _items(inner: str, closed: bool) -> FactReply | None:
    """The `<fact>` and `<retire>` elements at the start of `inner`. Of a closed `<facts>`
    element, nothing else may follow them; of an unclosed one (or bare elements), what follows
    is a cut element (dropped) or text without tags."""
    result = FactReply([], [])
    position = 0
    while True:
        position = _GAP.match(inner, position).end()  # type: ignore[union-attr]
        match = _ITEM.match(inner, position)
        if match is None:
            break
        position = match.end()
        if not _add_item(result, match):
            return None
    rest = inner[position:].strip()
    if not rest:
        return result
    if closed:
        return None
    is_cut = rest.startswith(("<fact", "<retire")) or any(
        tag.startswith(rest) for tag in ("<fact", "<retire", "</facts>")
    )
    if is_cut and "</fact>" not in rest and "</retire>" not in rest:
        return result
    return result if "<" not in rest else None


def _add_item(result: FactReply, match: re.Match[str]) -> bool:
    """Add a `<fact>` or `<retire>` element to `result`; False when it is malformed."""
    body = " ".join(html.unescape(match.group(3)).split())
    if "<fact" in body or "</fact" in body or "<retire" in body:
        return False
    if match.group(1) == "retire":
        attributes = _attributes(match.group(2), ("id",))
        if attributes is None or "id" not in attributes:
            return False
        result.retire.append((attributes["id"].strip(), body))
        return True
    if not body:
        return False
    attributes = _attributes(match.group(2), _FACT_ATTRIBUTES) or {}
    result.facts.append(
        ParsedFact(
            body,
            topics=fact_store.normalize_topics(attributes.get("topics", "")),
            entities=fact_store.normalize_entities(attributes.get("entities", "")),
            replaces=[i.strip() for i in attributes.get("replaces", "").split(",") if i.strip()],
            expires_at=_expiry(attributes.get("expires")),
        )
    )
    return True


def _json_reply(data: Any) -> FactReply | None:
    """A JSON reply (`FACTS_SCHEMA`) as a FactReply; None when it is not one. A fact's
    attributes that are not of the schema's types are dropped, never the fact."""
    if not isinstance(data, dict) or not isinstance(data.get("facts"), list):
        return None
    retire = data.get("retire", [])
    if set(data) - {"facts", "retire"} or not isinstance(retire, list):
        return None
    result = FactReply([], [])
    for item in data["facts"]:
        item = {"text": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            return None
        body = " ".join(item["text"].split())
        if not body or "<fact" in body or "<retire" in body:
            return None
        result.facts.append(
            ParsedFact(
                body,
                topics=fact_store.normalize_topics(_joined(item.get("topics"))),
                entities=fact_store.normalize_entities(_joined(item.get("entities"))),
                replaces=[i.strip() for i in _joined(item.get("replaces")).split(",") if i.strip()],
                expires_at=_expiry(_joined(item.get("expires"))),
            )
        )
    for item in retire:
        fact_id = item.get("id") if isinstance(item, dict) else None
        reason = item.get("reason", "") if isinstance(item, dict) else None
        if not isinstance(fact_id, str | int) or isinstance(fact_id, bool):
            return None
        if not isinstance(reason, str):
            return None
        result.retire.append((str(fact_id).strip(), " ".join(reason.split())))
    return None if _echoes_example(result) else result


def _joined(value: Any) -> str:
    """A JSON attribute as the text of a tag's attribute: a text or number as it is, a list of
    them joined with commas; anything else is no attribute ("")."""
    if isinstance(value, str | int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, list) and all(
        isinstance(v, str | int) and not isinstance(v, bool) for v in value
    ):
        return ", ".join(str(v) for v in value)
    return ""


def _echoes_example(reply: FactReply) -> bool:
    return any(f.text in _EXAMPLES for f in reply.facts) or any(
        why in _EXAMPLES for _, why in reply.retire
    )


def _merged(replies: Sequence[FactReply]) -> FactReply:
    """The facts and retirements of several replies (a repeated block), each once: a fact by
    its text (case and white space aside), a retirement by its id."""
    result = FactReply([], [])
    seen: set[str] = set()
    retired: set[str] = set()
    for reply in replies:
        for fact in reply.facts:
            if fact.text.casefold() not in seen:
                seen.add(fact.text.casefold())
                result.facts.append(fact)
        for fact_id, why in reply.retire:
            if fact_id not in retired:
                retired.add(fact_id)
                result.retire.append((fact_id, why))
    return result


def check_reply(reply: FactReply, shown: Sequence[fact_store.Fact]) -> str | None:
    """Why a reply's replacements and retirements cannot be applied to the facts it was shown
    (an id it was not shown, more replaced than shown, a fact both replaced and retired), or
    None when they can."""
    ids = {str(f.id) for f in shown}
    replaced = [i for f in reply.facts for i in f.replaces]
    retired = [i for i, _ in reply.retire]
    unknown = [i for i in [*replaced, *retired] if i not in ids]
    if unknown:
        return f"unknown fact ids in the reply: {', '.join(unknown[:10])}"
    both = set(replaced) & set(retired)
    if both:
        return f"the reply both replaces and retires facts {', '.join(sorted(both))}"
    if len(set(replaced)) + len(set(retired)) > len(shown):
        return "the reply replaces more facts than it was shown"
    return None


def changes_of(reply: FactReply) -> tuple[list[fact_store.NewFact], list[tuple[int, str]]]:
    """A checked reply as the store's changes: the new facts and the (id, reason) retired."""
    new = [
        fact_store.NewFact(
            f.text,
            topics=f.topics,
            entities=f.entities,
            expires_at=f.expires_at,
            replaces=[int(i) for i in f.replaces],
        )
        for f in reply.facts
    ]
    return new, [(int(i), reason or "retired") for i, reason in reply.retire]


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
