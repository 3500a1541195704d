"""Chat speed: Enter to the first streamed token, time to the first screen, CPU while idle.

    PYTHONPATH=. python benchmarks/chat.py [--turns 20]

Against the tests' loopback OpenAI-compatible server, which answers at once. Enter → first token is
measured two ways: inside the app (prompt-toolkit pipe input: from the Enter key handler to the
first piece reaching the UI thread), and end to end in a real terminal (tmux: from `send-keys Enter`
to the reply showing in `capture-pane`, which adds tmux's own latency and the ~5 ms polling). The
first screen and idle CPU are measured on `memcli chat` in tmux.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from llm_server import LLMServer  # noqa: E402


def summary(name: str, values: list[float]) -> None:
    ms = sorted(v * 1000 for v in values)
    p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
    print(
        f"{name}: median {statistics.median(ms):.1f} ms, p90 {p90:.1f} ms, "
        f"min {ms[0]:.1f} ms, max {ms[-1]:.1f} ms (n={len(ms)})"
    )


def wait(condition, timeout: float = 60.0, step: float = 0.001) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise TimeoutError
        time.sleep(step)


def in_app(server: LLMServer, turns: int, home: Path) -> list[float]:
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from memcli import MemoryBlock, SQLiteStore
    from memcli.chat import Chat, Commands
    from memcli.cli.chat.ui import ChatApp
    from memcli.llm import LLMConfig

    class Notes(MemoryBlock):
        name = "notes"
        priority = 0

        def get(self, messages, ctx):
            return "The user likes short answers."

    chat = Chat(
        SQLiteStore(home / "bench.db"),
        blocks=[Notes()],
        llm=LLMConfig("openai/bench", api_base=server.api_base),
    )
    chat.open()
    times = []
    with create_pipe_input() as pipe:
        ui = ChatApp(chat, Commands(chat), True, None, pipe, DummyOutput())
        runner = threading.Thread(target=ui.run)
        runner.start()
        ui.warmed.wait(120)
        for i in range(turns + 1):
            ui.timings.clear()
            pipe.send_text(f"benchmark message number {i}\r")
            wait(lambda: "first_piece" in ui.timings)
            took = ui.timings["first_piece"] - ui.timings["enter"]
            if i == 0:
                print(f"Enter → first token, first message after the warm-up: {took * 1000:.1f} ms")
            else:
                times.append(took)
            wait(lambda: ui.turn is None and not ui.pending)
        pipe.send_text("\x04")
        runner.join(10)
    return times


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def start_chat(name: str, home: Path, server: LLMServer) -> float:
    env = f"env MEMCLI_HOME={home} PYTHONPATH={ROOT} LITELLM_LOCAL_MODEL_COST_MAP=True"
    command = (
        f"{env} {sys.executable} -m memcli chat --model openai/bench --api-base {server.api_base}"
    )
    started = time.perf_counter()
    tmux("new-session", "-d", "-s", name, "-x", "140", "-y", "40", command)
    return started


def first_screen(server: LLMServer, home: Path, runs: int) -> tuple[list[float], list[float]]:
    """Wall time to the first screen, and the CPU the process had used by then (what the wall
    time would be on an idle machine: the start is one thread's work)."""
    times, cpu = [], []
    for i in range(runs):
        name = f"memcli-bench-screen-{os.getpid()}-{i}"
        started = start_chat(name, home, server)
        try:
            pid = int(tmux("display-message", "-p", "-t", name, "#{pane_pid}").strip())
            wait(lambda n=name: "Long-term" in tmux("capture-pane", "-p", "-t", n), step=0.002)
            times.append(time.perf_counter() - started)
            cpu.append(cpu_seconds(pid))
        finally:
            subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
        time.sleep(0.3)
    return times, cpu


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def terminal_turns_and_idle(server: LLMServer, home: Path, turns: int, idle: float) -> None:
    name = f"memcli-bench-{os.getpid()}"
    start_chat(name, home, server)
    try:
        pid = int(tmux("display-message", "-p", "-t", name, "#{pane_pid}").strip())

        def status() -> str:
            return tmux("capture-pane", "-p", "-t", name).splitlines()[-1]

        wait(lambda: status().startswith(" ready"), step=0.05)  # litellm imported
        times = []
        for i in range(turns + 1):
            marker = f"reply-{i}-end"
            server.default = {"content": f"Sure. {marker}"}
            tmux("send-keys", "-t", name, f"terminal message {i}")
            sent = time.perf_counter()
            tmux("send-keys", "-t", name, "Enter")
            wait(lambda m=marker: m in tmux("capture-pane", "-p", "-t", name), step=0.002)
            if i >= 1:
                times.append(time.perf_counter() - sent)
            wait(lambda: status().startswith(" ready"), step=0.01)
        summary("Enter → reply on screen, real terminal (tmux)", times)
        echo = []
        for i in range(10):  # the floor: a key typed until it shows (tmux and polling latency)
            mark = f"zq{i}x"
            sent = time.perf_counter()
            tmux("send-keys", "-t", name, mark)
            wait(lambda m=mark: m in tmux("capture-pane", "-p", "-t", name), step=0.002)
            echo.append(time.perf_counter() - sent)
            tmux("send-keys", "-t", name, "C-u")
            time.sleep(0.05)
        summary("  baseline: a typed key until it shows (tmux)", echo)
        time.sleep(1.0)
        before, t0 = cpu_seconds(pid), time.perf_counter()
        time.sleep(idle)
        used, wall = cpu_seconds(pid) - before, time.perf_counter() - t0
        print(
            f"idle CPU over {wall:.1f} s: {used:.2f} s of CPU = {100 * used / wall:.2f}% of a core"
        )
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)


def compile_bytecode() -> None:
    """memcli's bytecode, as `./run` keeps it: where PYTHONDONTWRITEBYTECODE is set, Python would
    otherwise compile every memcli module in memory on every start (about 70 ms)."""
    command = [sys.executable, "-m", "compileall", "-q", str(ROOT / "memcli")]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def first_screen_new_home(server: LLMServer, runs: int) -> list[float]:
    """The first screen of a first run: no database yet, so the migrations run first."""
    times = []
    for i in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            name = f"memcli-bench-new-{os.getpid()}-{i}"
            started = start_chat(name, Path(tmp), server)
            try:
                wait(lambda n=name: "Long-term" in tmux("capture-pane", "-p", "-t", n), step=0.002)
                times.append(time.perf_counter() - started)
            finally:
                subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
            time.sleep(0.3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--screens", type=int, default=5)
    parser.add_argument("--idle", type=float, default=10.0)
    args = parser.parse_args()
    compile_bytecode()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    server = LLMServer(default={"content": "Sure."}).start()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        summary("Enter → first token, in the app", in_app(server, args.turns, home))
        wall, cpu = first_screen(server, home, args.screens)
        summary("time to first screen (memcli chat in tmux)", wall)
        summary("  CPU used by the first screen (its time on an idle machine)", cpu)
        summary("time to first screen, first run (new database)", first_screen_new_home(server, 3))
        terminal_turns_and_idle(server, home, args.turns, args.idle)
    server.stop()


if __name__ == "__main__":
    main()
