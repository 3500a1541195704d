"""Settings: resolved once from flags > MEMCLI_* environment > TOML file > defaults.

The library never reads the environment: the CLI passes `os.environ` to `load_settings`.
"""

from __future__ import annotations

import math
import sys
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from memcli.errors import ConfigError, InputError, UsageError
from memcli.flush import MAX_TOKEN_LIMIT
from memcli.messages import check_text, validate_user
from memcli.store.base import is_postgres_url, redact_url, refuse_keyword_string

if TYPE_CHECKING:
    from collections.abc import Mapping


@dataclass(frozen=True)
class Field:
    """One setting: where it sits in the TOML file, its environment variable and its type; a
    number also has its range, `low` to `high` (`low` itself excluded when `above`), a string
    may have its `choices`."""

    name: str
    section: str | None
    key: str
    env: str | None
    kind: type
    default: Any
    low: float | None = None
    high: float | None = None
    above: bool = False
    choices: tuple[str, ...] | None = None

    def check_range(self, value: Any, where: str) -> None:
        """Raise ConfigError naming `where` unless the number `value` is in range (and finite),
        or the string `value` one of the choices."""
        if self.choices is not None and value is not None and value not in self.choices:
            shown = f"{value!r}" if len(repr(value)) <= 30 else f"{repr(value)[:27]}..."
            raise ConfigError(
                f"{where}: {self.key} must be one of {', '.join(self.choices)}, not {shown}",
                "See config.example.toml for every setting and its choices",
            )
        if self.low is None or self.high is None or value is None:
            return
        low_ok = value > self.low if self.above else value >= self.low
        if (isinstance(value, float) and not math.isfinite(value)) or not (
            low_ok and value <= self.high
        ):
            low = f"above {_number(self.low)}" if self.above else f"at least {_number(self.low)}"
            shown = f"{value!r}" if len(repr(value)) <= 30 else f"{repr(value)[:27]}..."
            raise ConfigError(
                f"{where}: {self.key} must be {low} and at most {_number(self.high)}, not {shown}",
                "See config.example.toml for every setting and its range",
            )


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


#: Every setting. config.example.toml mirrors this table (a test checks it).
FIELDS: tuple[Field, ...] = (
    Field("user", None, "user", "MEMCLI_USER", str, "default"),
    Field("db", None, "db", "MEMCLI_DB", str, None),
    Field(
        "token_limit", "memory", "token_limit", "MEMCLI_TOKEN_LIMIT", int, 30000, 1, MAX_TOKEN_LIMIT
    ),
    Field("ratio", "memory", "chat_history_token_ratio", "MEMCLI_RATIO", float, 0.7, 0, 1, True),
    Field(
        "flush_size",
        "memory",
        "token_flush_size",
        "MEMCLI_FLUSH_SIZE",
        int,
        None,
        1,
        MAX_TOKEN_LIMIT,
    ),
    Field("insert_method", "memory", "insert_method", "MEMCLI_INSERT_METHOD", str, "system"),
    Field("encoding", "memory", "encoding", "MEMCLI_ENCODING", str, "cl100k_base"),
    Field("model", "llm", "model", "MEMCLI_MODEL", str, None),
    Field("api_base", "llm", "api_base", "MEMCLI_API_BASE", str, None),
    Field("llm_timeout", "llm", "timeout", "MEMCLI_LLM_TIMEOUT", float, 60.0, 0, 86400, True),
    Field("memory_tools", "llm", "memory_tools", "MEMCLI_MEMORY_TOOLS", bool, False),
    Field("search_lexical_weight", "search", "lexical_weight", None, float, 1.0, 0, 1e6),
    Field("search_vector_weight", "search", "vector_weight", None, float, 1.0, 0, 1e6),
    Field("search_rrf_k", "search", "rrf_k", None, int, 10, 0, 1e6),
    Field("search_candidates", "search", "candidates", None, int, 100, 1, 100_000),
    Field("search_context_before", "search", "context_before", None, int, 1, 0, 1000),
    Field("search_context_after", "search", "context_after", None, int, 1, 0, 1000),
    Field("search_context_tokens", "search", "context_tokens", None, int, 60, 0, 1e6),
    Field("search_vector_context", "search", "vector_context", None, int, 1, 0, 1000),
    # The choices are memcli.search.onnx.PRECISIONS (a test checks), the default first.
    Field(
        "embedding_precision",
        "search",
        "embedding_precision",
        None,
        str,
        "int8",
        choices=("int8", "fp32"),
    ),
)


