"""The chat library (memcli.chat): turns through the engine, errors and /retry, cancel, offline
replies, slash commands; against the loopback LLM server with real litellm and tiktoken."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from memcli import MemoryBlock, Message, SQLiteStore, UsageError
from memcli.blocks.base import BlockContext
from memcli.chat import (
    Chat,
    Commands,
    ContextReady,
    ReplyDone,
    ReplyFailed,
    ReplyPiece,
    UserStored,
    default_model,
)
from memcli.chat.view import facts_in, panels
from memcli.flush import Budget
from memcli.llm import Hangup, LLMConfig


class StaticText(MemoryBlock):
    """A test block with fixed content."""

    def __init__(self, text: str, name: str = "notes", priority: int = 0) -> None:
        super().__init__(name=name, priority=priority)
        self.text = text

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        return self.text


class Retrieving(MemoryBlock):
    """A test block that reports what it retrieved, as the vector block does."""

    name = "recall"

    def __init__(self) -> None:
        super().__init__()
        self.last_hits: list[Any] = []

    def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
        hit = type(
            "Hit", (), {"score": 0.9, "text": "earlier", "session_id": "s", "message_ids": [1]}
        )
        self.last_hits = [hit()]
        return "earlier"


def make_chat(
    tmp_path: Any,
    llm: Any = None,
    blocks: Sequence[MemoryBlock] = (),
    timeout: float = 5,
    **kwargs: Any,
) -> Chat:
    store = SQLiteStore(tmp_path / "chat.db")
    config = LLMConfig("openai/test", api_base=llm.api_base, timeout=timeout) if llm else None
    chat = Chat(store, blocks=blocks, llm=config, **kwargs)
    chat.open("s1")
    return chat


def play(turn: Any) -> list[Any]:
    return list(turn.events())


def test_a_turn_sends_exactly_what_get_returns_and_stores_both_messages(tmp_path, llm):
    llm.script({"content": "Hello Ana, nice to meet you."})
    chat = make_chat(tmp_path, llm, blocks=[StaticText("The user is called Ana.")])
    events = play(chat.send("Hi, I am Ana"))
    kinds = [type(e) for e in events]
    assert kinds[0] is UserStored and kinds[1] is ContextReady and kinds[-1] is ReplyDone
    assert "".join(e.text for e in events if isinstance(e, ReplyPiece)) == events[-1].text
    assert events[-1].text == "Hello Ana, nice to meet you."
    sent = llm.requests[0]["messages"]
    expected = [{"role": m.role, "content": m.content} for m in events[1].context.messages]
    assert sent == expected
    assert sent[0]["role"] == "system" and "The user is called Ana." in sent[0]["content"]
    stored = chat.mem.get_all()
    assert [(m.role, m.content) for m in stored] == [
        ("user", "Hi, I am Ana"),
        ("assistant", "Hello Ana, nice to meet you."),
    ]
    assert llm.requests[0]["stream"] is True


@pytest.mark.parametrize(
    ("reply", "kind"),
    [({"status": 500}, "server"), ({"status": 429}, "rate_limit"), ({"status": 401}, "auth")],
)
def test_a_provider_error_keeps_the_user_message_and_retry_does_not_store_it_twice(
    tmp_path, llm, reply, kind
):
    llm.script(reply, {"content": "Second time lucky."})
    chat = make_chat(tmp_path, llm)
    events = play(chat.send("Are you there?"))
    assert isinstance(events[-1], ReplyFailed)
    assert events[-1].error.kind == kind
    assert [m.content for m in chat.mem.get_all()] == ["Are you there?"]
    assert chat.pending() is not None
    events = play(chat.retry())
    assert not any(isinstance(e, UserStored) for e in events)
    assert isinstance(events[-1], ReplyDone) and events[-1].text == "Second time lucky."
    assert [(m.role, m.content) for m in chat.mem.get_all()] == [
        ("user", "Are you there?"),
        ("assistant", "Second time lucky."),
    ]
    assert llm.requests[1]["messages"] == [{"role": "user", "content": "Are you there?"}]
    with pytest.raises(UsageError, match="nothing to retry"):
        chat.retry()


def test_cancel_keeps_the_partial_reply_marked(tmp_path):
    release = threading.Event()

    def stream(
        config: LLMConfig, messages: Sequence[dict[str, Any]], hangup: Hangup
    ) -> Iterator[str]:
        hangup.on_hangup(release.set)  # cancelling closes the connection
        yield "The first half"
        release.wait(5)  # the network goes quiet
        if not hangup.is_set:
            yield " and the rest"

    chat = make_chat(tmp_path, stream=stream)
    chat.set_model("openai/test")
    turn = chat.send("Tell me a story")
    seen = []
    for event in turn.events():
        seen.append(event)
        if isinstance(event, ReplyPiece):
            turn.cancel()
    release.set()
    done = seen[-1]
    assert isinstance(done, ReplyDone) and done.cancelled
    assert done.text == "The first half"
    last = chat.mem.get_all()[-1]
    assert (last.role, last.content, last.metadata) == (
        "assistant",
        "The first half",
        {"cancelled": True},
    )


@pytest.mark.parametrize("ending", ["ends", "fails"])
def test_cancel_is_a_cancel_when_the_hung_up_stream_ends_first(tmp_path, ending):
    """Hanging up may end (or break) the stream before `cancel` has queued its word: the reply
    is still stored as cancelled, not as a whole reply (or a failure)."""
    release = threading.Event()
    turns: list[Any] = []

    def hang_up() -> None:  # runs inside `cancel`: the stream is over before it goes on
        release.set()
        turns[0]._pump_thread.join(60)

    def stream(
        config: LLMConfig, messages: Sequence[dict[str, Any]], hangup: Hangup
    ) -> Iterator[str]:
        hangup.on_hangup(hang_up)
        yield "The first half"
        release.wait(60)
        if ending == "fails":
            raise ConnectionResetError("connection closed")

    chat = make_chat(tmp_path, stream=stream)
    chat.set_model("openai/test")
    turn = chat.send("Tell me a story")
    turns.append(turn)
    seen = []
    for event in turn.events():
        seen.append(event)
        if isinstance(event, ReplyPiece):
            turn.cancel()
    assert not turn._pump_thread.is_alive()
    done = seen[-1]
    assert isinstance(done, ReplyDone) and done.cancelled and done.text == "The first half"
    last = chat.mem.get_all()[-1]
    assert (last.content, last.metadata) == ("The first half", {"cancelled": True})


def test_cancel_closes_the_providers_connection_at_once_and_retry_asks_again(tmp_path, llm):
    llm.script({"content": "word " * 50, "chunk_delay": 300}, {"content": "The whole story."})
    chat = make_chat(tmp_path, llm, timeout=600)
    turn = chat.send("Tell me a story")
    seen = []
    for event in turn.events():
        seen.append(event)
        if isinstance(event, ReplyPiece):
            turn.cancel()
    # The next chunk is 5 minutes away and the client's timeout 10: only a closed connection
    # makes the server see it sooner.
    assert llm.wait_for_disconnect(timeout=120) is not None
    done = seen[-1]
    assert isinstance(done, ReplyDone) and done.cancelled and done.text == "word wor"
    assert chat.pending() is not None  # a cut reply is no answer
    events = play(chat.retry())
    assert not any(isinstance(e, UserStored) for e in events)
    assert events[-1].text == "The whole story."
    assert llm.requests[1]["messages"] == [{"role": "user", "content": "Tell me a story"}]
    assert [(m.role, m.content) for m in chat.mem.get_all()] == [
        ("user", "Tell me a story"),
        ("assistant", "word wor"),
        ("assistant", "The whole story."),
    ]


def test_interrupt_closes_the_providers_connection(tmp_path, llm):
    """Plain mode's Ctrl-C: a KeyboardInterrupt stops `events()`, then `interrupt()`."""
    llm.script({"content": "word " * 50, "chunk_delay": 300})
    chat = make_chat(tmp_path, llm, timeout=600)
    turn = chat.send("Tell me a story")
    events = turn.events()
    while not isinstance(next(events), ReplyPiece):
        pass
    events.close()
    done = turn.interrupt()
    assert llm.wait_for_disconnect(timeout=120) is not None  # (the next chunk: in 5 minutes)
    assert done is not None and done.cancelled and done.message is not None


