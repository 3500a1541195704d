"""Fact extraction against the number of facts stored: the prompt's tokens (cl100k) and the time
one extraction takes, for 10, 100, 1,000 and 10,000 stored facts of one user. The extraction
shows the model only the facts most related to the batch (at most `candidates`, 25), so the
prompt stays flat; "all facts" is what the prompt held when it showed every fact.

Run: .venv/bin/python benchmarks/facts_prompt.py [--sizes 10 100 1000 10000] [--hybrid]

The model is the tests' loopback OpenAI-compatible server (tests/llm_server.py) answering
`<facts></facts>` at once, so the time is memcli's own: choosing the facts (reading the user's
facts, BM25 over them; with --hybrid also the bundled MiniLM, its vectors of the facts embedded
once before the timing, as a long-running process keeps them) plus one HTTP round trip. Median
of 5 extractions. Nothing here is part of the test run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from llm_server import LLMServer  # noqa: E402

from memcli import FactBlock, Message  # noqa: E402
from memcli.blocks.base import BlockContext  # noqa: E402
from memcli.store import facts as fact_store  # noqa: E402
from memcli.store import open_store  # noqa: E402
from memcli.tokens import TiktokenTokenizer  # noqa: E402

SUBJECTS = "jazz tea chess painting bread hiking sailing opera poetry cycling gardening".split()
VERBS = "likes collects studies dislikes reads-about teaches avoids writes-about".split()
BATCH = [
    Message("user", "I moved to Zurich last month and started a new job at a bank."),
    Message("assistant", "Congratulations on the move and the new job!"),
]


def fact(i: int) -> str:
    verb = VERBS[i % len(VERBS)].replace("-", " ")
    return f"Ana {verb} {SUBJECTS[(i // len(VERBS)) % len(SUBJECTS)]}, item {i}"


def run(size: int, server: LLMServer, hybrid: bool, tokenizer: TiktokenTokenizer) -> tuple:
    with tempfile.TemporaryDirectory() as folder:
        store = open_store(Path(folder) / "facts.db")
        texts = [fact(i) for i in range(size - 1)] + ["Ana lives in Bern"]
        fact_store.add_facts(store, FactBlock.name, "user:ana", texts)
        embedder = None
        if hybrid:
            from memcli.search import OnnxEmbedder

            embedder = OnnxEmbedder(Path.home() / ".cache" / "memcli-bench-models")
        block = FactBlock(model="openai/test", api_base=server.api_base, embedder=embedder)
        ctx = BlockContext("s1", "ana", store, tokenizer)
        if hybrid:  # the vectors of the stored facts, made once as a running process keeps them
            block.related(store, "user:ana", "warm up")
        times = []
        for _ in range(5):
            server.reset()
            start = time.perf_counter()
            assert block.extract(BATCH, ctx) is None
            times.append(time.perf_counter() - start)
        request = server.requests[-1]
        prompt = sum(tokenizer.count(m["content"]) for m in request["messages"])
        shown = request["messages"][0]["content"].count('<fact id="')
        every = FactBlock._render(fact_store.list_facts(store, block.name, "user:ana"), ids=True)
        store.close()
    return shown, prompt, tokenizer.count(every), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1_000, 10_000])
    parser.add_argument("--hybrid", action="store_true", help="words and MiniLM vectors")
    args = parser.parse_args()
    tokenizer = TiktokenTokenizer("cl100k_base")
    server = LLMServer({"content": "<facts></facts>"}).start()
    try:
        print(f"{'facts':>7} {'shown':>6} {'prompt tokens':>14} {'all facts':>10} {'ms':>8}")
        for size in args.sizes:
            shown, prompt, every, seconds = run(size, server, args.hybrid, tokenizer)
            print(f"{size:>7} {shown:>6} {prompt:>14} {every:>10} {seconds * 1000:>8.1f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
