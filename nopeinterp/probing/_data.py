"""Shared plumbing of the probes: turning `data` into named sequence sets, and streaming
activations of a few hook points batch by batch.

`data` may be
  - a token tensor [B, T] (optional ``attention_mask`` [B, T], right-padded; optional
    per-sequence ``lengths`` [B], default the number of real tokens),
  - a ``nopeinterp.tasks.Batch`` (or anything with ``.tokens``/``.attention_mask``/``.lengths``),
  - a task: a ``Task``, a task name, or a ``(task, tokenizer)`` pair; teacher-forced
    ``<bos> prompt target <eos>`` sequences are generated (train / val / test splits),
  - a mapping of set name -> one of the first two (keys among "fit"/"train", "val", "ID", "OOD").
Every real token's probe label is its absolute index in the row (0 = <bos>).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm


@dataclass
class SequenceSet:
    name: str
    tokens: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long, right-padded
    lengths: torch.Tensor  # [B] the task's length, or the token count
    n_not_readable: int = 0  # sequences dropped: longer than the model's position table

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def subset(self, idx: torch.Tensor, name: str | None = None) -> SequenceSet:
        return SequenceSet(
            name or self.name, self.tokens[idx], self.attention_mask[idx], self.lengths[idx]
        )

    @property
    def n_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def readable_by(self, limit: int | None) -> SequenceSet:
        """The sequences of at most `limit` tokens (all if None), padding trimmed to fit."""
        if limit is None:
            return self
        keep = (self.attention_mask.sum(1) <= limit).nonzero().flatten()
        out = self.subset(keep)
        width = int(out.attention_mask.sum(1).max()) if len(out) else 0
        return SequenceSet(
            out.name, out.tokens[:, :width], out.attention_mask[:, :width], out.lengths
        )


def _as_set(name, tokens, attention_mask=None, lengths=None) -> SequenceSet:
    tokens = torch.as_tensor(tokens).long()
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [batch, pos], got shape {tuple(tokens.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(tokens)
    attention_mask = torch.as_tensor(attention_mask).long()
    if attention_mask.shape != tokens.shape:
        raise ValueError("attention_mask must have the shape of tokens")
    if (attention_mask[:, 1:] > attention_mask[:, :-1]).any():
        raise ValueError("attention_mask must be right-padded (real tokens first in each row)")
    if (attention_mask[:, 0] == 0).any():
        raise ValueError("every sequence needs at least one real token")
    if lengths is None:
        lengths = attention_mask.sum(1)
    return SequenceSet(name, tokens, attention_mask, torch.as_tensor(lengths).long())


def _from_obj(name, obj, attention_mask=None, lengths=None) -> SequenceSet:
    if hasattr(obj, "tokens"):
        return _as_set(name, obj.tokens, getattr(obj, "attention_mask", None), obj.lengths)
    return _as_set(name, obj, attention_mask, lengths)


def _in_range(lengths: torch.Tensor, rng) -> torch.Tensor:
    lo, hi = rng
    return (lengths >= lo) & (lengths <= hi)


def _split(s: SequenceSet, fractions: dict[str, float], seed: int) -> dict[str, SequenceSet]:
    """Random disjoint split of the sequences of `s` by fractions (last takes the rest)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(s), generator=g)
    out, start = {}, 0
    names = list(fractions)
    for i, name in enumerate(names):
        stop = len(s) if i == len(names) - 1 else start + int(round(fractions[name] * len(s)))
        out[name] = s.subset(perm[start:stop], name)
        start = stop
    return out


def resolve_task(task, tokenizer=None, model=None):
    """(Task, tokenizer) from a Task / name / dict / (task, tokenizer) pair."""
    from nopeinterp.tasks import get_task, task_tokenizer

    if isinstance(task, tuple):
        task, tokenizer = task
    if isinstance(task, str):
        task = get_task(task)
    elif isinstance(task, Mapping):
        opts = dict(task)
        task = get_task(opts.pop("name"), **opts)
    if tokenizer is None and model is not None:
        tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        tokenizer = task_tokenizer(task)
    return task, tokenizer


def _is_task_like(data) -> bool:
    if isinstance(data, str):
        return True
    if isinstance(data, tuple) and len(data) == 2 and hasattr(data[0], "generate"):
        return True
    if isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], str):
        return True
    return hasattr(data, "generate") and hasattr(data, "id_lengths")


