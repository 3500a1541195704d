"""Start-up discipline: the light commands never import the heavy modules."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = (
    "torch",
    "sentence_transformers",
    "transformers",
    "litellm",
    "faiss",
    "sklearn",
    "scipy",
    "onnxruntime",
    "mcp",  # only `memcli mcp` serves MCP
    "psycopg",  # only a PostgreSQL store (a postgresql:// URL) needs it
)


def imported(args: list[str]) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *args], capture_output=True, text=True
    )
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "memcli", "--help"],
        ["-m", "memcli", "sessions"],
        ["-m", "memcli", "inspect", "nope"],
        ["-m", "memcli", "mcp", "--help"],
        [
            "-c",
            "from memcli import Memory, Message; Memory.from_defaults().put(Message('user', 'hi'))",
        ],
    ],
)
def test_no_heavy_imports(args: list[str]) -> None:
    names = imported(args)
    assert "memcli" in names
    assert not names & set(HEAVY), f"{args} imported {sorted(names & set(HEAVY))}"


def test_public_api_names_resolve() -> None:
    import memcli

    for name in memcli.__all__:
        assert getattr(memcli, name) is not None
    with pytest.raises(AttributeError):
        memcli.NoSuchThing  # noqa: B018


def test_all_lists_every_export() -> None:
    import memcli

    assert sorted(memcli.__all__) == sorted(memcli._EXPORTS)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["inspect", "x"], "inspect"),
        (["--db", "a.db", "sessions"], "sessions"),
        (["--config=c.toml", "simulate", "flush", "-"], "simulate"),
        (["--help"], None),
        (["inspec"], None),
        ([], None),
    ],
)
def test_a_run_builds_only_the_command_it_needs(argv: list[str], expected: str | None) -> None:
    from memcli.cli.app import build_app, requested_command

    assert requested_command(argv) == expected
    if expected:
        app = build_app(expected)
        assert [c.name for c in app.registered_commands + app.registered_groups] == [expected]


@pytest.mark.parametrize("blocks", ["blocks = []\n", ""], ids=["no-blocks", "default-blocks"])
def test_a_plain_chat_reply_from_an_openai_compatible_server_never_imports_litellm(
    llm, tmp_path, blocks: str
) -> None:
    """A real process (not the tests' fork server, which has litellm loaded): `memcli chat
    --plain` with an `openai/...` model answers through the light client, and nothing on its way
    to the reply, nor at its exit, imports litellm (or the `openai` SDK)."""
    import os

    config = tmp_path / "chat.toml"
    config.write_text(blocks)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITELLM_")}
    env["MEMCLI_CONFIG"] = str(config)
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "memcli", "chat", "--plain"]
        + ["--model", "openai/test", "--api-base", llm.api_base],
        input="hi\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "OK\n\n"
    assert len(llm.requests) == 1 and llm.requests[0]["stream"] is True
    names = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "memcli" in names and "httpx" in names
    assert not names & {"litellm", "openai"}, sorted(names & {"litellm", "openai"})


#: What only the one-off export of the embedding model needs (in a child process of its own).
EXPORT_ONLY = {"torch", "transformers", "sentence_transformers"}


def test_a_plain_chat_with_the_default_blocks_runs_the_model_without_torch(
    llm, tmp_path, minilm
) -> None:
    """A real process: the chat's plain path embeds with the exported model (onnxruntime and
    tokenizers) and never imports torch, transformers or sentence-transformers."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("LITELLM_")}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "memcli", "--db", str(tmp_path / "c.db")]
        + ["chat", "--plain", "--model", "openai/test", "--api-base", llm.api_base],
        input="I keep bees on the roof\nwhat do I keep on the roof?\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    names = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert {"onnxruntime", "tokenizers"} <= names  # the model ran
    assert not names & EXPORT_ONLY, sorted(names & EXPORT_ONLY)


def test_the_mcp_server_searches_by_meaning_without_torch(tmp_path, minilm) -> None:
    """A real `memcli mcp` (stdio, default blocks): messages put and searched by meaning, with
    onnxruntime and never torch, transformers or sentence-transformers."""
    import json

    def call(ident: int, name: str, arguments: dict) -> dict:
        params = {"name": name, "arguments": arguments}
        return {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": params}

    chat = [
        {"role": "user", "content": "I keep bees on the roof."},
        {"role": "assistant", "content": "How lovely."},
    ]
    requests = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        call(2, "put_messages", {"messages": chat, "session": "roof"}),
        call(3, "search_memory", {"query": "insects kept at home", "mode": "vector"}),
        call(4, "get_context", {"session": "roof", "input": "and the honey?"}),
    ]
    # stderr to a file: -X importtime writes about 64 KB there before the search replies, the
    # size of a pipe's buffer, and a pipe read only at the end could block the server on it.
    errors = tmp_path / "stderr.txt"
    with errors.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", "memcli", "--db", str(tmp_path / "m.db")]
            + ["mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        assert proc.stdin is not None and proc.stdout is not None
        replies = []
        for request in requests:
            proc.stdin.write((json.dumps(request) + "\n").encode())
            proc.stdin.flush()
            if "id" in request:
                replies.append(json.loads(proc.stdout.readline()))
        proc.communicate(timeout=600)  # closes stdin: the server ends
    err = errors.read_bytes()
    assert proc.returncode == 0, err.decode()[-3000:]
    assert [r["id"] for r in replies] == [1, 2, 3, 4]
    assert not any(r["result"].get("isError") for r in replies[1:]), replies
    assert "bees" in json.dumps(replies[2]["result"])
    names = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in err.decode().splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert {"onnxruntime", "tokenizers", "mcp"} <= names
    assert not names & EXPORT_ONLY, sorted(names & EXPORT_ONLY)
