"""Formats added by other packages (entry points of the group `memcli.formats`): the example of
docs/formats.md installed (its module and a `.dist-info` with its entry point, on PYTHONPATH or
sys.path) and used by `--format` and by detection; looked up only when the built-in formats do
not do; a broken plugin named in a clear error, without a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from helpers import memcli

from memcli.errors import ConfigError, InputError

ROOT = Path(__file__).resolve().parents[1]
TALK = "user: Where do the trains to Zermatt leave from?\nassistant: From Visp, every hour.\n"


def doc_example() -> tuple[str, dict[str, str], str]:
    """The plugin of docs/formats.md's "Adding a format": its package name, entry points and
    module's code."""
    text = (ROOT / "docs/formats.md").read_text()
    text = text[text.index("## Adding a format") :]
    (toml,) = re.findall(r"^```toml\n(.*?)^```$", text, re.M | re.S)
    (code,) = re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)
    project = tomllib.loads(toml)["project"]
    return project["name"], project["entry-points"]["memcli.formats"], code


def install(site: Path, package: str, points: dict[str, str], modules: dict[str, str]) -> Path:
    """A package "installed" in `site`: its modules and a dist-info with its entry points."""
    site.mkdir(exist_ok=True)
    for module, code in modules.items():
        (site / f"{module}.py").write_text(code)
    info = site / f"{package.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in points.items())
    (info / "entry_points.txt").write_text(f"[memcli.formats]\n{lines}")
    return site


def with_site(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture
def chatlog(tmp_path: Path) -> Path:
    """The docs' example installed; the folder to put on the path."""
    package, points, code = doc_example()
    (module,) = {value.split(":")[0] for value in points.values()}
    return install(tmp_path / "site", package, points, {module: code})


def test_the_docs_plugin_imports_by_detection_and_by_format(chatlog: Path, tmp_path: Path) -> None:
    talk = tmp_path / "talk.txt"
    talk.write_text(TALK)
    found = memcli("import", str(talk), "--json", env=with_site(chatlog))
    assert found.code == 0, found.stderr
    assert found.records()[-1]["new"] == 2
    (session,) = memcli("sessions", "--json").records()
    (_, *messages) = memcli("export", session["session"]).records()
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "Where do the trains to Zermatt leave from?"),
        ("assistant", "From Visp, every hour."),
    ]
    # A log its shape does not give away (a blank first line) is read when --format names it;
    # without, it is read as a transcript, whose error names the line.
    odd = tmp_path / "odd.txt"
    odd.write_text("\nuser: and back?\nassistant: The same.\n")
    assert memcli("import", str(odd), env=with_site(chatlog)).code == 2
    named = memcli("import", str(odd), "--format", "chatlog", "--json", env=with_site(chatlog))
    assert named.code == 0, named.stderr
    assert named.records()[-1]["new"] == 2
    # Its own InputError is shown as it is: the file and line, and the hint.
    bad = tmp_path / "bad.txt"
    bad.write_text("user: hi\nrobot: beep\n")
    run = memcli("import", str(bad), env=with_site(chatlog))
    assert run.code == 2
    assert f"{bad}:2: not a `user: ...` or `assistant: ...` line" in run.stderr
    assert "Traceback" not in run.stderr
    # --format lists it among what it takes.
    unknown = memcli("import", str(talk), "--format", "nope", env=with_site(chatlog))
    assert unknown.code == 2 and "sillytavern, transcript, chatlog" in unknown.stderr


def test_the_library_reads_a_plugins_format(
    chatlog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memcli.formats import read

    monkeypatch.syspath_prepend(str(chatlog))
    talk = tmp_path / "talk.txt"
    talk.write_text(TALK)
    try:
        source = read(talk)
        assert source.format == "chatlog" and source.name == str(talk)
        (conversation,) = source.conversations
        assert [m.role for m in conversation.messages] == ["user", "assistant"]
        assert read(talk, format="chatlog").format == "chatlog"
    finally:
        sys.modules.pop("memcli_chatlog", None)
    monkeypatch.undo()
    with pytest.raises(InputError, match="unknown format 'chatlog'"):
        read(talk, format="chatlog")


def imported_modules(args: list[str], env: dict[str, str]) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "memcli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_plugins_are_not_looked_up_by_help_nor_by_an_import_of_a_built_in_format(
    chatlog: Path, tmp_path: Path
) -> None:
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"role": "user", "content": "hi"}\n{"role": "assistant", "content": "yo"}\n')
    # (-X importtime does not see a module importlib imports, the plugin's: that the entry
    # points were never read, importlib.metadata never imported, says it was not loaded.)
    for args in (["--help"], ["import", "--help"], ["import", str(chat), "--no-blocks"]):
        names = imported_modules(args, with_site(chatlog))
        assert "memcli.formats" in names  # the table (the help is made from it)
        assert "importlib.metadata" not in names, args
    # ... and are, when a format is none of the built-in ones.
    talk = tmp_path / "talk.txt"
    talk.write_text(TALK)
    assert "importlib.metadata" in imported_modules(["import", str(talk)], with_site(chatlog))


