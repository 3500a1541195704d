"""Messages as providers' chat APIs take them: what `Memory.get()` returns (or any messages),
ready to send to OpenAI's Chat Completions API (`openai_messages`) or Anthropic's Messages API
(`anthropic_messages`), and as a line of OpenAI's fine-tuning format (`openai_line`, what
`memcli export --format openai` writes).

One path: each message as the OpenAI export writes it (`transcripts.openai_message`: the keys its
source record came with, `tool_calls` and `tool_call_id` among them), then only the keys the API
takes for its role, and tool turns in a shape it accepts: an assistant's tool call stays a call
when a `tool` message right after it (among the tool messages that follow it) answers it by its
id, and that answer stays a tool result. A call nobody answered, and a tool message that answers
no call before it (an import's tool turns without ids: ChatGPT's code interpreter, browsing), are
written as plain text instead (the call in its message's text, the result as an assistant
message after the run's answers), never as an orphan the API refuses. Anthropic's shape is made from
OpenAI's: system messages folded into `system`, tool calls and results as `tool_use` and
`tool_result` blocks, and consecutive turns of one role merged so that user and assistant
alternate.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from memcli.transcripts import openai_message

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from memcli.messages import Message

#: The keys OpenAI's Chat Completions API takes on a message, by role.
OPENAI_KEYS = {
    "system": frozenset(("role", "content", "name")),
    "developer": frozenset(("role", "content", "name")),
    "user": frozenset(("role", "content", "name")),
    "assistant": frozenset(("role", "content", "name", "tool_calls", "refusal")),
    "tool": frozenset(("role", "content", "tool_call_id")),
}
#: The keys a fine-tuning line (`openai_line`) takes: the API's, and an assistant's `weight`.
FINE_TUNING_KEYS = {**OPENAI_KEYS, "assistant": OPENAI_KEYS["assistant"] | {"weight"}}
#: A `name` OpenAI takes (no spaces, no `<|\\/>`); another one is said in the text instead.
_OPENAI_NAME = re.compile(r"[^\s<|\\/>]{1,64}")
#: An id Anthropic takes for a `tool_use` block.
_ANTHROPIC_ID = re.compile(r"[a-zA-Z0-9_-]+")


def openai_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """The messages as OpenAI's Chat Completions API takes them (see the module docstring):
    role, content, `name` (when it is one OpenAI takes; else said as `Name: ` before the text),
    an assistant's answered `tool_calls`, a tool result's `tool_call_id`; memcli's metadata, the
    timestamp and any other key left out."""
    return _openai_messages(messages, OPENAI_KEYS)


def openai_line(
    messages: Iterable[Message], record_keys: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One OpenAI fine-tuning line, `{"messages": [...], ...record_keys}` (`memcli export
    --format openai`), that `memcli import` reads back to the same conversation (and the same
    keys): the messages as `openai_messages` gives them, an assistant's `weight` kept."""
    line: dict[str, Any] = {"messages": _openai_messages(messages, FINE_TUNING_KEYS)}
    for key, value in (record_keys or {}).items():
        line.setdefault(key, value)
    return line


def _openai_messages(
    messages: Iterable[Message], keys: dict[str, frozenset[str]]
) -> list[dict[str, Any]]:
    """`openai_messages`, each role's message with the `keys` given for it."""
    records = [openai_message(m) for m in messages]
    kept_calls, answers = _pair(records, _openai_call)
    out: list[dict[str, Any]] = []
    unanswered: list[dict[str, Any]] = []  # a run's tool messages that answer nothing: after it
    for i, record in enumerate(records):
        role = record["role"]
        if role != "tool" and unanswered:
            out += unanswered
            unanswered = []
        if role == "tool":
            if answers[i]:
                text = record.get("content") or ""
                out.append(
                    {"role": "tool", "content": text, "tool_call_id": record["tool_call_id"]}
                )
            else:
                unanswered.append({"role": "assistant", "content": _result_text(record)})
            continue
        text = record.get("content") or ""
        message: dict[str, Any] = {"role": role, "content": text}
        name = record.get("name")
        if isinstance(name, str) and _OPENAI_NAME.fullmatch(name):
            message["name"] = name
        elif name:
            message["content"] = f"{name}: {text}"
        for key in keys[role] - {"role", "content", "name", "tool_calls"}:
            if key in record:
                message[key] = record[key]
        if role == "assistant":
            kept = kept_calls.get(i, [])
            said = [_call_text(c) for c in _calls(record) if not any(c is k for k in kept)]
            if said:
                message["content"] = "\n".join(
                    [message["content"], *said] if message["content"] else said
                )
            if kept:
                message["tool_calls"] = [_openai_shape(c) for c in kept]
                if not message["content"]:
                    message["content"] = None  # (as OpenAI writes a reply that only calls)
        out.append(message)
    return out + unanswered


