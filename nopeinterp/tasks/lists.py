"""List tasks over small alphabets: parity of a bit list and sorting a digit list."""

from __future__ import annotations

import random

from .arithmetic import ANSWER_WORDS, DIGITS
from .base import Example, Task, answer_sentence, unique_words
from .scratchpad import Step


class ParityTask(Task):
    """``Is the number of 1 's even in the sequence [ 1 0 1 ] ?`` -> ``The answer is Yes .``

    Length = number of bits.
    """

    name = "parity"
    id_lengths = (1, 8)
    ood_lengths = (9, 16)
    separator = "?"
    scratchpad_components = "icovr"
    scratchpad_words = ("**", "=", "par", ":")

    def vocab(self) -> list[str]:
        question = ["Is", "the", "number", "of", "'s", "even", "in", "sequence", "[", "]", "?"]
        words = [*question, "0", "1", *ANSWER_WORDS, "Yes", "No"]
        return unique_words(words, self.scratchpad_vocab())

    def sample(self, length: int, rng: random.Random) -> Example:
        bits = [rng.randint(0, 1) for _ in range(length)]
        seq = " ".join(map(str, bits))
        prompt = f"Is the number of 1 's even in the sequence [ {seq} ] ?"
        answer = "Yes" if sum(bits) % 2 == 0 else "No"
        return Example(
            prompt, self.target(answer_sentence(answer), lambda: self.steps(bits)), length
        )

    @staticmethod
    def steps(bits: list[int]) -> list[Step]:
        """One bit per step, XOR-ed into the running parity, the variable (official
        processor). The remaining bits are written as the prompt writes them."""
        steps, par = [], 0
        for i, b in enumerate(bits):
            comp = f"{b} ** par = {b} ** {par}"
            par ^= b
            rest = " ".join(["[", *map(str, bits[i + 1 :]), "]"])
            steps.append(Step(str(b), comp, str(par), f"par : {par}", rest))
        return steps


class SortingTask(Task):
    """``Sort the following list [ 3 1 2 ] .`` -> ``The sorted list is [ 1 2 3 ] .``

    Elements are single digits 0-9 (repeats allowed). Length = number of elements.
    """

    name = "sorting"
    id_lengths = (1, 8)
    ood_lengths = (9, 16)
    separator = "."
    scratchpad_components = "icor"  # the official processor has no variables for sorting
    scratchpad_words = ("The", "minimum", "of", "the", "unsorted", "portion")

    def vocab(self) -> list[str]:
        prompt = ["Sort", "the", "following", "list", "[", "]", "."]
        words = [*prompt, "The", "sorted", "list", "is", *DIGITS]
        return unique_words(words, self.scratchpad_vocab())

    def sample(self, length: int, rng: random.Random) -> Example:
        xs = [rng.randrange(10) for _ in range(length)]
        prompt = f"Sort the following list [ {' '.join(map(str, xs))} ] ."
        answer = f"The sorted list is [ {' '.join(map(str, sorted(xs)))} ] ."
        return Example(prompt, self.target(answer, lambda: self.steps(xs)), length)

    @staticmethod
    def steps(xs: list[int]) -> list[Step]:
        """Selection sort (official processor): step i reads the list's i-th element, writes
        the minimum of the unsorted part (its first occurrence), swaps the two and leaves the
        rest of the list, written as the prompt writes a list."""
        xs = list(xs)
        steps = []
        for i in range(len(xs)):
            front = xs[i]
            m = min(range(i, len(xs)), key=lambda j: xs[j])
            xs[i], xs[m] = xs[m], xs[i]
            rest = " ".join(["[", *map(str, xs[i + 1 :]), "]"])
            comp = "The minimum of the unsorted portion"
            steps.append(Step(str(front), comp, str(xs[i]), "", rest))
        return steps
