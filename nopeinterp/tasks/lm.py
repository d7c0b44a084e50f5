"""Language modelling on real text: a corpus, its byte-level BPE tokenizer, training chunks.

Corpus (``read_corpus``)
    ``"stdlib"`` (the default): every ``*.py`` file of the running interpreter's standard
    library (``sysconfig``'s ``stdlib`` folder), leaving out installed packages
    (``site-packages``, ``dist-packages``) and the test suites (folders named ``test``,
    ``tests``, ``idle_test``): code, as the paper's 1B language models were trained on, on
    every machine with no download. Or a folder (every file under it, recursively) or a
    ``.jsonl`` file (one JSON object per line with a ``"text"`` string, ``"id"`` optional).
    Files that are binary (a NUL byte), not UTF-8, or empty are skipped and counted
    (``Corpus.skipped``); a corpus left with no document is an error.

Split (``split_of``)
    By document, deterministically: md5 of the document's name (its path relative to the
    corpus folder with ``/`` separators, or the JSONL ``id``, else ``line<k>``) in 100
    buckets; buckets 0-89 train, 90-94 val, 95-99 test. Adding or removing a file moves no
    other file.

Tokenizer (``train_tokenizer``)
    Byte-level BPE (GPT-2's byte alphabet, so any text encodes) trained by ``tokenizers`` on
    the training split only, with one special token ``<|endoftext|>`` (id 0) that ends every
    document; no start token is ever added.

Stream and chunks
    A split's documents in name order, each followed by ``<|endoftext|>``, concatenated into one
    token stream (``token_stream``); ``chunks`` cuts it into non-overlapping rows of the
    training context, dropping the remainder. Training batch at step s: ``batch_size`` chunks
    drawn (with replacement) by a generator seeded with (seed, s), so a resumed run sees the
    same batches. Validation: the first ``n`` validation chunks.

Tokenizer training and tokenizing the corpus take seconds to a minute on the standard library,
so ``LMTask`` keeps the tokenizer and the streams in a cache folder (``$NOPEINTERP_CACHE``,
default ``~/.cache/nopeinterp``) keyed by a hash of the documents and the settings; a cache
that cannot be written is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .base import TaskError
from .encoding import Batch

NAME = "lm"
EOT = "<|endoftext|>"
STDLIB = "stdlib"
SPLIT_BUCKETS = {"train": (0, 90), "val": (90, 95), "test": (95, 100)}
DEFAULT_CONTEXT = 256
DEFAULT_VOCAB_SIZE = 4096
_EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
_CACHE_FORMAT = "nopeinterp-lm-cache/1"


class CorpusError(TaskError):
    """A corpus that cannot be used (missing, no text, too small): one line, exit status 2."""


@dataclass(frozen=True)
class Document:
    name: str  # relative path with '/' (folder corpora) or the JSONL id
    text: str


@dataclass
class Corpus:
    """The documents of a corpus by split, and what was skipped (reason -> count)."""

    source: str
    documents: dict[str, list[Document]]
    skipped: dict[str, int] = field(default_factory=dict)

    def n_documents(self) -> dict[str, int]:
        return {s: len(d) for s, d in self.documents.items()}

    def fingerprint(self) -> str:
        """sha256 over every document's name and text, split by split."""
        h = hashlib.sha256()
        for split in SPLIT_BUCKETS:
            for doc in self.documents[split]:
                h.update(f"{split}\0{doc.name}\0".encode())
                h.update(hashlib.sha256(doc.text.encode("utf-8")).digest())
        return h.hexdigest()


def split_of(name: str) -> str:
    """The split of a document named `name`: md5 bucket (module docstring)."""
    bucket = int.from_bytes(hashlib.md5(name.encode("utf-8")).digest()[:8], "big") % 100
    return next(s for s, (lo, hi) in SPLIT_BUCKETS.items() if lo <= bucket < hi)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _folder_files(root: Path, pattern: str, exclude: set[str]) -> list[Path]:
    files = []
    for path in root.rglob(pattern):
        rel = path.relative_to(root)
        if any(part in exclude or part.startswith(".") for part in rel.parts[:-1]):
            continue
        if path.is_file():
            files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _decode(data: bytes) -> tuple[str | None, str | None]:
    """(text, None) or (None, reason skipped)."""
    if b"\0" in data:
        return None, "binary"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    if not text.strip():
        return None, "empty"
    return text, None


