"""The block contract: what a long-term memory block is and what it is given."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from memcli.messages import Message
    from memcli.store.base import Store
    from memcli.tokens import Tokenizer


@dataclass(frozen=True)
class BlockContext:
    """What a block is told on each call: whose memory it is and where state lives."""

    session_id: str
    user_id: str
    store: Store
    tokenizer: Tokenizer
    flush_id: int | None = None


class MemoryBlock:
    """Base class for long-term memory blocks.

    Subclasses set `name` and `priority` (0 = never truncated; among the others the highest number
    is cut first) and override `get`, and usually `put` and `truncate`. A block never mutates the
    messages it is given, and keeps its state in the store so that a fresh process sees it.
    """

    name: str = "block"
    priority: int = 1

    def __init__(self, name: str | None = None, priority: int | None = None, **_: Any) -> None:
        if name is not None:
            self.name = name
        if priority is not None:
            self.priority = priority
        if not isinstance(self.priority, int) or self.priority < 0:
            from memcli.errors import ConfigError

            raise ConfigError(
                f"block {self.name!r}: priority must be a whole number >= 0, not {self.priority!r}",
                "0 means never truncated; higher numbers are cut first",
            )

    def put(self, batch: Sequence[Message], ctx: BlockContext) -> None:
        """Receive a flushed batch of messages (oldest first)."""
        return None

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        """The block's content for a context whose latest messages are `messages`."""
        return ""

    def truncate(self, content: str, tokens_over: int) -> str | None:
        """A shorter content, or None to drop the block (the default)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, priority={self.priority})"