def test_offline_reply_says_how_to_set_a_model_and_answers_from_memory(tmp_path):
    chat = make_chat(tmp_path, blocks=[StaticText("<fact>likes green tea</fact>", name="facts")])
    play(chat.send("I play chess on Sundays"))
    events = play(chat.send("which tea do I like?"))
    done = events[-1]
    assert isinstance(done, ReplyDone) and done.offline and done.message is None
    assert "no model is configured" in done.text
    assert "--model" in done.text
    assert "[facts] likes green tea" in done.text
    assert "chess" not in done.text  # not related to the question
    assert [m.role for m in chat.mem.get_all()] == ["user", "user"]


def test_offline_reply_finds_earlier_messages_of_the_user(tmp_path):
    chat = make_chat(tmp_path)
    play(chat.send("My cat is called Miso"))
    chat.open("s2")
    done = play(chat.send("what is my cat called?"))[-1]
    assert "My cat is called Miso" in done.text


def test_default_model_follows_the_provider_key_that_is_set():
    assert default_model([]) is None
    assert default_model(["ANTHROPIC_API_KEY"]).startswith("anthropic/")
    assert default_model(["GROQ_API_KEY", "OPENAI_API_KEY"]) == "gpt-4o-mini"


def test_retrieval_hits_and_facts_reach_the_panels(tmp_path):
    chat = make_chat(tmp_path, blocks=[StaticText("<fact>a</fact>\n<fact>b</fact>"), Retrieving()])
    play(chat.send("hello"))
    data = panels(chat)
    notes, recall = data.long.blocks
    assert notes.facts == ["a", "b"] and notes.priority == 0
    assert recall.hits[0].score == 0.9
    assert data.short.messages[0].content == "hello"
    assert facts_in("<fact> x </fact>") == ["x"]


