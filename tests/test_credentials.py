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
