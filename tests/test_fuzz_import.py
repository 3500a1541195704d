"""Hostile input never crashes memcli: `memcli import` either stores a transcript whole and exports
it back exactly (exit 0), or stores nothing and says what is wrong and where (exit 2).

The cases issue 12 found, each through the real CLI (in process through `memcli.cli.app.main`, as
the console script runs it, and a few as real subprocesses), then a Hypothesis fuzzer over
transcripts of arbitrary Unicode (lone surrogates included), roles, names, metadata of every JSON
type and timestamps of every kind.
"""

from __future__ import annotations

import io
import json
import math
import os
import sqlite3
import sys
import tempfile
import zipfile
from contextlib import redirect_stderr, redirect_stdout
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import Run, memcli
from hypothesis import event, given, settings
from hypothesis import strategies as st

from memcli.cli.app import main
from memcli.messages import ROLES


def run(*args: str, env: dict[str, str] | None = None) -> Run:
    """`memcli ARGS` in this process, as the console script runs it: the exit code, stdout and
    stderr. An exception that is not turned into a message and an exit code propagates."""
    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_env = sys.argv, dict(os.environ)
    sys.argv = ["memcli", *args]
    os.environ.update(env or {})
    code: Any = 0
    try:
        with redirect_stdout(out), redirect_stderr(err):
            main()
    except SystemExit as done:
        code = done.code
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    return Run(code if isinstance(code, int) else 1, out.getvalue(), err.getvalue())


def stored(db: Path) -> dict[str, int]:
    """Every session of the database and how many messages it holds (via `memcli sessions`)."""
    if not db.exists():
        return {}
    result = run("--db", str(db), "sessions", "--json")
    assert result.code == 0, result.stderr
    return {r["session"]: r["active_messages"] + r["archived_messages"] for r in result.records()}


def seeded(tmp: Path) -> Path:
    """A database holding one other session, so that "nothing stored" is checked against it."""
    db = tmp / "m.db"
    seed = tmp / "seed.jsonl"
    seed.write_text('{"role": "user", "content": "seed"}\n{"role": "assistant", "content": "ok"}\n')
    assert run("--db", str(db), "import", str(seed), "--session", "seed", "--no-blocks").code == 0
    return db


# --- The cases found by the fault tests, each through the CLI -------------------------------

BIG = "9" * 5000
DEEP = "[" * 100_000 + "]" * 100_000
HOSTILE = {
    "surrogate in content": (r'{"role": "user", "content": "x\ud800y"}', "content"),
    "low surrogate alone in content": (r'{"role": "system", "content": "\udc00"}', "content"),
    "surrogate in name": (r'{"role": "user", "content": "x", "name": "a\udc00"}', "name"),
    "surrogate in a metadata key": (
        r'{"role": "user", "content": "x", "metadata": {"k\ud800": 1}}',
        "a key in metadata",
    ),
    "surrogate in a metadata value": (
        r'{"role": "user", "content": "x", "metadata": {"k": ["\udfff"]}}',
        "metadata['k'][0]",
    ),
    "surrogate in a session": (
        r'{"role": "user", "content": "x", "session": "s\ud800"}',
        "session",
    ),
    "surrogate in a conversation": (
        r'{"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "\ud800"}]}',
        "lone surrogate",
    ),
    "timestamp 1e20": ('{"role": "user", "content": "x", "timestamp": 1e20}', "out of range"),
    "timestamp NaN": ('{"role": "user", "content": "x", "timestamp": NaN}', "NaN is not JSON"),
    "timestamp Infinity": (
        '{"role": "user", "content": "x", "timestamp": Infinity}',
        "Infinity is not JSON",
    ),
    "timestamp 1e400": ('{"role": "user", "content": "x", "timestamp": 1e400}', "finite"),
    "timestamp -1e15": ('{"role": "user", "content": "x", "timestamp": -1e15}', "out of range"),
    "timestamp 10**30": (
        '{"role": "user", "content": "x", "timestamp": 1000000000000000000000000000000}',
        "out of range",
    ),
    "ISO timestamp past 9999 in UTC": (
        '{"role": "user", "content": "x", "timestamp": "9999-12-31T23:59:59-05:00"}',
        "out of range",
    ),
    "ISO timestamp before year 1 in UTC": (
        '{"role": "user", "content": "x", "timestamp": "0001-01-01T00:00:00+05:00"}',
        "out of range",
    ),
    "5,000-digit integer in metadata": (
        '{"role": "user", "content": "x", "metadata": {"n": ' + BIG + "}}",
        "more than 4300 digits",
    ),
    "JSON nested 100,000 deep": (
        '{"role": "user", "content": "x", "metadata": {"n": ' + DEEP + "}}",
        "nested too deeply",
    ),
    "metadata nested 101 deep": (
        '{"role": "user", "content": "x", "metadata": {"n": ' + "[" * 100 + "]" * 100 + "}}",
        "nested more than 100 levels",
    ),
    "duplicate role": (
        '{"role": "user", "role": "assistant", "content": "x"}',
        "duplicate key 'role'",
    ),
    "duplicate key in metadata": (
        '{"role": "user", "content": "x", "metadata": {"a": 1, "a": 2}}',
        "duplicate key 'a'",
    ),
    "metadata false": ('{"role": "user", "content": "x", "metadata": false}', "not false"),
    "metadata 0": ('{"role": "user", "content": "x", "metadata": 0}', "not 0"),
    "metadata []": ('{"role": "user", "content": "x", "metadata": []}', "not []"),
    "metadata a string": ('{"role": "user", "content": "x", "metadata": "k=v"}', "not a string"),
    "metadata NaN inside": (
        '{"role": "user", "content": "x", "metadata": {"a": [NaN]}}',
        "NaN is not JSON",
    ),
    "empty session": ('{"role": "user", "content": "x", "session": ""}', "must not be empty"),
}


