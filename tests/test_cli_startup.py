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
