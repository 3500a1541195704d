"""The block contract: what a long-term memory block is and what it is given."""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self

from memcli.template import TEMPLATE_TAGS, neutralise
from memcli.words import SET_MODEL

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from memcli.llm import LLMConfig
    from memcli.messages import Message
    from memcli.store.base import Store
    from memcli.tokens import Tokenizer

SCOPES = ("user", "session")

#: Constructor arguments a definition never records: keys, secrets, passwords, tokens.
SECRET = re.compile(r"(^|_)(api_?key|key|secret|password|passwd|token|credentials?)$", re.I)


def conversation_text(messages: Sequence[Message]) -> str:
    """A batch as an LLM prompt shows it: `<message role='ROLE'>TEXT</message>` lines inside
    `<conversation>`; a message's text cannot open or close these elements (`neutralise`)."""
    tags = ("conversation", *TEMPLATE_TAGS)
    lines = [f"<message role='{m.role}'>{neutralise(m.content, tags)}</message>" for m in messages]
    return "<conversation>\n" + "\n".join(lines) + "\n</conversation>"


@dataclass(frozen=True)
class BlockContext:
    """What a block is told on each call: whose memory it is and where state lives."""

    session_id: str
    user_id: str
    store: Store
    tokenizer: Tokenizer
    flush_id: int | None = None


