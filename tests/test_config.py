"""Settings: flag > MEMCLI_* environment > TOML file > defaults; the example documents every field."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from memcli.config import FIELDS, load_settings
from memcli.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_defaults(tmp_path: Path) -> None:
    s = load_settings({"MEMCLI_HOME": str(tmp_path)})
    assert s.token_limit == 30000 and s.ratio == 0.7 and s.flush_size is None
    assert s.user == "default" and s.db_path == tmp_path / "memcli.db"


def test_precedence(tmp_path: Path) -> None:
    path = write(
        tmp_path, "user = 'file'\n[memory]\ntoken_limit = 1000\nchat_history_token_ratio = 0.5\n"
    )
    env = {"MEMCLI_HOME": str(tmp_path), "MEMCLI_TOKEN_LIMIT": "2000", "MEMCLI_USER": "env"}
    s = load_settings(env, {"user": "flag"}, path)
    assert s.user == "flag"  # flag beats environment
    assert s.token_limit == 2000  # environment beats file
    assert s.ratio == 0.5  # file beats default
    assert {"user", "token_limit", "ratio"} <= s.explicit


def test_config_from_environment_variable(tmp_path: Path) -> None:
    path = write(tmp_path, "[llm]\nmodel = 'openai/x'\n")
    s = load_settings({"MEMCLI_HOME": str(tmp_path), "MEMCLI_CONFIG": str(path)})
    assert s.model == "openai/x" and s.config_path == path


def test_db_option_and_env(tmp_path: Path) -> None:
    env = {"MEMCLI_HOME": str(tmp_path), "MEMCLI_DB": str(tmp_path / "env.db")}
    assert load_settings(env).db_path == tmp_path / "env.db"
    assert load_settings(env, {"db": str(tmp_path / "flag.db")}).db_path == tmp_path / "flag.db"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[memory]\ntoken_limit = 'lots'\n", "token_limit must be int"),
        ("[memory]\ntoken_limt = 10\n", "unknown setting memory.token_limt"),
        ("colour = 'red'\n", "unknown setting 'colour'"),
        ("[memory\n", "invalid TOML"),
        ("blocks = 3\n", "blocks must be"),
    ],
)
def test_bad_config_names_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as info:
        load_settings({"MEMCLI_HOME": str(tmp_path)}, None, path)
    assert str(path) in str(info.value)


def test_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="MEMCLI_RATIO"):
        load_settings({"MEMCLI_HOME": str(tmp_path), "MEMCLI_RATIO": "high"})


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no config file"):
        load_settings({"MEMCLI_HOME": str(tmp_path)}, None, tmp_path / "none.toml")


def test_example_sets_every_field(tmp_path: Path) -> None:
    example = ROOT / "config.example.toml"
    data = tomllib.loads(example.read_text())
    for spec in FIELDS:
        table = data if spec.section is None else data.get(spec.section, {})
        assert spec.key in table, f"config.example.toml does not set {spec.section}.{spec.key}"
    # And it loads cleanly.
    load_settings({"MEMCLI_HOME": str(tmp_path)}, None, example)
