"""What a chat gives the model: evidence recall of the requests a new chat sends, and its memory.

For each LoCoMo development conversation (/work/shared/data/locomo), as a user would:
1. `memcli import` the conversation (benchmarks/locomo.py's transcript: speaker_a as `user`,
   speaker_b as `assistant`, each turn's session date as its time) under the user `locomo-NN`;
2. `memcli search --queries FILE -k 10 --json` with its questions (categories 1-4): R@10, the
   share of a question's evidence turns among the first 10 hits' messages;
3. `memcli chat --plain` in a NEW session (no config: the default blocks), the questions one per
   line, against a loopback OpenAI-compatible server (tests/llm_server.py) that answers every
   request with the same reply; the requests it receives are read;
4. the same again in a second new chat (the first chat's questions and replies are now stored);
5. `memcli search` R@10 again (the stored chats' questions now compete with the answers).

`--personal`: instead, a personal-facts chat: 8 small conversations state 13 facts about the user
among small talk ("My cat is called Mochi-Vortex"); then three new chats each ask the 13
questions ("What is my cat called?") one per turn; printed per chat, how many of the 13 facts
were in the request that asked for them, and the memory tokens per request.

Printed per chat: the evidence recall of the requests (per question, the share of its evidence
turns whose text is in the request the model received for it, averaged over questions), the
share of questions with all their evidence in the request, and the memory tokens per request
(the `<memory>...</memory>` text, tiktoken cl100k_base), mean and p95.

    PYTHONPATH=. python benchmarks/chat_recall.py                 # both conversations
    PYTHONPATH=. python benchmarks/chat_recall.py --questions 20  # a quick slice
    PYTHONPATH=. python benchmarks/chat_recall.py --config FILE   # other blocks ([[blocks]])
    PYTHONPATH=. python benchmarks/chat_recall.py --personal      # the personal-facts chat

The embedding model's export is kept in --model-cache (default /tmp/memcli-bench-models) so that
runs after the first skip it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from llm_server import LLMServer  # noqa: E402
from locomo import CATEGORIES, DEFAULT_DATA, evidence_of, transcript  # noqa: E402

#: What the test model answers, every time.
REPLY = "I am not sure."
MEMORY = re.compile(r"<memory>.*?</memory>", re.S)


def memcli(home: Path, *args: str, stdin: str | None = None, env: dict[str, str] | None = None):
    """Run `python -m memcli ARGS` from this checkout with MEMCLI_HOME=home; stdout as text."""
    environ = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MEMCLI_HOME": str(home),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "HF_HUB_OFFLINE": "1",
        "NO_COLOR": "1",
        **(env or {}),
    }
    for key in ("MEMCLI_MODEL", "MEMCLI_API_BASE", "MEMCLI_USER", "MEMCLI_DB", "MEMCLI_CONFIG"):
        if env is None or key not in env:
            environ.pop(key, None)
    if (home / "config.toml").exists():
        environ["MEMCLI_CONFIG"] = str(home / "config.toml")
    done = subprocess.run(
        [sys.executable, "-m", "memcli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=environ,
        cwd=home,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"memcli {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done.stdout


def request_text(body: dict[str, Any]) -> str:
    """Every message's text of a chat completion request."""
    out = []
    for m in body.get("messages", []):
        content = m.get("content")
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        out.append(content or "")
    return "\n".join(out)


def recall_of(body: dict[str, Any], evidence: set[str], texts: dict[str, str]) -> float:
    """The share of the evidence turns whose text is in the request (as memory renders it:
    `neutralise` may escape a `<`). An evidence id that is not a turn of the conversation
    (LoCoMo has a few) counts as not found, as in benchmarks/locomo.py."""
    from memcli.template import neutralise

    sent = request_text(body)
    found = sum(1 for d in evidence if d in texts and neutralise(texts[d]) in sent)
    return found / len(evidence)


def memory_tokens(body: dict[str, Any], tokenizer: Any) -> int:
    return sum(tokenizer.count(m.group(0)) for m in MEMORY.finditer(request_text(body)))


def search_recall(home: Path, user: str, asked: list[dict[str, Any]], dia: dict[int, str]) -> float:
    """R@10 of `memcli search --queries` on the questions, for the user."""
    lines = "\n".join(json.dumps({"query": q["question"]}) for q in asked)
    query_file = home / f"{user}-queries.jsonl"
    query_file.write_text(lines + "\n")
    out = memcli(home, "search", "--queries", str(query_file), "--user", user, "-k", "10", "--json")
    found: dict[int, set[str]] = {}
    for line in out.splitlines():
        row = json.loads(line)
        if row.get("type") == "hit":
            found.setdefault(row["query_index"], set()).update(
                dia.get(i, "") for i in row["message_ids"]
            )
    total = 0.0
    for i, qa in enumerate(asked):
        evidence = evidence_of(qa)
        total += len(evidence & found.get(i, set())) / len(evidence)
    return total / len(asked)