@dataclass(frozen=True)
class Settings:
    """Every setting, resolved. `blocks` holds the raw `[[blocks]]` tables of the config file."""

    home: Path
    config_path: Path | None = None
    user: str = "default"
    db: str | None = None
    token_limit: int = 30000
    ratio: float = 0.7
    flush_size: int | None = None
    insert_method: str = "system"
    encoding: str = "cl100k_base"
    model: str | None = None
    api_base: str | None = None
    llm_timeout: float = 60.0
    memory_tools: bool = False  # chat offers the model tools over memory (search, facts)
    search_lexical_weight: float = 1.0
    search_vector_weight: float = 1.0
    search_rrf_k: int = 10
    search_candidates: int = 100
    search_context_before: int = 1
    search_context_after: int = 1
    search_context_tokens: int = 60
    search_vector_context: int = 1
    embedding_precision: str = "int8"  # the embedding model's: "int8" or "fp32"
    blocks: tuple[dict[str, Any], ...] | None = None
    explicit: frozenset[str] = field(default_factory=frozenset)
    #: Where each setting came from: "flag", "env", "file" or "default"; also for "config" (the
    #: file: flag, env or default) and "home" (env or default).
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def db_url(self) -> str | None:
        """The PostgreSQL database's URL, when --db, MEMCLI_DB or `db` in the config is a
        `postgresql://` (or `postgres://`) URL; else None (a SQLite file: `db_path`). A URL that
        cannot be parsed is a UsageError (exit 2)."""
        if not is_postgres_url(self.db):
            return None
        assert self.db is not None
        try:
            _ = urlsplit(self.db).port  # (raises on a port that is no number)
        except ValueError:  # (its message quotes the URL's text: a password's, perhaps)
            raise UsageError(
                f"the database URL {redact_url(self.db)} is malformed (its host or port cannot"
                " be read)",
                "Write it as postgresql://USER@HOST[:PORT]/DBNAME; a password holding /, ?, #"
                " or @ is written with %2F, %3F, %23 or %40 in their place",
            ) from None
        return self.db

    @property
    def db_label(self) -> str:
        """The database as messages name it: the file's path, or the URL without its password."""
        url = self.db_url
        return redact_url(url) if url is not None else str(self.db_path)

    @property
    def db_path(self) -> Path:
        """The database file: --db, MEMCLI_DB or `db` in the config, else $MEMCLI_HOME/memcli.db.

        A path that exists but is no regular file (a directory, /dev/null, a pipe) can never hold
        a database: a UsageError (exit 2) says so before anything opens it. A PostgreSQL URL has
        no file: asking for one is a UsageError too (see `db_url`)."""
        refuse_keyword_string(self.db)
        if self.db_url is not None:
            raise UsageError(
                f"{self.db_label} is a PostgreSQL database: this works on SQLite files only",
                "Give --db the path of a SQLite file",
            )
        path = Path(self.db).expanduser() if self.db else self.home / "memcli.db"
        try:
            if path.exists() and not path.is_file():
                kind = "a directory" if path.is_dir() else "not a regular file"
                raise UsageError(
                    f"the database path {path} is {kind}",
                    "Give --db (or MEMCLI_DB, or db in the config) the path of a database file;"
                    " a new one is created there",
                )
        except OSError:
            pass  # unreadable or too long: opening it says why
        return path


