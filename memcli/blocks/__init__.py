"""Long-term memory blocks. Light imports only: models and litellm load when first used."""

from memcli.blocks.base import BlockContext, Deferred, LLMBlock, MemoryBlock
from memcli.blocks.facts import FactBlock
from memcli.blocks.static import StaticBlock
from memcli.blocks.summary import SummaryBlock
from memcli.blocks.vector import VectorBlock

__all__ = [
    "BlockContext",
    "Deferred",
    "FactBlock",
    "LLMBlock",
    "MemoryBlock",
    "StaticBlock",
    "SummaryBlock",
    "VectorBlock",
]