def test_commands(tmp_path):
    chat = make_chat(tmp_path, blocks=[StaticText("<fact>likes tea</fact>")])
    commands = Commands(chat)
    for text in ("one two three", "four five six", "seven eight"):
        play(chat.send(text))
    help_text = commands.run("/help").text
    search_line = next(line for line in help_text.splitlines() if line.startswith("/search"))
    assert "hybrid" in search_line and "BM25" in search_line and "vector" in search_line
    assert "Ctrl-C" in help_text and "PageUp" in help_text
    assert "notes" in commands.run("/blocks").text
    assert commands.run("/facts").text == "[notes] likes tea"
    context = commands.run("/context").text
    assert context.startswith("4 messages go to the LLM")
    assert "five six" in commands.run("/search FIVE").text
    assert "Nothing in memory matches" in commands.run("/search 100%").text
    flushed = commands.run("/flush").text
    assert flushed.startswith("Flushed 2 messages")  # all but the newest turn
    assert chat.mem.session().archived_messages == 2
    assert "Nothing to flush" in commands.run("/flush").text
    assert "No model" in commands.run("/model").text
    commands.run("/model openai/other")
    assert chat.model == "openai/other"
    result = commands.run("/session s9")
    assert result.switched and chat.session_id == "s9"
    assert "s1" in commands.run("/sessions").text
    commands.run("/session s1")
    assert "Type /reset again" in commands.run("/reset").text
    assert chat.mem.get_all()
    assert commands.run("/reset").text.startswith("Deleted 3 messages")
    assert chat.mem.get_all() == []
    assert commands.run("/exit").exit
    with pytest.raises(UsageError, match="unknown command"):
        commands.run("/nope")
    with pytest.raises(UsageError, match="nothing to retry"):
        commands.run("/retry")


def test_switching_to_a_name_another_user_has_starts_the_users_own(tmp_path):
    """`/session bobs` when bob has a `bobs`: a new session of the chat's user, named so."""
    chat = make_chat(tmp_path)
    bobs = Chat(chat.store, user_id="bob")
    bobs.open("bobs")
    bobs.mem.put(Message("user", "Bob's secret"))
    result = Commands(chat).run("/session bobs")
    assert "Started new session bobs" in result.text
    assert chat.mem.user_id != "bob" and chat.mem.get_all() == []
    assert chat.mem.session_key != bobs.mem.session_key


def test_flush_now_moves_one_batch_and_keeps_the_newest_turn(tmp_path):
    chat = make_chat(tmp_path, budget_for=lambda info: Budget(1000, 0.7, 5))
    for i in range(3):
        chat.mem.put_messages(
            [Message("user", f"question {i}"), Message("assistant", f"answer {i}")]
        )
    flushes = chat.mem.flush_now()
    assert len(flushes) == 1 and len(flushes[0].message_ids) == 2
    while chat.mem.flush_now():
        pass
    assert [m.content for m in chat.mem.get_all(status="active")] == ["question 2", "answer 2"]


