"""Shell completion as bash, zsh and fish ask for it: the values of every choice-valued option,
and the session ids and user names of the database the command would open."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import memcli

SHELLS = ("bash", "zsh", "fish")
LINES = '{"role": "user", "content": "hi"}\n{"role": "assistant", "content": "hello"}\n'


def complete(shell: str, line: str, env: dict[str, str] | None = None) -> list[str]:
    """What memcli offers a shell for the command line typed so far (`line`)."""
    words = line.split()
    if shell == "bash":
        cword = len(words) if line.endswith(" ") else len(words) - 1
        shell_env = {"COMP_WORDS": line, "COMP_CWORD": str(cword)}
    else:
        shell_env = {"_TYPER_COMPLETE_ARGS": line, "_TYPER_COMPLETE_FISH_ACTION": "get-args"}
    run = memcli(env={**(env or {}), **shell_env, "_MEMCLI_COMPLETE": f"complete_{shell}"})
    assert run.code == 0, run.stderr
    assert "Traceback" not in run.stderr
    if shell == "zsh":  # _arguments '*: :(("value" "value":"help" ...))'
        return re.findall(r'"([^":]+)"', run.stdout)
    return [line.split("\t")[0] for line in run.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("memcli search --mode ", ["hybrid", "lexical", "vector"]),
        ("memcli export s --format ", ["jsonl", "openai", "markdown"]),
        ("memcli import x --put b", ["batch"]),
        ("memcli simulate flush --put ", ["message", "batch", "call"]),
        ("memcli import x --format c", ["chatgpt", "claude"]),
    ],
)
def test_choice_valued_options_complete(shell: str, line: str, expected: list[str]) -> None:
    assert sorted(complete(shell, line)) == sorted(expected)


@pytest.mark.parametrize("shell", SHELLS)
def test_session_ids_and_users_complete_from_the_database(shell: str, tmp_path: Path) -> None:
    db = str(tmp_path / "x.db")
    for session, user in (("demo", "ana"), ("deep-work", "bo"), ("notes", "ana")):
        run = memcli("--db", db, "import", "-", "--session", session, "--user", user, input=LINES)
        assert run.code == 0, run.stderr
    assert sorted(complete(shell, f"memcli --db {db} inspect de")) == ["deep-work", "demo"]
    assert complete(shell, f"memcli --db {db} export n") == ["notes"]
    assert complete(shell, f"memcli --db {db} chat --user bo --session de") == ["deep-work"]
    assert complete(shell, f"memcli --db {db} sessions --user ") == ["ana", "bo"]
    assert sorted(complete(shell, "memcli inspect ", env={"MEMCLI_DB": db})) == [
        "deep-work",
        "demo",
        "notes",
    ]


def test_completion_opens_no_database_that_is_not_there(tmp_path: Path) -> None:
    db = tmp_path / "none.db"
    assert complete("bash", f"memcli --db {db} inspect ") == []
    assert not db.exists()
