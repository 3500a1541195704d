"""Formats other packages add: the entry points of the group `memcli.formats`, each naming a
`Reader` under the format's name (`chatlog = "memcli_chatlog:READER"` in the package's
pyproject.toml). They are looked up only when asked (`--format` names a format memcli does not
have, or no built-in reader knows an input's shape), never on the way of an import the built-in
readers read, nor at `memcli --help`.

A plugin that cannot be loaded, is not a `Reader` named as its entry point, or fails with an
exception that is no `MemcliError` is a `ConfigError` naming the entry point and its package.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from memcli.errors import ConfigError, MemcliError
from memcli.formats.reader import Reader, Source

if TYPE_CHECKING:
    from collections.abc import Callable, Collection
    from importlib.metadata import EntryPoint

    from memcli.formats.reader import Input

#: The entry-point group a package adds formats in.
GROUP = "memcli.formats"


def names() -> list[str]:
    """The names of the formats installed packages add (none of them is imported)."""
    return sorted({point.name for point in _entry_points()})


def named(name: str, built_in: Collection[str]) -> Reader | None:
    """The reader a package adds under `name` (None: no package adds one)."""
    points = [point for point in _entry_points() if point.name == name]
    return _load(points, built_in) if points else None


def readers(built_in: Collection[str]) -> list[Reader]:
    """Every reader installed packages add, by name (each loaded; `built_in`: the names they
    may not take)."""
    by_name: dict[str, list[EntryPoint]] = {}
    for point in _entry_points():
        by_name.setdefault(point.name, []).append(point)
    return [_load(by_name[name], built_in) for name in sorted(by_name)]


def _entry_points() -> list[EntryPoint]:
    from importlib.metadata import entry_points

    return list(entry_points(group=GROUP))


def _load(points: list[EntryPoint], built_in: Collection[str]) -> Reader:
    """The reader of the entry points named alike (one, unless two packages took the name),
    checked, its `detect` and `read` guarded: an exception of theirs becomes a ConfigError
    naming the plugin."""
    point = points[0]
    where = _described(point)
    if len(points) > 1:
        raise ConfigError(
            f"{' and '.join(sorted(_package(p) for p in points))} each add a format plugin"
            f" named {point.name!r}",
            "Uninstall all of them but one",
        )
    if point.name in built_in or point.name == "auto":
        raise ConfigError(f"{where}: {point.name!r} is a built-in format", _fix(point))
    try:
        reader = point.load()
    except Exception as exc:  # whatever importing someone else's module raises
        raise ConfigError(f"{where}: cannot be loaded ({_what(exc)})", _fix(point)) from None
    if not isinstance(reader, Reader):
        raise ConfigError(
            f"{where}: it is a {type(reader).__name__}, not a memcli.formats.Reader", _fix(point)
        )
    problem = _problem(reader, point.name)
    if problem:
        raise ConfigError(f"{where}: {problem}", _fix(point))
    return replace(
        reader,
        detect=_guarded(reader.detect, f"{where} failed detecting", point),
        read=_checked(_guarded(reader.read, f"{where} failed reading", point), where, point),
    )


def _problem(reader: Reader, name: str) -> str | None:
    """What is wrong with a plugin's reader (None: nothing)."""
    if reader.name != name:
        return f"its reader is named {reader.name!r}, not {name!r} as its entry point"
    if not isinstance(reader.help, str) or not isinstance(reader.lines, bool):
        return "its help is not text, or its lines is not true or false"
    if not (callable(reader.detect) and callable(reader.read)):
        return "its detect or read is not a function"
    return None


def _guarded(function: Callable[[Input], Any], what: str, point: EntryPoint) -> Any:
    def call(source: Input) -> Any:
        try:
            return function(source)
        except MemcliError:
            raise  # its own errors (an InputError naming the line) as they are
        except Exception as exc:  # a bug of the plugin: said, without a traceback
            raise ConfigError(f"{what} {source.name} ({_what(exc)})", _fix(point)) from None

    return call


def _checked(read: Callable[[Input], Any], where: str, point: EntryPoint) -> Any:
    def call(source: Input) -> Source:
        found = read(source)
        if not isinstance(found, Source):
            raise ConfigError(
                f"{where}: read gave a {type(found).__name__}, not a memcli.formats.Source",
                _fix(point),
            )
        return found

    return call


def _described(point: EntryPoint) -> str:
    return f"format plugin {point.name!r} ({point.value}, {_package(point)})"


def _package(point: EntryPoint) -> str:
    dist = point.dist
    return f"package {dist.name} {dist.version}" if dist is not None else "no package"


def _fix(point: EntryPoint) -> str:
    dist = point.dist
    who = f"`pip uninstall {dist.name}`" if dist is not None else "remove its entry point"
    return f"Fix the plugin, or uninstall it ({who})"


def _what(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
