"""The import rules of docs/architecture.md, checked on the source: each package imports only
the layers below it (at module level or lazily inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "memcli"

#: Every part of memcli (a top-level module or package), in layers from the bottom up, as
#: docs/architecture.md draws them: a part imports only parts of the layers below its own (not of
#: its own layer). `__init__` is the public API: it loads its names lazily and imports nothing.
LAYERS: list[set[str]] = [
    {"__init__", "errors", "credentials", "template", "words", "openai_client", "fold"},  # foundations
    {"messages", "flush", "tokens", "charts", "llm"},  # foundations over errors
    {"store", "transcripts"},  # every SQL statement; the transcript formats
    {"config", "search", "formats", "copy", "provider_messages", "writer", "context"},
    {"about", "health", "forgetting", "input_history", "tool_params", "simulate"},
    {"blocks"},
    {"facts"},
    {"memory_facts"},
    {"memory"},
    {"sessions", "integrations"},
    {"importing", "tools"},
    {"tool_calls"},
    {"chat"},
    {"cli"},
    {"__main__"},
]

#: What each part may import: every part of the layers below its own.
ALLOWED: dict[str, set[str]] = {
    part: set().union(*LAYERS[:level]) for level, layer in enumerate(LAYERS) for part in layer
}


def _all_parts() -> set[str]:
    return {
        p.stem if p.suffix == ".py" else p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))
    }


def test_every_part_has_its_place() -> None:
    placed = [part for layer in LAYERS for part in layer]
    assert len(placed) == len(set(placed)), "a part is in two layers"
    assert set(placed) == _all_parts()


def test_the_store_and_search_import_nothing_of_the_engine() -> None:
    """The rules docs/architecture.md names, beside the layers: the store knows the foundations
    only, the search never reads the settings (its callers hand it its folders)."""
    assert ALLOWED["store"] >= {"errors", "messages", "credentials"}
    assert "config" not in ALLOWED["search"] and "config" not in ALLOWED["store"]


def _part(name: str) -> str:
    return name.split(".")[1] if name.count(".") >= 1 else ""


def _imports(path: Path) -> set[str]:
    """The memcli parts a module imports, anywhere in it (type-checking-only imports aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for child in node.body for n in ast.walk(child))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("memcli"):
            if node.module == "memcli":  # the public API (its `__version__` too)
                found.update(
                    "__init__" if alias.name.startswith("__") else alias.name for alias in node.names
                )
            else:
                found.add(_part(node.module))
        elif isinstance(node, ast.Import):
            found.update(_part(a.name) for a in node.names if a.name.startswith("memcli."))
    return found


def _modules(part: str) -> list[Path]:
    if part == "__init__":
        return [PACKAGE / "__init__.py"]
    folder = PACKAGE / part
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [PACKAGE / f"{part}.py"]


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_a_layer_imports_only_the_layers_below_it(part: str) -> None:
    bad = {
        str(path.relative_to(PACKAGE)): sorted(_imports(path) - ALLOWED[part] - {part})
        for path in _modules(part)
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from memcli.memory import Memory\n    return Memory\n")
    assert _imports(module) == {"memory"}


def test_no_sql_in_the_cli() -> None:
    """Every SQL statement lives in the store: the commands call the library."""
    words = ("SELECT ", "INSERT INTO", "UPDATE ", "DELETE FROM", "CREATE TABLE")
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in sorted((PACKAGE / "cli").rglob("*.py"))
        if any(w in path.read_text(encoding="utf-8") for w in words)
    ]
    assert offenders == []


def test_the_search_index_chooses_its_dialect_in_one_place() -> None:
    """store/index.py picks each dialect's module in one place (`_dialect`); neither dialect's
    module, nor the scope and BM25 they share, reads the store's `dialect` or imports the face."""
    reads: dict[str, int] = {}
    back: list[str] = []
    for name in ("index", "sqlite_index", "pg_index", "scope", "bm25"):
        tree = ast.parse((PACKAGE / "store" / f"{name}.py").read_text(encoding="utf-8"))
        count = sum(isinstance(n, ast.Attribute) and n.attr == "dialect" for n in ast.walk(tree))
        if count:
            reads[name] = count
        if name != "index" and any(
            isinstance(n, ast.ImportFrom)
            and (n.module == "memcli.store.index" or any(a.name == "index" for a in n.names))
            for n in ast.walk(tree)
        ):
            back.append(name)
    assert reads == {"index": 1}
    assert back == []
