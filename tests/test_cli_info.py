"""`memcli info`, `--version`, `-h` and shell completion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import memcli, no_blocks  # noqa: F401 (a fixture)

from memcli import __version__
from memcli.search.onnx import onnx_path


def test_version() -> None:
    run = memcli("--version")
    assert run.code == 0 and run.stdout == f"memcli {__version__}\n"


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["sessions"],
        ["inspect"],
        ["facts"],
        ["facts", "rm"],
        ["facts", "edit"],
        ["export"],
        ["search"],
        ["simulate", "flush"],
        ["info"],
        ["dump", "context"],
    ],
    ids=lambda c: " ".join(c) or "memcli",
)
def test_dash_h_is_help(command: list[str]) -> None:
    short, long = memcli(*command, "-h"), memcli(*command, "--help")
    assert short.code == long.code == 0
    assert short.stdout == long.stdout and "Usage: memcli" in short.stdout


def test_help_names_values_and_choices() -> None:
    top = memcli("--help").stdout
    assert "--db PATH" in top and "--config FILE" in top and "--version" in top
    assert "--install-completion" in top and "--show-completion" in top
    search = memcli("search", "--help").stdout
    assert "-k, --top N" in search and "--mode [hybrid|lexical|vector]" in search
    assert "--queries FILE" in search and "--user NAME" in search
    simulate = memcli("simulate", "flush", "--help").stdout
    assert "--png FILE" in simulate and "--put [call|message|batch]" in simulate
    assert ".svg" in simulate
    for command in (["facts", "rm"], ["facts", "edit"]):
        text = memcli(*command, "--help").stdout
        assert "--user NAME" in text and "--json" in text
    assert "<str>" not in top + search + simulate


@pytest.mark.parametrize(
    ("shell", "marker"),
    [
        ("bash", "COMP_WORDS"),
        ("zsh", "#compdef memcli"),
        ("fish", "complete --command memcli"),
        ("powershell", "Register-ArgumentCompleter"),
        ("pwsh", "Register-ArgumentCompleter"),
    ],
)
def test_show_completion_writes_that_shells_script(shell: str, marker: str) -> None:
    run = memcli("--show-completion", shell)
    assert run.code == 0, run.stderr
    assert "_MEMCLI_COMPLETE" in run.stdout and marker in run.stdout
    others = {"bash": "COMP_WORDS", "zsh": "#compdef", "fish": "complete --command"}
    assert not [m for s, m in others.items() if s != shell and m in run.stdout]


def test_show_completion_of_an_unknown_shell_is_a_usage_error() -> None:
    run = memcli("--show-completion", "tcsh")
    assert run.code == 2 and "tcsh is not one of bash, zsh, fish" in run.stderr
    assert run.stdout == ""


def test_zsh_completion_completes_commands() -> None:
    run = memcli(env={"_MEMCLI_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "memcli fa"})
    assert run.code == 0, run.stderr
    assert '"facts"' in run.stdout


def test_completion_completes_commands() -> None:
    env = {"_MEMCLI_COMPLETE": "complete_bash", "COMP_WORDS": "memcli fa", "COMP_CWORD": "1"}
    run = memcli(env=env)
    assert run.code == 0, run.stderr
    assert "facts" in run.stdout.split()


def test_info_reports_where_each_setting_came_from(tmp_path: Path) -> None:
    config = tmp_path / "memcli.toml"
    config.write_text('user = "ana"\n[memory]\ntoken_limit = 5000\n')
    db = tmp_path / "chats.db"
    run = memcli(
        "--db",
        str(db),
        "--config",
        str(config),
        "info",
        env={"MEMCLI_RATIO": "0.5"},
    )
    assert run.code == 0, run.stderr
    records = run.records()
    head = records[0]
    assert head["type"] == "info" and head["version"] == __version__
    assert head["db"] == str(db) and head["db_bytes"] is None  # not created by `info`
    assert not db.exists()
    assert head["config"] == str(config) and head["config_source"] == "flag"
    assert head["home_source"] == "env" and head["model"] is None
    # Read from the files (the test session may have exported it already): nothing is exported.
    exported = onnx_path(Path(head["embedding_model"])).is_file()
    assert head["embedding_model_exported"] is exported
    settings = {r["name"]: (r["value"], r["source"]) for r in records if r["type"] == "setting"}
    assert settings["db"] == (str(db), "flag")
    assert settings["user"] == ("ana", "file")
    assert settings["token_limit"] == (5000, "file")
    assert settings["ratio"] == (0.5, "env")
    assert settings["encoding"] == ("cl100k_base", "default")
    blocks = [r for r in records if r["type"] == "block"]
    assert head["blocks_source"] == "default" and [b["kind"] for b in blocks] == [
        "VectorBlock",
        "FactBlock",
    ]


@pytest.mark.usefixtures("no_blocks")
def test_info_sizes_the_database(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"role": "user", "content": "hi"}) + "\n")
    assert memcli("import", str(path), "--session", "x").code == 0
    records = memcli("info", "--json").records()
    assert records[0]["db_bytes"] > 0 and records[0]["config_source"] == "env"
    assert records[0]["blocks_source"] == "file"
    assert [r for r in records if r["type"] == "block"] == []


@pytest.mark.usefixtures("no_blocks")
def test_info_never_shows_an_endpoints_credentials() -> None:
    """An LLM endpoint with a password and a key in it: `info` shows it masked, in JSON and in
    the table (a database URL's password is masked the same way)."""
    url = "http://ana:SECRET-KEY@llm.example:8080/v1?api_key=SECRET-TOO&x=1"
    for args in (["info", "--json"], ["info"]):
        run = memcli(*args, env={"MEMCLI_API_BASE": url, "COLUMNS": "200"})
        assert run.code == 0, run.stderr
        assert "SECRET" not in run.stdout + run.stderr
        assert "http://ana:***@llm.example:8080/v1?api_key=***&x=1" in run.stdout


@pytest.mark.usefixtures("no_blocks")
@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://sk-SECRET@llm.example/v1", "https://***@llm.example/v1"),
        ("http://ana:SE/CRET@llm.example/v1", "http://ana:***@llm.example/v1"),
        ("http://ana:SE)CRET@llm.example/v1", "http://ana:***@llm.example/v1"),
        ("http://ana:SE@CRET@llm.example/v1", "http://ana:***@llm.example/v1"),
        ("http://ana:SE CRET@llm.example/v1", "http://ana:***@llm.example/v1"),
        ("http://llm.example/v1?auth=SECRET&x=1", "http://llm.example/v1?auth=***&x=1"),
        ("http://llm.example/v1?access_token=SECRET", "http://llm.example/v1?access_token=***"),
    ],
)
def test_info_masks_every_part_of_a_url(url: str, shown: str) -> None:
    for args in (["info", "--json"], ["info"]):
        run = memcli(*args, env={"MEMCLI_API_BASE": url, "COLUMNS": "200"})
        assert run.code == 0, run.stderr
        assert "CRET" not in run.stdout + run.stderr
        assert shown in run.stdout, run.stdout


