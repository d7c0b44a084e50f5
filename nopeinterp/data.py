"""The one way in for data (like scikit-learn's `check_array`): every analysis turns what it is
given into named `Sequences` here, and nowhere else.

`make_sequences(data, model)` accepts
  - None with a checkpoint as `model`: the checkpoint's own task, with its task options;
  - a task: a `Task`, a task name, a dict {"name": ..., **options}, a `(task, tokenizer)` pair
    or a `Checkpoint` (its task and tokenizer): teacher-forced `<bos> prompt target <eos>`
    sequences are generated;
  - token ids: a tensor [B, T] (optional right-padded `attention_mask` and per-sequence
    `lengths`), or anything with `.tokens` (+ `.attention_mask`, `.lengths`), e.g. a
    `nopeinterp.tasks.Batch`;
  - a list of strings, with `tokenizer=` (or the model's tokenizer); with stated lengths (or
    for a model that records no task) each document is cut to one prefix per split, its length
    drawn in that split's range (`cut_texts`); shorter documents are counted as dropped;
  - None with a model that records no task (e.g. one from `nopeinterp.from_hf`): random token
    sequences from the model's vocabulary, its BOS token first when it has one
    (`random_sequences`), ID lengths DEFAULT_ID_LENGTHS and OOD lengths DEFAULT_OOD_LENGTHS
    (in tokens, BOS included) unless `id_lengths` / `ood_lengths` say otherwise;
  - a mapping of split name -> one of the token forms above (names among "fit"/"train",
    "val", "ID", "OOD", or any other).

The rules live here once:
  - the split rule: ID sequences come from a task's held-out "val" pool, OOD ones from its
    "test" pool (`SOURCE_SPLIT`), so no analysed example was trained on;
  - the readable cut: a model with a learned position table cannot read past it
    (`max_positions`); longer sequences are dropped and counted in `Sequences.dropped`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

# Where each analysed split is drawn from in a task (the others are never analysed).
SOURCE_SPLIT = {"ID": "val", "OOD": "test"}
# Canonical order of named splits.
SPLIT_ORDER = ("fit", "val", "ID", "OOD", "all")
NOT_READABLE = "longer than the model's position table"
TOO_SHORT = "document shorter than the requested length"
# Lengths (in tokens) for data without a task: random tokens and cut texts.
DEFAULT_ID_LENGTHS = (8, 64)
DEFAULT_OOD_LENGTHS = (65, 128)


@dataclass
class Sequences:
    """Right-padded token sequences of one split, with what was left out and why."""

    tokens: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long, 1 on real tokens (right-padded)
    lengths: torch.Tensor  # [B] the task's length of each sequence, else its token count
    split: str = "all"  # "ID", "OOD", "fit", "val", "all" or any name
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> number of sequences
    examples: list | None = None  # the task Examples behind the rows (task data only)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def n_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def subset(self, idx, split: str | None = None) -> Sequences:
        """Sequences `idx` (a tensor of indices or a bool mask); padding trimmed; `dropped` kept."""
        idx = torch.as_tensor(idx)
        if idx.dtype == torch.bool:
            idx = idx.nonzero().flatten()
        mask = self.attention_mask[idx]
        width = int(mask.sum(1).max()) if len(idx) else 0
        examples = None if self.examples is None else [self.examples[i] for i in idx.tolist()]
        return Sequences(
            self.tokens[idx][:, :width],
            mask[:, :width],
            self.lengths[idx],
            split or self.split,
            dict(self.dropped),
            examples,
        )

    def readable_by(self, limit: int | None) -> Sequences:
        """The sequences of at most `limit` tokens (all if None); the rest counted as dropped."""
        if limit is None:
            return self
        keep = self.attention_mask.sum(1) <= limit
        out = self.subset(keep)
        n_out = int((~keep).sum())
        if n_out:
            out.dropped[NOT_READABLE] = out.dropped.get(NOT_READABLE, 0) + n_out
        return out

    def batches(self, batch_size: int) -> Iterator[Sequences]:
        """Consecutive sub-batches of at most `batch_size`, each of one task length (so padding
        is minimal for task data), trimmed to their longest sequence."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        start, n = 0, len(self)
        lengths = self.lengths.tolist()
        while start < n:
            stop = start + 1
            while stop < n and stop - start < batch_size and lengths[stop] == lengths[start]:
                stop += 1
            yield self.subset(torch.arange(start, stop))
            start = stop

    def to(self, device) -> Sequences:
        return replace(
            self, tokens=self.tokens.to(device), attention_mask=self.attention_mask.to(device)
        )


