"""The registry of block kinds: building blocks from `[[blocks]]` tables, those of the config file
and those a Memory recorded for its session (each block's `definition()`).

Kinds: static, facts, vector, summary, and python (`path = "package.module:ClassName"`, a MemoryBlock
subclass whose constructor takes the table's other keys). Every key is checked; errors name the
block and the key.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memcli.blocks.base import MemoryBlock
from memcli.errors import ConfigError, UsageError
from memcli.flush import MAX_TOKEN_LIMIT

if TYPE_CHECKING:
    from memcli.store.base import SQLStore


@dataclass(frozen=True)
class Defaults:
    """What blocks take from the rest of the settings: the LLM, the embedder, and the folder of
    the index files of a PostgreSQL database without pgvector (a vector block's `index_dir`)."""

    model: str | None = None
    api_base: str | None = None
    llm_timeout: float = 60.0
    embedder: Any = None
    index_dir: Any = None


#: How an LLM block's calls are made (memcli.blocks.base.LLMBlock).
_CALL_KEYS: dict[str, tuple[type, ...]] = {
    "reply_tokens": (int,),
    "instructions": (str,),
    "structured_output": (bool,),
}

#: Per kind: the keys a table may have besides `kind`, with the type each must be.
KINDS: dict[str, dict[str, tuple[type, ...]]] = {
    "static": {"name": (str,), "priority": (int,), "content": (str,), "file": (str,)},
    "facts": {
        "name": (str,),
        "priority": (int,),
        "scope": (str,),
        "model": (str,),
        "api_base": (str,),
        "timeout": (int, float),
        "max_facts": (int,),
        "candidates": (int,),
        "token_budget": (int,),
        "temperature": (int, float),
        "max_tokens": (int,),
        "retry_pending": (int,),
        "auto_retries": (int,),
        **_CALL_KEYS,
    },
    "summary": {
        "name": (str,),
        "priority": (int,),
        "scope": (str,),
        "model": (str,),
        "api_base": (str,),
        "timeout": (int, float),
        "max_tokens": (int,),
        "temperature": (int, float),
        "retry_pending": (int,),
        "auto_retries": (int,),
        **_CALL_KEYS,
    },
    "vector": {
        "name": (str,),
        "priority": (int,),
        "scope": (str,),
        "source": (str,),
        "similarity_top_k": (int,),
        "retrieval_context_window": (int,),
        "token_budget": (int,),
        "search": (dict,),
    },
}


def _where(index: int, table: Mapping[str, Any]) -> str:
    name = table.get("name")
    return f"[[blocks]] #{index + 1}" + (f" ({name!r})" if isinstance(name, str) else "")


def _check_keys(where: str, kind: str, table: Mapping[str, Any]) -> None:
    allowed = KINDS[kind]
    for key, value in table.items():
        if key == "kind":
            continue
        if key not in allowed:
            raise ConfigError(
                f"{where}: unknown key {key!r} for kind {kind!r}",
                f"Known keys: kind, {', '.join(allowed)}",
            )
        types = allowed[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            names = " or ".join(
                "number" if t is float else "true or false" if t is bool else t.__name__
                for t in types
            )
            raise ConfigError(
                f"{where}: {key} must be {names}, not {value!r}", "See config.example.toml"
            )
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and not abs(value) <= MAX_TOKEN_LIMIT  # NaN too
        ):
            raise ConfigError(
                f"{where}: {key} must be at most {MAX_TOKEN_LIMIT:,}, not {value!r}",
                "See config.example.toml",
            )


def load_class(path: str, where: str = "block") -> type[MemoryBlock]:
    """Import `package.module:ClassName` and check that it is a MemoryBlock subclass."""
    module_name, _, class_name = path.partition(":")
    if not module_name or not class_name:
        raise ConfigError(
            f"{where}: path must be 'package.module:ClassName', not {path!r}",
            "Point it at a MemoryBlock subclass importable from the Python path",
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{where}: cannot import module {module_name!r}: {exc}",
            "Check the path and that the module is on PYTHONPATH",
        ) from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, MemoryBlock)):
        raise ConfigError(
            f"{where}: {path!r} is not a MemoryBlock subclass",
            "Subclass memcli.MemoryBlock and point path at the class",
        )
    return cls


def _python_block(where: str, table: Mapping[str, Any]) -> MemoryBlock:
    path = table.get("path")
    if not isinstance(path, str):
        raise ConfigError(
            f"{where}: kind 'python' needs path = \"package.module:ClassName\"", "Add it"
        )
    reason = table.get("not_rebuildable")
    if reason is not None:
        raise ConfigError(
            f"{where}: {path} cannot be rebuilt from its definition: {reason}",
            'Define it in [[blocks]] of the config file (kind = "python")',
        )
    cls = load_class(path, where)
    kwargs = {k: v for k, v in table.items() if k not in ("kind", "path")}
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if not takes_any:
        for key in kwargs:
            if key not in params:
                raise ConfigError(
                    f"{where}: {cls.__name__} takes no argument {key!r}",
                    f"Its arguments: {', '.join(params) or 'none'}",
                )
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.message}", exc.hint) from None
    except TypeError as exc:
        raise ConfigError(
            f"{where}: cannot create {cls.__name__}: {exc}", "Check its keys"
        ) from None


