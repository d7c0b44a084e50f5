"""Greedy decoding and exact-match accuracy per length (the paper's metric).

`greedy_decode` is the one decoding routine: the trainer's validation, `evaluate` and the CLI
all call it. Prompts are left-padded so a batch decodes in lock step; the padding is masked,
and absolute embeddings read positions from the attention mask, so every PE sees the same
positions as it would unpadded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import pandas as pd
import torch

from nopeinterp.data import (
    check_memory,
    example_tokens,
    max_positions,
    resolve_task,
    task_examples,
    task_lengths,
)
from nopeinterp.inputs import ModelInput, as_model
from nopeinterp.options import EvalOptions
from nopeinterp.progress import progress as progress_bar
from nopeinterp.results import Result
from nopeinterp.tasks import Example, decode_answer, encode_examples
from nopeinterp.tasks.scratchpad import score_steps


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


# Each item's decode bound comes from its own gold target, never from the items batched with
# it, so an item's score does not depend on its batch. An answer longer than its target cannot
# be an exact match, so the target + 1 tokens (for <eos>) suffice; a scratchpad answer is read
# after the closing marker, so a scratchpad longer than the gold one can still end in the right
# answer: those items get SCRATCHPAD_BOUND_FACTOR times their target (the paper's scratchpad
# runs decode up to 1,500 tokens).
SCRATCHPAD_BOUND_FACTOR = 2
# what a record says of the bound its test decoded with (records without it: the batch's
# longest target + 1, for every item of the batch)
DECODE_BOUND = f"per item: target + 1 tokens; x{SCRATCHPAD_BOUND_FACTOR} with a scratchpad"


def bound_factor(task) -> int:
    """How many times its target an item of `task` (None: a task without a scratchpad) may
    decode (see SCRATCHPAD_BOUND_FACTOR)."""
    return SCRATCHPAD_BOUND_FACTOR if getattr(task, "scratchpad", "") else 1


def decode_bounds(tokenizer, examples: Sequence[Example], factor: int) -> torch.Tensor:
    """Each example's decode bound in tokens: `factor` x its target's tokens, + 1 for <eos>."""
    return torch.tensor(
        [
            factor * len(tokenizer(e.target, add_special_tokens=False)["input_ids"]) + 1
            for e in examples
        ]
    )


@torch.inference_mode()
def greedy_decode(
    model,
    tokenizer,
    examples: Sequence[Example],
    *,
    max_new_tokens=None,
    factor: int = 1,
    use_cache=True,
) -> list[str]:
    """Greedy continuations of the examples' prompts, cut at <eos>.

    `max_new_tokens` defaults to each example's own bound (`decode_bounds` with `factor`:
    `bound_factor(task)`), so a row's answer never depends on the rows batched with it; an
    int bounds every row alike. `use_cache=False` re-runs the whole sequence at every step
    (slow; it is the reference the KV-cache path is tested against).
    """
    prompts = encode_examples(tokenizer, examples, with_target=False)
    if max_new_tokens is None:
        max_new_tokens = decode_bounds(tokenizer, examples, factor)
    tokens, mask = _left_pad(prompts, tokenizer.pad_token_id)
    out = greedy_ids(
        model, tokens, mask, max_new_tokens, tokenizer.eos_token_id, use_cache=use_cache
    )
    return [decode_answer(tokenizer, row) for row in out]


@torch.inference_mode()
def greedy_ids(model, tokens, mask, max_new_tokens, eos: int | None, *, use_cache=True):
    """Greedy continuation ids [B, <= max_new_tokens] (on the CPU) of left-padded prompts
    `tokens` with `mask` (1 on real tokens); `max_new_tokens`: an int, or one bound per row (a
    tensor; needs `eos`). A row that produced `eos` or reached its bound continues with `eos`,
    and decoding stops once every row has (never, for `eos` None)."""
    from nopeinterp._tl import init_kv_cache

    device = model.cfg.device
    tokens, mask = tokens.to(device), mask.to(device)
    batch = len(tokens)
    limits = torch.as_tensor(max_new_tokens, device=device).expand(batch)
    if eos is None and bool((limits != limits.max()).any()):
        raise ValueError("bounds that differ between rows need an <eos> token to pad with")
    longest = int(limits.max())
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    generated = []
    cache = init_kv_cache(model, batch) if use_cache else None
    logits = model(tokens, attention_mask=mask, past_kv_cache=cache)
    for _ in range(longest):
        next_token = logits[:, -1].argmax(-1)
        if eos is not None:
            next_token = torch.where(done, torch.full_like(next_token, eos), next_token)
            done |= next_token == eos
        generated.append(next_token)
        done |= limits <= len(generated)  # at its bound: <eos> from here on
        if done.all() or len(generated) == longest:
            break
        if use_cache:
            logits = model(
                next_token[:, None],
                attention_mask=torch.ones(batch, 1, dtype=torch.long, device=device),
                past_kv_cache=cache,
            )
        else:
            tokens = torch.cat([tokens, next_token[:, None]], 1)
            mask = torch.cat([mask, torch.ones(batch, 1, dtype=torch.long, device=device)], 1)
            logits = model(tokens, attention_mask=mask)
    return torch.stack(generated, 1).cpu()


def greedy_answers(
    model, tokenizer, examples, *, task=None, batch_size=64, use_cache=True
) -> list[str]:
    """Greedy answers in the examples' order; batches sorted by prompt length (less padding).
    Each example decodes to its own bound (`decode_bounds`), `bound_factor(task)` times its
    target."""
    factor = bound_factor(task)
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].prompt.split()))
    answers = [""] * len(examples)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        chunk = [examples[i] for i in idx]
        decoded = greedy_decode(model, tokenizer, chunk, factor=factor, use_cache=use_cache)
        for i, answer in zip(idx, decoded, strict=True):
            answers[i] = answer
    return answers


def exact_match(model, tokenizer, task, examples, *, batch_size=64, use_cache=True) -> list[bool]:
    """Per-example exact match of greedy answers (each decoded to its own bound)."""
    answers = greedy_answers(
        model, tokenizer, examples, task=task, batch_size=batch_size, use_cache=use_cache
    )
    return [task.is_correct(ex, a) for ex, a in zip(examples, answers, strict=True)]


def scratchpad_columns(examples, answers) -> dict:
    """Step scores of one length's answers: `steps_right` (mean share of gold steps written
    right, at their index), `all_steps_right` (items with every step right and no extra one)
    and `first_wrong_step` (mean index of the first wrong or missing step, over the items
    that have one; NaN when none has)."""
    scores = [score_steps(ex.target, a) for ex, a in zip(examples, answers, strict=True)]
    wrong = [s.first_wrong for s in scores if s.first_wrong is not None]
    return {
        "steps_right": sum(s.share_right for s in scores) / len(scores),
        "all_steps_right": len(scores) - len(wrong),
        "first_wrong_step": sum(wrong) / len(wrong) if wrong else math.nan,
    }


ERROR_KINDS = ("correct", "too short", "too long", "wrong words")


def error_kind(task, example: Example, answer: str) -> str:
    """How an answer fails, by its length in words against the target's: 'too short' (stopped
    early), 'too long' (did not stop in time; greedy decoding stops one token past the longest
    target, so any longer answer shows), 'wrong words' (the right length), or 'correct'."""
    if task.is_correct(example, answer):
        return "correct"
    got, want = len(answer.split()), len(example.target.split())
    return "too short" if got < want else "too long" if got > want else "wrong words"


@dataclass(repr=False)
class EvalResult(Result):
    """Exact match per length (`table`, one row per model and length) and its ID / OOD
    `summary`."""

    name: ClassVar[str] = "accuracy"
    title: ClassVar[str] = "Exact match by length"

    @property
    def summary(self) -> pd.DataFrame:
        """ID / OOD accuracy per model: mean over evaluable lengths, weighted by examples.

        A split whose lengths were all not evaluable (learned APE past its table) gets NaN.
        With error kinds counted (`evaluate(error_kinds=True)`), each kind's share of the items.
        """
        table = self.table
        kinds = [k for k in ERROR_KINDS[1:] if k in table]
        t = table.assign(
            ok_correct=table["correct"].where(table["evaluable"], 0),
            ok_n=table["n"].where(table["evaluable"], 0),
            not_evaluable=~table["evaluable"].astype(bool),
        )
        steps = "steps_right" in table
        if steps:  # a share per item: weighted by items, like the accuracy
            t["ok_steps"] = (table["steps_right"] * table["n"]).where(table["evaluable"], 0)
            t["ok_all_steps"] = table["all_steps_right"].where(table["evaluable"], 0)
        step_cols = ["ok_steps", "ok_all_steps"] if steps else []
        g = t.groupby(["model", "pe", "split"], sort=False)[
            ["ok_correct", "ok_n", "not_evaluable", *kinds, *step_cols]
        ].sum()
        n = g["ok_n"].where(g["ok_n"] > 0)
        out = pd.DataFrame(
            {
                "accuracy": g["ok_correct"] / n,
                "n": g["ok_n"].astype(int),
                "lengths_not_evaluable": g["not_evaluable"].astype(int),
                **{k: g[k] / n for k in kinds},
                **(
                    {"steps_right": g["ok_steps"] / n, "all_steps_right": g["ok_all_steps"] / n}
                    if steps
                    else {}
                ),
            }
        )
        return out.reset_index()

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"accuracy_by_length": self.table, "accuracy_summary": self.summary}

    @classmethod
    def concat(cls, results) -> EvalResult:
        """Several models' results as one (their tables stacked)."""
        results = list(results)
        meta = {"models": [r.meta.get("model") for r in results]}
        for key in ("n", "seed"):  # what the results share (e.g. examples per length)
            values = {repr(r.meta.get(key)) for r in results}
            if len(values) == 1 and key in results[0].meta:
                meta[key] = results[0].meta[key]
        return cls(pd.concat([r.table for r in results], ignore_index=True), meta)