def _read_jsonl(path: Path) -> tuple[list[Document], dict[str, int]]:
    docs, skipped, seen = [], {}, set()
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise CorpusError(f"{path}: cannot read the corpus ({e.strerror or e})") from None
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise CorpusError(f"{path}: not a UTF-8 JSONL file (byte {e.start})") from None
    for k, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise CorpusError(f"{path}: line {k} is not JSON ({e})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise CorpusError(f'{path}: line {k}: expected an object with a "text" string')
        name = str(obj["id"]) if "id" in obj else f"line{k}"
        if name in seen:
            raise CorpusError(f"{path}: line {k}: id {name!r} repeated")
        seen.add(name)
        if not obj["text"].strip():
            skipped["empty"] = skipped.get("empty", 0) + 1
            continue
        docs.append(Document(name, obj["text"]))
    return docs, skipped


def read_corpus(source: str | os.PathLike = STDLIB) -> Corpus:
    """The corpus's documents split into train / val / test (module docstring)."""
    skipped: dict[str, int] = {}
    if str(source) == STDLIB:
        root, files = stdlib_root(), None
        files = _folder_files(root, "*.py", _EXCLUDED_DIRS)
        label = STDLIB
    else:
        root = Path(source)
        label = str(root)
        if not root.exists():
            raise CorpusError(f"{root}: no such corpus file or folder")
        if root.is_file():
            if root.suffix != ".jsonl":
                raise CorpusError(f"{root}: a corpus is a folder of text files or a .jsonl file")
            docs, skipped = _read_jsonl(root)
            files = None
        else:
            files = _folder_files(root, "*", set())
    if files is not None:
        docs = []
        for path in files:
            try:
                data = path.read_bytes()
            except OSError:
                skipped["unreadable"] = skipped.get("unreadable", 0) + 1
                continue
            text, reason = _decode(data)
            if reason:
                skipped[reason] = skipped.get(reason, 0) + 1
                continue
            docs.append(Document(path.relative_to(root).as_posix(), text))
    if not docs:
        what = ", ".join(f"{n} {r}" for r, n in sorted(skipped.items())) or "no files"
        raise CorpusError(f"{label}: no text documents in the corpus ({what})")
    documents: dict[str, list[Document]] = {s: [] for s in SPLIT_BUCKETS}
    for doc in sorted(docs, key=lambda d: d.name):
        documents[split_of(doc.name)].append(doc)
    for split, found in documents.items():
        if not found:
            raise CorpusError(
                f"{label}: no {split} documents ({len(docs)} documents; the split by name puts "
                f"about {SPLIT_BUCKETS[split][1] - SPLIT_BUCKETS[split][0]}% in {split})"
            )
    return Corpus(label, documents, skipped)


# --- tokenizer ---------------------------------------------------------------------------------
def train_tokenizer(texts, vocab_size: int = DEFAULT_VOCAB_SIZE):
    """A byte-level BPE tokenizer (a transformers fast tokenizer) trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(texts), trainer)
    from .tokenizer import wrap_bpe

    return wrap_bpe(backend)


def token_stream(tokenizer, documents: list[Document]) -> torch.Tensor:
    """The documents' ids, each followed by <|endoftext|>, as one 1-D long tensor."""
    eot = tokenizer.convert_tokens_to_ids(EOT)
    ids = tokenizer([d.text for d in documents], add_special_tokens=False)["input_ids"]
    flat = [t for row in ids for t in (*row, eot)]
    return torch.tensor(flat, dtype=torch.long)


def chunks(stream: torch.Tensor, length: int) -> torch.Tensor:
    """Non-overlapping rows of `length` tokens [n, length]; the remainder is dropped."""
    n = stream.numel() // length
    return stream[: n * length].view(n, length)


def chunk_batch(rows: torch.Tensor) -> Batch:
    """Chunks as a training Batch: every next token is a target (the last column predicts
    nothing, as in `encode_examples`)."""
    b, t = rows.shape
    target = torch.ones(b, t, dtype=torch.bool)
    target[:, -1] = False
    return Batch(
        tokens=rows.clone(),
        attention_mask=torch.ones(b, t, dtype=torch.long),
        target_mask=target,
        prompt_lengths=torch.zeros(b, dtype=torch.long),
        lengths=torch.full((b,), t, dtype=torch.long),
    )


def _cache_dir() -> Path:
    return Path(os.environ.get("NOPEINTERP_CACHE") or Path.home() / ".cache" / "nopeinterp")


class LMTask:
    """Next-token prediction over a corpus cut into chunks of `context` tokens.

    Options (``--task lm:corpus=PATH,context=256,vocab_size=4096``): `corpus` ("stdlib", a
    folder or a .jsonl file), `context` (tokens per training chunk), `vocab_size` (of the BPE
    tokenizer trained on the training split).
    """

    name = NAME

    def __init__(
        self,
        *,
        corpus: str = STDLIB,
        context: int = DEFAULT_CONTEXT,
        vocab_size: int = DEFAULT_VOCAB_SIZE,
    ) -> None:
        for key, value, low in (("context", context, 2), ("vocab_size", vocab_size, 257)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise TaskError(f"lm: {key} must be an integer >= {low}, got {value!r}")
        if not isinstance(corpus, str) or not corpus:
            raise TaskError(f"lm: corpus must be 'stdlib', a folder or a .jsonl file: {corpus!r}")
        if corpus != STDLIB:
            corpus = str(Path(corpus).resolve())
        self.corpus_source, self.context, self.vocab_size = corpus, context, vocab_size
        self._loaded: tuple | None = None

    @property
    def options(self) -> dict:
        return {
            "corpus": self.corpus_source,
            "context": self.context,
            "vocab_size": self.vocab_size,
        }

    def load(self) -> tuple:
        """(corpus, tokenizer, {split: stream}), from the cache when it holds them."""
        if self._loaded is not None:
            return self._loaded
        import tokenizers

        from .tokenizer import tokenizer_from_json, tokenizer_to_json

        corpus = read_corpus(self.corpus_source)
        key = hashlib.sha256(
            json.dumps(
                [_CACHE_FORMAT, corpus.fingerprint(), self.vocab_size, tokenizers.__version__]
            ).encode()
        ).hexdigest()[:24]
        folder = _cache_dir() / "lm" / key
        tokenizer, streams = None, None
        try:
            tokenizer = tokenizer_from_json((folder / "tokenizer.json").read_text())
            streams = {s: torch.load(folder / f"{s}.pt", weights_only=True) for s in SPLIT_BUCKETS}
        except Exception:  # no cache, or a damaged one: build again
            tokenizer, streams = None, None
        if tokenizer is None:
            tokenizer = train_tokenizer(
                (d.text for d in corpus.documents["train"]), self.vocab_size
            )
            streams = {s: token_stream(tokenizer, d) for s, d in corpus.documents.items()}
            try:
                from nopeinterp._io import atomic_write, atomic_write_text

                for s, t in streams.items():
                    atomic_write(folder / f"{s}.pt", lambda p, t=t: torch.save(t, p))
                atomic_write_text(folder / "tokenizer.json", tokenizer_to_json(tokenizer))
            except OSError:
                pass  # an unwritable cache only costs time
        for split, stream in streams.items():
            need = self.context if split == "train" else 2
            if stream.numel() < need:
                raise CorpusError(
                    f"{corpus.source}: the {split} split has {stream.numel()} tokens, fewer "
                    f"than one context of {self.context}" if split == "train" else
                    f"{corpus.source}: the {split} split has {stream.numel()} tokens"
                )  # fmt: skip
        self._loaded = (corpus, tokenizer, streams)
        return self._loaded

    def tokenizer(self):
        return self.load()[1]

    def stream(self, split: str) -> torch.Tensor:
        return self.load()[2][split]

    def train_batch(self, batch_size: int, seed: int, step: int) -> Batch:
        """The global batch of step `step`: a function of (corpus, settings, seed, step)."""
        rows = chunks(self.stream("train"), self.context)
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        return chunk_batch(rows[torch.randint(len(rows), (batch_size,), generator=g)])

    def val_batch(self, n: int) -> Batch:
        """The first `n` validation chunks (fewer if the split is shorter; at least one,
        shorter than the context when the whole split is)."""
        stream = self.stream("val")
        rows = chunks(stream, min(self.context, stream.numel()))
        return chunk_batch(rows[:n])

    def token_counts(self) -> dict[str, int]:
        return {s: int(t.numel()) for s, t in self.load()[2].items()}
