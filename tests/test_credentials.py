"""Credentials in URLs are never shown nor stored: `memcli.credentials`, and a failed chat turn's
error (the other paths: test_cli_info.py, test_block_definitions.py)."""

from __future__ import annotations

import socket

import pytest
from helpers import memcli

from memcli.credentials import redact_text, redact_url, strip_credentials, without_credentials


@pytest.mark.parametrize(
    ("url", "shown", "stored"),
    [
        ("http://u:KEY@h:1/v1", "http://u:***@h:1/v1", "http://u@h:1/v1"),
        ("http://h/v1?api_key=KEY&a=1", "http://h/v1?api_key=***&a=1", "http://h/v1?a=1"),
        ("http://h/v1?Access-Token=KEY", "http://h/v1?Access-Token=***", "http://h/v1"),
        ("postgresql://me:pw@db/m?password=pw", "postgresql://me:***@db/m?password=***",
         "postgresql://me@db/m"),
        ("http://h/v1?max_tokens=5", "http://h/v1?max_tokens=5", "http://h/v1?max_tokens=5"),
        ("http://h/v1?email=a@b.org", "http://h/v1?email=a@b.org", "http://h/v1?email=a@b.org"),
        ("postgresql://me@db/m", "postgresql://me@db/m", "postgresql://me@db/m"),  # a role
        # a key as the user name
        ("https://sk-abc@h/v1", "https://***@h/v1", "https://h/v1"),
        ("http://sk-abc:@h/v1?x=a@b", "http://***:@h/v1?x=a@b", "http://h/v1?x=a@b"),
        # passwords holding what ends a URL's parts
        ("http://u:pa/ss@h:1/v1", "http://u:***@h:1/v1", "http://u@h:1/v1"),
        ("http://u:pa)ss@h/v1", "http://u:***@h/v1", "http://u@h/v1"),
        ("http://u:p@ss@h/v1", "http://u:***@h/v1", "http://u@h/v1"),
        ("http://u:p?s#s@h/v1?a=1", "http://u:***@h/v1?a=1", "http://u@h/v1?a=1"),
        ("postgresql://me:pa/ss@/m?host=/tmp", "postgresql://me:***@/m?host=/tmp",
         "postgresql://me@/m?host=/tmp"),
        # query (and fragment) parameters named like a secret
        ("http://h/v1?auth=K&x=1", "http://h/v1?auth=***&x=1", "http://h/v1?x=1"),
        ("http://h/v1?access_token=K", "http://h/v1?access_token=***", "http://h/v1"),
        ("http://h/v1?apiKey=K&client_secret=S", "http://h/v1?apiKey=***&client_secret=***",
         "http://h/v1"),
        ("http://h/o?X-Amz-Credential=C&X-Amz-Signature=S&v=1",
         "http://h/o?X-Amz-Credential=***&X-Amz-Signature=***&v=1", "http://h/o?v=1"),
        ("http://h/cb#access_token=K&state=1", "http://h/cb#access_token=***&state=1",
         "http://h/cb#state=1"),
        ("http://[::1]:8/v1?token=K", "http://[::1]:8/v1?token=***", "http://[::1]:8/v1"),
    ],
)  # fmt: skip
def test_urls_are_masked_for_showing_and_stripped_for_storing(
    url: str, shown: str, stored: str
) -> None:
    assert redact_url(url) == shown
    assert strip_credentials(url) == stored


