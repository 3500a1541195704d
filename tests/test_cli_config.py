"""`memcli config set|get|unset|list`, and one model setting for every command that calls one."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pytest
from helpers import memcli

EXAMPLE = Path(__file__).resolve().parent.parent / "config.example.toml"


def _settings_of(path: Path) -> dict[str, object]:
    """Every setting of a TOML file, by its dotted name (the [[blocks]] aside)."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    out: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        elif key != "blocks":
            out[key] = value
    return out


def _as_argument(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def test_config_round_trips_every_setting_of_the_example(tmp_path: Path) -> None:
    """Each setting of config.example.toml written with `config set` into a new file reads back
    the same, through the file and through `config get`; `config list` shows them all."""
    example = _settings_of(EXAMPLE)
    from memcli.config import FIELDS

    # (every Field of memcli/config.py; test_config checks the example mirrors them)
    assert len(example) == len(FIELDS)
    config = tmp_path / "deep" / "config.toml"  # its folder is made
    for key, value in example.items():
        run = memcli("--config", str(config), "config", "set", key, _as_argument(value))
        assert run.code == 0, (key, run.stderr)
        assert run.stdout == "" and key in run.stderr
    assert _settings_of(config) == example
    for key, value in example.items():
        run = memcli("--config", str(config), "config", "get", key)
        assert run.code == 0, run.stderr
        if isinstance(value, float | int) and not isinstance(value, bool):
            assert float(run.stdout) == value, (key, run.stdout)  # (timeout = 60: 60.0)
        else:
            assert run.stdout == _as_argument(value) + "\n", (key, run.stdout)
    listed = memcli("--config", str(config), "config", "list", "--json")
    assert listed.code == 0, listed.stderr
    records = {r["key"]: r for r in listed.records()}
    assert set(records) == set(example)
    for key, value in example.items():
        assert records[key]["value"] == value and records[key]["source"] == "file", key


def test_config_set_keeps_the_files_comments_and_other_settings(tmp_path: Path) -> None:
    """Editing the example itself: only the one value changes; every comment and every
    [[blocks]] table stays; `unset` removes the line, and the default applies again."""
    config = tmp_path / "config.toml"
    shutil.copy(EXAMPLE, config)
    before = config.read_text(encoding="utf-8")
    run = memcli("--config", str(config), "config", "set", "model", "gpt-4o-mini")
    assert run.code == 0, run.stderr
    after = config.read_text(encoding="utf-8")
    assert after == before.replace('model = "openai/llama3.2"', 'model = "gpt-4o-mini"', 1)
    assert tomllib.loads(after)["blocks"] == tomllib.loads(before)["blocks"]

    assert memcli("--config", str(config), "config", "unset", "llm.timeout").code == 0
    assert "timeout" not in tomllib.loads(config.read_text())["llm"]
    assert "# Seconds to wait for the LLM" in config.read_text()
    got = memcli("--config", str(config), "config", "get", "timeout")
    assert got.stdout == "60.0\n" and "default" in got.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("set", "memory.token_limit", "0"), "memory.token_limit: token_limit must be at least 1"),
        (("set", "ratio", "2"), "memory.chat_history_token_ratio"),
        (("set", "llm.memory_tools", "maybe"), "llm.memory_tools: memory_tools must be bool"),
        (("set", "search.rrf_k", "ten"), "search.rrf_k: rrf_k must be int"),
        (("set", "model", "  "), "llm.model: the value is empty"),
        (("set", "modle", "x"), "no setting 'modle'. Did you mean model?"),
        (("get", "blocks"), "no setting 'blocks'"),
    ],
)
def test_config_refuses_a_bad_key_or_value_naming_the_key(
    tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('# mine\nuser = "ana"\n')
    run = memcli("--config", str(config), "config", *args)
    assert run.code == 2 and said in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert config.read_text() == '# mine\nuser = "ana"\n'  # nothing written


def test_config_set_writes_the_user_config_dir_file_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no --config and no MEMCLI_CONFIG, the user config dir's config.toml is made, and
    every command reads it; the environment still wins (and `set` says so)."""
    run = memcli("config", "set", "user", "ana")
    assert run.code == 0, run.stderr
    made = tmp_path / "xdg-config" / "memcli" / "config.toml"
    assert tomllib.loads(made.read_text()) == {"user": "ana"}
    assert memcli("config", "get", "user").stdout == "ana\n"
    env = memcli("config", "set", "user", "bo", env={"MEMCLI_USER": "cy"})
    assert "MEMCLI_USER is set in the environment and wins" in env.stderr
    got = memcli("config", "get", "user", env={"MEMCLI_USER": "cy"})
    assert got.stdout == "cy\n" and "MEMCLI_USER" in got.stderr


def test_a_model_set_once_serves_facts_extract(llm, tmp_path: Path) -> None:
    """`memcli config set model ...` and `api_base` are all a command that calls a model needs."""
    config = tmp_path / "config.toml"
    config.write_text('[[blocks]]\nkind = "facts"\n')
    line = json.dumps({"role": "user", "content": "My cello lessons are on Mondays"}) + "\n"
    assert memcli("--config", str(config), "import", "-", "--session", "s", input=line).code == 0
    # No model: the dry run counts anyway (with the default tokenizer, and says so).
    dry = memcli("--config", str(config), "facts", "extract", "--dry-run", "--json")
    assert dry.code == 0, dry.stderr
    assert dry.records() == [{"type": "plan", "requests": 1, "tokens": dry.records()[0]["tokens"]}]
    assert "cl100k_base, the default tokenizer" in dry.stderr
    # Without a model the real run names everything a local server needs.
    run = memcli("--config", str(config), "facts", "extract")
    assert run.code == 2 and "no model is configured for facts" in run.stderr
    for needed in ("memcli config set model", "MEMCLI_MODEL", "MEMCLI_API_BASE", "api_base"):
        assert needed in run.stderr, needed
    assert llm.requests == []

    for key, value in (("model", "openai/test"), ("api_base", llm.api_base)):
        assert memcli("--config", str(config), "config", "set", key, value).code == 0
    llm.script({"content": "<facts><fact>Ana has cello lessons on Mondays</fact></facts>"})
    run = memcli("--config", str(config), "facts", "extract", "--json")
    assert run.code == 0, run.stderr
    assert run.records()[-1] == {"type": "summary", "done": 1, "pending": 0}
    assert len(llm.requests) == 1 and llm.requests[0]["model"] == "test"


def test_model_flags_win_over_the_config_file(llm, tmp_path: Path) -> None:
    """--model and --api-base on `facts extract` as on `chat`: flag > env > file."""
    config = tmp_path / "config.toml"
    config.write_text(
        '[llm]\nmodel = "openai/nowhere"\napi_base = "http://127.0.0.1:9/v1"\n'
        '\n[[blocks]]\nkind = "facts"\n'
    )
    line = json.dumps({"role": "user", "content": "I keep bees"}) + "\n"
    assert memcli("--config", str(config), "import", "-", "--no-extract", input=line).code == 0
    llm.script({"content": "<facts><fact>Keeps bees</fact></facts>"})
    flags = ("--model", "openai/flagged", "--api-base", llm.api_base)
    run = memcli("--config", str(config), "facts", "extract", *flags, "--json")
    assert run.code == 0, run.stderr
    assert [r["model"] for r in llm.requests] == ["flagged"]


@pytest.mark.parametrize(
    "command",
    [
        ("chat",),
        ("import",),
        ("facts", "extract"),
        ("blocks", "backfill"),
        ("summary",),
        ("mcp",),
    ],
)
def test_every_command_that_calls_a_model_takes_model_and_api_base(
    command: tuple[str, ...],
) -> None:
    run = memcli(*command, "--help", env={"COLUMNS": "200"})
    assert run.code == 0, run.stderr
    assert "--model NAME" in run.stdout and "--api-base URL" in run.stdout, run.stdout