#: (session, [(user message, assistant reply), ...]): the personal-facts conversations.
PERSONAL = [
    ("pets", [("My cat is called Mochi-Vortex.", "What a name! How old is she?"),
              ("She is three. She sleeps all day.", "Cats do love their naps.")]),
    ("work", [("I started a new job at Lumen Robotics in March.", "Congratulations!"),
              ("My manager there is called Ingrid Solberg.", "I hope she is a good manager."),
              ("Can you help me write an email?", "Of course, what should it say?")]),
    ("travel", [("Next month I'm flying to Reykjavik for a conference.", "Exciting! Iceland is lovely."),
                ("My flight number is FI 455.", "Noted.")]),
    ("health", [("I'm allergic to penicillin.", "Good to know, mention it to any doctor."),
                ("Any tips for sleeping better?", "Keep a regular schedule and avoid screens.")]),
    ("family", [("My sister Dalia lives in Vilnius.", "Do you visit her often?"),
                ("Her birthday is on 14 August.", "Lovely, summer birthday!")]),
    ("home", [("I live on Rua das Flores, number 28.", "Nice street name."),
              ("My wifi password hint is 'blue heron'.", "I will remember the hint.")]),
    ("hobby", [("I play the cello in a community orchestra.", "How long have you played?"),
               ("Since I was twelve.", "That is a long time!")]),
    ("food", [("My favourite dish is pastel de nata.", "A classic!"),
              ("I don't eat mushrooms.", "Noted, no mushrooms."),
              ("What's a good recipe for dinner tonight?", "How about a lemon pasta?")]),
]  # fmt: skip
#: (question, the text of the message that answers it).
PERSONAL_QUESTIONS = [
    ("What is my cat called?", "My cat is called Mochi-Vortex."),
    ("How old is my cat?", "She is three. She sleeps all day."),
    ("Where do I work?", "I started a new job at Lumen Robotics in March."),
    ("What is my manager's name?", "My manager there is called Ingrid Solberg."),
    ("Where am I flying next month?", "Next month I'm flying to Reykjavik for a conference."),
    ("What is my flight number?", "My flight number is FI 455."),
    ("Which medicine am I allergic to?", "I'm allergic to penicillin."),
    ("Where does my sister live?", "My sister Dalia lives in Vilnius."),
    ("When is my sister's birthday?", "Her birthday is on 14 August."),
    ("What is my address?", "I live on Rua das Flores, number 28."),
    ("What instrument do I play?", "I play the cello in a community orchestra."),
    ("What is my favourite dish?", "My favourite dish is pastel de nata."),
    ("What food do I avoid?", "I don't eat mushrooms."),
]


def run_personal(args: argparse.Namespace) -> dict[str, Any]:
    """The personal-facts chat (see the module's docstring)."""
    from memcli.tokens import TiktokenTokenizer

    tokenizer = TiktokenTokenizer()
    home = _home(args)
    server = LLMServer({"content": "Sorry, I don't remember that."}).start()
    env = {"MEMCLI_MODEL": "openai/test-model", "MEMCLI_API_BASE": server.api_base}
    user = "me"
    records = [
        {"session": session, "role": role, "content": text}
        for session, turns in PERSONAL
        for said, reply in turns
        for role, text in (("user", said), ("assistant", reply))
    ]
    file = home / "personal.jsonl"
    file.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    memcli(home, "import", str(file), "--user", user, "--json")
    report: dict[str, Any] = {"facts": len(PERSONAL_QUESTIONS), "chats": []}
    try:
        for _ in range(3):
            server.reset()
            stdin = "\n".join(q for q, _ in PERSONAL_QUESTIONS) + "\n"
            memcli(home, "chat", "--plain", "--user", user, stdin=stdin, env=env)
            bodies = list(server.requests)
            found = sum(
                1
                for body, (_, answer) in zip(bodies, PERSONAL_QUESTIONS, strict=True)
                if answer in request_text(body)
            )
            tokens = [memory_tokens(b, tokenizer) for b in bodies]
            report["chats"].append(
                {
                    "facts_in_request": found,
                    "memory_tokens_mean": round(statistics.fmean(tokens), 1),
                }
            )
    finally:
        server.stop()
    return report


def _home(args: argparse.Namespace) -> Path:
    """A new memcli home whose models folder is the kept export, with the config file given."""
    home = Path(tempfile.mkdtemp(prefix="memcli-chat-recall-"))
    cache = Path(args.model_cache)
    cache.mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(cache, target_is_directory=True)
    if args.config:
        (home / "config.toml").write_text(Path(args.config).read_text())
    return home