def test_warm_up_loads_block_embedders_and_asks_the_blocks(tmp_path):
    class Embedder:
        def __init__(self) -> None:
            self.calls: list[list[str]] = []

        def embed(self, texts: list[str]) -> list[list[float]]:
            self.calls.append(list(texts))
            return [[0.0] for _ in texts]

    block = StaticText("<fact>x</fact>")
    block.embedder = Embedder()  # type: ignore[attr-defined]
    chat = make_chat(tmp_path, blocks=[block])
    ready = chat.warm_up()
    assert block.embedder.calls == [["warm up"]]  # type: ignore[attr-defined]
    assert ready.context.blocks[0].content == "<fact>x</fact>"
    assert chat.last_context is ready


def test_a_turn_started_while_the_chat_prepares_waits_for_it(tmp_path, llm):
    """prepare_in_background loads the blocks' models, asks the blocks and warms litellm up on a
    thread of its own, sending nothing; a turn started meanwhile waits until it is done: the
    blocks are asked by the preparing thread first, then by the turn's."""
    go = threading.Event()
    asked: list[str] = []

    class Slow:
        def embed(self, texts: list[str]) -> list[list[float]]:
            go.wait(10)  # the model loads slowly
            return [[0.0] for _ in texts]

    class Recording(StaticText):
        def get(self, messages: Sequence[Message], ctx: BlockContext) -> str:
            asked.append(threading.current_thread().name)
            return super().get(messages, ctx)

    block = Recording("The user keeps bees.")
    block.embedder = Slow()  # type: ignore[attr-defined]
    llm.script({"content": "Noted."})
    chat = make_chat(tmp_path, llm, blocks=[block])
    steps: list[str] = []
    preparing = chat.prepare_in_background(steps.append)
    assert preparing.name == "memcli-prepare" and preparing is not threading.current_thread()
    events: list[Any] = []
    turn = threading.Thread(target=lambda: events.extend(play(chat.send("hi"))), name="turn")
    turn.start()
    turn.join(1)  # (it waits for the model; were it not waiting, it would ask the block now)
    go.set()
    preparing.join(30)
    turn.join(30)
    assert asked == ["memcli-prepare", "turn"]
    assert steps == ["blocks", "litellm"]
    assert events[-1].text == "Noted."
    assert len(llm.requests) == 1  # the turn's: preparing sends nothing


def test_exit_does_not_wait_for_the_chat_to_prepare(tmp_path, monkeypatch):
    """/exit while the chat still prepares: it returns at once (other commands wait)."""
    release = threading.Event()
    released: list[bool] = []
    monkeypatch.setattr(
        Chat, "prepare", lambda self, on_step=None: released.append(release.wait(10))
    )
    chat = make_chat(tmp_path)
    preparing = chat.prepare_in_background()
    assert Commands(chat).run("/exit").exit
    release.set()  # (were /exit waiting for it, it would have timed out first)
    preparing.join(30)
    assert released == [True]


def test_facts_command_lists_the_fact_blocks_facts_with_ids(tmp_path, llm):
    """/facts shows what a real FactBlock extracted (over HTTP) when the session flushed."""
    from memcli import FactBlock

    llm.script({"content": "<facts><fact>The user lives in Porto</fact></facts>"})
    facts = FactBlock(model="openai/test", api_base=llm.api_base, timeout=5)
    chat = make_chat(tmp_path, blocks=[facts], budget_for=lambda info: Budget(20, 0.5, 5))
    for text in ("I live in Porto with my cat", "I work nights", "I like tea", "and cake"):
        play(chat.send(text))
    assert chat.longterm is not None and chat.longterm.wait(30)  # extraction runs beside
    out = Commands(chat).run("/facts").text
    assert llm.requests, "a flush must have asked the LLM for facts"
    assert out.startswith("[extracted_info] #") and out.endswith("The user lives in Porto")


def test_search_command_uses_hybrid_retrieval_with_a_vector_block(tmp_path):
    from fakes import HashEmbedder

    from memcli import VectorBlock

    block = VectorBlock(embedder=HashEmbedder())
    chat = make_chat(tmp_path, blocks=[block])
    for text in ("My cello teacher is called Marta", "I drink green tea", "The weather is grey"):
        play(chat.send(text))
    out = Commands(chat).run("/search cello teacher").text
    assert out.splitlines()[0].endswith(" for 'cello teacher':")
    assert "Marta" in out.splitlines()[1]


