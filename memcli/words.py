"""How a count is said: `1 flush`, `2 flushes`. UI-free, so that the chat engine and the CLI
say counts the same way (`memcli.cli.output.plural` is this)."""

from __future__ import annotations


def plural(n: int, noun: str, plural_form: str | None = None) -> str:
    """`1 message`, `2 messages`, `1,200 batches` (`plural_form` when adding s is wrong)."""
    if n == 1:
        return f"1 {noun}"
    form = plural_form or (noun + "es" if noun.endswith(("s", "sh", "ch", "x")) else noun + "s")
    return f"{n:,} {form}"