# --- the model the sequences are for -----------------------------------------------------------


def task_spec(meta: dict):
    """A checkpoint meta's task: a name, or {"name": ..., **task_options}; None if unknown."""
    task = meta.get("task")
    if isinstance(task, str) and meta.get("task_options"):
        return {"name": task, **meta["task_options"]}
    return task


def _unwrap(model):
    """(model, tokenizer, meta) of a resolved model (`nopeinterp.inputs.ModelInput`, or a loaded
    `Checkpoint`) or of a bare hooked model (no meta). Nothing is loaded here: the entry
    point resolved paths already (`nopeinterp.inputs.as_model`)."""
    if isinstance(model, str | os.PathLike):
        raise TypeError(
            f"{model}: a path; load it first (nopeinterp.inputs.as_model or load_checkpoint)"
        )
    if hasattr(model, "model") and hasattr(model, "meta"):
        return model.model, model.tokenizer, dict(model.meta or {})
    return model, getattr(model, "tokenizer", None), {}


def max_positions(model) -> int | None:
    """The longest sequence `model` can read, read off the model itself; None = no limit.

    A learned position table (our `ape`, a stock TransformerLens "standard" model) has n_ctx
    rows. A stock TL rotary model precomputes sin/cos for n_ctx positions; our own PEs other
    than the learned table have no length limit (our rotary grows its table).
    """
    W_pos = getattr(getattr(model, "pos_embed", None), "W_pos", None)
    if isinstance(W_pos, torch.Tensor):
        return int(W_pos.shape[0])
    if getattr(model, "pe", None) is None and model.cfg.positional_embedding_type == "rotary":
        return int(model.cfg.n_ctx)
    return None


# --- tasks -------------------------------------------------------------------------------------


def resolve_task(task, tokenizer=None, model=None):
    """(Task, tokenizer) from a Task, a name, a dict, a (task, tokenizer) pair or a Checkpoint."""
    from nopeinterp.tasks import get_task, task_tokenizer

    if hasattr(task, "meta") and hasattr(task, "model"):  # a Checkpoint (or a resolved model)
        _, tok, meta = _unwrap(task)
        if task_spec(meta) is None:
            raise ValueError("the model records no task; pass data explicitly")
        tokenizer = tokenizer or tok
        task = task_spec(meta)
    if isinstance(task, tuple):
        task, tokenizer = task
    if isinstance(task, str):
        task = get_task(task)
    elif isinstance(task, Mapping):
        opts = dict(task)
        task = get_task(opts.pop("name"), **opts)
    if getattr(task, "name", None) == "lm":
        raise ValueError(
            "the lm task has no generated items: use `lm-eval` (nopeinterp.lm_eval), or pass "
            "token data (e.g. corpus chunks) to an analysis"
        )
    if tokenizer is None and model is not None:
        tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        tokenizer = task_tokenizer(task)
    return task, tokenizer


def split_of_length(task, length: int) -> str:
    """ "ID" if `length` is in the task's training range, else "OOD"."""
    lo, hi = task.id_lengths
    return "ID" if lo <= length <= hi else "OOD"


