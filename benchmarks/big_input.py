"""What a big message costs in `memcli chat --plain`: CPU seconds and peak RSS of the process, for
one message of 25 KB, 100 KB and 1 MB, against the tests' loopback OpenAI-compatible server
(tests/llm_server.py, in this process: its CPU is not counted).

    PYTHONPATH=. python benchmarks/big_input.py [--sizes 25,100,1000] [--blocks]
    PYTHONPATH=. python benchmarks/big_input.py --full-screen [--sizes 25] [--blocks]

--full-screen: the full-screen chat (prompt_toolkit) in a tmux pane of 160x48, driven as a person
drives it: once its status line says "ready" and it is idle, the message is pasted (tmux
`paste-buffer -p`: a bracketed paste, as a terminal sends one; the text is paragraphs of lines
of ~80 characters), then, once the chat is idle again, " - thanks" is typed a key every 0.1 s,
and Enter pressed. Printed per size: the chat process's CPU s (all its threads, /proc/PID/stat)
from the paste until it is idle again, the length its preview line says, CPU ms per key typed
after it, CPU s from Enter until the request holding the message reached the server (in
parentheses: until idle, when none came: a message over the budget is refused), the paste's
and Enter's sum; how many requests held the message whole, and in part; the screen's last line.

Each size runs in a fresh process with a fresh store (`blocks = []` unless --blocks, which keeps
the default blocks, with the exported embedding model when it is at hand), with the default
budget (token_limit 30,000). The message is English-like prose (words of 2 to 9 letters, ~5.5
bytes a word: ~1 token each). Plain mode: "hi" is the first line, the message the second;
printed per size: CPU s (user + system of that child alone, from os.wait4), peak RSS (MB), the
exit code, whether the big message reached the server (the request held it) and the last line on
stderr (what the user is told).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from chat_latency import model_folder  # noqa: E402 (this folder: the script's own)
from llm_server import LLMServer  # noqa: E402


def prose(size: int, seed: int = 7) -> str:
    """`size` bytes of one line of words."""
    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgk"
    words: list[str] = []
    total = 0
    while total < size:
        word = "".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
        words.append(word)
        total += len(word) + 1
    return " ".join(words)[:size]


def run(args: list[str], env: dict[str, str], stdin: bytes) -> tuple[float, float, int, str]:
    """CPU s, peak RSS in MB, exit code and stderr of one child process."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT
        )
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:  # it stopped reading (it refused the line)
            pass
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        said = err.read().decode("utf-8", errors="replace")
    cpu = usage.ru_utime + usage.ru_stime
    return cpu, usage.ru_maxrss / 1024, proc.returncode, said



def paragraphs(size: int, seed: int = 7) -> str:
    """`size` bytes of prose as a pasted document: lines of about 80 characters, a blank line
    after every fifth."""
    words, lines, line = prose(size, seed).split(), [], ""
    for word in words:
        if len(line) + len(word) >= 80:
            lines.append(line)
            line = ""
            if len(lines) % 6 == 5:
                lines.append("")
        line = f"{line} {word}" if line else word
    lines.append(line)
    return "\n".join(lines)[:size].strip()


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system, all threads) a live process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle(pid: int, timeout: float = 120) -> None:
    """Wait until the process uses (almost) no CPU for half a second."""
    end = time.monotonic() + timeout
    last = cpu_of(pid)
    while time.monotonic() < end:
        time.sleep(0.5)
        now = cpu_of(pid)
        if now - last < 0.02:
            return
        last = now
    raise SystemExit(f"the chat (pid {pid}) did not go idle in {timeout:.0f} s")


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


#: Typed after the paste, a key every 0.1 s: what each key costs with the paste in the editor.
TYPED = " - thanks"


