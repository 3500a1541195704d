"""Every example in README.md and in the docs/ pages it leads to, run as a user would, so that
the manual stays true.

Each line of each ```sh block is run with bash (in README order, then the pages of SH_PAGES in
order: the import examples create the sessions the later examples use) in one prepared directory:
MEMCLI_HOME and HOME in a temporary folder, `memcli` on PATH, sample transcripts under the names
the examples use. Each must exit 0 and print what it says: JSON Lines on stdout in a pipe (as
every data command does), the record types its comment names, the counts it quotes. The
```python blocks (README's, then PYTHON_PAGES') run as scripts in order in one folder, the
```toml block as a config file. What a test cannot run as written is handled by name below
(SKIPPED, SUBSTITUTIONS, STDIN): an example added that this file does not know how to run fails
`test_every_example_is_known`.

Commands run with a `blocks = []` config (no embedding model) except the long-term memory
sections (LONG_TERM_SECTIONS), which use the default blocks (the vector block and `search` embed
with the session's shared ONNX export).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pg import new_database

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
#: The pages of docs/ whose ```sh examples run after the README's, in this order, in the same
#: folder and on the same database (they go on from where the README's left it).
SH_PAGES = ("docs/formats.md", "docs/cli.md", "docs/mcp.md", "docs/postgresql.md")
#: The pages whose ```python examples run after the README's, in this order, in one folder.
PYTHON_PAGES = ("docs/python.md", "docs/postgresql.md")

# Examples not run, each with the reason.
SKIPPED = {
    "./run chat": "sets up .venv (pip installs) and starts the full-screen chat; "
    "`memcli chat` below runs the same program",
    "./run test": "runs ruff, mypy and the whole suite, this file included",
    "memcli mcp --http": "serves until interrupted; tests/test_mcp_http.py runs it",
}
# Text replaced before running: the README's endpoints become the tests' loopback LLM server.
# The model `gpt-4o-mini` (with OPENAI_API_KEY) is pointed at the same server.
LOOPBACK = "LOOPBACK"
SUBSTITUTIONS = {
    "http://127.0.0.1:11434/v1": LOOPBACK,
    "http://127.0.0.1:8080/v1": LOOPBACK,  # llama.cpp's server
    "http://127.0.0.1:1234/v1": LOOPBACK,  # LM Studio
    "--model ollama_chat/llama3.2": f"--model openai/llama3.2 --api-base {LOOPBACK}",
    "--model gpt-4o-mini": f"--model openai/gpt-4o-mini --api-base {LOOPBACK}",
}
# The README's PostgreSQL URLs become databases on a server the tests start (tests/pg.py), its
# SQLite file the one the examples before it filled.
PG_DATABASES = ("postgresql://memcli@localhost/memcli_copy", "postgresql://memcli@localhost/memcli")
SQLITE_DEFAULT = "~/.local/share/memcli/memcli.db"
# The full-screen chat needs a terminal: without one (here) it runs in plain mode, reading
# messages from stdin. These lines get one message on stdin.
STDIN = "hi\n"
# Sections whose examples use the default long-term blocks (the others run with `blocks = []`).
LONG_TERM_SECTIONS = ("Long-term memory", "search, blocks, facts")
# What the loopback model answers a ```python block holding the key (else its default, "OK").
PYTHON_REPLIES = {
    "memory.remember(": [
        {"content": '<facts><fact topics="home" entities="Porto">Ana lives in Porto</fact></facts>'}
    ],
}
# Lines that need a model configured (`facts extract` exits 2 without one): run with
# MEMCLI_MODEL/MEMCLI_API_BASE pointing at the loopback server.
NEEDS_MODEL = ("memcli facts extract",)
# stdout that is text, not JSON Lines.
TEXT_OUTPUT = (
    "memcli --show-completion",
    "memcli --install-completion",
    "memcli mcp token add",
    "memcli config get",
)
# Lines that edit the config file: run on a file of their own, so that the model they set does
# not reach the other examples (which run with `blocks = []` and no model).
CONFIG_EDITS = ("memcli config",)


def code_blocks(lang: str, text: str = README) -> list[tuple[str, str]]:
    """(section heading, block text) of every ```lang block of `text`, in order."""
    out = []
    heading = ""
    for match in re.finditer(rf"^(#+ [^\n]*)$|^```{lang}\n(.*?)^```$", text, re.M | re.S):
        if match.group(1):
            heading = match.group(1).lstrip("# ")
        else:
            out.append((heading, match.group(2)))
    return out


@dataclass(frozen=True)
class Example:
    source: str
    section: str
    line: str

    @property
    def command(self) -> str:
        """The line without its trailing comment."""
        return split_comment(self.line)[0]

    @property
    def comment(self) -> str:
        return split_comment(self.line)[1]

    def __str__(self) -> str:
        return self.command


def split_comment(line: str) -> tuple[str, str]:
    """A shell line's command and its `# comment` (a # outside quotes after a space)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] == " "):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