def task_examples(task, length: int, n: int | None, *, seed: int = 0):
    """(split, examples): `n` examples of one length from the pool its split is drawn from.

    `n=None`: the task's evaluation set at that length instead (`task.eval_set`, each item
    once, the task's default size: the reproduction protocol's test and validation sets).
    Returns (split, None) when the task has no such held-out example (e.g. SCAN length 1).
    """
    split = split_of_length(task, length)
    try:
        if n is None:
            examples = task.eval_set(SOURCE_SPLIT[split], lengths=[length], seed=seed)
            return split, examples or None
        return split, task.generate(n, lengths=length, seed=seed, split=SOURCE_SPLIT[split])
    except ValueError:
        return split, None


# What one token of a held example costs, in bytes: the task's Python objects (up to ~25 B
# per token measured on copy and SCAN), the encoded ids and mask (int64) and encoding's
# temporaries (~60 B in all measured); rounded up. Counts are refused past what this says.
BYTES_PER_TOKEN = 64


def available_memory() -> int:
    """Bytes this process may still take: MemAvailable (Linux), capped by a cgroup limit;
    else the physical memory."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            found.append(int(limit))
    except OSError:
        pass
    if not found:
        try:
            found.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError, AttributeError):
            return 2**63
    return min(found)


def _size(n_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n_bytes < 1024 or unit == "PiB":
            return f"{n_bytes:.1f} {unit}" if unit != "B" else f"{int(n_bytes)} B"
        n_bytes /= 1024
    return ""  # unreachable


def check_memory(n_sequences: int, tokens: int, what: str) -> None:
    """NopeinterpError (one line, with the estimate) when holding `n_sequences` sequences of
    up to `tokens` tokens at once would not fit in the memory available, before any is made."""
    from nopeinterp.errors import NopeinterpError

    need = n_sequences * max(tokens, 1) * BYTES_PER_TOKEN
    have = available_memory()
    if need > have:
        raise NopeinterpError(
            f"{what}: {n_sequences} sequences of up to {tokens} tokens need about "
            f"{_size(need)} of memory, more than the {_size(have)} available; ask for fewer"
        )


def example_tokens(task, tokenizer, length: int) -> int:
    """Tokens of the longest of a few encoded examples of `task` at `length` (0 if none)."""
    from nopeinterp.tasks import encode_examples

    try:
        examples = task.generate(4, lengths=length, seed=0)
    except ValueError:
        return 0
    return int(encode_examples(tokenizer, examples).attention_mask.sum(1).max())


def task_lengths(task) -> list[int]:
    """Every ID and OOD length of the task that has examples."""
    (a, b), (c, d) = task.id_lengths, task.ood_lengths
    return [n for n in [*range(a, b + 1), *range(c, d + 1)] if task.has_length(n)]


def _encode(name: str, tokenizer, examples) -> Sequences:
    from nopeinterp.tasks import encode_examples

    b = encode_examples(tokenizer, examples)
    return Sequences(b.tokens, b.attention_mask, b.lengths, name, examples=list(examples))


def _concat(name: str, parts: list[Sequences]) -> Sequences:
    width = max(p.tokens.shape[1] for p in parts)

    def pad(t):
        return torch.nn.functional.pad(t, (0, width - t.shape[1]))

    return Sequences(
        torch.cat([pad(p.tokens) for p in parts]),
        torch.cat([pad(p.attention_mask) for p in parts]),
        torch.cat([p.lengths for p in parts]),
        name,
        examples=None
        if any(p.examples is None for p in parts)
        else [e for p in parts for e in p.examples],
    )


def _task_sets(task, tok, *, purpose, id_r, ood_r, n_train, n_eval, n_per_length, seed, fractions):
    longest = example_tokens(task, tok, max(id_r[1], ood_r[1]))
    if n_per_length is not None:
        n_held = n_per_length * (id_r[1] - id_r[0] + ood_r[1] - ood_r[0] + 2)
        counts = f"n_per_length={n_per_length}"
    else:
        n_held = (n_train if purpose == "probe" else 0) + 2 * n_eval
        counts = f"n_train={n_train}, " * (purpose == "probe") + f"n_eval={n_eval}"
    check_memory(n_held, longest, f"{task.name} ({counts})")
    if n_per_length is not None:  # the paper's protocol: n examples at every ID and OOD length
        if n_per_length < 1:
            raise ValueError(f"n_per_length must be >= 1, got {n_per_length}")
        parts: dict[str, list[Sequences]] = {"ID": [], "OOD": []}
        skipped = []
        for length in [*range(id_r[0], id_r[1] + 1), *range(ood_r[0], ood_r[1] + 1)]:
            if not task.has_length(length):
                continue
            split, examples = task_examples(task, length, n_per_length, seed=seed)
            if examples is None:
                skipped.append(length)
                continue
            parts[split].append(_encode(split, tok, examples))
        return {k: _concat(k, v) for k, v in parts.items() if v}, skipped
    sets = {}
    if purpose == "probe":
        train = _encode("train", tok, task.generate(n_train, lengths=id_r, seed=seed))
        sets.update(_random_split(train, fractions, seed))
    for split, rng in (("ID", id_r), ("OOD", ood_r)):
        examples = task.generate(n_eval, lengths=rng, seed=seed, split=SOURCE_SPLIT[split])
        sets[split] = _encode(split, tok, examples)
    return sets, []


def _as_sequences(name, obj, attention_mask=None, lengths=None) -> Sequences:
    if isinstance(obj, Sequences):
        return replace(obj, split=name)
    if isinstance(obj, Mapping) and "tokens" in obj:
        obj, attention_mask, lengths = (
            obj["tokens"],
            obj.get("attention_mask"),
            obj.get("lengths"),
        )
    elif hasattr(obj, "tokens"):
        obj, attention_mask, lengths = (
            obj.tokens,
            getattr(obj, "attention_mask", None),
            getattr(obj, "lengths", None),
        )
    tokens = torch.as_tensor(obj).long()
    if tokens.numel() == 0:
        raise ValueError("no examples in data: no token ids given")
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [batch, pos], got shape {tuple(tokens.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(tokens)
    attention_mask = torch.as_tensor(attention_mask).long()
    if attention_mask.shape != tokens.shape:
        raise ValueError("attention_mask must have the shape of tokens")
    if (attention_mask[:, 1:] > attention_mask[:, :-1]).any():
        raise ValueError("attention_mask must be right-padded (real tokens first in each row)")
    if len(tokens) and (attention_mask[:, 0] == 0).any():
        raise ValueError("every sequence needs at least one real token")
    if lengths is None:
        lengths = attention_mask.sum(1)
    return Sequences(tokens, attention_mask, torch.as_tensor(lengths).long(), name)


def bos_token_id(model, tokenizer=None) -> int | None:
    """The model's BOS token id (recorded by `from_hf`, else its tokenizer's), or None."""
    bos = getattr(model, "bos_token_id", None)
    if bos is None and tokenizer is not None:
        bos = getattr(tokenizer, "bos_token_id", None)
    return None if bos is None else int(bos)


def _pad(rows: list[torch.Tensor], lengths=None, name="all") -> Sequences:
    width = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return _as_sequences(name, tokens, mask, lengths)


def _draw_lengths(ranges: list[tuple[tuple[int, int], int]], g) -> list[int]:
    out = []
    for (lo, hi), n in ranges:
        out += torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return out


def random_sequences(
    model, ranges: list[tuple[tuple[int, int], int]], *, seed: int = 0, tokenizer=None
) -> Sequences:
    """Uniform random token ids of the model's vocabulary: for each ((lo, hi), n) in `ranges`,
    n sequences of a length drawn in lo..hi (tokens, BOS included). The BOS token (see
    `bos_token_id`) comes first and is never drawn elsewhere."""
    g = torch.Generator().manual_seed(seed)
    d_vocab = int(model.cfg.d_vocab)
    bos = bos_token_id(model, tokenizer)
    rows = []
    for length in _draw_lengths(ranges, g):
        ids = torch.randint(0, d_vocab - (bos is not None), (length,), generator=g)
        if bos is not None:
            ids = ids + (ids >= bos).long()  # skip the BOS id
            ids[0] = bos
        rows.append(ids)
    return _pad(rows)


def cut_texts(
    texts: list[str], tokenizer, ranges: list[tuple[int, int]], *, seed: int = 0, bos=None
) -> Sequences:
    """Each document tokenized (BOS first when `bos` is given and the tokenizer did not add
    it), then cut to one prefix per range in `ranges`, its length drawn in that range (capped
    at the document's length when the document reaches the range); a document shorter than a
    range's minimum gives no sequence for it (counted in `dropped`)."""
    g = torch.Generator().manual_seed(seed)
    rows, n_short = [], 0
    for text in texts:
        ids = list(tokenizer(text)["input_ids"])
        if bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        for lo, hi in ranges:
            length = int(torch.randint(lo, hi + 1, (1,), generator=g))
            if len(ids) < lo:
                n_short += 1
                continue
            rows.append(torch.tensor(ids[: min(length, len(ids))], dtype=torch.long))
    if not rows:
        raise ValueError(f"no document reaches the requested lengths {ranges}")
    s = _pad(rows)
    if n_short:
        s.dropped[TOO_SHORT] = n_short
    return s


def read_texts(path) -> list[str]:
    """One document per non-empty line of a UTF-8 text file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason})") from None
    texts = [line for line in lines if line.strip()]
    if not texts:
        raise ValueError(f"{path}: no text (one document per line)")
    return texts


def _random_split(s: Sequences, fractions: dict[str, float], seed: int) -> dict[str, Sequences]:
    """Random disjoint split of `s` by fractions (the last takes the rest)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(s), generator=g)
    out, start = {}, 0
    names = list(fractions)
    for i, name in enumerate(names):
        stop = len(s) if i == len(names) - 1 else start + int(round(fractions[name] * len(s)))
        out[name] = s.subset(perm[start:stop], name)
        start = stop
    return out


