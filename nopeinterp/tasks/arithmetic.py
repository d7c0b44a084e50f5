"""Arithmetic tasks: addition, summation (mod 10) and polynomial evaluation (mod 10)."""

from __future__ import annotations

import random

from .base import Example, Task, answer_sentence, spaced_digits, unique_words
from .scratchpad import Step

DIGITS = [str(d) for d in range(10)]
ANSWER_WORDS = ["The", "answer", "is", "."]


def _random_number(n_digits: int, rng: random.Random) -> int:
    """Uniform integer with exactly ``n_digits`` digits (0-9 allowed when n_digits == 1)."""
    if n_digits == 1:
        return rng.randrange(10)
    return rng.randrange(10 ** (n_digits - 1), 10**n_digits)


class AdditionTask(Task):
    """``Compute 1 2 + 3 4 ?`` -> ``The answer is 4 6 .``

    Length = digits of the longer operand. One operand (chosen at random) has exactly
    ``length`` digits; the other has a uniform digit count in 1..length.
    """

    name = "addition"
    id_lengths = (1, 8)
    ood_lengths = (9, 16)
    separator = "?"
    scratchpad_components = "icovr"
    scratchpad_words = (",", "+", "=", "carry", ":")

    def vocab(self) -> list[str]:
        return unique_words(["Compute", "+", "?", *DIGITS, *ANSWER_WORDS], self.scratchpad_vocab())

    def sample(self, length: int, rng: random.Random) -> Example:
        a = _random_number(length, rng)
        b = _random_number(rng.randint(1, length), rng)
        if rng.random() < 0.5:
            a, b = b, a
        prompt = f"Compute {spaced_digits(a)} + {spaced_digits(b)} ?"
        target = self.target(answer_sentence(spaced_digits(a + b)), lambda: self.steps(a, b))
        return Example(prompt, target, length)

    @staticmethod
    def steps(a: int, b: int) -> list[Step]:
        """Column addition from the least significant digit, the shorter number padded with
        0; the variable is the carry; a last step writes a final carry (official processor)."""
        width = max(len(str(a)), len(str(b)))
        da, db = str(a).zfill(width), str(b).zfill(width)

        def rest(digits: str) -> str:  # what is left of a number, as a number ('' if nothing)
            return spaced_digits(int(digits)) if digits else ""

        steps, carry = [], 0
        for i in range(width - 1, -1, -1):
            x, y = int(da[i]), int(db[i])
            total = x + y + carry
            comp = f"{x} + {y} + carry = {spaced_digits(x + y)} + {carry} = {spaced_digits(total)}"
            out, carry = total % 10, total // 10
            remaining = f"{rest(da[:i])} + {rest(db[:i])}".strip()
            steps.append(Step(f"{x} , {y}", comp, str(out), f"carry : {carry}", remaining))
        if carry:
            comp = f"0 + 0 + carry = 0 + {carry} = {carry}"
            steps.append(Step("0 , 0", comp, str(carry), "carry : 0", "+"))
        return steps


class SummationTask(Task):
    """``Compute : 3 5 9 .`` -> ``The answer is 7 .`` (sum mod 10); digits 1-9.

    Length = number of summed digits.
    """

    name = "summation"
    id_lengths = (1, 8)
    ood_lengths = (9, 16)
    separator = "."
    scratchpad_components = "icovr"
    scratchpad_words = ("+", "=", "sum", ":")

    def vocab(self) -> list[str]:
        return unique_words(["Compute", ":", *DIGITS, *ANSWER_WORDS], self.scratchpad_vocab())

    def sample(self, length: int, rng: random.Random) -> Example:
        ds = [rng.randint(1, 9) for _ in range(length)]
        prompt = f"Compute : {' '.join(map(str, ds))} ."
        target = self.target(answer_sentence(str(sum(ds) % 10)), lambda: self.steps(ds))
        return Example(prompt, target, length)

    @staticmethod
    def steps(ds: list[int]) -> list[Step]:
        """One digit per step; the variable is the running sum mod 10 (official processor,
        stripped form). The remaining input is written as the prompt writes it."""
        steps, total = [], 0
        for i, d in enumerate(ds):
            out = spaced_digits(d + total)
            comp = f"{d} + sum = {d} + {total} ="
            variables = f"sum : {out} = {(d + total) % 10}"
            total = (d + total) % 10
            steps.append(Step(str(d), comp, out, variables, " ".join(map(str, ds[i + 1 :]))))
        return steps


class PolynomialTask(Task):
    """``Evaluate at x = 2 in 3 * x ** 2 + -1 * x ** 0 ?`` -> ``The answer is 1 .``

    Each term is ``c * x ** d`` with c in [-3, 3] and d in [0, 3] (both drawn uniformly,
    repeats allowed); x in [-2, 2]; the answer is the value mod 10 (Python's non-negative
    ``%``, and ``0 ** 0 == 1``). Signed numbers are single words (``-1``), as in the paper.
    Length = number of terms.
    """

    name = "polynomial"
    id_lengths = (1, 8)
    ood_lengths = (9, 16)
    separator = "?"
    coeffs = range(-3, 4)
    degrees = range(0, 4)
    xs = range(-2, 3)
    scratchpad_components = "icovr"
    scratchpad_words = ("-", "sum", ":")

    def vocab(self) -> list[str]:
        signed = [str(v) for v in range(-3, 4)]  # covers coefficients, degrees and x
        words = ["Evaluate", "at", "x", "=", "in", "*", "**", "+", "?", *ANSWER_WORDS]
        return unique_words(words, signed, DIGITS, self.scratchpad_vocab())

    def sample(self, length: int, rng: random.Random) -> Example:
        x = rng.choice(self.xs)
        terms = [(rng.choice(self.coeffs), rng.choice(self.degrees)) for _ in range(length)]
        value = sum(c * x**d for c, d in terms) % 10
        poly = " + ".join(f"{c} * x ** {d}" for c, d in terms)
        prompt = f"Evaluate at x = {x} in {poly} ?"
        target = self.target(answer_sentence(str(value)), lambda: self.steps(x, terms))
        return Example(prompt, target, length)

    @staticmethod
    def steps(x: int, terms: list[tuple[int, int]]) -> list[Step]:
        """One term per step; the variable is the running sum mod 10 (official processor,
        stripped form). Numbers read from the prompt keep its one-word form (``-3``), computed
        ones are spaced digits (``- 2 4``)."""
        steps, total = [], 0
        for i, (c, d) in enumerate(terms):
            value = c * x**d
            comp = f"{c} * {x} ** {d} = {c} * {spaced_digits(x**d)}"
            out = spaced_digits(value)
            variables = f"sum : {total} + {out} = {(total + value) % 10}"
            total = (total + value) % 10
            remaining = " + ".join(f"{c2} * x ** {d2}" for c2, d2 in terms[i + 1 :])
            steps.append(Step(f"{c} * x ** {d}", comp, out, variables, remaining))
        return steps