BROKEN = {
    "raises": "raise RuntimeError('the plugin is broken')\n",
    "notreader": "READER = 'not a reader'\n",
    "misnamed": "from memcli.formats import Reader\n"
    "READER = Reader('other', 'x', True, lambda s: True, lambda s: None)\n",
    "crashes": "from memcli.formats import Reader\n"
    "def read(source):\n    return {}['missing']\n"
    "READER = Reader('crashes', 'x', True, lambda s: True, read)\n",
    "gives": "from memcli.formats import Reader\n"
    "READER = Reader('gives', 'x', True, lambda s: True, lambda s: [])\n",
}


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("raises", "plug_raises:READER", "cannot be loaded (RuntimeError: the plugin is broken)"),
        ("gone", "plug_missing:READER", "cannot be loaded (ModuleNotFoundError"),
        ("notreader", "plug_notreader:READER", "it is a str, not a memcli.formats.Reader"),
        ("misnamed", "plug_misnamed:READER", "its reader is named 'other', not 'misnamed'"),
        ("crashes", "plug_crashes:READER", "failed reading"),
        ("gives", "plug_gives:READER", "read gave a list, not a memcli.formats.Source"),
        ("chatgpt", "plug_gives:READER", "'chatgpt' is a built-in format"),
    ],
)
def test_a_broken_plugin_is_named_in_a_clear_error(
    tmp_path: Path, name: str, value: str, error: str
) -> None:
    modules = {f"plug_{n}": code for n, code in BROKEN.items()}
    site = install(tmp_path / "site", "memcli-broken", {name: value}, modules)
    talk = tmp_path / "talk.txt"
    talk.write_text(TALK)
    args = [str(talk)] if name == "chatgpt" else [str(talk), "--format", name]
    by_shape = memcli("import", str(talk), env=with_site(site))  # (detection falls through)
    for run in (memcli("import", *args, env=with_site(site)), by_shape):
        assert run.code == ConfigError.exit_code, run.stderr
        assert f"format plugin {name!r} ({value}, package memcli-broken 0.1)" in run.stderr
        assert error in run.stderr
        assert "Traceback" not in run.stderr
    # Nothing was stored, and the built-in formats are read as ever.
    assert memcli("sessions", "--json").records() == []
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"role": "user", "content": "hi"}\n')
    assert memcli("import", str(chat), env=with_site(site)).code == 0


def test_two_packages_adding_one_name_are_both_named(tmp_path: Path) -> None:
    gives = {"plug_gives": BROKEN["gives"]}
    site = install(tmp_path / "site", "memcli-one", {"twice": "plug_gives:READER"}, gives)
    install(site, "memcli-two", {"twice": "plug_gives:READER"}, {})
    run = memcli("import", "x.txt", "--format", "twice", env=with_site(site))
    assert run.code == 2
    assert (
        "package memcli-one 0.1 and package memcli-two 0.1 each add a format plugin named 'twice'"
    ) in run.stderr


def test_a_plugin_failing_to_detect_is_named_in_a_clear_error(tmp_path: Path) -> None:
    code = "from memcli.formats import Reader\nREADER = Reader('odd', 'x', True, lambda s: 1 / 0, None)\n"
    site = install(tmp_path / "site", "memcli-odd", {"odd": "plug_odd:READER"}, {"plug_odd": code})
    talk = tmp_path / "talk.txt"
    talk.write_text(TALK)
    run = memcli("import", str(talk), env=with_site(site))
    assert run.code == 2
    assert "format plugin 'odd' (plug_odd:READER, package memcli-odd 0.1)" in run.stderr
    assert "its detect or read is not a function" in run.stderr
    code = code.replace("None)", "lambda s: None)")
    (site / "plug_odd.py").write_text(code)
    run = memcli("import", str(talk), env=with_site(site))
    assert run.code == 2
    assert f"failed detecting {talk} (ZeroDivisionError: division by zero)" in run.stderr
    assert "Traceback" not in run.stderr