class Deferred(Exception):  # noqa: N818 (a signal, not an error)
    """Raised by `put` when a batch could not be processed now (an LLM failed): it stays pending
    and is handed to the block again later. The flush itself does not fail."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MemoryBlock:
    """Base class for long-term memory blocks.

    Subclasses set `name` and `priority` (0 = never truncated; among the others the highest number
    is cut first) and override `get`, and usually `put` and `truncate`. A block never mutates the
    messages it is given, and keeps its state in the store so that a fresh process sees it.
    `scope` is "user" (the default: every session of the user shares the block's memory) or
    "session". A block that ignores flushes sets `receives_flushes = False`.

    `definition()` describes the block as a `[[blocks]]` table, which a Memory records for its
    session so that the CLI builds the same blocks (memcli.blocks.registry).
    """

    name: str = "block"
    priority: int = 1
    scope: str = "user"
    #: The `kind` of the `[[blocks]]` table that builds this class and that its `definition()`
    #: writes (memcli.blocks.registry); "python" for a custom block, whose table names its class.
    KIND: ClassVar[str] = "python"
    #: The keys a `[[blocks]]` table of the class's kind may have besides `kind`, each with the
    #: types its value may be: the registry checks a table against them (an unknown key, a value
    #: of another type, a number over MAX_TOKEN_LIMIT: an error naming the block and the key)
    #: before the constructor gets them. Each is a constructor argument (`search` excepted: the
    #: registry makes it `search_options`), or one of an LLMBlock's `TABLE_OPTIONS`.
    OPTIONS: ClassVar[dict[str, tuple[type, ...]]] = {
        "name": (str,),
        "priority": (int,),
        "scope": (str,),
    }
    #: The arguments it takes from the rest of the settings unless its table sets them (the
    #: registry's `Defaults`: model, api_base, timeout, embedder, index_dir).
    SETTINGS: ClassVar[tuple[str, ...]] = ()
    receives_flushes: bool = True
    #: Where the CLI got this block's definition ("config file PATH", "stored for session ID",
    #: "default"); None for a block an application built itself.
    origin: str | None = None
    _arguments: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        block = super().__new__(cls)
        block._arguments = (args, kwargs)  # what it was built with, for `definition()`
        return block

    def __init__(
        self,
        name: str | None = None,
        priority: int | None = None,
        scope: str | None = None,
        **unknown: Any,
    ) -> None:
        from memcli.errors import ConfigError

        if name is not None:
            self.name = name
        if unknown:  # a key a block does not take (a `kind = "python"` block's, passed on here)
            keys = ", ".join(repr(k) for k in sorted(unknown))
            raise ConfigError(
                f"block {self.name!r}: unknown key{'s' if len(unknown) > 1 else ''} {keys}",
                f"{type(self).__name__} does not take {'them' if len(unknown) > 1 else 'it'}:"
                " check the spelling, or remove the key from the block's table",
            )
        if priority is not None:
            self.priority = priority
        if scope is not None:
            self.scope = scope
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"block name must be non-empty text, not {self.name!r}", "Name it")
        if (
            not isinstance(self.priority, int)
            or isinstance(self.priority, bool)
            or self.priority < 0
        ):
            raise ConfigError(
                f"block {self.name!r}: priority must be a whole number >= 0, not {self.priority!r}",
                "0 means never truncated; higher numbers are cut first",
            )
        if self.scope not in SCOPES:
            raise ConfigError(
                f"block {self.name!r}: scope must be 'user' or 'session', not {self.scope!r}",
                "'user' shares the memory across the user's sessions; 'session' isolates it",
            )

    def definition(self) -> dict[str, Any]:
        """This block as a `[[blocks]]` table that rebuilds it: here, for a custom block, kind
        "python", its `module:Class` path, and the arguments it was built with (keys and secrets
        left out). When they cannot be recorded (not JSON, a class in a script or a function),
        `not_rebuildable` says why, and building from the table fails with that reason."""
        cls = type(self)
        table: dict[str, Any] = {"kind": "python", "path": f"{cls.__module__}:{cls.__qualname__}"}
        params = inspect.signature(cls).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        args, kwargs = self._arguments
        try:
            bound = inspect.signature(cls).bind_partial(*args, **kwargs).arguments
        except TypeError:
            bound = dict(kwargs)
        arguments: dict[str, Any] = {}
        problems = []
        for key, value in bound.items():
            kind = params[key].kind if key in params else None
            if kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(value)
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                if value:
                    problems.append(f"it was given *{key} (a table has only named arguments)")
            else:
                arguments[key] = value
        for key in ("name", "priority", "scope"):
            if key in params or takes_any:
                arguments[key] = getattr(self, key)
        if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
            problems.append(f"{cls.__qualname__} is defined in a script or a function")
        for key, value in arguments.items():
            if SECRET.search(key):
                continue
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                problems.append(f"argument {key!r} is a {type(value).__name__}, not JSON")
                continue
            table[key] = value
        if problems:
            table["not_rebuildable"] = "; ".join(problems)
        return table

    def scope_key(self, ctx: BlockContext) -> str:
        """Whose memory this is: `user:ID` or `session:ID`."""
        return self.key_for(ctx.session_id, ctx.user_id)

    def key_for(self, session_id: str, user_id: str) -> str:
        """The scope key of this block for a session of a user."""
        return f"session:{session_id}" if self.scope == "session" else f"user:{user_id}"

    def load_state(self, ctx: BlockContext, default: Any = None) -> Any:
        """The JSON value this block saved for the context's scope (user or session), or `default`.
        A small place for a custom block to keep its state in the store."""
        from memcli.store import longterm

        value = longterm.load_state(ctx.store, self.name, self.scope_key(ctx))
        return default if value is None else value

    def save_state(self, ctx: BlockContext, value: Any) -> None:
        """Save a JSON-ready value for the context's scope, replacing the last one."""
        from memcli.store import longterm

        longterm.save_state(ctx.store, self.name, self.scope_key(ctx), value)

    def put(self, batch: Sequence[Message], ctx: BlockContext) -> None:
        """Receive a flushed batch of messages (oldest first). Raise Deferred to retry it later."""
        return None

    def put_many(
        self,
        items: Sequence[tuple[Sequence[Message], BlockContext]],
        progress: Callable[[int], None] | None = None,
    ) -> list[str | None]:
        """Receive several flushed batches at once (an import, a backfill), each with its context;
        for each, None when processed or the reason it stays pending. `progress(n)`, when given,
        is told how many messages were just processed, as the work goes (here: after each
        batch). Override to batch work (one embedding call)."""
        results: list[str | None] = []
        for batch, ctx in items:
            try:
                self.put(batch, ctx)
            except Deferred as deferred:
                results.append(deferred.reason or "deferred")
            else:
                results.append(None)
            if progress is not None:
                progress(len(batch))
        return results

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        """The block's content for a context whose latest messages are `messages`."""
        return ""

    def truncate(self, content: str, tokens_over: int) -> str | None:
        """A shorter content, or None to drop the block (the default)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, priority={self.priority})"


INSTRUCTIONS = ("user", "system")


class LLMBlock(MemoryBlock):
    """Base class for blocks an LLM writes from each flushed batch (FactBlock, SummaryBlock).

    It holds what they share: the model (`llm`, an LLMConfig, or one made from `model`,
    `api_base`, `api_key`, `timeout` and extra litellm keyword arguments), the retry settings
    (`retry_pending` failed batches retried per flush, each at most `auto_retries` times), the
    tokenizer of the last context (for `truncate`), `ask` (the batch sent to the LLM with the
    block's instructions) and the model's part of `definition()`. Without a model the block
    shows what it holds and takes no flushes (none is marked done or pending: `memcli blocks
    backfill` hands it every batch once a model is set).

    How each call is made: `reply_tokens` bounds the reply (litellm's `max_tokens`; None: the
    block's default, `default_reply_tokens()`; a `max_tokens` litellm argument means the same);
    `instructions` is "user" (the default: the instructions and the batch in one user message,
    which every chat template keeps) or "system" (the instructions as a system message, which
    some local templates drop); `structured_output` True asks for a JSON reply of the block's
    schema, False for the tagged text, None (the default) for JSON when litellm's model table
    says the model supports it (`memcli.llm.supports_schema`).
    """

    #: The litellm options a `[[blocks]]` table may set and `definition` records, with their
    #: types (a subclass adds them to its OPTIONS).
    TABLE_OPTIONS: ClassVar[dict[str, tuple[type, ...]]] = {}
    OPTIONS: ClassVar[dict[str, tuple[type, ...]]] = {
        **MemoryBlock.OPTIONS,
        "model": (str,),
        "api_base": (str,),
        "timeout": (int, float),
        "max_tokens": (int,),  # litellm's name for reply_tokens (a SummaryBlock's own cap)
        "retry_pending": (int,),
        "auto_retries": (int,),
        "reply_tokens": (int,),
        "instructions": (str,),
        "structured_output": (bool,),
    }
    SETTINGS: ClassVar[tuple[str, ...]] = ("model", "api_base", "timeout")
    #: What the block does with a batch, for the error when it has no model.
    task = "process flushed batches"

    def __init__(
        self,
        name: str | None = None,
        model: str | None = None,
        priority: int | None = None,
        api_base: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        scope: str | None = None,
        retry_pending: int = 3,
        auto_retries: int = 3,
        llm: LLMConfig | None = None,
        reply_tokens: int | None = None,
        instructions: str = "user",
        structured_output: bool | None = None,
        **litellm_kwargs: Any,
    ) -> None:
        from memcli.errors import ConfigError
        from memcli.llm import LLMConfig

        super().__init__(name=name, priority=priority, scope=scope)
        if "max_tokens" in litellm_kwargs:  # litellm's name for the reply's bound
            if reply_tokens is not None:
                raise ConfigError(
                    f"block {self.name!r}: both reply_tokens and max_tokens bound the reply",
                    "Keep reply_tokens only",
                )
            reply_tokens = litellm_kwargs.pop("max_tokens")
        if llm is None and model is not None:
            if not model or not isinstance(model, str):
                raise ConfigError(
                    f"block {self.name!r}: model must be a model name, not {model!r}",
                    'Set model = "..." on the block, or [llm] model (--model)',
                )
            llm = LLMConfig(model, api_base, api_key, float(timeout), dict(litellm_kwargs))
        if llm is None:
            self.receives_flushes = False
        for key, value in (("retry_pending", retry_pending), ("auto_retries", auto_retries)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(
                    f"block {self.name!r}: {key} must be a whole number >= 0, not {value!r}",
                    "0 turns automatic retries off",
                )
        if reply_tokens is not None and (
            not isinstance(reply_tokens, int) or isinstance(reply_tokens, bool) or reply_tokens < 16
        ):
            raise ConfigError(
                f"block {self.name!r}: reply_tokens must be a whole number >= 16,"
                f" not {reply_tokens!r}",
                "It bounds the model's reply, in the model's tokens; leave it out for the default",
            )
        if instructions not in INSTRUCTIONS:
            raise ConfigError(
                f"block {self.name!r}: instructions must be 'user' or 'system',"
                f" not {instructions!r}",
                "'user' sends them in the user message (every chat template keeps it);"
                " 'system' as a system message",
            )
        if structured_output is not None and not isinstance(structured_output, bool):
            raise ConfigError(
                f"block {self.name!r}: structured_output must be true or false,"
                f" not {structured_output!r}",
                "Leave it out to use JSON replies when litellm says the model supports them",
            )
        self.llm: LLMConfig | None = llm
        self.retry_pending = retry_pending
        self.auto_retries = auto_retries
        self.instructions = instructions
        self.structured_output = structured_output
        self._reply_tokens = reply_tokens
        self._tokenizer: Tokenizer | None = None

    def default_reply_tokens(self) -> int:
        """The bound on a reply when `reply_tokens` is not given."""
        return 1024

    @property
    def reply_tokens(self) -> int:
        """The bound on each reply of the model (sent as `max_tokens`)."""
        return self._reply_tokens if self._reply_tokens is not None else self.default_reply_tokens()

    @property
    def uses_schema(self) -> bool:
        """Whether calls ask for JSON replies (structured output) rather than tagged text."""
        if self.structured_output is not None:
            return self.structured_output
        if self.llm is None:
            return False
        from memcli.llm import supports_schema

        return supports_schema(self.llm)

    def model_table(self) -> dict[str, Any]:
        """The model's part of a `[[blocks]]` table: model, API base, timeout and the options of
        `TABLE_OPTIONS` it was given (without a model: none of those), and how calls are made
        (reply_tokens and structured_output when given, instructions when not the default);
        never the API key."""
        table: dict[str, Any] = {}
        if self.llm is not None:
            table["model"] = self.llm.model
            if self.llm.api_base is not None:
                table["api_base"] = self.llm.api_base
            table["timeout"] = self.llm.timeout
            for key in self.TABLE_OPTIONS:
                if key in self.llm.extra:
                    table[key] = self.llm.extra[key]
        if self._reply_tokens is not None:
            table["reply_tokens"] = self._reply_tokens
        if self.instructions != "user":
            table["instructions"] = self.instructions
        if self.structured_output is not None:
            table["structured_output"] = self.structured_output
        return table

    def ask(
        self,
        prompt: str,
        batch: Sequence[Message] | None = None,
        schema: tuple[str, dict[str, Any]] | None = None,
    ) -> str:
        """The LLM's reply to `prompt` (the instructions) and the batch (`conversation_text`):
        both in one user message, or the instructions as the system message (`instructions`);
        without a batch, the prompt alone as the user message. The reply is bounded by
        `reply_tokens`; `schema` (name, JSON schema) is sent when `uses_schema`. ConfigError
        without a model; ProviderError when the call fails."""
        from memcli.errors import ConfigError
        from memcli.llm import complete

        if self.llm is None:
            raise ConfigError(
                f"block {self.name!r} has no model: it cannot {self.task}",
                f'Set a model: {SET_MODEL}; or model = "..." on the block',
            )
        if batch is None:
            messages = [{"role": "user", "content": prompt}]
        elif self.instructions == "system":
            messages = [
                {"role": "system", "content": prompt},
                {"role": "user", "content": conversation_text(batch)},
            ]
        else:
            messages = [{"role": "user", "content": f"{prompt}\n\n{conversation_text(batch)}"}]
        return complete(
            self.llm,
            messages,
            max_tokens=self.reply_tokens,
            schema=schema if self.uses_schema else None,
        )
