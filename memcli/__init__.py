"""memcli: local memory for LLM conversations.

`from memcli import Memory, Message` is the whole engine. Names are loaded on first use, so that
`memcli --help` does not pay for modules it does not need; nothing heavy is imported either way.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "AgentTools": "memcli.tools",
    "Attention": "memcli.health",
    "Batch": "memcli.flush",
    "BlockContext": "memcli.blocks.base",
    "Budget": "memcli.flush",
    "BudgetOverride": "memcli.flush",
    "Chat": "memcli.chat.session",
    "ConfigError": "memcli.errors",
    "Context": "memcli.context",
    "Deferred": "memcli.blocks.base",
    "Fact": "memcli.store.facts",
    "FactBlock": "memcli.blocks.facts",
    "Facts": "memcli.facts",
    "Flush": "memcli.writer",
    "InputError": "memcli.errors",
    "MemcliError": "memcli.errors",
    "MessageNotFound": "memcli.errors",
    "Memory": "memcli.memory",
    "MemoryBlock": "memcli.blocks.base",
    "Message": "memcli.messages",
    "ModelError": "memcli.errors",
    "OnnxEmbedder": "memcli.search",
    "PostgresStore": "memcli.store.postgres",
    "ProviderError": "memcli.errors",
    "Retriever": "memcli.search",
    "SQLiteStore": "memcli.store.sqlite",
    "SearchOptions": "memcli.search",
    "SessionNotFound": "memcli.errors",
    "StaticBlock": "memcli.blocks.static",
    "Store": "memcli.store.base",
    "SummaryBlock": "memcli.blocks.summary",
    "StoreError": "memcli.errors",
    "TiktokenTokenizer": "memcli.tokens",
    "Tokenizer": "memcli.tokens",
    "UsageError": "memcli.errors",
    "VectorBlock": "memcli.blocks.vector",
    "anthropic_messages": "memcli.provider_messages",
    "forget_user": "memcli.forgetting",
    "open_store": "memcli.store",
    "openai_messages": "memcli.provider_messages",
    "plan_flush": "memcli.flush",
    "unfinished": "memcli.health",
}

__all__ = [
    "AgentTools",
    "Attention",
    "Batch",
    "BlockContext",
    "Budget",
    "BudgetOverride",
    "Chat",
    "ConfigError",
    "Context",
    "Deferred",
    "Fact",
    "FactBlock",
    "Facts",
    "Flush",
    "InputError",
    "MemcliError",
    "Memory",
    "MemoryBlock",
    "Message",
    "MessageNotFound",
    "ModelError",
    "OnnxEmbedder",
    "PostgresStore",
    "ProviderError",
    "Retriever",
    "SQLiteStore",
    "SearchOptions",
    "SessionNotFound",
    "StaticBlock",
    "Store",
    "StoreError",
    "SummaryBlock",
    "TiktokenTokenizer",
    "Tokenizer",
    "UsageError",
    "VectorBlock",
    "anthropic_messages",
    "forget_user",
    "open_store",
    "openai_messages",
    "plan_flush",
    "unfinished",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'memcli' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:
    from memcli.blocks.base import BlockContext, Deferred, MemoryBlock
    from memcli.blocks.facts import FactBlock
    from memcli.blocks.static import StaticBlock
    from memcli.blocks.summary import SummaryBlock
    from memcli.blocks.vector import VectorBlock
    from memcli.chat.session import Chat
    from memcli.context import Context
    from memcli.errors import (
        ConfigError,
        InputError,
        MemcliError,
        MessageNotFound,
        ModelError,
        ProviderError,
        SessionNotFound,
        StoreError,
        UsageError,
    )
    from memcli.facts import Facts
    from memcli.flush import Batch, Budget, BudgetOverride, plan_flush
    from memcli.forgetting import forget_user
    from memcli.health import Attention, unfinished
    from memcli.memory import Memory
    from memcli.messages import Message
    from memcli.provider_messages import anthropic_messages, openai_messages
    from memcli.search import OnnxEmbedder, Retriever, SearchOptions
    from memcli.store import open_store
    from memcli.store.base import Store
    from memcli.store.facts import Fact
    from memcli.store.postgres import PostgresStore
    from memcli.store.sqlite import SQLiteStore
    from memcli.tokens import TiktokenTokenizer, Tokenizer
    from memcli.tools import AgentTools
    from memcli.writer import Flush
