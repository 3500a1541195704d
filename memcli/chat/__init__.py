"""The chat, free of any UI: turns over a Memory, slash commands, panels as data, offline replies.

Names are loaded on first use (as in `memcli`), so that `memcli chat --help` reads the commands
without loading the engine.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it.
_EXPORTS = {
    "COMMANDS": "memcli.chat.commands",
    "DEFAULT_MODELS": "memcli.chat.offline",
    "Chat": "memcli.chat.session",
    "Commands": "memcli.chat.commands",
    "ContextReady": "memcli.chat.session",
    "Event": "memcli.chat.session",
    "Panels": "memcli.chat.view",
    "ReplyDone": "memcli.chat.session",
    "ReplyFailed": "memcli.chat.session",
    "ReplyPiece": "memcli.chat.session",
    "Result": "memcli.chat.commands",
    "ToolCalled": "memcli.chat.session",
    "ToolsUnavailable": "memcli.chat.session",
    "Turn": "memcli.chat.session",
    "UserStored": "memcli.chat.session",
    "default_model": "memcli.chat.offline",
    "offline_answer": "memcli.chat.offline",
    "panels": "memcli.chat.view",
}

__all__ = [
    "COMMANDS",
    "Chat",
    "Commands",
    "ContextReady",
    "DEFAULT_MODELS",
    "Event",
    "Panels",
    "ReplyDone",
    "ReplyFailed",
    "ReplyPiece",
    "Result",
    "ToolCalled",
    "ToolsUnavailable",
    "Turn",
    "UserStored",
    "default_model",
    "offline_answer",
    "panels",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'memcli.chat' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from memcli.chat.commands import COMMANDS, Commands, Result
    from memcli.chat.offline import DEFAULT_MODELS, default_model, offline_answer
    from memcli.chat.session import (
        Chat,
        ContextReady,
        Event,
        ReplyDone,
        ReplyFailed,
        ReplyPiece,
        ToolCalled,
        ToolsUnavailable,
        Turn,
        UserStored,
    )
    from memcli.chat.view import Panels, panels
