"""Chat with no model: which model a provider key implies, and the reply made from memory alone."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from memcli.messages import session_name
from memcli.search.ranking import query_terms
from memcli.words import plural

if TYPE_CHECKING:
    from memcli.search.types import Hit
    from memcli.store.index import MessageRow

#: The model chat uses when none is configured but a provider's key variable is set.
DEFAULT_MODELS = {
    "OPENAI_API_KEY": "gpt-4o-mini",
    "ANTHROPIC_API_KEY": "anthropic/claude-3-5-haiku-latest",
    "GEMINI_API_KEY": "gemini/gemini-1.5-flash",
    "MISTRAL_API_KEY": "mistral/mistral-small-latest",
    "GROQ_API_KEY": "groq/llama-3.1-8b-instant",
    "OPENROUTER_API_KEY": "openrouter/openai/gpt-4o-mini",
    "DEEPSEEK_API_KEY": "deepseek/deepseek-chat",
}

MODEL_HINT = (
    "Set one with `memcli config set model NAME` (e.g. gpt-4o-mini with OPENAI_API_KEY set; for"
    " a local server model openai/llama3.2 and `memcli config set api_base"
    " http://127.0.0.1:11434/v1`), MEMCLI_MODEL and MEMCLI_API_BASE, or --model and --api-base;"
    " `/model NAME` switches now"
)


def default_model(present: Iterable[str]) -> str | None:
    """The model for the first provider key variable that is set, in DEFAULT_MODELS order."""
    names = set(present)
    for variable, model in DEFAULT_MODELS.items():
        if variable in names:
            return model
    return None


def ranked_lines(query: str, texts: Iterable[tuple[str, str]], limit: int = 5) -> list[str]:
    """Lines (of `(source, text)` pairs) sharing the most of the query's terms (the retriever's
    `query_terms`), best first."""
    wanted = set(query_terms(query))
    scored: list[tuple[int, int, str]] = []
    order = 0
    for source, text in texts:
        for line in text.splitlines():
            line = _strip_tags(line)
            if not line:
                continue
            score = len(wanted & set(query_terms(line)))
            if score:
                scored.append((-score, order, f"[{source}] {line}"))
            order += 1
    scored.sort()
    return [line for _, _, line in scored[:limit]]


def related_messages(
    query: str, hits: Iterable[Hit], skip: Callable[[MessageRow], bool], limit: int = 3
) -> list[MessageRow]:
    """The stored messages a search's hits offer for `query`, best first: each hit's matched
    message, and its neighbours when they share a term with the query; `skip` leaves some out
    (the message being answered)."""
    wanted = set(query_terms(query))
    out: list[MessageRow] = []
    seen: set[int] = set()
    for hit in hits:
        for m in sorted(hit.messages, key=lambda m: m.id != hit.anchor_id):
            if m.id in seen or skip(m):
                continue
            if m.id != hit.anchor_id and not wanted & set(query_terms(m.content)):
                continue
            seen.add(m.id)
            out.append(m)
    return out[:limit]


def _strip_tags(line: str) -> str:
    text = line.strip()
    for tag in ("fact", "message"):
        text = re.sub(rf"^<{tag}[^>]*>|</{tag}>$", "", text)
    return text.strip()


def offline_answer(
    text: str,
    blocks: Sequence[tuple[str, str]],
    earlier: Sequence[MessageRow],
    *,
    active_tokens: int,
    block_names: Sequence[str],
) -> str:
    """The reply when no model is configured: that none is, how to set one, and what memory holds
    for `text`: lines of the blocks' contents (`(name, content)` pairs) that share its terms, and
    the `earlier` stored messages a search found for it (`related_messages`)."""
    lines = [
        "(Offline: no model is configured, so this reply comes from memory alone; set one with "
        "`memcli config set model NAME` (and api_base URL for a local server), MEMCLI_MODEL and "
        "MEMCLI_API_BASE, --model and --api-base, or /model NAME.)"
    ]
    found = ranked_lines(text, blocks)
    found += [
        f"[{m.role}, session {session_name(m.session_id or '')} #{m.id}] {' '.join(m.content.split())}"
        for m in earlier
    ]
    if found:
        lines.append("What memory holds for this message:")
        lines.extend(f"- {line}" for line in found)
    else:
        kinds = ", ".join(block_names) or "none configured"
        lines.append(
            f"Memory holds nothing related yet ({plural(active_tokens, 'token')} in short-term"
            " memory; "
            f"long-term blocks: {kinds})."
        )
    return "\n".join(lines)