def default_home(env: Mapping[str, str]) -> Path:
    if env.get("MEMCLI_HOME"):
        return Path(env["MEMCLI_HOME"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("memcli", appauthor=False))


def default_config_path(env: Mapping[str, str]) -> Path:
    import platformdirs

    return Path(platformdirs.user_config_dir("memcli", appauthor=False)) / "config.toml"


def config_file(env: Mapping[str, str], config_path: str | Path | None = None) -> tuple[Path, str]:
    """The config file and where it was named: `config_path` (--config: "flag"), else
    $MEMCLI_CONFIG ("env"), else the user config dir's config.toml ("default"), which may not
    exist."""
    if config_path is not None:
        return Path(config_path).expanduser(), "flag"
    if env.get("MEMCLI_CONFIG"):
        return Path(env["MEMCLI_CONFIG"]).expanduser(), "env"
    return default_config_path(env), "default"


def _convert(value: Any, spec: Field, where: str) -> Any:
    if value is None:
        return None
    if spec.kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in (
            "1",
            "true",
            "yes",
            "on",
            "0",
            "false",
            "no",
            "off",
        ):
            return value.lower() in ("1", "true", "yes", "on")
    elif spec.kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif spec.kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif spec.kind is str:
        if isinstance(value, str):
            return value or None
    raise ConfigError(
        f"{where}: {spec.key} must be {spec.kind.__name__}, not {value!r}",
        "See config.example.toml for every setting and its type",
    )


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML config file; errors name the file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"no config file at {path}", "Check --config or MEMCLI_CONFIG") from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read config file {path}: {exc}", "Check its permissions"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1)
        raise ConfigError(
            f"{path}:{line}: invalid UTF-8 at byte {column} of the line",
            "TOML files are UTF-8: save the file as UTF-8",
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"{path}: invalid TOML: {exc}", "Fix the file; see config.example.toml"
        ) from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid TOML: nested too deeply", "Flatten it") from None
    except ValueError:  # a number of more digits than int() takes
        raise ConfigError(
            f"{path}: invalid TOML: a number of more than {sys.get_int_max_str_digits()} digits",
            "See config.example.toml for every setting and its range",
        ) from None


def load_settings(
    env: Mapping[str, str],
    flags: Mapping[str, Any] | None = None,
    config_path: str | Path | None = None,
) -> Settings:
    """Resolve every setting: flags > MEMCLI_* environment > TOML file > defaults."""
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    sources: dict[str, str] = {"home": "env" if env.get("MEMCLI_HOME") else "default"}
    path: Path | None
    path, sources["config"] = config_file(env, config_path)
    if sources["config"] == "default" and not path.is_file():
        path = None
    data = read_toml(path) if path is not None else {}
    _check_known(data, path)
    values: dict[str, Any] = {}
    explicit: set[str] = set()
    for spec in FIELDS:
        table = data if spec.section is None else data.get(spec.section, {})
        if not isinstance(table, dict):
            raise ConfigError(
                f"{path}: [{spec.section}] must be a table", "See config.example.toml"
            )
        value, where, sources[spec.name] = spec.default, "default", "default"
        if spec.key in table:
            where = str(path)
            value = _convert(table[spec.key], spec, where)
            spec.check_range(value, where)
            sources[spec.name] = "file"
        if spec.env and env.get(spec.env):
            where = f"environment variable {spec.env}"
            value = _convert(env[spec.env], spec, where)
            spec.check_range(value, where)
            sources[spec.name] = "env"
        if spec.name in flags:
            value, where = flags[spec.name], f"--{spec.name.replace('_', '-')}"
            spec.check_range(value, where)
            sources[spec.name] = "flag"
        if sources[spec.name] != "default":
            explicit.add(spec.name)
        if isinstance(value, str) and spec.name != "db":  # a path may be any bytes
            try:
                check_text(value, spec.key)
                if spec.name == "user":  # the one rule for names: trimmed, one printable line
                    value = validate_user(value)
            except InputError as exc:  # bytes that are not UTF-8, in a flag or the environment
                raise ConfigError(f"{where}: {exc.message}", exc.hint) from None
        values[spec.name] = value
    blocks = data.get("blocks")
    if blocks is not None:
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            raise ConfigError(
                f"{path}: blocks must be [[blocks]] tables", "See config.example.toml"
            )
        blocks = tuple(blocks)
    known = {f.name for f in fields(Settings)}
    values = {k: v for k, v in values.items() if k in known}
    return Settings(
        home=default_home(env),
        config_path=path,
        blocks=blocks,
        explicit=frozenset(explicit),
        sources=sources,
        **values,
    )