def accuracy_by_split(summary: pd.DataFrame, keys) -> pd.DataFrame:
    """`EvalResult.summary` (joined with any identity columns `keys` name, e.g. task and seed)
    as one accuracy column per split, ID then OOD: one row per `keys`, in order of appearance
    (a row with no accuracy at all is left out, as `pivot_table` does)."""
    wide = summary.pivot_table(index=list(keys), columns="split", values="accuracy", sort=False)
    return wide.reindex(columns=["ID", "OOD"]).reset_index()


def model_and_task(model, data=None, name: str | None = None, *, device=None):
    """(ModelInput, Task, tokenizer) of a model and its task: `data` (a task name, Task, dict
    or (task, tokenizer) pair) or, when None, the checkpoint's own task with its options."""
    mi = as_model(model, name, device=device)
    if data is None:
        data = mi.task_spec
        if data is None:
            raise ValueError(f"{mi.name}: records no task; pass data= (a task name or Task)")
    task, tokenizer = resolve_task(data, mi.tokenizer, mi.model)
    return mi, task, tokenizer


def evaluate(model, data=None, *, options: EvalOptions | None = None, **changes) -> EvalResult:
    """Exact-match accuracy per length (greedy decoding): one row per length.

    `model`: a hooked model (ours, `from_hf`, a TL model), a Checkpoint or a checkpoint path. `data`: the task (a
    name, a Task, a dict with options, or a (task, tokenizer) pair); None = the checkpoint's
    task with its options. `lengths` default: the task's ID and OOD ranges. Examples come from
    the pool `nopeinterp.data` assigns each split (ID: "val", OOD: "test"), so no evaluated
    example was trained on. Columns: model, pe, task, length, split (ID/OOD), n, correct,
    accuracy, evaluable. A model asked for sequences past its position table gets
    evaluable=False and accuracy NaN for those lengths (it cannot read them). Lengths with no
    held-out example (SCAN length 1) are listed in meta["lengths_without_examples"].
    `n=None`: each length's items of the task's evaluation set instead (`Task.eval_set`: every
    item once, the task's default size; SCAN's OOD lengths: the whole pool).
    `error_kinds=True` adds one count column per kind of wrong answer (`ERROR_KINDS`: too
    short, too long, wrong words; see `error_kind`). A task with a scratchpad is scored on the
    answer after its closing marker, and gets the step columns of `scratchpad_columns`. Options
    (`nopeinterp.options.EvalOptions`): `options=` or any of its fields.
    """
    opts = EvalOptions.make(options, **changes)
    mi, task, tokenizer = model_and_task(model, data, opts.name, device=opts.device)
    return run_evaluate(mi, task, tokenizer, opts)