def _in_range(lengths: torch.Tensor, rng) -> torch.Tensor:
    return (lengths >= rng[0]) & (lengths <= rng[1])


def _is_task_like(data) -> bool:
    if isinstance(data, str) or (isinstance(data, Mapping) and "name" in data):
        return True
    if (
        isinstance(data, tuple)
        and len(data) == 2
        and (hasattr(data[0], "generate") or isinstance(data[0], str))
    ):
        return True
    if hasattr(data, "meta") and hasattr(data, "model"):  # a Checkpoint
        return True
    return hasattr(data, "generate") and hasattr(data, "id_lengths")


def _is_text(data) -> bool:
    return isinstance(data, list | tuple) and bool(data) and all(isinstance(x, str) for x in data)


def make_sequences(
    data=None,
    model=None,
    *,
    purpose: str = "analysis",
    tokenizer=None,
    attention_mask=None,
    lengths=None,
    id_lengths: tuple[int, int] | None = None,
    ood_lengths: tuple[int, int] | None = None,
    n_train: int = 512,
    n_eval: int = 256,
    n_per_length: int | None = None,
    seed: int = 0,
    val_fraction: float = 0.2,
    test_fraction: float = 0.2,
) -> Splits:
    """Named `Sequences` from `data` (see the module docstring), cut to what `model` can read.

    purpose="probe": "fit" and "val" (probe training and alpha selection, ID lengths) plus the
    held-out "ID" and, when available, "OOD". purpose="analysis": "ID" and "OOD" when lengths
    say what they are, else "all".
    Task data: `n_train` train-pool sequences to fit on, `n_eval` per analysed split, or, with
    `n_per_length`, that many at every ID and OOD length (the paper's attention protocol).
    Token data are split by `lengths` (task length, else token count): ID = within
    `id_lengths` (all, if no range is given), OOD = within `ood_lengths` (or past the ID range).
    For probing, ID sequences are split `test_fraction` held-out ID / the rest probe training
    (of which `val_fraction` choose the ridge penalty), seeded by `seed`.
    Splits left empty are absent; sequences dropped are counted in each set's `dropped`.
    """
    if purpose not in ("probe", "analysis"):
        raise ValueError(f"purpose must be 'probe' or 'analysis', got {purpose!r}")
    for name, n in (("n_train", n_train), ("n_eval", n_eval)):
        if n < 1:
            raise ValueError(f"{name} must be >= 1, got {n}")
    spec = None
    if model is not None:
        model, tok, meta = _unwrap(model)
        tokenizer = tokenizer or tok
        spec = task_spec(meta)
    no_task = model is not None and spec is None
    if data is None and no_task:
        id_lengths = tuple(id_lengths or DEFAULT_ID_LENGTHS)
        ood_lengths = tuple(ood_lengths or DEFAULT_OOD_LENGTHS)
        if n_per_length is not None:  # that many at every ID and OOD length
            ranges = [((n, n), n_per_length) for r in (id_lengths, ood_lengths)
                      for n in range(r[0], r[1] + 1)]  # fmt: skip
        else:
            n_id = n_train + n_eval if purpose == "probe" else n_eval
            ranges = [(id_lengths, n_id), (ood_lengths, n_eval)]
        longest = max(id_lengths[1], ood_lengths[1])
        check_memory(sum(n for _, n in ranges), longest, "random token sequences")
        data = random_sequences(model, ranges, seed=seed, tokenizer=tokenizer)
    if data is None:
        if spec is None:
            raise ValueError(
                "no data given and the model records no task: pass data (a task name, "
                "token ids or texts with a tokenizer)"
            )
        data = spec
    fractions = {"val": val_fraction, "fit": 1 - val_fraction}

    if _is_task_like(data):
        task, tok = resolve_task(data, tokenizer, model)
        id_r = tuple(id_lengths) if id_lengths is not None else tuple(task.id_lengths)
        ood_r = tuple(ood_lengths) if ood_lengths is not None else tuple(task.ood_lengths)
        sets, skipped = _task_sets(
            task,
            tok,
            purpose=purpose,
            id_r=id_r,
            ood_r=ood_r,
            n_train=n_train,
            n_eval=n_eval,
            n_per_length=n_per_length,
            seed=seed,
            fractions=fractions,
        )
        out = _ordered(sets, model)
        out.skipped_lengths = skipped
        out.task, out.tokenizer = task, tok
        return out

    if _is_text(data):
        tok = tokenizer
        if tok is None:
            raise ValueError("texts need a tokenizer: pass tokenizer= or a model that has one")
        if id_lengths is None and ood_lengths is None and not no_task:
            enc = tok(list(data), padding=True, return_tensors="pt")
            data = _as_sequences("all", enc["input_ids"], enc["attention_mask"])
        else:
            id_lengths = tuple(id_lengths or DEFAULT_ID_LENGTHS)
            ood_lengths = tuple(ood_lengths or DEFAULT_OOD_LENGTHS)
            bos = bos_token_id(model, tok) if model is not None else None
            data = cut_texts(list(data), tok, [id_lengths, ood_lengths], seed=seed, bos=bos)

    if isinstance(data, Sequences) and data.split != "all":
        data = {data.split: data}
    if isinstance(data, Mapping) and "tokens" not in data:
        named = {}
        for key, obj in data.items():
            k = {"train": "fit", "fit": "fit", "val": "val", "id": "ID", "ood": "OOD"}.get(
                str(key).lower(), str(key)
            )
            named[k] = _as_sequences(k, obj)
        if purpose == "probe":
            if "fit" not in named:
                raise ValueError("a data mapping for probing needs a 'fit' (or 'train') entry")
            if "val" not in named:
                named.update(_random_split(named.pop("fit"), fractions, seed))
        return _ordered(named, model)

    s = _as_sequences("all", data, attention_mask, lengths)
    if id_lengths is None and ood_lengths is None:
        is_id = torch.ones(len(s), dtype=torch.bool)
        is_ood = torch.zeros(len(s), dtype=torch.bool)
    elif id_lengths is None:
        is_ood = _in_range(s.lengths, ood_lengths)
        is_id = ~is_ood
    else:
        is_id = _in_range(s.lengths, id_lengths)
        is_ood = (
            _in_range(s.lengths, ood_lengths)
            if ood_lengths is not None
            else s.lengths > id_lengths[1]
        )
    sets = {}
    id_set = s.subset(is_id, "ID")
    if purpose == "probe":
        if len(id_set) < 3:
            raise ValueError(f"need at least 3 ID-length sequences to probe, got {len(id_set)}")
        rest = 1 - test_fraction
        sets.update(
            _random_split(
                id_set,
                {"ID": test_fraction, "val": rest * val_fraction, "fit": rest * (1 - val_fraction)},
                seed,
            )
        )
    elif is_ood.any() or id_lengths is not None:
        sets["ID"] = id_set
    else:
        sets["all"] = replace(id_set, split="all")
    if is_ood.any():
        sets["OOD"] = s.subset(is_ood, "OOD")
    return _ordered(sets, model)


