"""A chat over memory, free of any UI: turns, streaming, cancel, retry and session switching.

A turn puts the user message through the engine (flushes happen as in the library), sends exactly
what `memory.get()` returns to the LLM, streams the reply, then puts the assistant message. The
turn is a generator of events, so a UI can update its panels at each step. Everything that touches
the store runs on the thread that iterates the turn; only the LLM stream runs on a helper thread, so
that `Turn.cancel()` takes effect at once even while the network is silent.

With memory tools (`Chat(tools=...)`, a `memcli.tool_calls.ToolSet`), the model is offered them:
a reply that calls tools is stored as an assistant message with its `tool_calls`, each call runs
and its result is stored as a `tool` message, and the model is called again with them, until it
replies in text (at most MAX_TOOL_ROUNDS rounds of calls). A model found not to take tools is
told once (`ToolsUnavailable`) and the chat goes on without them.
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memcli.blocks.background import Background
from memcli.chat.offline import offline_answer, related_messages
from memcli.errors import MemcliError, ProviderError, UsageError
from memcli.memory import Context, Flush, Memory
from memcli.messages import Message, format_time
from memcli.provider_messages import openai_messages

if TYPE_CHECKING:
    from memcli.blocks.base import MemoryBlock
    from memcli.flush import Budget
    from memcli.llm import LLMConfig, ToolCall
    from memcli.search.retriever import Retriever
    from memcli.search.types import SearchOptions, SearchResult
    from memcli.store.base import SessionInfo, Store
    from memcli.store.index import MessageRow
    from memcli.tokens import Tokenizer
    from memcli.tool_calls import ToolResult, ToolSet

#: `stream(config, messages, hangup=...)`, with tools `stream(..., tools=..., choice=...)`: text
#: pieces, then the reply's tool calls (memcli.llm.stream). `hangup` (a memcli.llm.Hangup) is
#: called from another thread when the turn is cancelled: the stream should close its connection.
StreamFn = Callable[..., Iterator["str | ToolCall"]]
BudgetFn = Callable[["SessionInfo | None"], "Budget | None"]

CANCELLED = "cancelled"  # the metadata key that marks a reply cut short by the user
#: The most rounds of tool calls in one turn; the round after them is asked to reply in text.
MAX_TOOL_ROUNDS = 5

#: What an empty reply after the last round of tool calls says.
TOOL_CAP_NOTE = (
    f"The model made {MAX_TOOL_ROUNDS} rounds of memory tool calls, the most a turn allows, and"
    " then wrote no reply. Ask again, or more precisely"
)

_SURROGATES = re.compile("[\ud800-\udfff]")


def readable(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD. Bytes that are not UTF-8 reach Python
    as lone surrogates (a terminal or a pipe decoded with `surrogateescape`), and SQLite stores
    UTF-8 only: such a message would fail to store."""
    return _SURROGATES.sub("\ufffd", text)


@dataclass(frozen=True)
class UserStored:
    """The user message is in short-term memory; `flushes` are what putting it caused."""

    message: Message
    flushes: list[Flush] = field(default_factory=list)