def _check_known(data: dict[str, Any], path: Path | None) -> None:
    """Unknown keys are mistakes worth telling about (a typo silently ignored costs hours)."""
    top = {f.key for f in FIELDS if f.section is None}
    sections: dict[str, set[str]] = {}
    for spec in FIELDS:
        if spec.section is not None:
            sections.setdefault(spec.section, set()).add(spec.key)
    for key, value in data.items():
        if key == "blocks" or key in top:
            continue
        if key in sections and isinstance(value, dict):
            unknown = sorted(set(value) - sections[key])
            if unknown:
                raise ConfigError(
                    f"{path}: unknown setting {key}.{unknown[0]}",
                    f"Known settings in [{key}]: {', '.join(sorted(sections[key]))}",
                )
            continue
        home = next((name for name, keys in sections.items() if key in keys), None)
        raise ConfigError(
            f"{path}: unknown setting {key!r}",
            f"It goes in [{home}]: write it under a [{home}] line"
            if home is not None
            else "See config.example.toml for every setting",
        )


# -- the config file, edited (`memcli config set|get|unset|list`) ---------------------------------


def dotted(spec: Field) -> str:
    """A setting's name in the config file: `llm.model`, `user`."""
    return spec.key if spec.section is None else f"{spec.section}.{spec.key}"


def setting(name: str) -> Field:
    """The setting a `memcli config` KEY names: its dotted name (`llm.model`), or its key alone
    (`model`: every key is one section's), `-` read as `_`. UsageError naming the key otherwise,
    with the close names."""
    wanted = name.strip().replace("-", "_")
    for spec in FIELDS:
        if wanted in (dotted(spec), spec.key, spec.name):  # (name: as its flag, --flush-size)
            return spec
    from difflib import get_close_matches

    names = [dotted(spec) for spec in FIELDS]
    close = get_close_matches(wanted, names + [spec.key for spec in FIELDS], n=1, cutoff=0.6)
    guess = f"Did you mean {close[0]}? " if close else ""
    raise UsageError(
        f"no setting {name!r}",
        f"{guess}The settings: {', '.join(names)} ([[blocks]] are edited in the file itself)",
    )


def parse_setting(spec: Field, text: str) -> Any:
    """A setting's value as written on a command line (`0.5`, `true`, `openai/llama3.2`),
    checked as the config file's value is: its type, its range, valid Unicode. ConfigError
    (exit 2) naming the key otherwise."""
    where = f"config key {dotted(spec)}"
    if spec.kind is str and not text.strip():
        raise ConfigError(
            f"{where}: the value is empty",
            f"Remove the setting with `memcli config unset {spec.key}`",
        )
    value = _convert(text, spec, where)
    spec.check_range(value, where)
    if isinstance(value, str):
        try:
            check_text(value, spec.key)
            if spec.name == "user":
                value = validate_user(value)
        except InputError as exc:
            raise ConfigError(f"{where}: {exc.message}", exc.hint) from None
    return value


def file_value(path: Path, spec: Field) -> Any:
    """The value the config file at `path` sets for `spec` (None: not set, or no file)."""
    if not path.is_file():
        return None
    data = read_toml(path)
    table = data if spec.section is None else data.get(spec.section, {})
    return table.get(spec.key) if isinstance(table, dict) else None


def write_setting(path: Path, spec: Field, value: Any) -> None:
    """Set (`value` not None) or remove (None) one setting in the TOML file at `path`, keeping
    the rest of the file as it is, its comments and layout too (tomlkit); a file that is not
    there is made (its folder too). The file is checked before and after (`read_toml`, unknown
    keys) and replaced at once: a failure leaves it as it was."""
    import os
    import tempfile

    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    text = ""
    if path.exists():
        read_toml(path)  # invalid TOML or UTF-8: said with the file's name, nothing written
        text = path.read_text(encoding="utf-8")
    try:
        document = tomlkit.parse(text)
        if spec.section is None:
            table: Any = document
        else:
            if spec.section not in document:
                if value is None:
                    return
                document.add(spec.section, tomlkit.table())
            table = document[spec.section]
            if not isinstance(table, dict):
                raise ConfigError(
                    f"{path}: [{spec.section}] must be a table", "See config.example.toml"
                )
        if value is None:
            table.pop(spec.key, None)
        else:
            table[spec.key] = value
        new_text = tomlkit.dumps(document)
    except TOMLKitError as exc:
        raise ConfigError(f"{path}: cannot edit it: {exc}", "Edit the file by hand") from None
    check = tomllib.loads(new_text)
    _check_known(check, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".config-", suffix=".toml", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as out:
            out.write(new_text)
        if path.exists():
            os.chmod(temporary, path.stat().st_mode & 0o7777)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
