"""A transcript's roles and token counts, for a replay: read and counted in two processes when long.

    from memcli.counting import read_counted
    counted = read_counted(data, "chat.jsonl", TiktokenTokenizer())
    counted.roles, counted.tokens, counted.sizes, counted.sessions

Reading the JSON and counting the tokens hold the interpreter's lock, so threads cannot share
them. A long JSON Lines transcript (lines are independent) is cut in two at a line break: a forked
process reads and counts the second half while this one does the first, and sends back only
roles, counts and sizes (`memcli.forked`). An error names the source's line as a single process
would, and the first one in the file wins. Where the system cannot fork safely (not Linux, one
core, other threads running), or the child fails, everything is done here, with the same result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from memcli.transcripts import is_array, parse_columns

if TYPE_CHECKING:
    from collections.abc import Sequence

    from memcli.tokens import Tokenizer
    from memcli.transcripts import Columns

#: A JSON Lines transcript of at least this many bytes is read and counted in two processes.
PARALLEL_BYTES = 2_000_000


class Counted(NamedTuple):
    """Per message its role and tokens; per record (line) its message count; the sessions named."""

    roles: list[str]
    tokens: list[int]
    sizes: list[int]
    sessions: set[str]


def count_columns(columns: Columns, tokenizer: Tokenizer) -> Counted:
    """The token counts of columns read by `memcli.transcripts.parse_columns`."""
    tokens = count_texts(columns.contents, columns.metadata, tokenizer)
    return Counted(columns.roles, tokens, columns.sizes, columns.sessions)


def count_texts(contents: Sequence[str], extras: dict[int, str], tokenizer: Tokenizer) -> list[int]:
    """The tokens of each content, plus those of `extras[i]` (a message's metadata) where given.

    A text that repeats (a system prompt on every line, "ok", a tool's usual answer) is counted once.
    """
    count_many = getattr(tokenizer, "count_many", None)
    if count_many is None:
        tokens = [tokenizer.count(text) for text in contents]
    else:
        distinct = list(dict.fromkeys(contents))
        counts = count_many(distinct)
        if len(distinct) == len(contents):
            tokens = counts
        else:
            counted = dict(zip(distinct, counts, strict=True))
            tokens = [counted[text] for text in contents]
    for i, text in extras.items():
        tokens[i] += tokenizer.count(text)
    return tokens


def read_counted(
    data: bytes, name: str, tokenizer: Tokenizer, *, parallel: bool | None = None
) -> Counted:
    """Parse transcript bytes (any format `memcli.transcripts` reads) and count their tokens.

    `parallel`: None decides by size and system; False never forks; True forks whenever the
    transcript has two halves (tests use it).
    """
    from memcli.forked import Forked, can_fork

    cut = _middle(data)
    if parallel is None:
        parallel = len(data) >= PARALLEL_BYTES and can_fork()
    if cut is None or not parallel:
        return count_columns(parse_columns(data, name), tokenizer)
    first_line = data.count(b"\n", 0, cut) + 1
    with Forked(_count_rest, data, cut, name, first_line, tokenizer) as child:
        first = count_columns(parse_columns(data[:cut], name), tokenizer)
    second = child.result()  # its error raised, after any in the first half
    return Counted(
        first.roles + second.roles,
        first.tokens + second.tokens,
        first.sizes + second.sizes,
        first.sessions | second.sessions,
    )


def _count_rest(data: bytes, cut: int, name: str, first_line: int, tokenizer: Tokenizer) -> Counted:
    """The counts of `data[cut:]`, which starts at line `first_line` of the source."""
    return count_columns(parse_columns(data[cut:], name, first_line), tokenizer)


def _middle(data: bytes) -> int | None:
    """Where the second half of JSON Lines starts: after the first line break past the middle."""
    if is_array(data):
        return None
    cut = data.find(b"\n", len(data) // 2) + 1
    return cut if 0 < cut < len(data) else None