SH_EXAMPLES = [
    Example(source, section, line.strip())
    for source, text in [("README.md", README)]
    + [(page, (ROOT / page).read_text()) for page in SH_PAGES]
    for section, block in code_blocks("sh", text)
    for line in block.splitlines()
    if line.strip()
]


def test_every_example_is_known():
    """Every sh line is a memcli command (or a pipeline into or out of one), or skipped by name."""
    assert len(SH_EXAMPLES) > 40
    assert {e.source for e in SH_EXAMPLES} == {"README.md", *SH_PAGES}
    for example in SH_EXAMPLES:
        command = example.command
        if command in SKIPPED:
            continue
        assert re.match(r"^(memcli |printf .*\| memcli |cat \S+ \| memcli )", command), (
            f"{example.source} example {command!r}: this test does not know how to run it; "
            "add a way (or a reason to skip it) in tests/test_readme.py"
        )
        assert example.section, command


# --- the prepared environment --------------------------------------------------------------

TOPICS = [
    "I moved house to Porto last week, the new flat is near the river.",
    "My dog Rex loves the beach at Matosinhos.",
    "I play the cello in a small orchestra on Thursdays.",
    "I'm vegetarian, so no fish for me either.",
    "Work is busy: we ship the new billing system in June.",
    "My sister Marta visits from Lisbon next month.",
    "I started learning Japanese with an app.",
]


def message(i: int, role: str, text: str, day0: int = 0) -> dict[str, Any]:
    hour = (day0 * 24 + i * 3) % (24 * 90)
    day, hour = divmod(hour, 24)
    month, day = divmod(day, 30)
    return {
        "role": role,
        "content": text,
        "timestamp": f"2023-{4 + month:02d}-{1 + day:02d}T{hour:02d}:00:00+00:00",
    }


