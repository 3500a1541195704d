"""What a new user meets first: a refused command leaves nothing behind, a global option in the
wrong place is said so, a mistyped session gets "did you mean", and another user's session is
refused the same way by every command."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import memcli

LINES = '{"role": "user", "content": "I play the cello"}\n{"role": "assistant", "content": "Nice"}\n'


@pytest.mark.parametrize(
    "args",
    [
        ["import", "-", "--token-limit", "-5"],
        ["import", "-", "--ratio", "1.5"],
        ["import", "-", "--token-limit", "100", "--flush-size", "500"],
        ["import", "-", "--flush-size", "0"],
        ["chat", "--plain", "--token-limit", "0"],
        ["chat", "--plain", "--ratio", "0"],
    ],
)
def test_a_refused_budget_creates_no_database(isolated: Path, args: list[str]) -> None:
    run = memcli(*args, input=LINES)
    assert run.code == 2, run.stderr
    assert "Error:" in run.stderr
    assert not (isolated / "memcli.db").exists()
    assert list(isolated.glob("memcli.db*")) == []


def test_a_db_in_a_folder_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "x.db"
    run = memcli("--db", str(target), "import", "-", input=LINES)
    assert run.code == 2
    assert f"no folder '{target.parent}'" in " ".join(run.stderr.split())
    assert not (tmp_path / "no").exists()
    env_run = memcli("import", "-", input=LINES, env={"MEMCLI_DB": str(target)})
    assert env_run.code == 2 and "MEMCLI_DB" in env_run.stderr
    assert not (tmp_path / "no").exists()


def test_the_default_home_is_still_made(isolated: Path) -> None:
    home = isolated / "fresh" / "home"
    run = memcli("import", "-", input=LINES, env={"MEMCLI_HOME": str(home)})
    assert run.code == 0, run.stderr
    assert (home / "memcli.db").exists()


@pytest.mark.parametrize("option", ["--db", "--config"])
def test_a_global_option_after_the_command_says_where_it_goes(option: str) -> None:
    run = memcli("sessions", option, "x.db", "--json")
    assert run.code == 2
    said = " ".join(run.stderr.split())
    assert f"{option} goes before the command" in said
    assert f"`memcli {option} x.db sessions --json`" in said
    joined = memcli("sessions", f"{option}=x.db")
    assert joined.code == 2 and f"`memcli {option}=x.db sessions`" in joined.stderr


def test_a_mistyped_session_gets_did_you_mean() -> None:
    assert memcli("import", "-", "--session", "demo", input=LINES).code == 0
    run = memcli("inspect", "demoo")
    assert run.code == 1
    assert "no session 'demoo'" in run.stderr and "Did you mean demo?" in run.stderr
    far = memcli("inspect", "zzzzzz")
    assert far.code == 1 and "Did you mean" not in far.stderr


def test_did_you_mean_looks_only_at_the_users_own_sessions() -> None:
    assert memcli("import", "-", "--session", "ana-notes", "--user", "ana", input=LINES).code == 0
    run = memcli("export", "ana-note", "--user", "bo")
    assert run.code == 1 and "Did you mean" not in run.stderr
    run = memcli("export", "ana-notez", "--user", "ana")
    assert run.code == 1 and "Did you mean ana-notes?" in run.stderr


def test_another_users_session_is_refused_alike_by_every_command(llm: object) -> None:
    assert memcli("import", "-", "--session", "s1", "--user", "ana", input=LINES).code == 0
    runs = {
        "inspect": memcli("inspect", "s1", "--user", "bo"),
        "export": memcli("export", "s1", "--user", "bo"),
        "search": memcli("search", "cello", "--session", "s1", "--user", "bo", "--json"),
        "chat": memcli("chat", "--plain", "--session", "s1", "--user", "bo", input="hi\n"),
    }
    for name, run in runs.items():
        said = " ".join(run.stderr.split())
        if name == "chat":  # a chat starts bo's own s1 (a name is its user's)
            assert run.code == 0 and "new session s1 (user bo)" in said, (name, said)
            continue
        assert run.code == 1, (name, run.stderr)
        assert "no session 's1' of user 'bo'" in said, (name, said)
        assert "--user ana" in said, (name, said)  # the CLI reads the whole database
    assert memcli("inspect", "s1", "--user", "ana").code == 0
    run = memcli("inspect", "s1")  # without --user: a name two users have is ambiguous
    assert run.code == 2 and "2 users have a session 's1': ana, bo" in run.stderr
