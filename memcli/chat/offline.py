"""Chat with no model: which model a provider key implies, and the reply made from memory alone."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memcli.chat.session import Chat
    from memcli.messages import Message

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
    "Set one with --model (e.g. `--model gpt-4o-mini` with OPENAI_API_KEY set, or "
    "`--model openai/llama3.2 --api-base http://127.0.0.1:11434/v1` for a local server), "
    "MEMCLI_MODEL, or `[llm] model` in the config file; `/model NAME` switches now"
)

_WORD = re.compile(r"\w+", re.UNICODE)
_STOP = frozenset(
    "a an and are as at be but by can did do does for from had has have he her his how i if in "
    "is it its me my no not of on or our she so that the their them then there they this to was "
    "we were what when where which who why will with you your".split()
)


def default_model(present: Iterable[str]) -> str | None:
    """The model for the first provider key variable that is set, in DEFAULT_MODELS order."""
    names = set(present)
    for variable, model in DEFAULT_MODELS.items():
        if variable in names:
            return model
    return None


def words(text: str) -> set[str]:
    """The content words of a text, lower-cased."""
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 1}


def ranked_lines(query: str, texts: Iterable[tuple[str, str]], limit: int = 5) -> list[str]:
    """Lines (of `(source, text)` pairs) sharing the most words with `query`, best first."""
    wanted = words(query)
    scored: list[tuple[int, int, str]] = []
    order = 0
    for source, text in texts:
        for line in text.splitlines():
            line = _strip_tags(line)
            if not line:
                continue
            score = len(wanted & words(line))
            if score:
                scored.append((-score, order, f"[{source}] {line}"))
            order += 1
    scored.sort()
    return [line for _, _, line in scored[:limit]]


def _strip_tags(line: str) -> str:
    text = line.strip()
    for tag in ("fact", "message"):
        text = re.sub(rf"^<{tag}[^>]*>|</{tag}>$", "", text)
    return text.strip()


def offline_answer(chat: Chat, text: str) -> str:
    """The reply when no model is configured: that none is, how to set one, and what memory holds
    for `text`: lines of the blocks' contents and stored messages that share its words."""
    lines = [
        "(Offline: no model is configured, so this reply comes from memory alone; set one with "
        "--model, MEMCLI_MODEL, `[llm] model` in the config, or /model NAME.)"
    ]
    ready = chat.last_context
    blocks = [(b.name, b.content) for b in ready.context.blocks] if ready else []
    found = ranked_lines(text, blocks)
    memory = chat.mem
    earlier: dict[int | None, Message] = {}
    for word in sorted(words(text), key=len, reverse=True)[:5]:
        for m in chat.store.search_messages(word, chat.user_id, limit=20):
            if m.role == "user" and m.content == text and m.session_id == memory.session_id:
                continue  # the message itself
            earlier[m.id] = m
    found += ranked_lines(
        text,
        [(f"{m.role}, session {m.session_id} #{m.id}", m.content) for m in earlier.values()],
        limit=3,
    )
    if found:
        lines.append("What memory holds for this message:")
        lines.extend(f"- {line}" for line in found)
    else:
        active = memory.active_tokens()
        kinds = ", ".join(b.name for b in chat.blocks) or "none configured"
        lines.append(
            f"Memory holds nothing related yet ({active:,} tokens in short-term memory; "
            f"long-term blocks: {kinds})."
        )
    return "\n".join(lines)