def run_evaluate(mi: ModelInput, task, tokenizer, opts: EvalOptions) -> EvalResult:
    """Exact match of `mi` on `task` (resolved), at `opts.lengths` (default the task's)."""
    n, seed = opts.n, opts.seed
    if opts.lengths is None:
        lengths = task_lengths(task)
    else:
        lengths = list(opts.lengths)
        bad = [x for x in lengths if not task.min_length <= x <= task.max_length]
        if bad:
            raise ValueError(
                f"{task.name}: invalid lengths {bad}; this task's lengths are "
                f"{task.min_length}-{task.max_length} (trained on {task.id_lengths[0]}-"
                f"{task.id_lengths[1]}, OOD {task.ood_lengths[0]}-{task.ood_lengths[1]})"
            )
    if n is not None and lengths:  # one length's examples are held at a time
        check_memory(n, example_tokens(task, tokenizer, max(lengths)), f"eval {mi.name}")
    limit = max_positions(mi.model)
    pe = mi.meta.get("pe", getattr(mi.model, "pe", None))
    rows, skipped = [], []
    for length in progress_bar(
        list(lengths), desc=f"eval {mi.name}", disable=not opts.progress, leave=False
    ):
        if not task.has_length(length):
            continue
        split, examples = task_examples(task, length, n, seed=seed)
        if examples is None:  # e.g. SCAN length 1: no held-out command of that length
            skipped.append(length)
            continue
        row = {
            "model": mi.name,
            "pe": pe,
            "task": task.name,
            "length": length,
            "split": split,
            "n": len(examples),
        }
        if limit is not None and max_sequence_length(tokenizer, examples) > limit:
            rows.append({**row, "correct": 0, "accuracy": math.nan, "evaluable": False})
            continue
        answers = greedy_answers(
            mi.model, tokenizer, examples, task=task, batch_size=opts.batch_size,
            use_cache=opts.use_cache,
        )  # fmt: skip
        kinds = [error_kind(task, ex, a) for ex, a in zip(examples, answers, strict=True)]
        correct = kinds.count("correct")
        row = {**row, "correct": correct, "accuracy": correct / len(kinds), "evaluable": True}
        if opts.error_kinds:
            row.update({k: kinds.count(k) for k in ERROR_KINDS[1:]})
        if task.scratchpad:
            row.update(scratchpad_columns(examples, answers))
        rows.append(row)
    if not rows:
        raise ValueError(f"no evaluable lengths among {list(lengths)} for task {task.name}")
    meta = {"title": f"Exact match by length: {mi.name}", "model": mi.name, "n": n, "seed": seed}
    if skipped:
        meta["lengths_without_examples"] = skipped
    return EvalResult(pd.DataFrame(rows), meta)
