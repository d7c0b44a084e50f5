"""Turn examples into padded id tensors with a loss mask over the target.

Layout of one row (``with_target=True``)::

    <bos> prompt-words... <sep>  target-words...  <eos>  <pad>...
    0     1 ...           P-1    P ...            L-1    L ...

``P`` = ``prompt_lengths`` (bos + prompt, separator included) and ``L`` the real length.
A tokenizer without a start token (``adds_bos`` False, a task with ``bos=False``) gives the
same layout without the ``<bos>`` column: row = prompt target <eos>, ``P`` = prompt words.

Loss convention: the logits at position ``i`` predict token ``i + 1``. ``target_mask[i]`` is
True exactly when token ``i + 1`` is a target word or the final ``<eos>``, i.e. for
``P - 1 <= i <= L - 2``. So the loss is ``cross_entropy(logits[:, :-1][mask[:, :-1]],
tokens[:, 1:][mask[:, :-1]])``; the last column of ``target_mask`` is always False.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

import torch

from .base import Example
from .tokenizer import adds_bos


@dataclass
class Batch:
    """Padded batch; all tensors share the batch dimension B."""

    tokens: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long, 1 on real tokens
    target_mask: torch.Tensor  # [B, T] bool, True where the NEXT token is target/<eos>
    prompt_lengths: torch.Tensor  # [B] long, (bos +) prompt incl. separator
    lengths: torch.Tensor  # [B] long, the task's length of each example

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def to(self, device) -> Batch:
        """Copy of the batch with every tensor on ``device``."""
        return Batch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def _word_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    """Word ids of many texts in one tokenizer call (the per-call overhead dominates)."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    unk = tokenizer.unk_token_id
    for text, row in zip(texts, ids, strict=True):
        if unk in row:
            words = text.split()
            unknown = [w for w, i in zip(words, row, strict=False) if i == unk]
            raise ValueError(f"words outside the tokenizer vocabulary in {text!r} {unknown}")
    return ids


def encode_examples(tokenizer, examples: Sequence[Example], *, with_target: bool = True) -> Batch:
    """Encode examples as ``<bos> prompt target <eos>`` (or ``<bos> prompt`` for generation);
    no ``<bos>`` when the tokenizer adds none (``adds_bos``).

    Rows are right-padded with the pad id. Raises ``ValueError`` if a word is not in the
    vocabulary (silently mapping to ``<unk>`` would hide task/tokenizer mismatches). See the
    module docstring for the ``target_mask`` convention; with ``with_target=False`` it is
    all False.
    """
    if not examples:
        raise ValueError("no examples to encode")
    start = [tokenizer.bos_token_id] if adds_bos(tokenizer) else []
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    prompts = _word_ids(tokenizer, [ex.prompt for ex in examples])
    targets = _word_ids(tokenizer, [ex.target for ex in examples]) if with_target else None
    rows, prompt_lens, spans = [], [], []
    for i, prompt_ids in enumerate(prompts):
        prompt = [*start, *prompt_ids]
        row = prompt + ([*targets[i], eos] if with_target else [])
        rows.append(row)
        prompt_lens.append(len(prompt))
        spans.append((len(prompt) - 1, len(row) - 1) if with_target else (0, 0))
    width = max(map(len, rows))
    tokens = torch.tensor([row + [pad] * (width - len(row)) for row in rows], dtype=torch.long)
    lens = torch.tensor([len(row) for row in rows])
    cols = torch.arange(width)
    attention = (cols[None, :] < lens[:, None]).long()
    lo = torch.tensor([a for a, _ in spans])[:, None]
    hi = torch.tensor([b for _, b in spans])[:, None]
    target_mask = (cols[None, :] >= lo) & (cols[None, :] < hi)
    return Batch(
        tokens=tokens,
        attention_mask=attention,
        target_mask=target_mask,
        prompt_lengths=torch.tensor(prompt_lens, dtype=torch.long),
        lengths=torch.tensor([ex.length for ex in examples], dtype=torch.long),
    )


def decode_answer(tokenizer, ids: Iterable[int] | torch.Tensor) -> str:
    """Words of generated ids up to (excluding) the first ``<eos>``.

    Pass only the generated continuation (ids after the prompt). Other special tokens are
    kept (e.g. ``<pad>``), so a prediction containing them never counts as an exact match.
    """
    if isinstance(ids, torch.Tensor):
        ids = ids.flatten().tolist()
    words = []
    for i in ids:
        if int(i) == tokenizer.eos_token_id:
            break
        words.append(tokenizer.convert_ids_to_tokens(int(i)))
    return " ".join(words)
