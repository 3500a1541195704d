"""StaticBlock: fixed text (a persona, instructions, what the user told you to always know)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from memcli.blocks.base import BlockContext, MemoryBlock
from memcli.errors import ConfigError
from memcli.template import neutralise

if TYPE_CHECKING:
    from collections.abc import Sequence

    from memcli.messages import Message


class StaticBlock(MemoryBlock):
    """Fixed content, given as text or read from a file; never receives flushes.

    Priority 0 by default: never truncated.
    """

    name = "core_info"
    priority = 0
    receives_flushes = False
    KIND = "static"
    OPTIONS = {"name": (str,), "priority": (int,), "content": (str,), "file": (str,)}

    def __init__(
        self,
        name: str | None = None,
        content: str | None = None,
        file: str | Path | None = None,
        priority: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name=name, priority=priority, **kwargs)
        if (content is None) == (file is None):
            raise ConfigError(
                f"block {self.name!r}: give exactly one of content and file",
                'content = "..." for text, file = "path" to read it from a file',
            )
        if file is not None:
            path = Path(file).expanduser()
            try:
                content = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(
                    f"block {self.name!r}: cannot read file {str(path)!r}: {exc}",
                    "Check the path (relative paths start from the current directory)",
                ) from None
        if not isinstance(content, str):
            raise ConfigError(f"block {self.name!r}: content must be text", "Quote it")
        self.content = content.strip()

    def definition(self) -> dict[str, Any]:
        """kind "static" with the content as read (a file's text too: the CLI may run elsewhere)."""
        if type(self) is not StaticBlock:
            return super().definition()
        return {
            "kind": self.KIND,
            "name": self.name,
            "priority": self.priority,
            "content": self.content,
        }

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        """The content, unable to open or close the template's elements (`neutralise`)."""
        return neutralise(self.content)