def build_block(index: int, table: Mapping[str, Any], defaults: Defaults) -> MemoryBlock:
    """One block from one `[[blocks]]` table."""
    from memcli.blocks.facts import FactBlock
    from memcli.blocks.static import StaticBlock
    from memcli.blocks.summary import SummaryBlock
    from memcli.blocks.vector import VectorBlock
    from memcli.search.types import SearchOptions

    where = _where(index, table)
    kind = table.get("kind")
    if kind == "python":
        return _python_block(where, table)
    if kind not in KINDS:
        raise ConfigError(
            f"{where}: kind must be one of static, facts, vector, python, summary, not {kind!r}",
            'Set kind = "static" | "facts" | "vector" | "python" | "summary"',
        )
    _check_keys(where, kind, table)
    kwargs = {k: v for k, v in table.items() if k != "kind"}
    if "search" in kwargs:
        try:
            kwargs["search_options"] = SearchOptions(**kwargs.pop("search"))
        except (TypeError, ValueError, UsageError) as exc:
            raise ConfigError(f"{where}: bad search options: {exc}", "See [search]") from None
    makers: dict[str, Callable[..., MemoryBlock]] = {
        "static": StaticBlock,
        "vector": lambda **kw: VectorBlock(
            embedder=defaults.embedder, index_dir=defaults.index_dir, **kw
        ),
        "facts": lambda **kw: FactBlock(
            **{
                "embedder": defaults.embedder,
                "model": defaults.model,
                "api_base": defaults.api_base,
                "timeout": defaults.llm_timeout,
                **kw,
            }
        ),
        "summary": lambda **kw: SummaryBlock(
            **{
                "model": defaults.model,
                "api_base": defaults.api_base,
                "timeout": defaults.llm_timeout,
                **kw,
            }
        ),
    }
    try:
        return makers[kind](**kwargs)
    except (ConfigError, UsageError) as exc:
        raise ConfigError(f"{where}: {exc.message}", exc.hint) from None


def build_blocks(
    tables: Sequence[Mapping[str, Any]] | None, defaults: Defaults
) -> list[MemoryBlock]:
    """The blocks of `[[blocks]]` tables; without tables, the default blocks: a vector block and a
    fact block (which extracts facts only when a model is configured, and always shows the facts
    added by hand)."""
    from memcli.blocks.facts import FactBlock
    from memcli.blocks.vector import VectorBlock

    if tables is None:
        return [
            VectorBlock(embedder=defaults.embedder, index_dir=defaults.index_dir),
            FactBlock(
                model=defaults.model,
                api_base=defaults.api_base,
                timeout=defaults.llm_timeout,
                embedder=defaults.embedder,
            ),
        ]
    blocks = [build_block(i, table, defaults) for i, table in enumerate(tables)]
    seen: set[str] = set()
    for i, block in enumerate(blocks):
        if block.name in seen:
            raise ConfigError(
                f"{_where(i, tables[i])}: a block named {block.name!r} is already configured",
                "Give each block its own name",
            )
        seen.add(block.name)
    return blocks


def rebuild(
    tables: Sequence[Mapping[str, Any]], defaults: Defaults
) -> tuple[list[MemoryBlock], list[tuple[Mapping[str, Any], str]]]:
    """The blocks of recorded definitions, as `build_block` builds them, and each definition that
    cannot be rebuilt here (a class that does not import, arguments that were not recorded) with
    the reason: the others still serve. A recorded `api_base` that is the settings' one without
    its credentials (as `record` stores it) is given the settings' one, credentials and all."""
    from memcli.credentials import same_endpoint

    blocks: list[MemoryBlock] = []
    problems: list[tuple[Mapping[str, Any], str]] = []
    for i, table in enumerate(tables):
        base = table.get("api_base")
        if isinstance(base, str) and same_endpoint(base, defaults.api_base):
            table = {**table, "api_base": defaults.api_base}  # its credentials, from the settings
        try:
            blocks.append(build_block(i, table, defaults))
        except ConfigError as exc:
            problems.append((table, exc.message))
        except Exception as exc:  # a custom class failing in its own way
            problems.append((table, f"{_where(i, table)}: {type(exc).__name__}: {exc}"))
    return blocks, problems


def record(store: SQLStore, session_id: str, blocks: Sequence[MemoryBlock]) -> bool:
    """Record the blocks' definitions for the session (a write only when they changed); blocks
    the CLI built from a definition (`origin` set) are not recorded again. True when written.
    No secret is recorded: URLs lose their passwords and keys (`without_credentials`); `rebuild`
    gives an endpoint back its credentials when it is the configured one."""
    from memcli.credentials import without_credentials
    from memcli.store import longterm

    if not blocks or any(b.origin is not None for b in blocks):
        return False
    definitions = [without_credentials(b.definition()) for b in blocks]
    return longterm.save_block_definitions(store, session_id, definitions)
