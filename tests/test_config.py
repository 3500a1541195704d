"""Settings: flag > MEMCLI_* environment > TOML file > defaults; the example documents every field."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest

from memcli.config import FIELDS, Field, load_settings
from memcli.errors import ConfigError, UsageError

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


@pytest.mark.parametrize(
    ("text", "section"), [("token_limit = 4000\n", "memory"), ("model = 'gpt-4o-mini'\n", "llm")]
)
def test_a_setting_outside_its_section_is_sent_there(tmp_path: Path, text: str, section: str):
    # The README's table says `[memory] token_limit`; written at the top, it is named its section.
    with pytest.raises(ConfigError, match="unknown setting") as info:
        load_settings({"MEMCLI_HOME": str(tmp_path)}, None, write(tmp_path, text))
    assert f"It goes in [{section}]: write it under a [{section}] line" in str(info.value)


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


def test_non_utf8_config_file_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_bytes(b"user = 'a'\n[memory]\ntoken_limit = 10 # caf\xe9\n")
    with pytest.raises(ConfigError, match="invalid UTF-8") as info:
        load_settings({"MEMCLI_HOME": str(tmp_path)}, None, path)
    assert f"{path}:3:" in str(info.value)


NUMBERS = [spec for spec in FIELDS if spec.low is not None]


def _toml(value: float) -> str:
    return {math.inf: "inf", -math.inf: "-inf"}.get(value, repr(value)) if value == value else "nan"


def _outside(spec: Field) -> list[float]:
    """Values just outside a setting's range, and absurd ones."""
    low = spec.low if spec.above else spec.low - 1
    values = [low, spec.high + 1, 10**23 if spec.kind is int else 1e308]
    if spec.kind is float:
        values += [math.nan, math.inf, -math.inf]
    return [spec.kind(v) if spec.kind is int else float(v) for v in values]


def test_every_number_has_a_range() -> None:
    assert {s.name for s in NUMBERS} == {s.name for s in FIELDS if s.kind in (int, float)}


@pytest.mark.parametrize("spec", NUMBERS, ids=[s.name for s in NUMBERS])
def test_numbers_out_of_range_in_the_file_are_config_errors(tmp_path: Path, spec: Field) -> None:
    for value in _outside(spec):
        line = f"{spec.key} = {_toml(value)}\n"
        text = line if spec.section is None else f"[{spec.section}]\n{line}"
        path = write(tmp_path, text)
        with pytest.raises(ConfigError, match=f"{spec.key} must be") as info:
            load_settings({"MEMCLI_HOME": str(tmp_path)}, None, path)
        assert str(path) in str(info.value)
    ok = write(tmp_path, f"[{spec.section}]\n{spec.key} = {_toml(spec.kind(spec.high))}\n")
    assert getattr(load_settings({"MEMCLI_HOME": str(tmp_path)}, None, ok), spec.name) == spec.high


@pytest.mark.parametrize(
    "spec", [s for s in NUMBERS if s.env], ids=[s.name for s in NUMBERS if s.env]
)
def test_numbers_out_of_range_in_the_environment_name_the_variable(
    tmp_path: Path, spec: Field
) -> None:
    assert spec.env is not None
    for value in (*_outside(spec), "99999999999999999999999"):
        env = {"MEMCLI_HOME": str(tmp_path), spec.env: str(value)}
        with pytest.raises(ConfigError, match=spec.env):
            load_settings(env)


def test_numbers_out_of_range_as_flags_name_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--token-limit: token_limit must be"):
        load_settings({"MEMCLI_HOME": str(tmp_path)}, {"token_limit": 10**23})


def test_a_database_path_that_is_no_file_is_a_usage_error(tmp_path: Path) -> None:
    for db, what in (("/dev/null", "is not a regular file"), (str(tmp_path), "is a directory")):
        settings = load_settings({"MEMCLI_HOME": str(tmp_path)}, {"db": db})
        with pytest.raises(UsageError, match=what):
            _ = settings.db_path
    fine = load_settings({"MEMCLI_HOME": str(tmp_path)}, {"db": str(tmp_path / "new.db")})
    assert fine.db_path == tmp_path / "new.db"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[memory]\ntoken_limit = " + "9" * 5000 + "\n", "more than 4300 digits"),
        ("x = " + "[" * 100_000 + "\n", "nested too deeply"),
        ("[[blocks]]\nkind = 'vector'\nsimilarity_top_k = 99999999999999999999999\n", "at most"),
        ("[[blocks]]\nkind = 'facts'\ntimeout = nan\n", "timeout must be at most"),
        ("[[blocks]]\nkind = 'facts'\ntemperature = inf\n", "temperature must be at most"),
    ],
)
def test_absurd_values_in_the_file_are_config_errors(
    tmp_path: Path, text: str, message: str
) -> None:
    from memcli.blocks.registry import build_blocks

    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as info:
        settings = load_settings({"MEMCLI_HOME": str(tmp_path)}, None, path)
        build_blocks(settings.blocks, None)  # type: ignore[arg-type]
    assert str(path) in str(info.value) or "[[blocks]]" in str(info.value)


def test_text_settings_that_are_not_utf8_name_where_they_came_from(tmp_path: Path) -> None:
    """`--user $'u\\xff'` or MEMCLI_USER with such bytes: Python hands a lone surrogate over."""
    home = {"MEMCLI_HOME": str(tmp_path)}
    with pytest.raises(ConfigError, match="environment variable MEMCLI_USER: user holds a lone"):
        load_settings({**home, "MEMCLI_USER": "u\udcff"})
    with pytest.raises(ConfigError, match="--user: user holds a lone surrogate"):
        load_settings(home, {"user": "u\udcff"})
    assert load_settings(home, {"db": str(tmp_path / "d\udcff.db")}).db.endswith("d\udcff.db")
