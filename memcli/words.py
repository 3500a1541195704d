"""How a count, a duration and a command's argument are said: `1 flush`, `2 flushes`, `45 s`,
`9 min`, `--user 'o'"'"'brien'`. UI-free, so that the engine, the store and the CLI say them the
same way (`memcli.cli.output.plural` is this)."""

from __future__ import annotations

import shlex


def plural(n: int, noun: str, plural_form: str | None = None) -> str:
    """`1 message`, `2 messages`, `1,200 batches` (`plural_form` when adding s is wrong)."""
    if n == 1:
        return f"1 {noun}"
    form = plural_form or (noun + "es" if noun.endswith(("s", "sh", "ch", "x")) else noun + "s")
    return f"{n:,} {form}"


def duration(seconds: float) -> str:
    """About how long, for people: `45 s`, `9 min`, `1.5 h` (at least `1 s`)."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def shell_arg(value: str) -> str:
    """`value` as one argument of a command a person copies into a shell: as it is when that is
    safe (`alice`), quoted otherwise (`'o'"'"'brien smith'`)."""
    return shlex.quote(value)


#: How every hint that asks for a model says to set one: with all that a local server needs.
SET_MODEL = (
    "`memcli config set model NAME` (for a local OpenAI-compatible server also `memcli config"
    " set api_base URL`, e.g. model openai/llama3.2 with api_base http://127.0.0.1:11434/v1),"
    " or MEMCLI_MODEL and MEMCLI_API_BASE in the environment, or --model and --api-base"
)