@pytest.mark.parametrize("case", list(HOSTILE), ids=list(HOSTILE))
def test_hostile_line_exits_2_naming_file_and_line_and_stores_nothing(
    tmp_path: Path, case: str
) -> None:
    line, what = HOSTILE[case]
    db = seeded(tmp_path)
    path = tmp_path / "t.jsonl"
    path.write_text('{"role": "user", "content": "fine"}\n' + line + "\n")
    result = run("--db", str(db), "import", str(path), "--session", "s", "--no-blocks")
    assert result.code == 2, result.stderr
    assert result.stderr.startswith("Error: ") and f"{path}:2: " in result.stderr
    assert what in result.stderr, result.stderr
    assert stored(db) == {"seed": 2}


@pytest.mark.parametrize(
    ("items", "what"),
    [
        ('[{"role": "user", "content": "\\ud800"}]', "item 0: content holds a lone surrogate"),
        ("[" + DEEP + "]", "nested too deeply"),
        ('[{"role": "user", "content": "x", "timestamp": 1e20}]', "item 0: timestamp 1e+20"),
        ('[{"role": "user", "content": "x", "content": "y"}]', "duplicate key 'content'"),
    ],
)
def test_hostile_json_array_exits_2(tmp_path: Path, items: str, what: str) -> None:
    db = seeded(tmp_path)
    path = tmp_path / "t.json"
    path.write_text(items)
    result = run("--db", str(db), "import", str(path), "--no-blocks")
    assert result.code == 2 and f"{path}" in result.stderr and what in result.stderr, result.stderr
    assert stored(db) == {"seed": 2}


@pytest.mark.parametrize("case", ["surrogate in content", "timestamp 1e20", "duplicate role"])
def test_hostile_line_as_a_real_process(tmp_path: Path, case: str) -> None:
    line, what = HOSTILE[case]
    db = seeded(tmp_path)
    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n")
    result = memcli("--db", str(db), "import", str(path), "--session", "s", "--no-blocks")
    assert result.code == 2 and "Traceback" not in result.stderr
    assert f"Error: {path}:1: " in result.stderr and what in result.stderr, result.stderr
    assert stored(db) == {"seed": 2}


