"""What a fact block asks its model and how it reads the reply: the extraction and condensing
prompts (as the reference words them; `fact_prompt`, with the JSON answer of structured output),
and the reply read leniently, as small local models write it (`parse_fact_reply`: the
`<facts>` tags with their attributes, amid thinking, fences, comments and list marks, or the
JSON object), checked against the facts shown (`check_reply`) and turned into the store's
changes (`changes_of`). `memcli.blocks.facts.FactBlock` uses them."""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memcli.store import facts as fact_store

if TYPE_CHECKING:
    from collections.abc import Sequence


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