def full_screen(server: LLMServer, env: dict[str, str], text: str, name: str) -> dict[str, Any]:
    """The full-screen chat in a tmux pane: CPU s from the paste to idle (and the length its
    preview line says), per key typed after it, from Enter to the request at the server (None:
    none came; `said`: the screen's last note), how many requests held the message whole."""
    command = " ".join(
        [
            "exec env",
            *(shlex.quote(f"{k}={v}") for k, v in env.items()),
            shlex.quote(sys.executable),
            "-m memcli chat --session big",
        ]
    )
    tmux("new-session", "-d", "-s", name, "-x", "160", "-y", "48", "-c", str(ROOT), command)
    out: dict[str, Any] = {}
    try:
        pid = int(tmux("list-panes", "-t", name, "-F", "#{pane_pid}").split()[0])
        end = time.monotonic() + 120
        while " ready " not in tmux("capture-pane", "-p", "-t", name):
            if time.monotonic() > end:
                raise SystemExit("the chat's status line never said ready")
            time.sleep(0.2)
        idle(pid)
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as pasted:
            pasted.write(text)
            pasted.flush()
            tmux("load-buffer", "-b", name, pasted.name)
        start = cpu_of(pid)
        tmux("paste-buffer", "-p", "-d", "-b", name, "-t", name)
        idle(pid)
        out["paste"] = cpu_of(pid) - start
        seen = re.search(r"([0-9,]+) characters, ", tmux("capture-pane", "-p", "-t", name))
        out["seen"] = int(seen.group(1).replace(",", "")) if seen else 0
        start = cpu_of(pid)
        for key in TYPED:
            tmux("send-keys", "-l", "-t", name, key)
            time.sleep(0.1)
        idle(pid)
        out["key"] = (cpu_of(pid) - start) / len(TYPED)
        text += TYPED
        start = cpu_of(pid)
        tmux("send-keys", "-t", name, "Enter")
        out["enter"] = None
        end = time.monotonic() + 300
        while time.monotonic() < end:
            if any(
                text[:200] in str(m.get("content")) for r in server.requests for m in r["messages"]
            ):
                out["enter"] = cpu_of(pid) - start
                break
            if time.monotonic() > end - 295 and cpu_of(pid) - start > 0 and _quiet(pid):
                break  # refused: nothing is sent
            time.sleep(0.01)
        idle(pid)
        out["refused"] = cpu_of(pid) - start  # (what a refusal cost, when nothing was sent)
        screen = tmux("capture-pane", "-p", "-t", name).splitlines()[:-3]  # (not the editor)
        said = [line.partition("│")[0].strip() for line in screen]
        out["said"] = next((line for line in reversed(said) if line), "")
        held = [
            str(m.get("content"))
            for r in server.requests
            for m in r["messages"]
            if text[:200] in str(m.get("content"))
        ]
        out["whole"], out["held"] = sum(h == text for h in held), len(held)
        tmux("send-keys", "-t", name, "C-d")
        return out
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)


def _quiet(pid: int) -> bool:
    """Whether the process used no CPU in the last 0.3 s."""
    before = cpu_of(pid)
    time.sleep(0.3)
    return cpu_of(pid) - before < 0.01


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="25,100,1000", help="KB, comma-separated")
    parser.add_argument("--blocks", action="store_true", help="keep the default blocks")
    parser.add_argument(
        "--full-screen", action="store_true", help="paste into the full-screen chat in tmux"
    )
    args = parser.parse_args()
    server = LLMServer().start()
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("MEMCLI_", "LITELLM_", "LLM_"))
    }
    base |= {
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "NO_COLOR": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    if args.full_screen:
        print(f"memcli chat (full screen, tmux), one big paste (load {os.getloadavg()[0]:.1f})")
        print(
            f"  {'size':>8} {'paste s':>8} {'previewed':>9} {'key ms':>7} {'Enter s':>8}"
            f" {'total':>6}  whole/requests, last line"
        )
    else:
        print(f"memcli chat --plain, one big message (load {os.getloadavg()[0]:.1f})")
        print(f"  {'size':>8} {'CPU s':>7} {'peak MB':>8} {'exit':>4}  sent  last line on stderr")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for kb in (int(s) for s in args.sizes.split(",")):
                home = Path(tmp) / f"home-{kb}"
                home.mkdir()
                models = model_folder()
                if args.blocks and models is not None:
                    (home / "models").symlink_to(models, target_is_directory=True)
                config = home / "config.toml"
                blocks = "" if args.blocks else "blocks = []\n"
                config.write_text(
                    blocks + f'[llm]\nmodel = "openai/test"\napi_base = "{server.api_base}"\n'
                )
                env = base | {"MEMCLI_HOME": str(home), "MEMCLI_CONFIG": str(config)}
                server.reset()
                if args.full_screen:
                    text = paragraphs(kb * 1000)
                    env["TERM"] = "xterm-256color"
                    r = full_screen(server, env, text, f"memcli-big-{os.getpid()}")
                    enter = f"({r['refused']:.2f})" if r["enter"] is None else f"{r['enter']:.2f}"
                    total = "-" if r["enter"] is None else f"{r['paste'] + r['enter']:.2f}"
                    print(
                        f"  {kb:>6}KB {r['paste']:8.2f} {r['seen']:>9,} {r['key'] * 1000:7.1f}"
                        f" {enter:>8} {total:>6}  {r['whole']}/{r['held']:<4} {r['said'][:60]}"
                    )
                    continue
                text = prose(kb * 1000)
                cpu, rss, code, said = run(
                    [sys.executable, "-m", "memcli", "chat", "--plain", "--session", "big"],
                    env,
                    f"hi\n{text}\n".encode(),
                )
                sent = any(
                    text[:200] in str(m.get("content"))
                    for r in server.requests
                    for m in r["messages"]
                )
                last = (said.strip().splitlines() or [""])[-1][:110]
                print(
                    f"  {kb:>6}KB {cpu:7.2f} {rss:8.0f} {code:>4}  {'yes' if sent else 'no':4}  {last}"
                )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
