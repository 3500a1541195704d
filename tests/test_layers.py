"""The import rules of docs/architecture.md, checked on the source: each package imports only
the layers below it (at module level or lazily inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "memcli"

#: The foundations: modules every layer may import.
FOUNDATIONS = {
    "errors",
    "messages",
    "credentials",
    "tokens",
    "flush",
    "config",
    "about",
    "template",
}

#: What each part may import of memcli, besides itself (a part is a top-level module or package).
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "credentials": set(),
    "messages": {"errors"},
    "flush": {"errors"},
    "template": set(),
    "tokens": {"errors", "messages"},
    "store": {"errors", "messages", "credentials"},
    "search": {"store", "messages", "tokens", "errors"},
    "transcripts": {"errors", "messages", "flush"},
    "formats": {"transcripts", "errors", "messages", "flush"},
    "provider_messages": {"transcripts", "messages"},
    "blocks": FOUNDATIONS | {"store", "search", "llm"},
    "context": FOUNDATIONS,
    "writer": FOUNDATIONS | {"store"},
    "memory": FOUNDATIONS | {"store", "search", "blocks", "context", "writer"},
}


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
            if node.module == "memcli":
                found.update(alias.name for alias in node.names)
            else:
                found.add(_part(node.module))
        elif isinstance(node, ast.Import):
            found.update(_part(a.name) for a in node.names if a.name.startswith("memcli."))
    return found


def _modules(part: str) -> list[Path]:
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
