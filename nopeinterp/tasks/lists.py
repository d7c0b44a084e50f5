"""List tasks over small alphabets: parity of a bit list and sorting a digit list."""

from __future__ import annotations

import random

from .arithmetic import ANSWER_WORDS, DIGITS
from .base import Example, Task, answer_sentence, unique_words


class ParityTask(Task):
    """``Is the number of 1 's even in the sequence [ 1 0 1 ] ?`` -> ``The answer is Yes .``

    Length = number of bits.
    """

    name = "parity"
    id_lengths = (1, 8)
    ood_lengths = (9, 16)
    separator = "?"

    def vocab(self) -> list[str]:
        question = ["Is", "the", "number", "of", "'s", "even", "in", "sequence", "[", "]", "?"]
        return unique_words(question, ["0", "1"], ANSWER_WORDS, ["Yes", "No"])

    def sample(self, length: int, rng: random.Random) -> Example:
        bits = [rng.randint(0, 1) for _ in range(length)]
        seq = " ".join(map(str, bits))
        prompt = f"Is the number of 1 's even in the sequence [ {seq} ] ?"
        answer = "Yes" if sum(bits) % 2 == 0 else "No"
        return Example(prompt, answer_sentence(answer), length)


class SortingTask(Task):
    """``Sort the following list [ 3 1 2 ] .`` -> ``The sorted list is [ 1 2 3 ] .``

    Elements are single digits 0-9 (repeats allowed). Length = number of elements.
    """

    name = "sorting"
    id_lengths = (1, 8)
    ood_lengths = (9, 16)
    separator = "."

    def vocab(self) -> list[str]:
        prompt = ["Sort", "the", "following", "list", "[", "]", "."]
        return unique_words(prompt, ["The", "sorted", "list", "is"], DIGITS)

    def sample(self, length: int, rng: random.Random) -> Example:
        xs = [rng.randrange(10) for _ in range(length)]
        prompt = f"Sort the following list [ {' '.join(map(str, xs))} ] ."
        target = f"The sorted list is [ {' '.join(map(str, sorted(xs)))} ] ."
        return Example(prompt, target, length)