def anthropic_messages(messages: Iterable[Message]) -> tuple[str, list[dict[str, Any]]]:
    """`(system, messages)` as Anthropic's Messages API takes them: the system messages' texts
    joined into `system` (where they were: one text per message, a blank line between), user
    and assistant turns alternating (consecutive ones of a role merged into one message of
    content blocks), an answered tool call as a `tool_use` block (its arguments, a JSON object,
    as `input`) and its result as a `tool_result` block at the start of the next user message;
    a call whose id or arguments Anthropic would refuse, and its result, as text. Empty texts
    are left out (the API refuses empty text blocks); a message of one text is its string."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    as_text: set[str] = set()  # ids of calls written as text: their results are text too
    for record in openai_messages(messages):
        role = record["role"]
        text = record.get("content") or ""
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text.strip() else []
        if role in ("system", "developer"):
            if text.strip():
                system.append(text)
            continue
        if role == "tool":
            call_id = record["tool_call_id"]
            if call_id in as_text:
                _add(out, "user", [{"type": "text", "text": f"Tool result:\n{text}"}])
            else:
                result = {"type": "tool_result", "tool_use_id": call_id}
                if blocks:
                    result["content"] = blocks
                _add(out, "user", [result])
            continue
        for call in record.get("tool_calls", []):
            used = _tool_use(call)
            if used is None:
                as_text.add(call["id"])
                blocks.append({"type": "text", "text": _call_text(call)})
            else:
                blocks.append(used)
        _add(out, role, blocks)
    for message in out:
        content = message["content"]
        if len(content) == 1 and content[0]["type"] == "text":
            message["content"] = content[0]["text"]
    return "\n\n".join(system), out


def _add(out: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Add a turn's blocks, to the last message when it is of the same role (tool results first
    in a user message, as Anthropic wants them)."""
    if not blocks:
        return
    if out and out[-1]["role"] == role:
        content = out[-1]["content"]
        results = [b for b in blocks if b["type"] == "tool_result"]
        if results:
            at = sum(1 for b in content if b["type"] == "tool_result")
            content[at:at] = results
        content.extend(b for b in blocks if b["type"] != "tool_result")
    else:
        out.append({"role": role, "content": blocks})


def _tool_use(call: dict[str, Any]) -> dict[str, Any] | None:
    """An OpenAI tool call as an Anthropic `tool_use` block; None when Anthropic would refuse it."""
    function = call["function"]
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):
        return None
    if not isinstance(arguments, dict) or not _ANTHROPIC_ID.fullmatch(call["id"]):
        return None
    return {"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments}


def _pair(
    records: list[dict[str, Any]], valid: Callable[[Any], bool]
) -> tuple[dict[int, list[dict[str, Any]]], list[bool]]:
    """Which tool calls stay calls and which tool messages stay results: by record index, an
    assistant's calls that a tool message among those right after it answers (by id, the first
    answer to each), and for every record whether it is such an answer."""
    kept: dict[int, list[dict[str, Any]]] = {}
    answers = [False] * len(records)
    for i, record in enumerate(records):
        if record["role"] != "assistant":
            continue
        calls: dict[str, dict[str, Any]] = {}
        for call in _calls(record):
            if valid(call) and call["id"] not in calls:
                calls[call["id"]] = call
        answered: set[str] = set()
        j = i + 1
        while j < len(records) and records[j]["role"] == "tool":
            call_id = records[j].get("tool_call_id")
            if call_id in calls and call_id not in answered:
                answered.add(call_id)
                answers[j] = True
            j += 1
        kept[i] = [c for c in calls.values() if c["id"] in answered]
    return kept, answers


def _openai_shape(call: dict[str, Any]) -> dict[str, Any]:
    """A call `_openai_call` took, with just the keys OpenAI takes."""
    function = call["function"]
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": function["name"], "arguments": function.get("arguments") or "{}"},
    }


def _calls(record: dict[str, Any]) -> list[Any]:
    """An assistant record's tool calls (and an old-style `function_call`, written as text)."""
    calls = record.get("tool_calls")
    out = list(calls) if isinstance(calls, list) else []
    if isinstance(record.get("function_call"), dict):
        out.append({"function": record["function_call"]})
    return out


def _openai_call(call: Any) -> bool:
    """A tool call as OpenAI takes it: an id, and a function with a name and text arguments."""
    if not isinstance(call, dict) or not isinstance(call.get("id"), str) or not call["id"]:
        return False
    function = call.get("function")
    return (
        call.get("type", "function") == "function"
        and isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and isinstance(function.get("arguments", ""), str)
    )


def _call_text(call: Any) -> str:
    """A tool call said in text: `[called name(arguments)]`."""
    function = call.get("function") if isinstance(call, dict) else None
    if isinstance(function, dict):
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        return f"[called {function.get('name', 'a tool')}({arguments})]"
    return f"[called {json.dumps(call, ensure_ascii=False)}]"


def _result_text(record: dict[str, Any]) -> str:
    """A tool message that answers no call, said in text (with its tool's name when it has one)."""
    name = record.get("name")
    head = f"Tool result ({name}):" if isinstance(name, str) and name else "Tool result:"
    return f"{head}\n{record.get('content') or ''}"
