"""Language-model length generalization: loss at each position past the training context,
perplexity per length, and passkey retrieval.

Loss by position (``lm_eval``): the corpus's test split as one token stream (its documents in
name order, each ended by ``<|endoftext|>``: ``tasks.lm``), cut into windows of each evaluated
length L. ``position`` p (1..L-1) is a token's index in its window: it is predicted from the
p tokens before it. Two modes, as in Press et al.'s ALiBi paper:

- ``nonoverlap``: windows [kL, (k+1)L); every prediction in a window is scored.
- ``sliding`` (stride S, 1 <= S <= L): windows start at 0, S, 2S, ...; the first window scores
  every prediction, each later one only its last S tokens (positions L-S..L-1), so every
  stream token from the second to the end of the last window is scored once, with at least
  L-S tokens of context. S = L is ``nonoverlap``.

Perplexity per length: exp of the mean loss over the scored tokens. For a model trained at a
known context C, the same windows' mean loss at positions < C (``loss_within_context``) and
at positions >= C (``loss_past_context``): the rise past the context on the same text.

Passkey retrieval (landmark attention, YaRN): the instruction, filler sentences, "The pass key
is K. Remember it. K is the pass key." at a depth (0 = right after the instruction, 1 = right
before the question), more filler, then "What is the pass key? The pass key is"; as many
filler sentences as keep the prompt within L tokens. K is a random 5-digit number; greedy
decoding of a few tokens; correct when the first number in the continuation is K.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import ClassVar

import pandas as pd
import torch
import torch.nn.functional as F

from nopeinterp.errors import NopeinterpError, check_choice
from nopeinterp.options import LM_MODES as MODES
from nopeinterp.options import LMEvalOptions
from nopeinterp.progress import progress as progress_bar
from nopeinterp.results import Result

PASSKEY_INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "it. I will quiz you about the important information there."
)
PASSKEY_FILLER = (
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)
PASSKEY_LINE = " The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = " What is the pass key? The pass key is"
PASSKEY_NEW_TOKENS = 8  # greedy tokens after the question: enough for " 12345" in any BPE
TOKENS_PER_BATCH = 8192  # rows per forward: this many tokens (logits are [B, T, vocab])


class LMEvalError(NopeinterpError, ValueError):
    """Settings or a model that lm-eval cannot use (one line, exit status 2)."""


# --- loss by position ----------------------------------------------------------------------------
@torch.inference_mode()
def token_losses(model, tokens: torch.Tensor, *, batch_rows: int | None = None) -> torch.Tensor:
    """Cross-entropy of every next token, [N, T-1] float32 on the CPU: entry [i, p-1] is the
    loss of tokens[i, p] given tokens[i, :p]."""
    n, t = tokens.shape
    rows = batch_rows or max(1, TOKENS_PER_BATCH // t)
    device = model.cfg.device
    out = []
    for start in range(0, n, rows):
        x = tokens[start : start + rows].to(device)
        logits = model(x)
        # a row at a time: its [T-1, V] log-softmax, not a transposed copy of the batch's
        # logits and a log-softmax as large (each the size of the logits themselves)
        for i in range(x.shape[0]):
            row = F.cross_entropy(logits[i, :-1].float(), x[i, 1:], reduction="none")
            out.append(row[None].cpu())
        del logits
    return torch.cat(out) if out else torch.zeros(0, t - 1)


def windows(n_tokens: int, length: int, mode: str = "nonoverlap", stride: int | None = None):
    """[(start, first scored position)] of the windows of `length` over a stream of `n_tokens`
    (module docstring)."""
    check_choice(mode, MODES, "mode", error=LMEvalError)
    if mode == "nonoverlap":
        return [(s, 1) for s in range(0, n_tokens - length + 1, length)]
    if stride is None or not 1 <= stride <= length:
        raise LMEvalError(f"stride {stride!r}: sliding windows need 1 <= stride <= length {length}")
    starts = range(0, n_tokens - length + 1, stride)
    return [(s, 1 if k == 0 else length - stride) for k, s in enumerate(starts)]


def position_loss(
    model,
    stream: torch.Tensor,
    length: int,
    *,
    mode: str = "nonoverlap",
    stride: int | None = None,
    max_windows: int | None = None,
    batch_rows: int | None = None,
) -> pd.DataFrame:
    """Loss by position on `stream` at one window `length`: rows (position, loss, n) with the
    mean over the windows that score that position; `max_windows`: the first windows only;
    `batch_rows`: windows per forward pass (`token_losses`)."""
    plan = windows(stream.numel(), length, mode, stride)[:max_windows]
    if not plan:
        raise LMEvalError(
            f"the stream has {stream.numel()} tokens, fewer than one window of {length}"
        )
    tokens = torch.stack([stream[s : s + length] for s, _ in plan])
    losses = token_losses(model, tokens, batch_rows=batch_rows).double()  # [W, L-1]: p-1 = p
    first = torch.tensor([f for _, f in plan])
    scored = torch.arange(1, length)[None, :] >= first[:, None]
    n = scored.sum(0)
    total = (losses * scored).sum(0)
    return pd.DataFrame(
        {
            "position": range(1, length),
            "loss": (total / n.clamp(min=1)).where(n > 0, torch.nan).numpy(),
            "n": n.numpy(),
        }
    )


# --- passkey -------------------------------------------------------------------------------------
def passkey_text(n_filler: int, depth: float, key: int) -> str:
    before = round(depth * n_filler)
    return (
        PASSKEY_INTRO
        + PASSKEY_FILLER * before
        + PASSKEY_LINE.format(key=key)
        + PASSKEY_FILLER * (n_filler - before)
        + PASSKEY_QUESTION
    )


def passkey_prompt(tokenizer, length: int, depth: float, key: int) -> list[int]:
    """The ids of the longest passkey prompt (most filler) of at most `length` tokens."""

    def ids(n):
        return tokenizer(passkey_text(n, depth, key), add_special_tokens=False)["input_ids"]

    base = len(ids(0))
    if base > length:
        raise LMEvalError(
            f"passkey: the prompt without filler has {base} tokens, more than length {length}"
        )
    per = max(1, (len(ids(8)) - base) / 8)
    n = max(0, int((length - base) / per))
    while n > 0 and len(ids(n)) > length:
        n -= 1
    while len(ids(n + 1)) <= length:
        n += 1
    return ids(n)


def passkey_correct(continuation: str, key: int) -> bool:
    """Whether the first number in the generated text is the key."""
    found = re.search(r"\d+", continuation)
    return found is not None and found.group() == str(key)


def passkey_keys(trials: int, seed: int, length: int, depth: float) -> list[int]:
    rng = random.Random(f"nopeinterp/passkey/{seed}/{length}/{depth}")
    return [rng.randint(10_000, 99_999) for _ in range(trials)]


def passkey(
    model,
    tokenizer,
    length: int,
    depth: float,
    *,
    trials: int = 20,
    seed: int = 0,
    batch_rows: int | None = None,
):
    """(correct, trials, mean prompt tokens) of greedy passkey retrieval at one cell;
    `batch_rows` prompts per forward pass (default: TOKENS_PER_BATCH tokens' worth)."""
    from nopeinterp.evaluation import greedy_ids

    keys = passkey_keys(trials, seed, length, depth)
    prompts = [passkey_prompt(tokenizer, length, depth, k) for k in keys]
    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tokens = torch.full((trials, width), pad, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, p in enumerate(prompts):  # left-padded: every prompt ends where decoding starts
        tokens[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    correct = 0
    rows = batch_rows or max(1, TOKENS_PER_BATCH // width)
    for start in range(0, trials, rows):
        out = greedy_ids(
            model,
            tokens[start : start + rows],
            mask[start : start + rows],
            PASSKEY_NEW_TOKENS,
            tokenizer.eos_token_id,
        )
        texts = tokenizer.batch_decode(out, skip_special_tokens=True)
        correct += sum(passkey_correct(t, k) for t, k in zip(texts, keys[start:], strict=False))
    return correct, trials, sum(map(len, prompts)) / trials


def _token_mean(rows: pd.DataFrame) -> float:
    """The mean loss per token of loss-by-position rows (NaN when there are none)."""
    return float((rows["loss"] * rows["n"]).sum() / rows["n"].sum()) if len(rows) else math.nan


# --- the analysis --------------------------------------------------------------------------------
@dataclass(repr=False)
class LMEvalResult(Result):
    """`table`: loss by (model, length, position); `perplexity`: one row per (model, length);
    `passkey`: accuracy per (model, length, depth)."""

    perplexity: pd.DataFrame = None
    passkey: pd.DataFrame = None

    name: ClassVar[str] = "lm_loss"
    title: ClassVar[str] = "Language-model loss by position and passkey retrieval"
    extra_tables: ClassVar[tuple[str, ...]] = ("perplexity", "passkey")

    def passkey_figure(self):
        """Passkey accuracy by length and depth (drawn by nopeinterp.viz.results)."""
        return self.draw("passkey")

    @classmethod
    def concat(cls, results) -> LMEvalResult:
        """Several models' results as one."""
        results = list(results)
        meta = {**results[0].meta, "models": [m for r in results for m in r.meta["models"]]}
        meta["contexts"] = {k: v for r in results for k, v in r.meta["contexts"].items()}
        meta.pop("title", None)
        return cls(
            pd.concat([r.table for r in results], ignore_index=True),
            meta,
            pd.concat([r.perplexity for r in results], ignore_index=True),
            pd.concat([r.passkey for r in results], ignore_index=True),
        )


def training_context(meta: dict) -> int | None:
    """The context a checkpoint of the `lm` task was trained at (None if unknown)."""
    if meta.get("task") != "lm":
        return None
    from nopeinterp.tasks.lm import DEFAULT_CONTEXT

    return int((meta.get("task_options") or {}).get("context", DEFAULT_CONTEXT))


def check_lengths(model, lengths, name: str = "model") -> None:
    """A length past what the model can read (a learned position table): LMEvalError."""
    from nopeinterp.data import max_positions

    limit = max_positions(model)
    bad = [n for n in lengths if limit is not None and n > limit]
    if bad:
        raise LMEvalError(
            f"{name}: cannot read lengths {bad}: its position table has {limit} positions"
        )


def lm_eval(
    model, corpus: str | None = None, *, options: LMEvalOptions | None = None, **changes
) -> LMEvalResult:
    """Loss by position, perplexity by length and passkey accuracy (module docstring).

    `model`: a checkpoint (path or loaded) of the `lm` task, or any hooked model with a
    tokenizer (`nopeinterp.from_hf`). `corpus`: "stdlib", a folder or a .jsonl file (default:
    the checkpoint's own, else "stdlib"); its test split is tokenized with the model's
    tokenizer. Options (`nopeinterp.options.LMEvalOptions`), as `options=` or any of its
    fields: `lengths`, `mode`, `stride` (sliding mode's; default length // 4), `max_windows`
    per length (None: all), `trials` passkey prompts per (length, depth), `depths` (`()` skips
    passkey), `seed` of the passkeys.
    """
    from nopeinterp.inputs import as_model

    opts = LMEvalOptions.make(options, **changes)
    return run_lm_eval(as_model(model, opts.name, device=opts.device), corpus, opts)


def run_lm_eval(mi, corpus: str | None, opts: LMEvalOptions) -> LMEvalResult:
    """`lm_eval` on a resolved model (`nopeinterp.inputs.ModelInput`)."""
    from nopeinterp.tasks.lm import STDLIB, read_corpus, token_stream

    lengths, mode, stride, max_windows = (
        list(opts.lengths),
        opts.mode,
        opts.stride,
        opts.max_windows,
    )
    depths, trials, seed, rows = list(opts.depths), opts.trials, opts.seed, opts.batch_size
    tokenizer = mi.tokenizer or getattr(mi.model, "tokenizer", None)
    if tokenizer is None:
        raise LMEvalError(f"{mi.name}: has no tokenizer (save one beside a Hugging Face model)")
    check_lengths(mi.model, lengths, mi.name)
    if depths:
        for n in lengths:  # every passkey prompt fits before any work
            passkey_prompt(tokenizer, n, 0.0, 10_000)
    if corpus is None:
        corpus = (mi.meta.get("task_options") or {}).get("corpus", STDLIB)
    docs = read_corpus(corpus)
    stream = token_stream(tokenizer, docs.documents["test"])
    if stream.numel() < lengths[-1]:
        raise LMEvalError(
            f"{docs.source}: the test split has {stream.numel()} tokens with this tokenizer, "
            f"fewer than one window of {lengths[-1]}"
        )
    context = training_context(mi.meta)
    pe = mi.meta.get("pe", getattr(mi.model, "pe", None))
    was_training = mi.model.training
    mi.model.eval()
    loss_rows, ppl_rows, key_rows = [], [], []
    cells = [(n, d) for n in lengths for d in depths]
    bar = progress_bar(
        total=len(lengths) + len(cells), desc=f"lm-eval {mi.name}", disable=not opts.progress
    )
    try:
        for n in lengths:
            s = stride if stride is not None else max(1, n // 4)
            by_pos = position_loss(
                mi.model, stream, n, mode=mode, stride=s if mode == "sliding" else None,
                max_windows=max_windows, batch_rows=rows,
            )  # fmt: skip
            by_pos.insert(0, "length", n)
            by_pos.insert(0, "model", mi.name)
            loss_rows.append(by_pos)
            ok = by_pos[by_pos["n"] > 0]
            tokens = int(ok["n"].sum())
            mean = _token_mean(ok)
            row = {
                "model": mi.name,
                "pe": pe,
                "length": n,
                "mode": mode,
                "stride": s if mode == "sliding" else None,
                "windows": len(windows(stream.numel(), n, mode, s)[:max_windows]),
                "tokens": tokens,
                "loss": mean,
                "perplexity": math.exp(mean),
            }
            if context is not None:  # the same windows' loss inside and past the context
                inside = ok["position"] < context
                row["loss_within_context"] = _token_mean(ok[inside])
                row["loss_past_context"] = _token_mean(ok[~inside])
            ppl_rows.append(row)
            bar.update(1)
        for n, d in cells:
            correct, k, mean_len = passkey(
                mi.model, tokenizer, n, d, trials=trials, seed=seed, batch_rows=rows
            )
            key_rows.append(
                {
                    "model": mi.name,
                    "pe": pe,
                    "length": n,
                    "depth": d,
                    "trials": k,
                    "correct": correct,
                    "accuracy": correct / k,
                    "prompt_tokens": round(mean_len, 1),
                }
            )
            bar.update(1)
    finally:
        bar.close()
        mi.model.train(was_training)
    meta = {
        "title": opts.title or f"Loss by position and passkey: {mi.name}",
        "models": [mi.name],
        "contexts": {mi.name: context},
        "corpus": docs.source,
        "test_documents": len(docs.documents["test"]),
        "test_tokens": int(stream.numel()),
        "skipped_files": docs.skipped,
        "mode": mode,
        "stride": stride,
        "lengths": lengths,
        "max_windows": max_windows,
        "depths": depths,
        "trials": trials,
        "seed": seed,
    }
    cols = ["model", "pe", "length", "depth", "trials", "correct", "accuracy", "prompt_tokens"]
    return LMEvalResult(
        pd.concat(loss_rows, ignore_index=True),
        meta,
        pd.DataFrame(ppl_rows),
        pd.DataFrame(key_rows, columns=cols),
    )
