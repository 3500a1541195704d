"""Long-term memory blocks."""

from memcli.blocks.base import BlockContext, MemoryBlock

__all__ = ["BlockContext", "MemoryBlock"]