def test_valid_edge_values_import_and_export_exactly(tmp_path: Path) -> None:
    """What the checks above refuse is refused, and nothing more: the extremes that are valid,
    surrogate pairs, an escaped backslash before `ud800`, a 4,300-digit number, metadata 100 deep,
    null and {} metadata (both meaning none), control characters and line separators."""
    db = tmp_path / "m.db"
    nested: Any = []
    for _ in range(98):  # with metadata itself and the innermost [], 100 levels
        nested = [nested]
    lines = [
        {"role": "user", "content": "\U0001f600 x", "timestamp": "0001-01-01T00:00:00Z"},
        {"role": "assistant", "content": "\\ud800 is text", "timestamp": 253402300799},
        {"role": "user", "content": "a\x00b\x85c\u2028d\u2029e\x1ef", "metadata": {"n": nested}},
        {"role": "tool", "content": "", "name": "", "metadata": {"big": int("9" * 4300)}},
        {"role": "system", "content": "s", "metadata": None, "timestamp": -62135596800},
        {"role": "user", "content": "u", "metadata": {}, "timestamp": 1.5},
    ]
    path = tmp_path / "t.jsonl"
    # json.dumps escapes non-ASCII (the emoji as the pair \ud83d\ude00)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    result = run("--db", str(db), "import", str(path), "--session", "s", "--no-blocks")
    assert result.code == 0, result.stderr
    exported = run("--db", str(db), "export", "s")
    assert exported.code == 0, exported.stderr
    # The session record, then one line per message (U+0085/2028/2029 escaped).
    assert len(exported.stdout.splitlines()) == 1 + len(lines)
    records = [json.loads(line) for line in exported.stdout.split("\n") if line][1:]
    assert [r["content"] for r in records] == [r["content"] for r in lines]
    assert records[2]["metadata"] == {"n": nested} and records[3]["metadata"]["big"] == int(
        "9" * 4300
    )
    assert "metadata" not in records[4] and "metadata" not in records[5]
    assert records[3]["name"] == ""
    assert [r.get("timestamp") for r in records] == [
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        None,
        None,
        "0001-01-01T00:00:00Z",
        "1970-01-01T00:00:01.500000Z",
    ]


def test_export_escapes_line_separators_and_reads_back(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    path = tmp_path / "t.jsonl"
    text = "one\u2028two\x85three\u2029four"
    path.write_text(
        json.dumps({"role": "user", "content": text, "metadata": {"k\u2028": "v\x85"}}) + "\n",
        encoding="utf-8",
    )
    assert run("--db", str(db), "import", str(path), "--session", "s", "--no-blocks").code == 0
    first = run("--db", str(db), "export", "s", "--all").stdout
    assert "\u2028" not in first and "\x85" not in first and "\u2029" not in first
    assert "\\u2028" in first and len(first.splitlines()) == 2  # the session record, the message
    again = tmp_path / "again.jsonl"
    again.write_text(first, encoding="utf-8")
    assert run("--db", str(db), "import", str(again), "--session", "c", "--no-blocks").code == 0
    second = run("--db", str(db), "export", "c", "--all").stdout
    assert (
        second.replace('"session": "c"', '"session": "s"').replace('"id": "c"', '"id": "s"')
        == first
    )
    assert json.loads(first.splitlines()[1])["content"] == text


@pytest.mark.parametrize(
    ("args", "stdin_text"),
    [
        (("import", "{file}", "--session", ""), None),
        (("import", "{file}", "--session", "   "), None),
        (("search", "x", "--session", "", "--mode", "lexical"), None),
        (("simulate", "flush", "--session", "", "--no-chart"), None),
        (("facts", "--session", ""), None),
        (("chat", "--plain", "--session", ""), "hi\n"),
    ],
)
def test_empty_session_is_refused_by_every_command(
    tmp_path: Path, args: tuple[str, ...], stdin_text: str | None
) -> None:
    db = seeded(tmp_path)
    path = tmp_path / "t.jsonl"
    path.write_text('{"role": "user", "content": "x"}\n')
    full = [a.replace("{file}", str(path)) for a in args]
    if stdin_text is None:
        result = run("--db", str(db), *full)
    else:
        result = memcli("--db", str(db), *full, input=stdin_text)
    assert result.code == 2, result.stderr
    assert "Error: --session must not be empty" in result.stderr
    assert stored(db) == {"seed": 2}


def test_command_line_text_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    """Bytes of argv that are not UTF-8 reach Python as lone surrogates."""
    db = seeded(tmp_path)
    path = tmp_path / "t.jsonl"
    path.write_text('{"role": "user", "content": "x"}\n')
    for args, what in (
        (("import", str(path), "--no-blocks", "--session", "s\udcff"), "--session holds"),
        (("import", str(path), "--no-blocks", "--user", "u\udcff"), "--user holds"),
        (("export", "s\udcff"), "SESSION holds"),
        (("inspect", "s\udcff"), "SESSION holds"),
    ):
        result = run("--db", str(db), *args)
        assert result.code == 2 and what in result.stderr, (args, result.stderr)
    assert stored(db) == {"seed": 2}


def test_db_that_is_no_regular_file_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"role": "user", "content": "x"}\n')
    for db, what in (("/dev/null", "is not a regular file"), (str(tmp_path), "is a directory")):
        for args in (("import", str(path), "--no-blocks"), ("sessions",), ("export", "s")):
            result = run("--db", db, *args)
            assert result.code == 2 and what in result.stderr, (args, result.stderr)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database" * 100)
    result = run("--db", str(garbage), "import", str(path), "--no-blocks")
    assert result.code == 1 and "file is not a database" in result.stderr  # a store error
    # Said as what it is (another kind of file), not as a damaged database to restore.
    assert "is not a memcli database: it is not a SQLite file" in result.stderr
    for args in (("sessions",), ("copy", str(garbage), str(tmp_path / "c.db"))):
        other = run("--db", str(garbage), *args) if args[0] != "copy" else run(*args)
        assert other.code == 1 and "is not a memcli database" in other.stderr, other.stderr
    assert garbage.read_bytes() == b"not a database" * 100