def resolve_sets(
    data,
    *,
    purpose: str,
    model=None,
    attention_mask=None,
    lengths=None,
    tokenizer=None,
    id_lengths=None,
    ood_lengths=None,
    n_train: int = 512,
    n_eval: int = 256,
    seed: int = 0,
    val_fraction: float = 0.2,
    test_fraction: float = 0.2,
) -> dict[str, SequenceSet]:
    """Named sequence sets.

    purpose="probe": "fit" and "val" (probe training and alpha selection, ID lengths) plus
    "ID" (held-out ID sequences) and "OOD" when available.
    purpose="analysis": "ID" and "OOD" when lengths say what they are, else "all".
    """
    if purpose not in ("probe", "analysis"):
        raise ValueError(purpose)
    if _is_task_like(data):
        from nopeinterp.tasks import encode_examples

        task, tok = resolve_task(data, tokenizer, model)
        id_r = tuple(id_lengths) if id_lengths is not None else tuple(task.id_lengths)
        ood_r = tuple(ood_lengths) if ood_lengths is not None else tuple(task.ood_lengths)

        def make(name, n, split, rng):
            exs = task.generate(n, lengths=rng, seed=seed, split=split)
            return _from_obj(name, encode_examples(tok, exs))

        sets = {}
        if purpose == "probe":
            train = make("train", n_train, "train", id_r)
            sets.update(_split(train, {"val": val_fraction, "fit": 1 - val_fraction}, seed))
        sets["ID"] = make("ID", n_eval, "val", id_r)
        sets["OOD"] = make("OOD", n_eval, "test", ood_r)
        return _ordered(sets, model)

    if isinstance(data, Mapping):
        named = {}
        for key, obj in data.items():
            k = {"train": "fit", "fit": "fit", "val": "val", "id": "ID", "ood": "OOD"}.get(
                str(key).lower(), str(key)
            )
            named[k] = _from_obj(k, obj)
        if purpose == "probe":
            if "fit" not in named:
                raise ValueError("a data mapping for probing needs a 'fit' (or 'train') entry")
            if "val" not in named:
                named.update(
                    _split(named.pop("fit"), {"val": val_fraction, "fit": 1 - val_fraction}, seed)
                )
        return _ordered(named, model)

    s = _from_obj("all", data, attention_mask, lengths)
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
    id_set = s.subset(is_id.nonzero().flatten(), "ID")
    if purpose == "probe":
        if len(id_set) < 3:
            raise ValueError(f"need at least 3 ID-length sequences to probe, got {len(id_set)}")
        rest = 1 - test_fraction
        sets.update(
            _split(
                id_set,
                {"ID": test_fraction, "val": rest * val_fraction, "fit": rest * (1 - val_fraction)},
                seed,
            )
        )
    elif is_ood.any() or id_lengths is not None:
        sets["ID"] = id_set
    else:
        sets["all"] = id_set
    if is_ood.any():
        sets["OOD"] = s.subset(is_ood.nonzero().flatten(), "OOD")
    return _ordered(sets, model)


def _ordered(sets: dict[str, SequenceSet], model=None) -> dict[str, SequenceSet]:
    """Non-empty sets in a fixed order, each cut to what `model` can read.

    A learned-APE model cannot read past its table (n_ctx): longer sequences are left out
    (counted in `n_not_readable`), and a split left empty (usually OOD) is absent.
    """
    if model is not None:
        from nopeinterp.evaluation import max_positions

        sets = {k: v.readable_by(max_positions(model)) for k, v in sets.items()}
    order = ["fit", "val", "ID", "OOD", "all"]
    out = {k: sets[k] for k in order if k in sets and len(sets[k])}
    out.update({k: v for k, v in sets.items() if k not in out and len(v)})
    return out


def block_of(hook_name: str) -> int:
    return int(hook_name.split(".")[1])


def stream(
    model,
    s: SequenceSet,
    hook_names: Mapping,
    *,
    batch_size: int,
    bytes_per_item: int,
    max_cache_mb: float,
    progress: bool,
    desc: str,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, dict]]:
    """Yield (batch index [b], attention mask [b, t], {key: activation}) for every batch.

    `hook_names`: key -> TL hook name, or a tuple of names that are cached together (the
    yielded value is then the tuple of activations). Only those are cached (names_filter), the forward pass
    stops after the last block needed, and when caching all hooks of a batch at once would
    exceed `max_cache_mb` (estimated as `bytes_per_item(t)` per hook and sequence), the hooks
    are split over several passes of that batch, so memory is bounded by the budget rather
    than by the number of layers. Sequences are batched in order of length (less padding).
    """
    lens = s.attention_mask.sum(1)
    order = torch.argsort(lens, descending=True, stable=True)
    groups = {k: (v,) if isinstance(v, str) else tuple(v) for k, v in hook_names.items()}
    keys = sorted(groups, key=lambda k: max(block_of(n) for n in groups[k]))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    plan = []
    for idx in batches:
        t = int(lens[idx].max())
        per_hook = bytes_per_item(t) * len(idx)
        k = max(1, int(max_cache_mb * 2**20 // max(per_hook, 1)))
        plan.append((idx, t, [keys[i : i + k] for i in range(0, len(keys), k)]))
    total = sum(len(chunks) for _, _, chunks in plan)
    with (
        torch.inference_mode(),
        tqdm(total=total, desc=desc, disable=not progress, leave=False) as bar,
    ):
        for idx, t, chunks in plan:
            tokens = s.tokens[idx, :t]
            mask = s.attention_mask[idx, :t]
            for chunk in chunks:
                names = {n for k in chunk for n in groups[k]}
                stop = max(block_of(n) for n in names) + 1
                _, cache = model.run_with_cache(
                    tokens,
                    attention_mask=mask,
                    names_filter=lambda name, names=names: name in names,
                    stop_at_layer=stop,
                    return_cache_object=False,
                )
                yield (
                    idx,
                    mask,
                    {
                        k: cache[hook_names[k]]
                        if isinstance(hook_names[k], str)
                        else tuple(cache[n] for n in groups[k])
                        for k in chunk
                    },
                )
                del cache
                bar.update(1)