@pytest.mark.parametrize("password", ["QX/ZZY", "QX)ZZY", "QX@ZZY", "QX?ZZY"])
def test_info_masks_a_database_password_of_any_characters(tmp_path: Path, password: str) -> None:
    url = f"postgresql://me:{password}@/nodb?host={tmp_path}"  # no server on that socket
    run = memcli("--db", url, "info", "--json")
    assert run.code in (1, 2)  # (libpq reads no password holding "/": a usage error)
    assert "QX" not in run.stdout + run.stderr and "ZZY" not in run.stdout + run.stderr
    assert f"postgresql://me:***@/nodb?host={tmp_path}" in run.stdout + run.stderr


def test_info_names_where_vectors_are_searched(vdb: str, request: pytest.FixtureRequest) -> None:
    records = memcli("--db", vdb, "info", "--json").records()
    backend = records[0]["vector_backend"]
    kind = request.node.callspec.params["vdb"]
    if kind != "sqlite":
        if kind == "pgvector":
            assert backend == "pgvector (in the database)"
        else:  # the FAISS files of a PostgreSQL database are under $MEMCLI_HOME/indexes
            home = Path(records[0]["home"])
            assert backend.startswith(f"FAISS index files in {home / 'indexes'}/")
    else:
        name = Path(vdb).name
        assert (
            backend
            == f"FAISS index files beside the database ({name}.retrieval.faiss, .npz, .json)"
        )
        assert not Path(vdb).exists()  # not opened


def test_info_on_a_database_it_cannot_open_says_why_and_exits_1(tmp_path: Path) -> None:
    """docs/postgresql.md's check after setting MEMCLI_DB: everything else is shown, then the reason."""
    url = f"postgresql://postgres:@/nodb?host={tmp_path}"  # no server on that socket
    run = memcli("--db", url, "info", "--json")
    assert run.code == 1
    records = run.records()
    assert records[0]["vector_backend"] == "unknown: the database cannot be opened"
    assert records[0]["db"] == url  # an empty password is no secret: shown as it is
    said = " ".join(run.stderr.split())
    assert "Error: cannot connect to the database" in said and "No such file" in said, said
    assert "?." not in said and ".." not in said
