"""Greedy decoding and exact-match accuracy per length (the paper's metric).

`greedy_decode` is the one decoding routine: the trainer's validation, `evaluate` and the CLI
all call it. Prompts are left-padded so a batch decodes in lock step; the padding is masked,
and absolute embeddings read positions from the attention mask, so every PE sees the same
positions as it would unpadded.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

from nopeinterp.tasks import Example, decode_answer, encode_examples, get_task

log = logging.getLogger(__name__)


def _left_pad(batch, pad_id):
    """Right-padded prompts -> left-padded (tokens, attention_mask)."""
    lengths = batch.attention_mask.sum(1)
    width = int(lengths.max())
    tokens = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, n in enumerate(lengths.tolist()):
        tokens[i, width - n :] = batch.tokens[i, :n]
        mask[i, width - n :] = 1
    return tokens, mask


def max_sequence_length(tokenizer, examples: Sequence[Example]) -> int:
    """Tokens of the longest teacher-forced sequence <bos> prompt target <eos>."""
    return int(encode_examples(tokenizer, examples).attention_mask.sum(1).max())


@torch.inference_mode()
def greedy_decode(
    model, tokenizer, examples: Sequence[Example], *, max_new_tokens=None, use_cache=True
) -> list[str]:
    """Greedy continuations of the examples' prompts, cut at <eos>.

    `max_new_tokens` defaults to the longest target + 1 (for <eos>): a longer answer cannot
    be an exact match. `use_cache=False` re-runs the whole sequence at every step (slow; it
    is the reference the KV-cache path is tested against).
    """
    prompts = encode_examples(tokenizer, examples, with_target=False)
    if max_new_tokens is None:
        max_new_tokens = 1 + max(
            len(tokenizer(e.target, add_special_tokens=False)["input_ids"]) for e in examples
        )
    tokens, mask = _left_pad(prompts, tokenizer.pad_token_id)
    batch = len(examples)
    eos = tokenizer.eos_token_id
    done = torch.zeros(batch, dtype=torch.bool)
    generated = []
    cache = (
        TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, batch)
        if use_cache
        else None
    )
    logits = model(tokens, attention_mask=mask, past_kv_cache=cache)
    for _ in range(max_new_tokens):
        next_token = logits[:, -1].argmax(-1)
        next_token = torch.where(done, torch.full_like(next_token, eos), next_token)
        generated.append(next_token)
        done |= next_token == eos
        if done.all():
            break
        if use_cache:
            logits = model(
                next_token[:, None],
                attention_mask=torch.ones(batch, 1, dtype=torch.long),
                past_kv_cache=cache,
            )
        else:
            tokens = torch.cat([tokens, next_token[:, None]], 1)
            mask = torch.cat([mask, torch.ones(batch, 1, dtype=torch.long)], 1)
            logits = model(tokens, attention_mask=mask)
    out = torch.stack(generated, 1)
    return [decode_answer(tokenizer, row) for row in out]


def exact_match(model, tokenizer, task, examples, *, batch_size=64, use_cache=True) -> list[bool]:
    """Per-example exact match of greedy answers; batches sorted by prompt length."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].prompt.split()))
    correct = [False] * len(examples)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        chunk = [examples[i] for i in idx]
        answers = greedy_decode(model, tokenizer, chunk, use_cache=use_cache)
        for i, ex, answer in zip(idx, chunk, answers, strict=True):
            correct[i] = task.is_correct(ex, answer)
    return correct


def max_positions(model) -> int | None:
    """Longest sequence the model can read: n_ctx for learned APE, unlimited otherwise."""
    return model.cfg.n_ctx if getattr(model, "pe", None) == "ape" else None