class Splits(dict):
    """split name -> Sequences, in a fixed order; `dropped` keeps, per split, what was left out
    and why, including splits that were left empty and are therefore absent."""

    dropped: dict[str, dict[str, int]]
    skipped_lengths: list[int]  # task lengths with no held-out example (e.g. SCAN length 1)
    task: object | None  # the Task the sequences were generated from (None for token data)
    tokenizer: object | None  # its tokenizer (None for token data)

    def meta(self) -> dict:
        """Counts for a result's meta: n_seq_<split>, n_tok_<split>, lengths_<split> and
        dropped_<split> ({reason: n})."""
        out = {}
        for k, v in self.items():
            out[f"n_seq_{k}"] = len(v)
            out[f"n_tok_{k}"] = v.n_tokens
            out[f"lengths_{k}"] = (int(v.lengths.min()), int(v.lengths.max()))
        out.update({f"dropped_{k}": dict(d) for k, d in self.dropped.items()})
        if self.skipped_lengths:
            out["lengths_without_examples"] = list(self.skipped_lengths)
        return out


def as_splits(sets: Mapping[str, Sequences], model=None) -> Splits:
    """Named `Sequences` already made (e.g. a subset of other `Splits`) as `Splits`, in the
    fixed order and cut to what `model` can read; nothing else is converted."""
    return _ordered({k: replace(v, split=k) for k, v in sets.items()}, _unwrap(model)[0])


def _ordered(sets: dict[str, Sequences], model=None) -> Splits:
    """Sets in a fixed order, each cut to what `model` can read. A split left empty (usually
    OOD for a learned-APE model) is absent, its count kept in `Splits.dropped`."""
    if model is not None:
        limit = max_positions(model)
        sets = {k: v.readable_by(limit) for k, v in sets.items()}
    order = [k for k in SPLIT_ORDER if k in sets] + [k for k in sets if k not in SPLIT_ORDER]
    out = Splits((k, sets[k]) for k in order if len(sets[k]))
    out.dropped = {k: dict(sets[k].dropped) for k in order if sets[k].dropped}
    out.skipped_lengths = []
    out.task = out.tokenizer = None
    return out


__all__ = [
    "DEFAULT_ID_LENGTHS",
    "DEFAULT_OOD_LENGTHS",
    "NOT_READABLE",
    "TOO_SHORT",
    "SOURCE_SPLIT",
    "Sequences",
    "Splits",
    "as_splits",
    "bos_token_id",
    "cut_texts",
    "make_sequences",
    "max_positions",
    "random_sequences",
    "read_texts",
    "resolve_task",
    "split_of_length",
    "task_spec",
    "task_examples",
    "task_lengths",
]