def test_search_without_a_vector_block_is_lexical_and_scoped_to_the_user(tmp_path):
    chat = make_chat(tmp_path)
    play(chat.send("My cello teacher is called Marta"))
    other = Chat(chat.store, user_id="bob")
    other.open("bobs")
    other.mem.put(Message("user", "I sold my cello"))
    result = chat.search("cello lessons")
    (hit,) = result.hits
    assert hit.session_id == chat.session_id and "Marta" in hit.text
    assert hit.lexical_rank == 1 and hit.vector_rank is None  # BM25 alone: no model
    out = Commands(chat).run("/search cello").text
    assert out.splitlines()[0] == "1 hit for 'cello':" and "Marta" in out


def test_undecodable_input_is_stored_with_replacement_characters_and_the_chat_goes_on(tmp_path):
    chat = make_chat(tmp_path)
    for text in ("ok", "bad \udcff line \ud800", "after"):  # bytes a pipe could not decode
        play(chat.send(text))
    assert [m.content for m in chat.mem.get_all()] == ["ok", "bad \ufffd line \ufffd", "after"]


def test_chat_messages_are_stored_with_their_time(tmp_path, llm):
    from datetime import UTC, datetime, timedelta

    llm.script({"content": "Noted."})
    chat = make_chat(tmp_path, llm)
    before = datetime.now(UTC).replace(microsecond=0)
    play(chat.send("I moved to Lisbon"))
    after = datetime.now(UTC)
    stored = chat.mem.get_all()
    assert [m.role for m in stored] == ["user", "assistant"]
    for message in stored:
        assert message.timestamp is not None
        assert before <= message.timestamp <= after + timedelta(seconds=1)


def test_a_failed_extraction_is_pending_work_with_its_reason(tmp_path, llm):
    from memcli.blocks.facts import FactBlock
    from memcli.chat.view import pending_work

    def server(body: dict[str, Any]) -> dict[str, Any]:
        if body.get("stream"):
            return {"content": "Noted."}
        return {"status": 500, "message": "the extractor is down"}

    llm.default = server
    try:
        config = LLMConfig("openai/test", api_base=llm.api_base, timeout=5)
        chat = make_chat(
            tmp_path,
            llm,
            blocks=[FactBlock(name="facts", llm=config)],
            budget_for=lambda info: Budget(60, 0.5, 10),
        )
        assert pending_work(chat).text == ""
        for i in range(4):
            play(chat.send(f"message {i}: I keep bees on the roof of my house"))
        assert chat.longterm is not None and chat.longterm.wait(30)
        work = pending_work(chat)
    finally:
        llm.default = {"content": "OK"}
    assert chat.mem.session().flushes >= 1
    assert work.batches >= 1
    assert work.error is not None and work.error.startswith("facts: ")
    assert "the extractor is down" in work.error and "pending" in work.text
    assert panels(chat).pending == work


def test_turns_go_on_while_the_blocks_work_and_the_next_context_has_what_is_done(tmp_path, llm):
    """A flush's fact extraction runs beside the chat: while the fact call is held, the next
    turns are sent and answered; once it is done, the next turn's context has the fact."""
    from memcli.blocks.facts import FactBlock

    release = threading.Event()

    def server(body: dict[str, Any]) -> dict[str, Any]:
        if body.get("stream"):
            return {"content": "Noted."}
        release.wait(30)  # the fact call returns only when the test says so
        return {"content": "<facts><fact>The user keeps bees</fact></facts>"}

    llm.default = server
    try:
        config = LLMConfig("openai/test", api_base=llm.api_base, timeout=60)
        chat = make_chat(
            tmp_path,
            llm,
            blocks=[FactBlock(name="facts", llm=config, retry_pending=0)],
            budget_for=lambda info: Budget(60, 0.5, 10),
        )
        assert chat.longterm is not None
        for i in range(4):
            play(chat.send(f"message {i}: I keep bees on the roof of my house"))
        status = chat.longterm.status()
        chats = [i for i, body in enumerate(llm.requests) if body.get("stream")]
        facts = [i for i, body in enumerate(llm.requests) if not body.get("stream")]
        assert status.waiting >= 1 and "in progress" in status.text
        assert facts and ("reply", facts[0]) not in llm.events
        assert chats[-1] > facts[0]  # a turn after the flush was sent while the fact call ran
        release.set()
        assert chat.longterm.wait(30)
        play(chat.send("what do I keep?"))
    finally:
        release.set()
        llm.default = {"content": "OK"}
    assert chat.longterm.status().done >= 1 and chat.longterm.status().waiting == 0
    system = llm.requests[-1]["messages"][0]
    assert system["role"] == "system" and "The user keeps bees" in system["content"]
    assert chat.close() == 0