def transcript(n: int, day0: int = 0) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        if i % 2 == 0:
            out.append(message(i, "user", f"{TOPICS[(i // 2) % len(TOPICS)]} ({i})", day0))
        else:
            out.append(message(i, "assistant", f"Noted, thanks for telling me ({i}).", day0))
    return out


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@dataclass
class Env:
    cwd: Path
    vars: dict[str, str]
    no_blocks: Path
    api_base: str
    #: The README's PostgreSQL URLs and its default SQLite path, as they are here.
    places: dict[str, str]


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory, onnx_models: Path, llm_server: Any, pg_server: Any
) -> Env:
    root = tmp_path_factory.mktemp("readme")
    cwd, home, data, bin_ = root / "work", root / "user", root / "memcli-home", root / "bin"
    for folder in (cwd, home, data, bin_):
        folder.mkdir()
    (home / "backups").mkdir()  # `memcli backup ~/backups/memcli.db` needs the folder
    (data / "models").symlink_to(onnx_models, target_is_directory=True)
    shim = bin_ / "memcli"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m memcli "$@"\n')
    shim.chmod(0o755)
    no_blocks = root / "no-blocks.toml"
    no_blocks.write_text("blocks = []\n")
    # The files the examples name.
    write_jsonl(cwd / "chat.jsonl", transcript(419))  # "0 new, 419 already stored"
    write_jsonl(cwd / "more.jsonl", transcript(40, day0=60))
    write_jsonl(
        cwd / "big.jsonl",
        [{"messages": transcript(10, day0=10 * k)} for k in range(6)],
    )
    # "Bring your conversations": the samples of tests/data/exports under the names it uses.
    exports = ROOT / "tests" / "data" / "exports"
    shutil.copy(exports / "chatgpt-conversations.json", cwd / "conversations.json")
    for zipped, sample in (("chatgpt", "chatgpt"), ("claude", "claude")):
        with zipfile.ZipFile(cwd / f"{zipped}-export.zip", "w") as archive:
            archive.write(exports / f"{sample}-conversations.json", "conversations.json")
            archive.writestr("user.json", "{}")
    shutil.copy(exports / "llm-0.36-logs.db", cwd / "logs.db")
    shutil.copy(exports / "llm-0.27-logs.json", cwd / "llm-logs.json")
    shutil.copy(exports / "finetune.jsonl", cwd / "train.jsonl")
    for sample, named in (
        ("sharegpt.jsonl", "dataset.jsonl"),
        ("openwebui-chats.json", "chat-export.json"),
        ("sillytavern.jsonl", "Seraphina - 2024-06-01@12h00m00s.jsonl"),
        ("lmstudio.conversation.json", "1717243200123.conversation.json"),
        ("anthropic-messages.json", "request.json"),
    ):
        shutil.copy(exports / sample, cwd / named)
    write_jsonl(
        cwd / "questions.jsonl",
        [{"query": "where does Ana live"}, {"query": "cello", "k": 2}, {"query": "dog"}],
    )
    keep = {"PATH", "PYTHONPATH", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV"}
    variables = {k: v for k, v in os.environ.items() if k in keep}
    variables.update(
        PATH=f"{bin_}{os.pathsep}{os.environ.get('PATH', '')}",
        HOME=str(home),
        SHELL="/bin/bash",
        MEMCLI_HOME=str(data),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        NO_COLOR="1",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    places = {url: new_database(pg_server) for url in PG_DATABASES}
    places[SQLITE_DEFAULT] = str(data / "memcli.db")
    return Env(cwd, variables, no_blocks, llm_server.api_base, places)


def substitute(command: str, env: Env) -> str:
    for old, new in SUBSTITUTIONS.items():
        command = command.replace(old, new)
    for old, new in env.places.items():
        command = command.replace(old, new)
    return command.replace(LOOPBACK, env.api_base)


def run(env: Env, command: str, extra: dict[str, str] | None = None, stdin: str | None = None):
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=env.cwd,
        env={**env.vars, **(extra or {})},
        input=(stdin or "").encode(),
        capture_output=True,
        timeout=300,
    )


def json_lines(text: str, where: str) -> list[dict[str, Any]]:
    """stdout as JSON values: one per line, or jq's pretty-printed stream."""
    decoder = json.JSONDecoder()
    records, i = [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            pytest.fail(f"{where}: stdout is not JSON Lines: {text[i : i + 200]!r}")
        records.append(value)
    return records


@pytest.mark.parametrize("example", SH_EXAMPLES, ids=str)
def test_sh_example(example: Example, env: Env, llm: Any) -> None:
    command = example.command
    if command in SKIPPED:
        pytest.skip(SKIPPED[command])
    command = substitute(command, env)
    extra: dict[str, str] = {}
    if not example.section.startswith(LONG_TERM_SECTIONS):
        extra["MEMCLI_CONFIG"] = str(env.no_blocks)
    if command.startswith(NEEDS_MODEL):
        extra.update(MEMCLI_MODEL="openai/test", MEMCLI_API_BASE=env.api_base)
    if command.startswith(CONFIG_EDITS):
        extra["MEMCLI_CONFIG"] = str(env.no_blocks.with_name("edited-config.toml"))
    interactive_chat = command.startswith("memcli chat")
    proc = run(env, command, extra, STDIN if interactive_chat else None)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    where = f"{example.source} example {example.command!r}"
    assert proc.returncode == 0, f"{where} exited {proc.returncode}\n{err}\n{out[:2000]}"
    assert "Traceback" not in err, f"{where}\n{err}"

    if command.startswith(TEXT_OUTPUT):
        assert out.strip() or err.strip()
    elif "memcli chat" in command and "--json" not in command:
        assert out.endswith("\n\n"), f"{where}: each reply then an empty line: {out!r}"
    elif ">" in command and "--format markdown" in command:  # a transcript to read
        target = command.split(">")[-1].split()[0]
        assert (env.cwd / target).read_text().startswith("# Session "), where
    elif ">" in command:  # output redirected to a file
        target = command.split(">")[-1].split()[0]
        assert json_lines((env.cwd / target).read_text(), where)
    else:
        records = json_lines(out, where)
        # A record type the comment shows ({"type": "hit", ...}) must be in the output.
        for kind in re.findall(r'\{"type": "(\w+)"', example.comment):
            assert any(r.get("type") == kind for r in records), f"{where}: no {kind!r} record"
        selected = re.search(r"select\(\.type == \"(\w+)\"\)", command)
        if selected:
            assert records and all(r["type"] == selected.group(1) for r in records), where

    # A message the comment quotes (`# again: "0 new, 419 already stored"`) is what it says.
    quoted = re.search(r'(?:^|: )"([^"{}]+)"$', example.comment)
    if quoted:
        assert quoted.group(1) in err + out, f"{where}: {quoted.group(1)!r} not in {err!r}"
    png = re.search(r"--png (\S+)", command)
    if png:  # the chart file, in the format its extension names
        assert (env.cwd / png.group(1)).read_bytes().startswith(b"\x89PNG"), where
    if "| memcli import - --session copy" in command:  # "copy a session, budget included"
        sessions = run(env, "memcli sessions --json", extra).stdout.decode()
        budgets = {
            r["session"]: (r["token_limit"], r["threshold"], r["flush_size"])
            for r in json_lines(sessions, where)
        }
        assert budgets["copy"] == budgets["demo"], (where, budgets)
    if "--install-completion" in command:
        rc = Path(env.vars["HOME"]) / ".bashrc"
        assert rc.is_file() and "memcli" in rc.read_text(), where
    if command.startswith("memcli chat") and "--model" in command:
        assert llm.requests, f"{where}: the model was not called"


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(text: str) -> str:
    """Markdown without its fenced code blocks."""
    return re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)


def headings(text: str) -> set[str]:
    return {anchor(h) for h in re.findall(r"^#+ (.*)$", prose(text), re.M)}


MARKDOWN_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", MARKDOWN_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_lead_somewhere(page: Path) -> None:
    """Every relative link of the README and of docs/ names a file that exists and, with a
    #fragment, a heading that file has (a bare #fragment: a heading of the page itself)."""
    text = page.read_text()
    links = re.findall(r"\]\(([^)\s]*)\)", prose(text))
    if page.name == "README.md":
        assert any(link.startswith("docs/") for link in links)
    for link in links:
        if re.match(r"^[a-z]+:", link):  # https:, mailto:
            continue
        path, _, fragment = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}: ({link})"
        assert target.exists(), where
        if fragment:
            assert fragment in headings(target.read_text()), where