def run(args: argparse.Namespace) -> dict[str, Any]:
    from memcli.store import open_store
    from memcli.tokens import TiktokenTokenizer

    tokenizer = TiktokenTokenizer()
    home = _home(args)
    server = LLMServer({"content": REPLY}).start()
    chat_env = {"MEMCLI_MODEL": "openai/test-model", "MEMCLI_API_BASE": server.api_base}
    report: dict[str, Any] = {"conversations": {}, "reply": REPLY}
    try:
        for path in sorted(Path(args.data).glob("*.json")):
            if args.conversations and path.stem not in args.conversations.split(","):
                continue
            data = json.loads(path.read_text())
            conv = data.get("conversation", data)
            user = f"locomo-{path.stem}"
            records, dia_ids = transcript(conv, user)
            texts = {d: r["content"] for d, r in zip(dia_ids, records, strict=True)}
            file = home / f"{user}.jsonl"
            file.write_text("\n".join(json.dumps(r) for r in records) + "\n")
            memcli(home, "import", str(file), "--user", user, "--json")
            store = open_store(home / "memcli.db")
            ids = [m.id for m in store.iter_messages(user)]
            store.close()
            dia = dict(zip(ids, dia_ids, strict=True))
            asked = [
                q
                for q in data.get("qa", conv.get("qa", []))
                if q.get("category") in CATEGORIES and evidence_of(q)
            ]
            if args.questions:
                asked = asked[: args.questions]
            row: dict[str, Any] = {"questions": len(asked)}
            row["search_r10"] = round(search_recall(home, user, asked, dia), 3)
            for chat in ("chat1", "chat2"):
                server.reset()
                stdin = "\n".join(q["question"] for q in asked) + "\n"
                memcli(home, "chat", "--plain", "--user", user, stdin=stdin, env=chat_env)
                bodies = list(server.requests)
                if len(bodies) != len(asked):
                    raise SystemExit(f"{chat}: {len(bodies)} requests for {len(asked)} questions")
                recalls = [
                    recall_of(b, evidence_of(q), texts) for b, q in zip(bodies, asked, strict=True)
                ]
                tokens = sorted(memory_tokens(b, tokenizer) for b in bodies)
                row[chat] = {
                    "recall": round(statistics.fmean(recalls), 3),
                    "all_evidence": round(sum(r == 1.0 for r in recalls) / len(recalls), 3),
                    "memory_tokens_mean": round(statistics.fmean(tokens), 1),
                    "memory_tokens_p95": tokens[int(len(tokens) * 0.95)],
                    "memory_tokens_max": tokens[-1],
                }
            row["search_r10_after_chats"] = round(search_recall(home, user, asked, dia), 3)
            report["conversations"][path.stem] = row
    finally:
        server.stop()
    rows = list(report["conversations"].values())
    weights = [r["questions"] for r in rows]

    def mean(get: Any) -> float:
        return round(sum(get(r) * w for r, w in zip(rows, weights, strict=True)) / sum(weights), 3)

    report["overall"] = {
        "questions": sum(weights),
        "search_r10": mean(lambda r: r["search_r10"]),
        **{
            f"{chat}_{key}": mean(lambda r, c=chat, k=key: r[c][k])
            for chat in ("chat1", "chat2")
            for key in ("recall", "all_evidence", "memory_tokens_mean")
        },
        "search_r10_after_chats": mean(lambda r: r["search_r10_after_chats"]),
    }
    return report


def print_report(report: dict[str, Any]) -> None:
    print(f"test model's reply to every request: {report['reply']!r}")
    head = ["conv", "q", "search R@10", "chat", "recall", "all ev.", "mem tok", "p95", "max"]
    print("  ".join(f"{h:>11}" for h in head))
    for name, row in report["conversations"].items():
        for chat in ("chat1", "chat2"):
            c = row[chat]
            cells = [
                name,
                row["questions"],
                row["search_r10"] if chat == "chat1" else row["search_r10_after_chats"],
                chat,
                c["recall"],
                c["all_evidence"],
                c["memory_tokens_mean"],
                c["memory_tokens_p95"],
                c["memory_tokens_max"],
            ]
            print("  ".join(f"{x!s:>11}" for x in cells))
    print("overall:", json.dumps(report["overall"]))
    print("(search R@10: before the chats on the chat1 row, after both chats on the chat2 row)")


def _personal_text(report: dict[str, Any]) -> str:
    return "\n".join(
        f"chat {i}: {c['facts_in_request']} of {report['facts']} facts in the request that asked"
        f" for them; memory tokens per request {c['memory_tokens_mean']}"
        for i, c in enumerate(report["chats"], start=1)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="folder of LoCoMo *.json")
    parser.add_argument("--conversations", help="comma-separated file stems (default: all)")
    parser.add_argument("--questions", type=int, default=0, help="first N questions per file")
    parser.add_argument("--config", help="a memcli config file for the chats (e.g. [[blocks]])")
    parser.add_argument(
        "--model-cache",
        default=os.environ.get("MEMCLI_MODEL_CACHE", "/tmp/memcli-bench-models"),
        help="folder for the exported ONNX model, kept between runs",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--personal", action="store_true", help="the personal-facts chat instead")
    args = parser.parse_args(argv)
    if args.personal:
        personal = run_personal(args)
        print(json.dumps(personal) if args.json else _personal_text(personal))
        return 0
    report = run(args)
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