@pytest.mark.parametrize(
    ("env", "args", "what"),
    [
        ({"MEMCLI_TOKEN_LIMIT": "99999999999999999999999"}, (), "MEMCLI_TOKEN_LIMIT"),
        ({"MEMCLI_FLUSH_SIZE": "-3"}, (), "MEMCLI_FLUSH_SIZE"),
        ({"MEMCLI_RATIO": "nan"}, (), "MEMCLI_RATIO"),
        ({"MEMCLI_LLM_TIMEOUT": "inf"}, (), "MEMCLI_LLM_TIMEOUT"),
        ({}, ("--token-limit", "99999999999999999999999"), "at most 1,000,000,000"),
        ({}, ("--flush-size", "99999999999999999999999"), "larger than token_limit"),
        ({}, ("--ratio", "1e308"), "chat_history_token_ratio"),
    ],
)
def test_absurd_numbers_are_range_errors(
    tmp_path: Path, env: dict[str, str], args: tuple[str, ...], what: str
) -> None:
    db = seeded(tmp_path)
    path = tmp_path / "t.jsonl"
    path.write_text('{"role": "user", "content": "x"}\n')
    result = run("--db", str(db), "import", str(path), "--no-blocks", *args, env=env)
    assert result.code == 2 and what in result.stderr, result.stderr
    assert stored(db) == {"seed": 2}


def test_non_utf8_config_file(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_bytes(b"[memory]\ntoken_limit = 100 # caf\xe9\n")
    result = run("--config", str(config), "--db", str(tmp_path / "m.db"), "sessions")
    assert result.code == 2 and f"{config}:2: invalid UTF-8" in result.stderr, result.stderr


# --- The fuzzer -------------------------------------------------------------------------------

MISSING = object()
#: Any character, lone surrogates and the characters that trip line-based readers included.
CHARS = st.one_of(
    st.characters(),  # every code point
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),  # surrogates more often
    st.sampled_from(["\x00", "\n", "\r", "\x85", "\u2028", "\u2029", "\ufeff", '"', "\\", "é"]),
)
TEXT = st.text(CHARS, max_size=12)
#: Text without lone surrogates (characters beyond U+FFFF are written as escaped pairs).
CLEAN_TEXT = st.text(
    st.one_of(
        st.characters(exclude_categories=["Cs"]),
        st.sampled_from(["\x00", "\n", "\x85", "\u2028", '"', "\\"]),
    ),
    max_size=12,
)


