"""Names of users and sessions: one rule (trimmed; not blank, no control characters) for every
command, the environment, the config file, MCP and the library; suggestions a shell can take;
hints for an option given on the wrong side of the command."""

from __future__ import annotations

import json
import shlex

import pytest
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)

from memcli.errors import InputError
from memcli.messages import check_name

pytestmark = pytest.mark.usefixtures("no_blocks")


def _import(user: str, session: str) -> None:
    line = json.dumps({"role": "user", "content": "hello"}) + "\n"
    run = memcli("import", "-", "--user", user, "--session", session, input=line)
    assert run.code == 0, run.stderr


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("ana\nbo", "control character (U+000A)"),
        ("ana\tbo", "control character (U+0009)"),
        ("\x1b[31mana", "control character (U+001B)"),
        ("ana\u2028bo", "control character (U+2028)"),
    ],
)
def test_a_bad_name_is_refused_everywhere(value: str, said: str) -> None:
    with pytest.raises(InputError, match=r"user"):
        check_name(value, "user")
    for args in (
        ("sessions", "--user", value),
        ("import", "-", "--user", value),
        ("chat", "--plain", "--user", value),
        ("facts", "add", "tea", "--user", value),
        ("rm", "--user", value, "--yes"),
        ("mcp", "token", "add", "--user", value),
        ("inspect", value),
        ("chat", "--plain", "--session", value),
        ("search", "x", "--session", value),
    ):
        run = memcli(*args, input="")
        assert run.code == 2, (args, run.stderr)
        assert said in run.stderr and "Traceback" not in run.stderr, (args, run.stderr)
    env = memcli("sessions", env={"MEMCLI_USER": value})
    if value:  # (an empty variable is no variable)
        assert env.code == 2 and "MEMCLI_USER" in env.stderr, env.stderr
    assert memcli("sessions", "--json").stdout == ""  # nothing was stored


def test_names_are_trimmed_by_every_way_in(tmp_path) -> None:
    _import(" ana ", "  trip  ")
    [record] = memcli("sessions", "--json").records()
    assert record["user"] == "ana" and record["session"] == "trip"
    config = tmp_path / "c.toml"
    config.write_text('user = "ana  "\nblocks = []\n')
    assert memcli("--config", str(config), "config", "get", "user").stdout == "ana\n"
    run = memcli("--config", str(config), "config", "set", "user", "  bo ")
    assert run.code == 0 and 'user = "bo"' in config.read_text()


def test_the_library_and_the_tools_take_the_same_rule(tmp_path) -> None:
    from memcli import Memory
    from memcli.tools import AgentTools

    assert Memory.from_defaults(session_id=" s1 ", user_id=" ana ").user_id == "ana"
    with pytest.raises(InputError, match="user must not be empty"):
        Memory.from_defaults(user_id="  ")
    with pytest.raises(InputError, match="control character"):
        Memory.from_defaults(session_id="a\nb")
    from memcli.config import load_settings
    from memcli.store.sqlite import SQLiteStore

    with pytest.raises(InputError, match="control character"):
        AgentTools(SQLiteStore(":memory:"), load_settings({}), "a\nb")


def test_did_you_mean_prints_what_a_shell_takes() -> None:
    """A suggestion is copied into a shell as it is printed: quoted as a shell quotes, never
    Python's repr (whose backslashes are not in the name)."""
    _import("o'brien smith", "s1")
    run = memcli("sessions", "--user", "o'brien smit")
    assert run.code == 0
    guess = run.stderr.split("Did you mean ")[1].split("?")[0]
    assert guess == "--user " + shlex.quote("o'brien smith")
    assert shlex.split(guess) == ["--user", "o'brien smith"]
    _import("ana", "garden-plans")
    run = memcli("inspect", "garden-plams")  # (no start of an id: the close ids)
    assert run.code == 1, run.stderr
    assert "Did you mean garden-plans?" in run.stderr


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("--user", "you", "sessions"), "Run `memcli sessions --user you`"),
        (("--user=you", "sessions", "--json"), "Run `memcli sessions --user=you --json`"),
        (("--json", "--db", "x.db", "sessions"), "Run `memcli --db x.db sessions --json`"),
        (
            ("--user", "ana", "facts", "extract", "--dry-run"),
            "Run `memcli facts extract --user ana --dry-run`",
        ),
        (("--session", "s", "inspect", "s"), "no option --session: neither memcli nor"),
        (("sessions", "--db", "x.db"), "Run `memcli --db x.db sessions`"),
        (("sessions", "--config=c.toml"), "Run `memcli --config=c.toml sessions`"),
    ],
)
def test_an_option_on_the_wrong_side_of_the_command_gets_a_hint(
    argv: tuple[str, ...], said: str
) -> None:
    run = memcli(*argv)
    assert run.code == 2, run.stderr
    assert said in run.stderr, run.stderr
    assert "No such option" not in run.stderr