def evaluate(
    checkpoint,
    *,
    lengths=None,
    n: int = 200,
    batch_size: int = 64,
    seed: int = 0,
    use_cache: bool = True,
    progress: bool = True,
    name: str | None = None,
) -> pd.DataFrame:
    """Exact-match accuracy per length: one row per length.

    `checkpoint`: a path or a loaded `Checkpoint`. `lengths` default: the task's ID and OOD
    ranges. ID lengths are drawn from the "val" split, OOD lengths from "test", so no
    evaluated example was trained on. Columns: model, pe, task, length, split (ID/OOD), n,
    correct, accuracy, evaluable. A learned-APE model asked for sequences past its table gets
    evaluable=False and accuracy NaN for those lengths (it cannot read them).
    """
    from nopeinterp.checkpoint import Checkpoint, load_checkpoint

    for key, value in (("n", n), ("batch_size", batch_size)):
        if value < 1:
            raise ValueError(f"{key} must be >= 1, got {value}")
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint)
    task = get_task(ckpt.meta["task"], **ckpt.meta.get("task_options", {}))
    id_lo, id_hi = task.id_lengths
    if lengths is None:
        lengths = [*task.split_lengths("train"), *task.split_lengths("test")]
    task._resolve_lengths(list(lengths), "test")  # lengths outside the task's range: ValueError
    limit = max_positions(ckpt.model)
    name = name or (ckpt.path.stem if ckpt.path else ckpt.pe)
    rows, skipped = [], []
    for length in tqdm(list(lengths), desc=f"eval {name}", disable=not progress, leave=False):
        split = "ID" if id_lo <= length <= id_hi else "OOD"
        if not task.has_length(length):
            continue
        try:
            examples = task.generate(
                n, lengths=length, seed=seed, split="val" if split == "ID" else "test"
            )
        except ValueError:  # e.g. SCAN length 1: no held-out command of that length
            skipped.append(length)
            continue
        row = {
            "model": name,
            "pe": ckpt.pe,
            "task": task.name,
            "length": length,
            "split": split,
            "n": len(examples),
        }
        if limit is not None and max_sequence_length(ckpt.tokenizer, examples) > limit:
            rows.append({**row, "correct": 0, "accuracy": math.nan, "evaluable": False})
            continue
        correct = exact_match(
            ckpt.model, ckpt.tokenizer, task, examples, batch_size=batch_size, use_cache=use_cache
        )
        rows.append(
            {
                **row,
                "correct": sum(correct),
                "accuracy": sum(correct) / len(correct),
                "evaluable": True,
            }
        )
    if not rows:
        raise ValueError(f"no evaluable lengths among {list(lengths)} for task {task.name}")
    if skipped:  # expected (SCAN has no held-out command of some lengths): one quiet line
        log.info("evaluate %s: no held-out examples of length %s, skipped", name, skipped)
    table = pd.DataFrame(rows)
    table.attrs["skipped_lengths"] = skipped
    return table


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """ID / OOD accuracy per model: mean over evaluable lengths, weighted by examples.

    A split whose lengths were all not evaluable (learned APE past its table) gets NaN.
    """
    t = table.assign(
        ok_correct=table["correct"].where(table["evaluable"], 0),
        ok_n=table["n"].where(table["evaluable"], 0),
        not_evaluable=~table["evaluable"],
    )
    g = t.groupby(["model", "pe", "split"], sort=False)[
        ["ok_correct", "ok_n", "not_evaluable"]
    ].sum()
    out = pd.DataFrame(
        {
            "accuracy": (g["ok_correct"] / g["ok_n"].where(g["ok_n"] > 0)),
            "n": g["ok_n"].astype(int),
            "lengths_not_evaluable": g["not_evaluable"].astype(int),
        }
    )
    return out.reset_index()


def save_evaluation(table: pd.DataFrame, out_dir) -> list:
    """CSV of the per-length table and summary, and an offline HTML figure."""
    from pathlib import Path

    from nopeinterp.viz.evaluation import accuracy_figure
    from nopeinterp.viz.html import atomic_write_text, write_report

    out_dir = Path(out_dir)
    paths = [
        atomic_write_text(out_dir / "accuracy_by_length.csv", table.to_csv(index=False)),
        atomic_write_text(out_dir / "accuracy_summary.csv", summarize(table).to_csv(index=False)),
    ]
    paths.append(
        write_report(
            out_dir / "accuracy.html",
            "Exact match by length",
            [
                ("Accuracy vs length", accuracy_figure(table)),
                ("Summary", summarize(table)),
                ("Per length", table),
            ],
        )
    )
    return paths
