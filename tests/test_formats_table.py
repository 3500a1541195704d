"""The formats are one table (`memcli.formats.READERS`): every format module is in it, and
`memcli import --help`, its errors and the docs name the formats it holds, no more, no fewer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import memcli

from memcli.formats import FORMATS, READERS

ROOT = Path(__file__).resolve().parents[1]
NAMES = {r.name for r in READERS}
#: A list of names written in backticks: `a`, `b` or `c`.
_NAME = r"`([a-z][a-z0-9_-]*)`"
_LIST = re.compile(rf"{_NAME}(?:(?:,|,? or|,? and)\s+{_NAME})+")


def name_lists(text: str) -> list[list[str]]:
    """Each list of backticked names in `text` (`a`, `b`, or `c`), as its names."""
    text = re.sub(r"\s+", " ", text)
    return [re.findall(_NAME, m.group(0)) for m in _LIST.finditer(text)]


def section(path: str, heading: str) -> str:
    """The text of a doc under `heading` (up to the next heading of its level or above)."""
    text = (ROOT / path).read_text()
    level = heading.split(" ")[0]
    start = text.index(f"\n{heading}\n")
    end = re.compile(rf"^#{{1,{len(level)}}} ", re.M).search(text, start + len(heading) + 2)
    return text[start : end.start() if end else len(text)]


PLACES = [
    ("README.md", "### import"),
    ("docs/cli.md", "## import"),
    ("docs/formats.md", "## Each format in detail"),
]


def test_name_lists_finds_a_list_and_what_is_missing_from_it() -> None:
    """(The test below can fail: a list naming one format fewer is found as it is.)"""
    assert name_lists("`a`, `b`\n or `c`; `d`") == [["a", "b", "c"]]
    assert name_lists("`chatgpt` and `claude`") == [["chatgpt", "claude"]]


@pytest.mark.parametrize(("path", "heading"), PLACES)
def test_each_doc_names_every_format_of_the_table(path: str, heading: str) -> None:
    lists = [names for names in name_lists(section(path, heading)) if set(names) & NAMES]
    assert lists, f"{path} ({heading}) lists no formats"
    for names in lists:
        assert set(names) - {"auto"} == NAMES, f"{path} ({heading}) lists {names}"


def test_formats_md_describes_each_format_of_the_table() -> None:
    text = section("docs/formats.md", "## Each format in detail")
    described = re.findall(r"^- \*\*([a-z0-9_-]+)\*\*:", text, re.M)
    assert sorted(described) == sorted(NAMES)


def test_import_help_lists_every_format_with_its_help() -> None:
    run = memcli("import", "--help", env={"COLUMNS": "200"})
    assert run.code == 0, run.stderr
    text = re.sub(r"\s+", " ", run.stdout)
    option = re.search(
        r"--format FORMAT The input's format: auto \(by its shape\), (.*?), or", text
    )
    assert option is not None, run.stdout
    assert option.group(1).split(", ") == list(FORMATS[1:])
    listed = dict(re.findall(r"^ +([a-z][a-z0-9_-]*): +(.+?) *$", run.stdout, re.M))
    assert listed == {r.name: r.help for r in READERS}


def test_an_unknown_format_and_an_unknown_shape_name_every_format(tmp_path: Path) -> None:
    path = tmp_path / "odd.json"
    path.write_text('[{"question": "q", "answer": "a"}]')
    unknown = memcli("import", str(path), "--format", "nope")
    assert unknown.code == 2
    assert f"Use one of: {', '.join(FORMATS)}" in unknown.stderr
    shape = memcli("import", str(path))
    assert shape.code == 2
    assert all(r.help in shape.stderr for r in READERS), shape.stderr
    assert f"or give --format ({', '.join(FORMATS[1:])})" in shape.stderr


def test_every_format_module_is_in_the_table() -> None:
    """Adding a format is a module and its entry in READERS: a module left out of the table
    would never be read."""
    import importlib

    not_formats = {"__init__", "base", "reader", "plugins", "archive"}
    modules = sorted(
        p.stem for p in (ROOT / "memcli" / "formats").glob("*.py") if p.stem not in not_formats
    )
    readers = [importlib.import_module(f"memcli.formats.{m}").READER for m in modules]
    assert sorted(readers, key=lambda r: r.name) == sorted(READERS, key=lambda r: r.name)
    assert len(NAMES) == len(READERS) and READERS[-1].name == "transcript"


EXPORTS = ROOT / "tests" / "data" / "exports"


@pytest.mark.parametrize(
    ("file", "kind"),
    [
        ("llm-0.36-logs.db", "an llm"),
        ("sharegpt.jsonl", "a sharegpt"),
        ("openwebui-chats.json", "an openwebui"),
        ("sillytavern.jsonl", "a sillytavern"),
        ("lmstudio.conversation.json", "a lmstudio"),
        ("anthropic-messages.json", "an anthropic"),
    ],
)
def test_simulate_refuses_an_export_of_any_format_by_name(file: str, kind: str) -> None:
    """(It knew three formats' names, and failed with a KeyError on the others.)"""
    run = memcli("simulate", "flush", str(EXPORTS / file))
    assert run.code == 2, run.stderr
    assert f"is {kind} export: simulate replays one transcript" in " ".join(run.stderr.split())
    assert "Traceback" not in run.stderr
