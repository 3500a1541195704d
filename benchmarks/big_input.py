"""What a big message costs in `memcli chat --plain`: CPU seconds and peak RSS of the process, for
one message of 25 KB, 100 KB and 1 MB, against the tests' loopback OpenAI-compatible server
(tests/llm_server.py, in this process: its CPU is not counted).

    PYTHONPATH=. python benchmarks/big_input.py [--sizes 25,100,1000] [--blocks]

Each size runs in a fresh process with a fresh store (`blocks = []` unless --blocks, which keeps
the default blocks, with the exported embedding model when it is at hand), after "hi" as the first line, with the default budget (token_limit 30,000).
The message is English-like prose (words of 2 to 9 letters, ~5.5 bytes a word: ~1 token each).
Printed per size: CPU s (user + system of that child alone, from os.wait4), peak RSS (MB), the
exit code, whether the big message reached the server (the request held it) and the last line on
stderr (what the user is told).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

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


def model_folder() -> Path | None:
    """The exported embedding model, when at hand ($MEMCLI_HOME/models or
    ~/.local/share/memcli/models): without it --blocks would export one first."""
    for home in (os.environ.get("MEMCLI_HOME"), "~/.local/share/memcli"):
        if home and (Path(home).expanduser() / "models").is_dir():
            return Path(home).expanduser() / "models"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="25,100,1000", help="KB, comma-separated")
    parser.add_argument("--blocks", action="store_true", help="keep the default blocks")
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
                text = prose(kb * 1000)
                server.reset()
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