def clean(value: Any) -> bool:
    """No lone surrogate in any string (keys included) of a parsed JSON value."""
    if isinstance(value, str):
        return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return all(clean(v) for v in value)
    if isinstance(value, dict):
        return all(clean(k) and clean(v) for k, v in value.items())
    return True


def finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(finite(v) for v in value)
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    return True


def as_read(value: Any) -> Any:
    """A value as a JSON reader sees it once written with json.dumps (a surrogate pair written
    as two escapes reads back as one character)."""
    return json.loads(json.dumps(value))


#: (value, valid): every field is drawn with whether memcli must take it (None: either way).
def text_field(value: str) -> tuple[Any, bool]:
    return value, clean(as_read(value))


ROLE = st.one_of(
    st.sampled_from(ROLES).map(lambda r: (r, True)),
    TEXT.map(lambda t: (t, as_read(t) in ROLES)),
    st.integers().map(lambda n: (n, False)),
)
CONTENT = st.one_of(
    TEXT.map(text_field), st.sampled_from([None, 3, ["x"]]).map(lambda v: (v, False))
)
NAME = st.one_of(
    st.just((MISSING, True)),
    st.just((None, True)),
    TEXT.map(text_field),
    st.integers().map(lambda n: (n, False)),
)
JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and Infinity included: refused
    TEXT,
)
JSON = st.recursive(
    JSON_LEAF,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
CLEAN_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | CLEAN_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(CLEAN_TEXT, inner, max_size=3),
    max_leaves=8,
)


def metadata_field(value: Any) -> tuple[Any, bool]:
    read = json.loads(json.dumps(value))  # NaN and Infinity read back by Python's parser
    return value, isinstance(read, dict) and clean(read) and finite(read)


METADATA = st.one_of(
    st.just((MISSING, True)),
    st.just((None, True)),
    st.dictionaries(TEXT, JSON, max_size=4).map(metadata_field),
    st.one_of(st.booleans(), st.integers(), st.floats(), TEXT, st.lists(JSON, max_size=3)).map(
        lambda v: (v, False)
    ),
)


def unix_field(value: float) -> tuple[Any, bool]:
    if isinstance(value, float) and not math.isfinite(value):
        return value, False
    try:
        datetime.fromtimestamp(value, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return value, False
    return value, True


def iso_field(value: datetime) -> tuple[Any, bool]:
    try:
        (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
    except (OverflowError, ValueError):
        return value.isoformat(), False
    return value.isoformat(), True


TIMESTAMP = st.one_of(
    st.just((MISSING, True)),
    st.just((None, True)),
    st.integers(min_value=-62135596800, max_value=253402300799).map(lambda n: (n, True)),
    st.integers().map(unix_field),
    st.floats().map(unix_field),
    st.datetimes(timezones=st.none() | st.timezones()).map(iso_field),
    TEXT.map(lambda t: (t, None)),  # a random string: whatever ISO 8601 makes of it
    st.booleans().map(lambda b: (b, False)),
)
def _is_name(text: str) -> bool:
    import unicodedata

    return (
        bool(text.strip())
        and text == text.strip()
        and not any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text)
    )


SESSION = st.one_of(
    st.just((MISSING, True)),
    TEXT.map(lambda t: (t, clean(as_read(t)) and _is_name(as_read(t).strip()))),
    st.sampled_from(["", "  ", 7]).map(lambda v: (v, False)),
)


def valid(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, bool]]:
    return strategy.map(lambda v: (v, True))


