"""Copy and Reverse: reproduce a random word sequence, as is or reversed."""

from __future__ import annotations

import random
import string

from .base import Example, Task

SEP = "[SEP]"
DEFAULT_ALPHABET = tuple(string.ascii_lowercase[:10])  # a..j


class _SequenceTask(Task):
    """Shared machinery: ``{Instruction} : {seq} [SEP]`` -> transformed seq."""

    id_lengths = (2, 20)
    ood_lengths = (21, 40)
    separator = SEP
    instruction: str

    def __init__(self, *, alphabet: tuple[str, ...] = DEFAULT_ALPHABET, **kwargs) -> None:
        if len(alphabet) < 2 or len(set(alphabet)) != len(alphabet):
            raise ValueError("alphabet needs at least 2 distinct words")
        if any(len(w.split()) != 1 for w in alphabet):
            raise ValueError("alphabet entries must be single words")
        self.alphabet = tuple(alphabet)
        super().__init__(**kwargs)

    def vocab(self) -> list[str]:
        return [self.instruction, ":", *self.alphabet, SEP]

    def transform(self, seq: list[str]) -> list[str]:
        raise NotImplementedError

    def sample(self, length: int, rng: random.Random) -> Example:
        seq = [rng.choice(self.alphabet) for _ in range(length)]
        prompt = f"{self.instruction} : {' '.join(seq)} {SEP}"
        return Example(prompt, " ".join(self.transform(seq)), length)


class CopyTask(_SequenceTask):
    """``Copy : a b c [SEP]`` -> ``a b c``; length = number of sequence words."""

    name = "copy"
    instruction = "Copy"

    def transform(self, seq: list[str]) -> list[str]:
        return list(seq)


class ReverseTask(_SequenceTask):
    """``Reverse : a b c [SEP]`` -> ``c b a``; length = number of sequence words."""

    name = "reverse"
    instruction = "Reverse"

    def transform(self, seq: list[str]) -> list[str]:
        return seq[::-1]