def test_text_and_definitions_lose_every_secret() -> None:
    text = "Connection error to http://u:KEY@h:1/v1/chat (see 'http://h?token=KEY2')."
    assert redact_text(text) == (
        "Connection error to http://u:***@h:1/v1/chat (see 'http://h?token=***')."
    )
    text = "(at http://u:pa)ss@h/v1), 'https://sk-KEY@h/v1'; \"http://u:p'q@h\" http://h?auth=K."
    assert redact_text(text) == (
        "(at http://u:***@h/v1), 'https://***@h/v1'; \"http://u:***@h\" http://h?auth=***."
    )
    assert redact_text("see http://h/a (or me@x.org)") == "see http://h/a (or me@x.org)"
    table = {"api_base": "http://u:KEY@h/v1", "nested": [{"url": "x http://h?key=K y"}], "n": 3}
    assert without_credentials(table) == {
        "api_base": "http://u@h/v1",
        "nested": [{"url": "x http://h y"}],
        "n": 3,
    }


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("reachable", [False, True])
def test_a_failed_turn_never_shows_the_endpoints_credentials(llm, reachable: bool) -> None:
    """A turn that cannot reach the endpoint, and one the endpoint refuses (401): the error
    names the endpoint with its password and key masked."""
    port = llm.port if reachable else _closed_port()
    if reachable:
        llm.script({"status": 401})
    url = f"http://ana:SECRET-KEY@127.0.0.1:{port}/v1?api_key=SECRET-TOO"
    run = memcli(
        "chat", "--session", "err", "--model", "openai/test", "--api-base", url,
        input="are you there?\n/model\n", env={"MEMCLI_LLM_TIMEOUT": "2", "COLUMNS": "300"},
    )  # fmt: skip
    assert run.code == 1
    said = " ".join((run.stdout + run.stderr).split())
    assert "SECRET" not in said
    assert f"127.0.0.1:{port}/v1?api_key=***" in said  # /model names it, masked
    if not reachable:
        assert f"Cannot reach http://ana:***@127.0.0.1:{port}/v1" in said


#: Database URLs libpq cannot parse, each holding the secret "Se" + "CRET" in some form: the
#: driver's message quotes the part it cannot read, the password included.
UNPARSABLE_URLS = [
    "postgresql://u:pa ssSeCRET@127.0.0.1/db",
    "postgresql://u:Se%zzCRET@127.0.0.1/db",
    "postgresql://u@127.0.0.1/db?password=Se%zzCRET",
    "postgres://u:Se%41CRET%zz@127.0.0.1/db",
]


@pytest.mark.parametrize("url", UNPARSABLE_URLS)
@pytest.mark.parametrize("command", [["sessions"], ["info"], ["search", "x"]])
def test_a_database_url_the_driver_cannot_parse_never_shows_its_password(
    url: str, command: list[str]
) -> None:
    run = memcli("--db", url, *command)
    said = run.stdout + run.stderr
    assert run.code != 0 or command == ["info"], said
    assert "CRET" not in said and "SeA" not in said, said
    assert "***" in said


@pytest.mark.parametrize(
    "dsn",
    [
        "host=127.0.0.1 dbname=memcli password=DSNPW",
        "host=db user=ana password='DSN PW' port=5432",
        "dbname = memcli password = DSNPW",
    ],
)
def test_a_libpq_keyword_string_is_refused_with_the_url_form(tmp_path, dsn: str) -> None:
    """Taken as a SQLite file name, the string made a file named with its password; it is a
    usage error now (exit 2), naming the URL form, showing no password, creating nothing."""
    for where in (["--db", dsn], []):
        env = {} if where else {"MEMCLI_DB": dsn}
        run = memcli(*where, "import", "-", "--session", "s", input='{"role":"user","content":"hi"}\n',
                     env={**env, "MEMCLI_HOME": str(tmp_path)})  # fmt: skip
        assert run.code == 2, run.stderr
        assert "libpq keyword string" in run.stderr
        assert "postgresql://USER:PASSWORD@HOST:PORT/DBNAME" in run.stderr
        assert "DSNPW" not in run.stderr and "DSN PW" not in run.stderr
    assert not [p for p in tmp_path.rglob("*") if "DSN" in p.name or "dbname" in p.name]


def test_the_library_refuses_a_keyword_string_and_keeps_file_names_with_equals(tmp_path) -> None:
    from memcli.errors import UsageError
    from memcli.store import open_store

    with pytest.raises(UsageError, match="libpq keyword string") as err:
        open_store("host=db password=DSNPW")
    assert "DSNPW" not in str(err.value)
    store = open_store(str(tmp_path / "a=b.db"))  # (a path: no libpq keyword is its own word)
    store.close()
    assert (tmp_path / "a=b.db").exists()