#: Each field drawn from values memcli must take (a message is mostly these)...
VALID = {
    "role": valid(st.sampled_from(ROLES)),
    "content": valid(CLEAN_TEXT),
    "name": valid(st.just(MISSING) | st.none() | CLEAN_TEXT),
    "metadata": valid(
        st.just(MISSING) | st.none() | st.dictionaries(CLEAN_TEXT, CLEAN_JSON, max_size=4)
    ),
    "timestamp": st.one_of(
        valid(st.just(MISSING) | st.none()),
        valid(st.integers(min_value=-62135596800, max_value=253402300799)),
        valid(st.floats(min_value=-6e10, max_value=2.5e11)),
        st.datetimes(timezones=st.none() | st.timezones()).map(iso_field),
    ),
    # (a name: one line of printable text, without white space around it)
    "session": valid(st.just(MISSING) | CLEAN_TEXT.filter(_is_name)),
}
#: ... or from anything, hostile values included (one field of one message in four).
ANY = {
    "role": ROLE,
    "content": CONTENT,
    "name": NAME,
    "metadata": METADATA,
    "timestamp": TIMESTAMP,
    "session": SESSION,
}


@st.composite
def messages(draw: st.DrawFn) -> dict[str, tuple[Any, bool | None]]:
    """A message's fields, each with whether memcli must take it."""
    hostile = draw(st.sampled_from([None, None, None, *VALID]))
    return {key: draw(ANY[key] if key == hostile else VALID[key]) for key in VALID}


@st.composite
def transcripts(draw: st.DrawFn) -> tuple[str, list[dict[str, Any]], bool | None]:
    """The text of a transcript file, its messages, and whether memcli must take it (None:
    either way, a random string as a timestamp)."""
    drawn = draw(st.lists(messages(), min_size=1, max_size=4))
    layout = draw(st.sampled_from(["lines", "lines", "conversation", "array", "duplicate key"]))
    if layout == "conversation":  # the messages of a conversation have no session of their own
        drawn = [{k: v for k, v in fields.items() if k != "session"} for fields in drawn]
    records = [{k: v for k, (v, _) in fields.items() if v is not MISSING} for fields in drawn]
    verdicts = [ok for fields in drawn for _, ok in fields.values()]
    valid: bool | None = False if False in verdicts else (None if None in verdicts else True)
    if layout == "array":
        text = json.dumps(records)
    elif layout == "conversation":
        text = json.dumps({"messages": records}) + "\n"
    elif layout == "duplicate key":  # "role" twice on the first line
        first, *rest = [json.dumps(r) for r in records]
        text = "\n".join(['{"role": "user", ' + first[1:], *rest]) + "\n"
        valid = False
    else:
        text = "".join(json.dumps(r) + "\n" for r in records)
    return text, records, valid


def expected(record: dict[str, Any]) -> dict[str, Any]:
    """The message a valid record must export as, read independently of memcli."""
    read = as_read(record)
    out = {"role": read["role"], "content": read["content"]}
    if read.get("name") is not None:
        out["name"] = read["name"]
    if read.get("metadata"):
        out["metadata"] = read["metadata"]
    stamp = read.get("timestamp")
    if isinstance(stamp, str):
        parsed = datetime.fromisoformat(stamp[:-1] + "+00:00" if stamp.endswith("Z") else stamp)
        out["timestamp"] = (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC)
    elif stamp is not None:
        out["timestamp"] = datetime.fromtimestamp(stamp, tz=UTC)
    return out


def exported(db: Path, session: str) -> Run:
    result = run("--db", str(db), "export", session, "--all")
    assert result.code == 0, result.stderr
    assert len(result.stdout.splitlines()) == result.stdout.count("\n")  # one record per line
    return result


def as_message(record: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in record.items() if k not in ("session", "status")}
    if "timestamp" in out:
        out["timestamp"] = datetime.fromisoformat(out["timestamp"].replace("Z", "+00:00"))
    return out


