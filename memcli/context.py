"""The context `Memory.get()` assembles: the blocks' contents for the messages plus the input,
truncated by priority to fit the token limit, rendered as `<memory>` and inserted into the
messages (`insert_method`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memcli.flush import truncation_order
from memcli.messages import Message
from memcli.template import TEMPLATE_TAGS, neutralise
from memcli.tokens import message_tokens

if TYPE_CHECKING:
    from collections.abc import Sequence

    from memcli.blocks.base import BlockContext, MemoryBlock
    from memcli.tokens import Tokenizer


@dataclass(frozen=True)
class BlockContent:
    """A block's content in an assembled context, and what truncation did to it."""

    name: str
    priority: int
    content: str
    tokens: int
    original_tokens: int
    truncated: str | None = None  # None, "cut" or "dropped"
    original_content: str = ""  # the block's content before truncation


@dataclass(frozen=True)
class Context:
    """What `get()` assembles: the messages to send, and how the blocks contributed."""

    messages: list[Message]
    blocks: list[BlockContent] = field(default_factory=list)
    history_tokens: int = 0
    memory_text: str = ""


def assemble(
    blocks: Sequence[MemoryBlock],
    history: Sequence[Message],
    input: str | Message | None,
    ctx: BlockContext,
    token_limit: int,
    insert_method: str = "system",
    *,
    history_tokens: int | None = None,
) -> Context:
    """The context for `history` plus `input`: block contents, truncated by priority to fit
    `token_limit`, rendered into the messages. `history_tokens`, when the caller knows it, saves
    summing the history's tokens."""
    tokenizer = ctx.tokenizer
    if history_tokens is None:
        history_tokens = sum(
            m.tokens if m.tokens is not None else message_tokens(m, tokenizer) for m in history
        )
    if not blocks:
        return Context(list(history), [], history_tokens, "")
    shown = list(history)
    if input is not None:
        shown.append(input if isinstance(input, Message) else Message("user", input))
    contents: dict[str, str] = {}
    # No content opens or closes `<memory>` or a block's element (the blocks neutralise the
    # texts they put in their own `<fact>`, `<message>` elements); done before counting, so
    # that what is counted is what is sent.
    tags = ("memory", *(b.name for b in blocks if b.name not in TEMPLATE_TAGS))
    for block in blocks:
        text = block.get(shown, ctx)
        if text:
            contents[block.name] = neutralise(text, tags)
    full = dict(contents)
    original = {name: tokenizer.count(text) for name, text in contents.items()}
    truncated = truncate_blocks(blocks, contents, original, history_tokens, token_limit, tokenizer)
    out = []
    for block in blocks:
        if block.name not in original:
            continue
        text = contents.get(block.name, "")
        out.append(
            BlockContent(
                name=block.name,
                priority=block.priority,
                content=text,
                tokens=tokenizer.count(text) if text else 0,
                original_tokens=original[block.name],
                truncated=truncated.get(block.name),
                original_content=full[block.name],
            )
        )
    memory_text = render_memory([(b.name, b.content) for b in out if b.content])
    messages = insert_memory(history, memory_text, insert_method)
    return Context(messages, out, history_tokens, memory_text)


def truncate_blocks(
    blocks: Sequence[MemoryBlock],
    contents: dict[str, str],
    original: dict[str, int],
    history_tokens: int,
    token_limit: int,
    tokenizer: Tokenizer,
) -> dict[str, str]:
    """Cut block contents in place until blocks + history fit the token limit; return, per block
    touched, "cut" or "dropped". Priority 0 and the history are never cut."""
    over = sum(original.values()) + history_tokens - token_limit
    what: dict[str, str] = {}
    if over <= 0:
        return what
    order = [blocks[i] for i in truncation_order([b.priority for b in blocks])]
    for block in order:
        if over <= 0:
            break
        text = contents.get(block.name)
        if not text:
            continue
        shorter = block.truncate(text, over)
        before = tokenizer.count(text)
        if shorter:
            over -= before - tokenizer.count(shorter)
            if shorter != text:
                contents[block.name] = shorter
                what[block.name] = "cut"
        else:
            over -= before
            del contents[block.name]
            what[block.name] = "dropped"
    for block in order:
        if over <= 0:
            break
        text = contents.pop(block.name, None)
        if text:
            over -= tokenizer.count(text)
            what[block.name] = "dropped"
    return what


def render_memory(blocks: Sequence[tuple[str, str]]) -> str:
    """`<memory>`, each block as `<NAME>`, content, `</NAME>` on their own lines, `</memory>`
    (the contents as given: `assemble` has neutralised them)."""
    if not blocks:
        return ""
    parts = ["<memory>"]
    for name, content in blocks:
        parts.extend((f"<{name}>", content, f"</{name}>"))
    parts.append("</memory>")
    return "\n".join(parts)


def insert_memory(
    history: Sequence[Message], memory_text: str, insert_method: str
) -> list[Message]:
    """Put the rendered memory into the messages, as the reference does."""
    result = list(history)
    if not memory_text:
        return result
    if insert_method == "system":
        for i, m in enumerate(result):
            if m.role == "system":
                result[i] = m.with_content(f"{memory_text}\n{m.content}")
                return result
        return [Message("system", memory_text), *result]
    for i in range(len(result) - 1, -1, -1):
        if result[i].role == "user":
            result[i] = result[i].with_content(f"{memory_text}\n{result[i].content}")
            return result
    result.append(Message("user", memory_text))
    return result
