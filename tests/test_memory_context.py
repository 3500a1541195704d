"""get()/context(): truncation order by priority, `<memory>` rendering for both insert methods,
and the input shown to blocks."""

from __future__ import annotations

import pytest
from fakes import WordTokenizer

from memcli import Memory, MemoryBlock, Message
from memcli.blocks.base import BlockContext


class Fixed(MemoryBlock):
    """A block with fixed content of `words` words; truncate keeps the first half when allowed."""

    def __init__(self, name: str, priority: int, words: int, cuttable: bool = False) -> None:
        super().__init__(name=name, priority=priority)
        self.text = " ".join(f"{name}{i}" for i in range(words))
        self.cuttable = cuttable
        self.seen: list[list[Message]] = []

    def get(self, messages, ctx: BlockContext) -> str:
        self.seen.append(list(messages))
        return self.text

    def truncate(self, content: str, tokens_over: int) -> str | None:
        if not self.cuttable:
            return None
        words = content.split()
        keep = max(0, len(words) - tokens_over)
        return " ".join(words[:keep]) or None


def memory(blocks, limit: int, insert_method: str = "system") -> Memory:
    return Memory.from_defaults(
        session_id="s",
        token_limit=limit,
        token_flush_size=1,
        memory_blocks=blocks,
        tokenizer=WordTokenizer(),
        insert_method=insert_method,
    )


# Each block is (name, priority, words); the history is 4 words. The limit decides what must go.
@pytest.mark.parametrize(
    ("blocks", "limit", "dropped"),
    [
        # Everything fits: nothing dropped.
        ([("a", 1, 5), ("b", 2, 5)], 100, []),
        # Highest priority number goes first.
        ([("a", 1, 5), ("b", 2, 5)], 10, ["b"]),
        ([("a", 2, 5), ("b", 1, 5)], 10, ["a"]),
        ([("a", 3, 5), ("b", 1, 5), ("c", 2, 5)], 15, ["a"]),
        ([("a", 3, 5), ("b", 1, 5), ("c", 2, 5)], 10, ["a", "c"]),
        # Priority 0 is never cut, even when nothing else is left to cut.
        ([("a", 0, 20), ("b", 1, 5)], 10, ["b"]),
        ([("a", 0, 20)], 5, []),
        # Equal priorities: declaration order.
        ([("a", 1, 5), ("b", 1, 5)], 10, ["a"]),
        # All non-zero blocks go when the priority-0 block alone is over.
        ([("a", 0, 10), ("b", 2, 5), ("c", 1, 5)], 12, ["b", "c"]),
    ],
)
def test_truncation_order(blocks, limit, dropped) -> None:
    mem = memory([Fixed(n, p, w) for n, p, w in blocks], limit)
    mem.put_messages([Message("user", "one two"), Message("assistant", "three four")])
    ctx = mem.context()
    assert ctx.history_tokens == 4
    gone = [b.name for b in ctx.blocks if b.truncated == "dropped"]
    assert gone == dropped
    kept = [b.name for b in ctx.blocks if not b.truncated]
    assert kept == [n for n, _, _ in blocks if n not in dropped]
    for name in dropped:
        assert f"<{name}>" not in ctx.memory_text


def test_truncate_hook_cuts_before_dropping() -> None:
    a = Fixed("a", 1, 10, cuttable=True)
    b = Fixed("b", 2, 10, cuttable=True)
    mem = memory([a, b], limit=20)
    mem.put_messages([Message("user", "one two"), Message("assistant", "three four")])
    ctx = mem.context()
    # 24 tokens, 4 over: b (priority 2) is cut by 4 words, a is untouched.
    by_name = {blk.name: blk for blk in ctx.blocks}
    assert by_name["b"].truncated == "cut"
    assert by_name["b"].tokens == 6
    assert by_name["b"].original_tokens == 10
    assert by_name["a"].truncated is None
    assert sum(blk.tokens for blk in ctx.blocks) + ctx.history_tokens <= 20


def test_history_is_never_cut() -> None:
    mem = memory([Fixed("a", 1, 3)], limit=5)
    mem.set([Message("user", " ".join(["w"] * 20))])
    messages = mem.get()
    assert [m.content for m in messages] == [" ".join(["w"] * 20)]


def test_empty_blocks_are_left_out() -> None:
    empty = Fixed("empty", 1, 0)
    full = Fixed("full", 1, 2)
    mem = memory([empty, full], limit=100)
    mem.put(Message("user", "hi"))
    ctx = mem.context()
    assert ctx.memory_text == "<memory>\n<full>\nfull0 full1\n</full>\n</memory>"


RENDERED = "<memory>\n<a>\na0 a1\n</a>\n<b>\nb0\n</b>\n</memory>"


@pytest.mark.parametrize(
    ("insert_method", "history", "expected"),
    [
        (
            "system",
            [("system", "Be brief."), ("user", "hi")],
            [("system", f"{RENDERED}\nBe brief."), ("user", "hi")],
        ),
        ("system", [("user", "hi")], [("system", RENDERED), ("user", "hi")]),
        (
            "system",
            [("user", "hi"), ("system", "first"), ("system", "second")],
            [("user", "hi"), ("system", f"{RENDERED}\nfirst"), ("system", "second")],
        ),
        (
            "user",
            [("user", "one"), ("assistant", "ok"), ("user", "two"), ("assistant", "ok")],
            [
                ("user", "one"),
                ("assistant", "ok"),
                ("user", f"{RENDERED}\ntwo"),
                ("assistant", "ok"),
            ],
        ),
        ("user", [("system", "sys")], [("system", "sys"), ("user", RENDERED)]),
        ("user", [], [("user", RENDERED)]),
        ("system", [], [("system", RENDERED)]),
    ],
)
def test_rendering(insert_method, history, expected) -> None:
    mem = memory([Fixed("a", 1, 2), Fixed("b", 2, 1)], limit=1000, insert_method=insert_method)
    mem.set([Message(r, c) for r, c in history])
    got = [(m.role, m.content) for m in mem.get()]
    assert got == expected
    # Nothing of the rendering is stored.
    assert [(m.role, m.content) for m in mem.get_all()] == history


@pytest.mark.parametrize("given", ["what now?", Message("user", "what now?")])
def test_input_is_shown_to_blocks_not_returned(given) -> None:
    block = Fixed("a", 1, 1)
    mem = memory([block], limit=1000)
    mem.put(Message("user", "hello"))
    messages = mem.get(given)
    assert [m.content for m in block.seen[-1]] == ["hello", "what now?"]
    assert [m.content for m in messages][-1] == "hello"
    assert len(mem.get_all()) == 1
