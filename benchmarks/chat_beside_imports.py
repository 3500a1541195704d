"""A chat beside its user's imports: the chat's CPU and turn times alone, then beside concurrent
`memcli import`s of the same user (each storing and embedding a few thousand messages: they flush at a 2,000-token limit, and
their vector block embeds each flushed batch's session under the embedding claim).

    PYTHONPATH=. python benchmarks/chat_beside_imports.py [--imports 4] [--messages 3000] [--turns 6]

The chat is `memcli chat --plain` with the default blocks against the tests' loopback
OpenAI-compatible server (it answers at once), its lines piped in at once; each turn's time is
taken when its reply's closing empty line arrives. Its CPU (user + system) is the chat process's
own (`os.wait4`). A chat turn searches what is indexed and embeds only its query (issue 41): the
imports' backlog is theirs to embed, so its CPU beside them should stay within 2x of alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from llm_server import LLMServer  # noqa: E402

USER = "ana"
QUESTIONS = [
    "What is my cat called?",
    "Where did I go hiking last summer?",
    "Where does my sister live?",
    "and what does she do for work?",
    "What instrument do I play?",
    "Who works as a baker at night?",
    "What is my favourite museum?",
    "What did I cook on Sunday?",
    "Which city did I visit in May?",
    "What is my colleague's name?",
    "What do I grow in my garden?",
    "Where does my brother work?",
]
FACTS = [
    "My cat is called Mochi-Vortex.",
    "I went hiking in the Alps last summer.",
    "My sister Ana Lucia lives in Porto, she is a nurse.",
    "I play the cello in an amateur orchestra.",
    "My colleague Tom works as a baker at night.",
]
WORDS = (
    "river garden museum train coffee violin harbour mountain letter window bicycle lantern "
    "market winter summer kitchen recipe island bridge forest meadow castle theatre library"
).split()


#: The imports flush (so their vector block embeds what they store, one process at a time under
#: the embedding claim) and extract no facts (no LLM for them).
IMPORT = ["--token-limit", "2000", "--no-extract"]


def env(home: Path) -> dict[str, str]:
    return {**os.environ, "MEMCLI_HOME": str(home), "PYTHONPATH": str(ROOT)}


def memcli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "memcli", *args]
    return subprocess.run(command, env=env(home), capture_output=True, text=True, check=True)


def conversations(path: Path, tag: str, messages: int) -> None:
    """`messages` messages in conversations of 200, of made-up everyday text."""
    lines = []
    for i in range(messages):
        words = " ".join(WORDS[(i * 7 + j * 3 + len(tag)) % len(WORDS)] for j in range(14))
        role = "user" if i % 2 == 0 else "assistant"
        text = f"{tag} note {i}: the {words}."
        lines.append(json.dumps({"session": f"{tag}-{i // 200}", "role": role, "content": text}))
    path.write_text("\n".join(lines) + "\n")


def chat(home: Path, server: LLMServer, turns: int) -> tuple[float, float, list[float]]:
    """One `memcli chat --plain` of `turns` questions: its CPU seconds, wall seconds, and each
    turn's seconds (from the previous reply's end; the first from the start)."""
    text = "\n".join(QUESTIONS[i % len(QUESTIONS)] for i in range(turns)) + "\n"
    command = [sys.executable, "-m", "memcli", "chat", "--plain", "--user", USER]
    command += ["--model", "openai/bench", "--api-base", server.api_base]
    started = time.perf_counter()
    proc = subprocess.Popen(
        command,
        env=env(home),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(text)
    proc.stdin.close()
    ends = []
    for line in proc.stdout:
        if not line.strip():
            ends.append(time.perf_counter())
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    if proc.returncode != 0 or len(ends) < turns:
        raise SystemExit(f"the chat failed (exit {proc.returncode}, {len(ends)} replies)")
    turn_times = [b - a for a, b in zip([started, *ends[:-1]], ends[:turns], strict=True)]
    return usage.ru_utime + usage.ru_stime, wall, turn_times


def show(name: str, cpu: float, wall: float, turns: list[float]) -> None:
    each = ", ".join(f"{t:.1f}" for t in turns)
    print(f"{name}: chat CPU {cpu:.1f} s, wall {wall:.1f} s; turns (s): {each}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--imports", type=int, default=4)
    parser.add_argument("--messages", type=int, default=3000, help="messages per import")
    parser.add_argument("--turns", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        seed = Path(tmp) / "seed.jsonl"
        seed.write_text(
            "\n".join(json.dumps({"session": "facts", "role": "user", "content": f}) for f in FACTS)
            + "\n"
        )
        memcli(home, "import", str(seed), "--user", USER)
        memcli(home, "search", "cat", "--user", USER)  # the model exported, the seed embedded
        files = []
        for n in range(args.imports):
            files.append(Path(tmp) / f"import-{n}.jsonl")
            conversations(files[-1], f"batch{n}", args.messages)
        server = LLMServer({"content": "Noted."}).start()
        try:
            chat(home, server, 1)  # (a first chat: the sessions' tables warm, nothing measured)
            alone = chat(home, server, args.turns)
            show("alone", *alone)
            started = time.perf_counter()
            importers = [
                subprocess.Popen(
                    [sys.executable, "-m", "memcli", "import", str(f), "--user", USER, *IMPORT],
                    env=env(home),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for f in files
            ]
            time.sleep(5.0)  # the imports under way: storing, embedding, holding the claim
            beside = chat(home, server, args.turns)
            running = sum(1 for p in importers if p.poll() is None)
            show(f"beside {args.imports} imports ({running} still running at its end)", *beside)
            codes = [p.wait() for p in importers]
            print(
                f"imports: {args.imports} x {args.messages} messages in "
                f"{time.perf_counter() - started:.0f} s (exit codes {codes})"
            )
            print(f"chat CPU beside / alone: {beside[0] / alone[0]:.2f}x (target: within 2x)")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
