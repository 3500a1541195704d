"""memcli: local memory for LLM conversations.

`from memcli import Memory, Message` is the whole engine; nothing heavy is imported here.
"""

from memcli.blocks.base import BlockContext, MemoryBlock
from memcli.blocks.facts import FactBlock
from memcli.blocks.static import StaticBlock
from memcli.blocks.vector import VectorBlock
from memcli.errors import (
    ConfigError,
    InputError,
    MemcliError,
    ModelError,
    ProviderError,
    SessionNotFound,
    StoreError,
    UsageError,
)
from memcli.flush import Batch, Budget, plan_flush
from memcli.memory import Context, Flush, Memory
from memcli.messages import Message
from memcli.store import SQLiteStore, Store
from memcli.tokens import TiktokenTokenizer, Tokenizer, WordTokenizer

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "BlockContext",
    "Budget",
    "ConfigError",
    "Context",
    "FactBlock",
    "Flush",
    "InputError",
    "MemcliError",
    "Memory",
    "MemoryBlock",
    "Message",
    "ModelError",
    "ProviderError",
    "SQLiteStore",
    "SessionNotFound",
    "StaticBlock",
    "Store",
    "StoreError",
    "TiktokenTokenizer",
    "Tokenizer",
    "UsageError",
    "VectorBlock",
    "WordTokenizer",
    "plan_flush",
]