@settings(max_examples=100, deadline=None)
@given(transcripts())
def test_fuzzed_import_round_trips_or_exits_2_storing_nothing(
    transcript: tuple[str, list[dict[str, Any]], bool | None],
) -> None:
    text, records, valid = transcript
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        db = seeded(tmp)
        path = tmp / "t.jsonl"
        path.write_text(text, encoding="utf-8")  # json.dumps wrote ASCII, surrogates escaped
        result = run("--db", str(db), "import", str(path), "--session", "s", "--no-blocks")
        assert result.code in (0, 2), result.stderr
        event(f"exit {result.code}, expected {valid}")
        if valid is not None:
            assert result.code == (0 if valid else 2), (result.stderr, records)
        if result.code == 2:
            assert result.stderr.startswith("Error: ") and str(path) in result.stderr
            assert stored(db) == {"seed": 2}
            return
        first = exported(db, "s")
        messages = [r for r in first.records() if r.get("type") != "session"]
        assert [as_message(r) for r in messages] == [expected(r) for r in records]
        # what export writes, import reads back the same
        again = tmp / "again.jsonl"
        again.write_text(first.stdout, encoding="utf-8")
        assert run("--db", str(db), "import", str(again), "--session", "c", "--no-blocks").code == 0
        second = exported(db, "c").stdout
        assert (
            second.replace('"session": "c"', '"session": "s"').replace('"id": "c"', '"id": "s"')
            == first.stdout
        )


# --- Every format, fuzzed: a MemcliError or an import, never a traceback ------------------------

EXPORTS = Path(__file__).parent / "data" / "exports"
#: A seed of each format, as the JSON value its file holds (a fine-tuning file: its lines).
SEEDS = {
    "chatgpt": json.loads((EXPORTS / "chatgpt-conversations.json").read_text()),
    "claude": json.loads((EXPORTS / "claude-conversations.json").read_text()),
    "llm": json.loads((EXPORTS / "llm-0.36-logs.json").read_text()),
    "finetune": [
        json.loads(line) for line in (EXPORTS / "finetune.jsonl").read_text().splitlines()
    ],
    "sharegpt": json.loads((EXPORTS / "sharegpt.json").read_text()),
    "sharegpt-lines": [
        json.loads(line) for line in (EXPORTS / "sharegpt.jsonl").read_text().splitlines()
    ],
    "openwebui": json.loads((EXPORTS / "openwebui-chats.json").read_text()),
    "openwebui-chat": json.loads((EXPORTS / "openwebui-chat.json").read_text()),
    "sillytavern": [
        json.loads(line) for line in (EXPORTS / "sillytavern.jsonl").read_text().splitlines()
    ],
    "lmstudio": json.loads((EXPORTS / "lmstudio.conversation.json").read_text()),
    "anthropic": json.loads((EXPORTS / "anthropic-messages.json").read_text()),
    "chatgpt-tools": json.loads((EXPORTS / "chatgpt-tools.json").read_text()),
    "llm-fragments": json.loads((EXPORTS / "llm-0.36-fragments.json").read_text()),
}
#: The formats written one record a line.
LINES = ("finetune", "sharegpt-lines", "sillytavern")
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)


def paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value (the value itself included)."""
    found = [at]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += paths(item, (*at, i))
    return found


def replaced(value: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    copy = json.loads(json.dumps(value))
    inner = copy
    for key in at[:-1]:
        inner = inner[key]
    inner[at[-1]] = new
    return copy


@st.composite
def export_files(draw: st.DrawFn) -> tuple[str, bytes]:
    """A seed export with a few of its values replaced by anything (non-objects, lone
    surrogates, loops of ids), written as JSON, JSON Lines, or in a zip (whole or split)."""
    kind = draw(st.sampled_from(sorted(SEEDS)))
    value = SEEDS[kind]
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.sampled_from(paths(value)))
        new = draw(ANY_JSON | st.sampled_from(["a2", "b1", "\ud800", 1e400, [None], {}]))
        value = replaced(value, at, new)
    if kind in LINES and isinstance(value, list):
        return kind, "".join(json.dumps(line) + "\n" for line in value).encode()
    data = json.dumps(value).encode()
    wrap = draw(st.sampled_from(["json", "json", "zip", "split"]))
    if wrap == "json" or kind not in ("chatgpt", "claude"):
        return kind, data
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        if wrap == "zip" or not isinstance(value, list):
            z.writestr("conversations.json", data)
        else:
            for i, item in enumerate(value):
                z.writestr(f"conversations-{i:03}.json", json.dumps([item]))
    return kind, out.getvalue()


def import_bytes(data: bytes) -> None:
    """`data` imported as `memcli import` imports it, into a new database in memory."""
    from memcli.flush import BudgetOverride
    from memcli.formats import read
    from memcli.importing import Opening, from_source, import_conversations
    from memcli.store.sqlite import SQLiteStore
    from memcli.tokens import TiktokenTokenizer

    source = read("-", io.BytesIO(data))
    found = from_source(source)
    store = SQLiteStore(":memory:")
    try:
        opening = Opening(TiktokenTokenizer(), default_budget=BudgetOverride(4000, 0.7))
        import_conversations(store, found, opening, session_record=source.header)
    finally:
        store.close()


@settings(max_examples=80, deadline=None)
@given(export_files())
def test_fuzzed_exports_of_every_format_import_or_raise_a_memcli_error(
    export: tuple[str, bytes],
) -> None:
    from memcli.errors import MemcliError

    kind, data = export
    try:
        import_bytes(data)
        event(f"{kind}: imported")
    except MemcliError as exc:
        event(f"{kind}: {type(exc).__name__}")
        assert exc.exit_code == 2, exc


LOG_VALUES = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.binary(max_size=8),
    CLEAN_TEXT,
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(*[LOG_VALUES] * 5), max_size=6),
    st.lists(st.tuples(*[LOG_VALUES] * 4), max_size=6),
    st.lists(st.tuples(*[LOG_VALUES] * 4), max_size=6),
)
def test_fuzzed_logs_dbs_import_or_raise_a_memcli_error(
    responses: list[tuple[Any, ...]], messages: list[tuple[Any, ...]], parts: list[tuple[Any, ...]]
) -> None:
    """llm's logs.db, either schema, holding values of any SQLite type in its columns."""
    from memcli.errors import MemcliError

    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "logs.db"
        conn = sqlite3.connect(db)
        conn.executescript(
            "CREATE TABLE conversations (id, name);"
            "CREATE TABLE responses (id, prompt, response, conversation_id, datetime_utc);"
            "CREATE TABLE threads (id, name, tip_message_hash, datetime_utc);"
            "CREATE TABLE messages (hash, parent_hash, role);"
            "CREATE TABLE parts (message_hash, type, text, position);"
            "CREATE TABLE turns (parent_message_hash, tip_message_hash, datetime_utc);"
        )
        conn.executemany("INSERT INTO responses VALUES (?, ?, ?, ?, ?)", responses)
        conn.executemany("INSERT INTO threads VALUES (?, ?, ?, ?)", messages)
        conn.executemany("INSERT INTO messages VALUES (?, ?, ?)", [m[:3] for m in messages])
        conn.executemany("INSERT INTO parts VALUES (?, ?, ?, ?)", parts)
        conn.commit()
        conn.close()
        try:
            import_bytes(db.read_bytes())
        except MemcliError as exc:
            assert exc.exit_code == 2, exc


@pytest.mark.parametrize(
    ("name", "data", "what"),
    [
        ("array.json", b'[1, {"mapping": {}, "current_node": null}]', "conversation 0: no mapping"),
        (
            "surrogate.json",
            b'[{"mapping": {}, "current_node": null, "conversation_id": "c\\ud800"}]',
            "its id holds a lone surrogate",
        ),
    ],
)
def test_a_bad_export_exits_2_and_makes_no_database(
    tmp_path: Path, name: str, data: bytes, what: str
) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    db = tmp_path / "m.db"
    result = run("--db", str(db), "import", str(path), "--no-blocks")
    assert result.code == 2 and what in result.stderr and str(path) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not db.exists()


def test_a_zip_bomb_exits_2_storing_nothing(tmp_path: Path) -> None:
    db = seeded(tmp_path)
    bomb = tmp_path / "export.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("conversations.json", b"[" + b" " * (8 * 2**20) + b"]")
    result = run("--db", str(db), "import", str(bomb), "--no-blocks")
    assert result.code == 2 and "conversations.json: expands from" in result.stderr, result.stderr
    assert stored(db) == {"seed": 2}
