"""The chat, free of any UI: turns over a Memory, slash commands, panels as data, offline replies."""

from memcli.chat.commands import COMMANDS, Commands, Result
from memcli.chat.offline import DEFAULT_MODELS, default_model, offline_answer
from memcli.chat.session import (
    Chat,
    ContextReady,
    Event,
    ReplyDone,
    ReplyFailed,
    ReplyPiece,
    Turn,
    UserStored,
)
from memcli.chat.view import Panels, panels

__all__ = [
    "COMMANDS",
    "DEFAULT_MODELS",
    "Chat",
    "Commands",
    "ContextReady",
    "Event",
    "Panels",
    "ReplyDone",
    "ReplyFailed",
    "ReplyPiece",
    "Result",
    "Turn",
    "UserStored",
    "default_model",
    "offline_answer",
    "panels",
]
