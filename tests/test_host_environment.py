"""A library opened by someone else's program leaves no trace in it: memcli never writes
os.environ (tiktoken's files and offline model loading are passed explicitly), so an app that
embeds it finds Hugging Face as it left it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memcli.tokens import ENCODINGS, TiktokenTokenizer, litellm_tokenizer_dir, load_encoding

ROOT = Path(__file__).resolve().parents[1]

APP = r"""
import json, os, sys
from pathlib import Path
before = dict(os.environ)
import memcli
from memcli import Memory, Message, TiktokenTokenizer

home = sys.argv[1]
with Memory.from_defaults(session_id="s", user_id="ana", db=home + "/m.db", home=home) as memory:
    memory.put(Message("user", "We moved to Porto in May 2023."))
    memory.put(Message("assistant", "How do you like it there?"))
    hits = memory.search("which city do we live in?", k=2, mode="vector").hits
tokens = TiktokenTokenizer().count("Hello, wörld! <|endoftext|> 12345")
import huggingface_hub.constants as hub
after = dict(os.environ)
print(json.dumps({
    "changed": sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k)),
    "hub_offline": hub.HF_HUB_OFFLINE,
    "exported": sorted(p.name for p in (Path(home) / "models").iterdir()),
    "hit": hits[0].text if hits else None,
    "tokens": tokens,
}))
"""


def test_an_app_embedding_memcli_keeps_its_environment(tmp_path: Path) -> None:
    """In a fresh process with a clean environment (no HF_HUB_OFFLINE, no TIKTOKEN_CACHE_DIR,
    no MEMCLI_HOME): import memcli, export the model into a new folder, embed and search, count
    tokens; the environment is as it was, and huggingface_hub is not switched offline."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "LANG": "C.UTF-8",
    }
    done = subprocess.run(
        [sys.executable, "-c", APP, str(tmp_path / "home")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["changed"] == []
    assert out["hub_offline"] is False
    assert any(name.endswith(".onnx") for name in out["exported"])  # exported here, offline
    assert out["hit"] and "Porto" in out["hit"]
    assert out["tokens"] == TiktokenTokenizer().count("Hello, wörld! <|endoftext|> 12345")


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_the_encodings_are_tiktokens_own(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The encodings memcli builds from litellm's files are tiktoken's, token for token: tiktoken
    pointed at the same files through its environment variable (as memcli did before) gives
    the same ranks, pattern, special tokens and counts."""
    import tiktoken

    folder = litellm_tokenizer_dir()
    assert folder is not None and (folder / ENCODINGS[name]["file"]).is_file()
    before = dict(os.environ)
    mine = load_encoding(name)
    assert dict(os.environ) == before
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(folder))
    theirs = tiktoken.get_encoding(name)
    assert mine._pat_str == theirs._pat_str
    assert mine._special_tokens == theirs._special_tokens
    assert mine._mergeable_ranks == theirs._mergeable_ranks
    assert mine.n_vocab == theirs.n_vocab
    text = "Hello wörld 12345 <|endoftext|>\n\n  def f(x):\n\treturn x**2  # 日本語 🙂 don't"
    assert mine.encode(text, allowed_special="all") == theirs.encode(text, allowed_special="all")