@dataclass(frozen=True)
class ContextReady:
    """The context is assembled: `context.messages` is exactly what the LLM is sent.

    `hits` maps a block's name to what it retrieved for this turn (its `last_hits`), when it says.
    """

    context: Context
    hits: dict[str, list[Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class ReplyPiece:
    """A piece of the reply, as it streams in."""

    text: str


@dataclass(frozen=True)
class ReplyDone:
    """The turn is over. `message` is the stored reply (None when nothing was stored)."""

    text: str
    message: Message | None = None
    flushes: list[Flush] = field(default_factory=list)
    offline: bool = False
    cancelled: bool = False
    #: Why the reply says nothing, when the user should be told (the tool rounds ran out).
    note: str = ""


@dataclass(frozen=True)
class ToolCalled:
    """The model called a memory tool and it ran (or was refused: `result.ok` is false, and the
    model reads why); the call and its result are stored in the session."""

    result: ToolResult


@dataclass(frozen=True)
class ToolsUnavailable:
    """The model does not take tools: the chat goes on without them (said once per model)."""

    model: str
    reason: str

    @property
    def text(self) -> str:
        return (
            f"Memory tools are off for {self.model}: it does not take tools ({self.reason})."
            " The chat goes on without them."
        )


@dataclass(frozen=True)
class ReplyFailed:
    """The LLM call failed; the user message stays in memory and `/retry` sends it again."""

    error: ProviderError
    partial: str = ""


Event = (
    UserStored | ContextReady | ReplyPiece | ToolCalled | ToolsUnavailable | ReplyDone | ReplyFailed
)

_CANCEL = object()
_END = object()


class Chat:
    """One user's chat: the current session's Memory, the model, and the turns."""

    def __init__(
        self,
        store: Store,
        *,
        user_id: str = "default",
        blocks: Sequence[MemoryBlock] = (),
        tokenizer: Tokenizer | None = None,
        budget_for: BudgetFn | None = None,
        insert_method: str = "system",
        llm: LLMConfig | None = None,
        stream: StreamFn | None = None,
        search_options: SearchOptions | None = None,
        tools: ToolSet | None = None,
        background: bool = True,
        reopen: Callable[[], Store] | None = None,
    ) -> None:
        """`search_options` shape `search` when no vector block is configured (the vector
        block's own options apply otherwise). `tools` are offered to the model (memory tools).

        With `background` (the default), the blocks' work on flushed batches (fact extraction,
        summaries, embedding) runs beside the conversation, on a thread of its own
        (`longterm`, a `memcli.blocks.background.Background`, with its own connection from
        `reopen()` when given): a turn never waits for it, and the next turn's context has what
        is done by then. `close()` when leaving: nothing is waited for."""
        self.store = store
        self.longterm: Background | None = Background(store, reopen) if background else None
        self.user_id = user_id
        self.blocks = list(blocks)
        for block in self.blocks:  # typing never waits for the embedding model's export
            if hasattr(block, "words_while_preparing"):
                block.words_while_preparing = True  # type: ignore[attr-defined]
        self.tokenizer = tokenizer
        self.budget_for: BudgetFn = budget_for or (lambda info: None)
        self.insert_method = insert_method
        self.llm = llm
        self._stream = stream
        self.search_options = search_options
        self._lexical: Retriever | None = None
        self.tools = tools
        self._without_tools: set[str] = set()  # models found not to take tools
        self.memory: Memory | None = None
        self.last_context: ContextReady | None = None
        self._preparer: threading.Thread | None = None  # prepare_in_background's thread
        #: The session this chat started and nothing was said in yet: removed when the chat
        #: leaves it (another session, or the end), so that no empty session is left behind.
        self._unsaid: str | None = None

    # -- sessions ---------------------------------------------------------------------------------

    def open(self, session_id: str | None = None) -> bool:
        """Open (resume) a session, or start one; return True when it is new. A session is kept
        once a message is said in it: one started and left without a message is removed when
        the chat opens another or closes (`close`)."""
        from memcli.store.base import named

        info = named(self.store, session_id, self.user_id) if session_id else None
        self._drop_unsaid(keep=info.id if info is not None else None)
        self.memory = Memory(
            self.store,
            session_id=session_id,
            user_id=self.user_id,
            budget=self.budget_for(info),
            tokenizer=self.tokenizer,
            memory_blocks=self.blocks,
            insert_method=self.insert_method,
            background=self.longterm,
        )
        self.last_context = None
        self._unsaid = self.memory.session_key if info is None else None
        if info is not None and self.longterm is not None and self.blocks:
            # What the last chat in this session left unfed is fed now, beside this one.
            self.longterm.resume(self.blocks, [info], self.memory.tokenizer)
        return info is None

    def close(self) -> int:
        """Leave: long-term work not done yet is not waited for (it stays in the store, for the
        next chat in its session or `memcli blocks backfill`); return how many batches wait. A
        session started here without a message is removed."""
        self._drop_unsaid()
        return self.longterm.close() if self.longterm is not None else 0

    def _drop_unsaid(self, keep: str | None = None) -> None:
        """Remove the session this chat started when it still holds no message (unless it is
        `keep`, the one being opened again)."""
        unsaid, self._unsaid = self._unsaid, None
        if unsaid is None or unsaid == keep:
            self._unsaid = unsaid
            return
        info = self.store.get_session(unsaid)
        if info is not None and info.active_messages + info.archived_messages == 0:
            self.store.delete_session(unsaid)

    @property
    def title(self) -> str | None:
        """The session's title: given with `/title` (`set_title`), else its first user message,
        shortened; an imported conversation's own title."""
        return self.mem.session().title

    def set_title(self, title: str) -> str:
        """Give the session a title (whitespace made single spaces); return it. UsageError when
        it is empty or holds control characters."""
        from memcli.sessions import check_title

        text = check_title(title)
        self.store.describe_session(self.mem.session_key, title=text)
        return text

    def _said(self, message: Message) -> None:
        """A user message is stored: the session is kept, and titled by it when it has none."""
        self._unsaid = None
        if self.mem.session().title is None:
            from memcli.sessions import title_from

            title = title_from(message.content)
            if title:
                self.store.describe_session(self.mem.session_key, title=title)

    @property
    def mem(self) -> Memory:
        if self.memory is None:
            self.open()
        assert self.memory is not None
        return self.memory

    @property
    def session_id(self) -> str:
        """The session's name (what its user calls it)."""
        return self.mem.session_id

    @property
    def offline(self) -> bool:
        return self.llm is None

    @property
    def model(self) -> str | None:
        return self.llm.model if self.llm else None

    def set_model(
        self, name: str, api_base: str | None = None, timeout: float | None = None
    ) -> None:
        """Use another model from the next turn on (the endpoint is kept unless given)."""
        from memcli.llm import LLMConfig

        base = api_base if api_base is not None else (self.llm.api_base if self.llm else None)
        wait = timeout if timeout is not None else (self.llm.timeout if self.llm else 60.0)
        self.llm = LLMConfig(model=name, api_base=base, timeout=wait)

    def offered_tools(self) -> tuple[list[dict[str, Any]] | None, ToolsUnavailable | None]:
        """The tools to offer the model in a turn (None: none), and the notice when they were
        turned off just now because litellm's model table says the model takes none."""
        if self.tools is None or self.llm is None or self.llm.model in self._without_tools:
            return None, None
        from memcli.llm import supports_tools

        if supports_tools(self.llm) is False:
            return None, self.without_tools("litellm's model table says so")
        return self.tools.schemas(), None

    def without_tools(self, reason: str) -> ToolsUnavailable:
        """Stop offering tools to the current model; the notice to give."""
        assert self.llm is not None
        self._without_tools.add(self.llm.model)
        return ToolsUnavailable(self.llm.model, reason)

    def pending(self) -> Message | None:
        """The last user message when it has no reply yet (what /retry sends): the last active
        message, or the one before the memory tool calls and results that end the window (the
        reply after them failed). A reply cut short by the user (Ctrl-C) is not an answer."""
        active = _uncut(self.mem.get_all(status="active"))
        if active and active[-1].role == "user":
            return active[-1]
        if active and active[-1].role == "tool":
            return next((m for m in reversed(active) if m.role == "user"), None)
        return None

    def prepare(self, on_step: Callable[[str], None] | None = None) -> None:
        """Load now what a fresh process would load during its first turn (seconds): the
        tokenizer, the blocks' models and the store's indexes (the blocks asked once:
        `warm_up`), then what the model's first call needs (`memcli.llm.warm_up`, with a model:
        httpx for an OpenAI-compatible one, ~0.1 s; litellm and what its first call builds for
        another provider, ~3 s) and the tools' schemas. `on_step(part)` is told when "blocks",
        then "litellm" (the model's client), is done. Nothing is sent to the model. A store or model error is left
        for the turn that meets it again to report."""
        try:
            self.mem.tokenizer.count("warm up")
            if self.blocks:
                self.warm_up()
        except MemcliError:
            pass  # the first turn says it
        if on_step is not None:
            on_step("blocks")
        if self.llm is not None and self._stream is None:  # (a stream of its own: no litellm)
            from memcli.llm import warm_up

            warm_up(self.llm)
            if self.tools is not None:
                self.tools.schemas()  # derived once, before the first message
        if on_step is not None:
            on_step("litellm")

    def prepare_in_background(
        self, on_step: Callable[[str], None] | None = None
    ) -> threading.Thread:
        """Run `prepare(on_step)` on a daemon thread while the user types the first message;
        return the thread. A turn or a command started meanwhile waits for it to end
        (`wait_prepared`): it would wait for the same loads itself, and the blocks and the
        session's memory are never used by two threads at once. Leaving does not wait for it."""
        thread = threading.Thread(
            target=self.prepare, args=(on_step,), name="memcli-prepare", daemon=True
        )
        self._preparer = thread
        thread.start()
        return thread

    def wait_prepared(self) -> None:
        """Wait until `prepare_in_background`'s work is done (at once when none runs, and on
        its own thread)."""
        thread = self._preparer
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def warm_up(self) -> ContextReady:
        """Load what the blocks need (an embedding model loads on first use: seconds), then ask
        them once, so that the first message does not wait. Blocks with an `embedder` (the
        Embedder protocol) get it loaded; one still to be prepared (exported: seconds, once) is
        exported in the background instead, the blocks searching by words meanwhile; others are
        just asked."""
        for block in self.blocks:
            embedder = getattr(block, "embedder", None)
            preparing = getattr(block, "preparing", None)  # VectorBlock.preparing starts the
            if callable(preparing) and preparing():  # export in the background: words meanwhile
                continue
            embed = getattr(embedder, "embed", None)
            if callable(embed):
                embed(["warm up"])
        return self.context()

    def context(self) -> ContextReady:
        """Assemble the context now (the blocks see the active window); remember it for the panels."""
        ctx = self.mem.context()
        hits: dict[str, list[Any]] = {}
        for block in self.blocks:
            found = getattr(block, "last_hits", None)
            if found is not None:
                hits[block.name] = list(found)
        self.last_context = ContextReady(ctx, hits)
        return self.last_context

    def search(self, query: str, k: int = 5) -> SearchResult:
        """The user's stored messages (every session) that best match `query`, found as
        `memcli search` finds them (memcli.search): hybrid, through the retriever of the chat's
        vector block (its model embeds the query), or without a vector block lexical (BM25
        alone), so that no embedding model is loaded for it."""
        from memcli.blocks.vector import VectorBlock

        block = next((b for b in self.blocks if isinstance(b, VectorBlock)), None)
        if block is not None:
            mode = "lexical" if block.preparing() else "hybrid"  # words while the model is made
            return block.retriever(self.store).search(query, k=k, user_id=self.user_id, mode=mode)
        if self._lexical is None or self._lexical.store is not self.store:
            # A vector block that is not in the chat lends its retriever: in lexical mode its
            # embedding model is never loaded.
            self._lexical = VectorBlock(search_options=self.search_options).retriever(self.store)
        return self._lexical.search(query, k=k, user_id=self.user_id, mode="lexical")

    def offline_reply(self, text: str) -> str:
        """The reply to `text` (the newest user message) when no model is configured: what the
        blocks (as last assembled) and a search of the stored messages hold for it."""
        ready = self.last_context
        blocks = [(b.name, b.content) for b in ready.context.blocks] if ready else []
        session_id = self.mem.session_key

        def itself(m: MessageRow) -> bool:
            return m.role == "user" and m.content == text and m.session_id == session_id

        earlier = related_messages(text, self.search(text, k=4).hits, itself)
        return offline_answer(
            text,
            blocks,
            earlier,
            active_tokens=self.mem.active_tokens(),
            block_names=[b.name for b in self.blocks],
        )

    # -- turns ------------------------------------------------------------------------------------

    def send(self, text: str) -> Turn:
        """A turn for a new user message (nothing happens until its events are read); undecodable
        characters (lone surrogates) are stored as U+FFFD (`readable`)."""
        if not text.strip():
            raise UsageError("the message is empty", "Type something to send")
        return Turn(self, readable(text))

    def check_fits(self, message: Message) -> None:
        """UsageError when `message` alone is over the session's budget: more tokens than its
        `token_limit`, the most a context holds. Such a message could never be sent as the
        budget says (it would be flushed at once, or sent whole as the newest turn whatever the
        limit); it is refused, neither stored nor sent, with its size and the budget. (A
        message over the flush threshold but within the limit is sent: it flushes what came
        before it, as a small budget's tests and users expect.)"""
        from memcli.tokens import message_tokens

        budget = self.mem.budget
        tokens = message_tokens(message, self.mem.tokenizer)
        if tokens <= budget.token_limit:
            return
        size = len(message.content.encode("utf-8", errors="replace"))
        raise UsageError(
            f"the message is {tokens:,} tokens ({size:,} bytes), over this session's budget of"
            f" {budget.token_limit:,} tokens (its token_limit); it was neither sent nor stored",
            "Send it in smaller parts, or chat in a session with a larger budget (--token-limit)",
        )

    def retry(self) -> Turn:
        """A turn that sends the unanswered user message again, without storing it twice."""
        if self.pending() is None:
            raise UsageError(
                "nothing to retry: the last message already has a reply",
                "Type a new message instead",
            )
        return Turn(self, None)

    def stream_fn(self) -> StreamFn:
        if self._stream is not None:
            return self._stream
        from memcli.llm import stream

        return stream


class Turn:
    """One exchange. Iterate `events()` on one thread; `cancel()` may be called from any other."""

    def __init__(self, chat: Chat, text: str | None) -> None:
        self.chat = chat
        self.text = text
        self.is_retry = text is None
        self._queue: queue.Queue[Any] = queue.Queue()
        self._cancelled = threading.Event()
        self.pieces: list[str] = []  # of the reply being streamed (the last round's)
        self._calls: list[ToolCall] = []  # the tool calls of the reply being streamed
        self._flushes: list[Flush] = []  # what storing tool calls and results flushed
        self._streaming = False
        self._done = False
        self._hangup: Any = None  # closes the connection of the reply being streamed
        self._pump_thread: threading.Thread | None = None
        #: The user message is in memory (a retry's was stored before): what a failed turn keeps.
        self.user_stored = self.is_retry

    def cancel(self) -> None:
        """Stop the reply: the provider's connection is closed at once; what arrived so far is
        stored, marked as cancelled."""
        self._cancelled.set()
        self._hang_up()
        self._queue.put((_CANCEL, None))

    def _hang_up(self) -> None:
        hangup = self._hangup
        if hangup is not None:
            hangup()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def events(self) -> Iterator[Event]:
        chat = self.chat
        chat.wait_prepared()  # the first turn finds what `prepare` loads, or waits for the rest
        memory = chat.mem
        if self.text is not None:
            message = Message("user", self.text, timestamp=_now())
            chat.check_fits(message)  # before it is stored: a refused message leaves no trace
            flushes = memory.put(message)
            self.user_stored = True
            chat._said(message)
            yield UserStored(message, flushes)
        ready = chat.context()
        if chat.llm is None:
            yield ready
            asked = self.text or (chat.pending() or Message("user", "")).content
            text = chat.offline_reply(asked)
            yield ReplyPiece(text)
            yield ReplyDone(text, offline=True)
            self._done = True
            return
        if self.cancelled:  # cancelled while it waited for its turn: the message stays, unsent
            yield ready
            self._done = True
            yield ReplyDone("", cancelled=True)
            return
        tools, notice = chat.offered_tools()
        if notice is not None:
            yield notice
        # The request starts before the UI is told about the context, so the two overlap.
        sent = _uncut(ready.context.messages) if self.is_retry else ready.context.messages
        payload = openai_messages(sent)
        rounds = 0
        self._start(payload, tools, rounds)
        yield ready
        while True:
            kind, value = self._queue.get()
            if kind is _CANCEL or (self.cancelled and (kind is _END or kind == "error")):
                # (a stream hung up by `cancel` may end, or fail, before `cancel` says so)
                yield self._finish(cancelled=True)
                return
            if kind is _END and self._calls and tools and rounds < MAX_TOOL_ROUNDS:
                yield from self._run_calls(payload)
                rounds += 1
                self._start(payload, tools, rounds)
                continue
            if kind is _END:
                yield self._finish(
                    cancelled=False, capped=bool(tools) and rounds >= MAX_TOOL_ROUNDS
                )
                return
            if isinstance(value, ProviderError):
                if tools and not self.pieces and _refuses_tools(value):
                    tools = None
                    yield chat.without_tools(f"the server said: {_reason(value)}")
                    self._start(payload, None, rounds)
                    continue
                self._done = True
                yield ReplyFailed(value, "".join(self.pieces))
                return
            if kind == "call":
                self._calls.append(value)
                continue
            self.pieces.append(value)
            yield ReplyPiece(value)

    def _start(self, payload: list[dict[str, Any]], tools: Any, rounds: int) -> None:
        """Send the request for the next reply on a helper thread (the round after the last
        allowed one asks for text: `tool_choice` none)."""
        chat = self.chat
        assert chat.llm is not None
        self.pieces, self._calls = [], []
        from memcli.llm import Hangup

        self._hangup = Hangup()
        if self.cancelled:  # cancelled from another thread just now
            self._hangup()
        options: dict[str, Any] = {"hangup": self._hangup}
        if tools:
            options |= {"tools": tools, "choice": "none" if rounds >= MAX_TOOL_ROUNDS else None}
        self._pump_thread = threading.Thread(
            target=self._pump, args=(chat.stream_fn(), chat.llm, payload, options), daemon=True
        )
        self._pump_thread.start()
        self._streaming = True

    def _run_calls(self, payload: list[dict[str, Any]]) -> Iterator[Event]:
        """Store the reply that called tools, run each call and store its result, and add both
        to `payload` for the next request."""
        memory = self.chat.mem
        assert self.chat.tools is not None
        calls = [c.to_dict() for c in self._calls]
        asked = Message.from_dict(
            {
                "role": "assistant",
                "content": "".join(self.pieces) or None,
                "tool_calls": calls,
                "timestamp": format_time(_now()),
            }
        )
        self._flushes += memory.put(asked)
        answers = []
        for call in self._calls:
            result = self.chat.tools.call(call.id, call.name, call.arguments)
            answer = Message.from_dict(
                {
                    "role": "tool",
                    "content": result.content(),
                    "tool_call_id": call.id,
                    "timestamp": format_time(_now()),
                }
            )
            self._flushes += memory.put(answer)
            answers.append(answer)
            yield ToolCalled(result)
        payload += openai_messages([asked, *answers])

    def interrupt(self) -> ReplyDone | None:
        """After a KeyboardInterrupt stopped `events()`: close the provider's connection, keep
        what arrived, marked as cancelled."""
        self._cancelled.set()
        self._hang_up()
        if not self._streaming or self._done:
            return None
        return self._finish(cancelled=True)

    def _pump(
        self,
        stream: StreamFn,
        config: LLMConfig,
        payload: list[dict[str, Any]],
        options: dict[str, Any],
    ) -> None:
        """On a helper thread: read the stream into the queue until it ends or the turn is cancelled."""
        try:
            pieces = stream(config, list(payload), **options)
            try:
                for piece in pieces:
                    if self._cancelled.is_set():
                        return
                    self._queue.put(("piece" if isinstance(piece, str) else "call", piece))
            finally:
                close = getattr(pieces, "close", None)
                if close is not None:
                    close()
        except ProviderError as error:
            self._queue.put(("error", error))
            return
        except Exception as error:  # a stream that fails oddly is still a provider failure
            self._queue.put(("error", ProviderError(f"the LLM stream failed: {error}", "Retry")))
            return
        self._queue.put((_END, None))

    def _finish(self, *, cancelled: bool, capped: bool = False) -> ReplyDone:
        """End the turn: store the reply (calls of tools past the last round are not run). An
        empty reply after the last round of tool calls (`capped`) says why it is empty."""
        self._done = True
        if cancelled and self._pump_thread is not None:
            # Hung up: the stream winds down at once. Let it, so that a program that exits now
            # does not stop it halfway (in an import, holding the import lock).
            self._pump_thread.join(timeout=2)
        text = "".join(self.pieces)
        if not text:
            note = TOOL_CAP_NOTE if capped and not cancelled else ""
            return ReplyDone("", flushes=self._flushes, cancelled=cancelled, note=note)
        message = Message(
            "assistant", text, metadata={CANCELLED: True} if cancelled else None, timestamp=_now()
        )
        flushes = self._flushes + self.chat.mem.put(message)
        return ReplyDone(text, message, flushes, cancelled=cancelled)


def _uncut(messages: list[Message]) -> list[Message]:
    """`messages` without the replies cut short by the user (Ctrl-C) that end them: a retry
    asks again as if they had not been written (they stay stored, marked)."""
    end = len(messages)
    while end and messages[end - 1].role == "assistant" and _is_cut(messages[end - 1]):
        end -= 1
    return messages[:end]


def _is_cut(message: Message) -> bool:
    return bool(message.metadata and message.metadata.get(CANCELLED))


def _now() -> datetime:
    """The time a chat message is stored with: now, in UTC, to the second (as exported)."""
    return datetime.now(UTC).replace(microsecond=0)


def _reason(error: ProviderError) -> str:
    """What the server said, without the names of the exception classes litellm puts first."""
    said = error.message.partition(" failed: ")[2] or error.message
    return said.rpartition("Exception - ")[2].strip()


def _refuses_tools(error: ProviderError) -> bool:
    from memcli.llm import refuses_tools

    return refuses_tools(error)