@pytest.mark.parametrize("page", MARKDOWN_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_heading_is_repeated(page: Path) -> None:
    """A page names each section once (a repeated heading is a slip of an edit, and its
    anchor would lead to the first of them)."""
    found = re.findall(r"^(#+ .*)$", prose(page.read_text()), re.M)
    assert sorted({h for h in found if found.count(h) > 1}) == []


# --- Python and TOML ----------------------------------------------------------------------


def python_blocks() -> list[tuple[str, str]]:
    pages = [(ROOT / page).read_text() for page in PYTHON_PAGES]
    return code_blocks("python") + [b for text in pages for b in code_blocks("python", text)]


@pytest.fixture(scope="module")
def py_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("readme-python")


@pytest.mark.parametrize(
    "block", [b for _, b in python_blocks()], ids=lambda b: b.splitlines()[0][:40]
)
def test_python_example(block: str, env: Env, py_dir: Path, llm: Any) -> None:
    """Each ```python block runs as a script, in order, in one folder (the blocks build on each
    other's memcli.db); the examples' endpoint is the loopback server."""
    script = py_dir / "example.py"
    script.write_text(substitute(block, env))
    for key, replies in PYTHON_REPLIES.items():
        if key in block:
            llm.script(*replies)
    variables = {**env.vars, "PYTHONPATH": os.pathsep.join([str(ROOT / "examples"), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=py_dir,
        env=variables,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"Python example failed:\n{block}\n{proc.stderr.decode()}"


def test_toml_example_is_a_config_memcli_reads(env: Env, tmp_path: Path) -> None:
    """The ```toml block (a custom block from examples/) as a config file: `blocks list` shows it."""
    python_doc = (ROOT / "docs" / "python.md").read_text()
    (toml,) = [b for _, b in code_blocks("toml") + code_blocks("toml", python_doc)]
    config = tmp_path / "config.toml"
    config.write_text(toml)
    variables = {**env.vars, "PYTHONPATH": os.pathsep.join([str(ROOT / "examples"), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-m", "memcli", "--config", str(config), "blocks", "list", "--json"],
        cwd=env.cwd,
        env=variables,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert "mention" in proc.stdout.decode().lower(), proc.stdout.decode()
