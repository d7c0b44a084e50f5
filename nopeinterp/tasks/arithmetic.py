"""Arithmetic tasks: addition, summation (mod 10) and polynomial evaluation (mod 10)."""

from __future__ import annotations

import random

from .base import Example, Task, answer_sentence, spaced_digits, unique_words

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

    def vocab(self) -> list[str]:
        return ["Compute", "+", "?", *DIGITS, *ANSWER_WORDS]

    def sample(self, length: int, rng: random.Random) -> Example:
        a = _random_number(length, rng)
        b = _random_number(rng.randint(1, length), rng)
        if rng.random() < 0.5:
            a, b = b, a
        prompt = f"Compute {spaced_digits(a)} + {spaced_digits(b)} ?"
        return Example(prompt, answer_sentence(spaced_digits(a + b)), length)


class SummationTask(Task):
    """``Compute : 3 5 9 .`` -> ``The answer is 7 .`` (sum mod 10); digits 1-9.

    Length = number of summed digits.
    """

    name = "summation"
    id_lengths = (1, 8)
    ood_lengths = (9, 16)
    separator = "."

    def vocab(self) -> list[str]:
        return ["Compute", ":", *DIGITS, *ANSWER_WORDS]

    def sample(self, length: int, rng: random.Random) -> Example:
        ds = [rng.randint(1, 9) for _ in range(length)]
        prompt = f"Compute : {' '.join(map(str, ds))} ."
        return Example(prompt, answer_sentence(str(sum(ds) % 10)), length)


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

    def vocab(self) -> list[str]:
        signed = [str(v) for v in range(-3, 4)]  # covers coefficients, degrees and x
        words = ["Evaluate", "at", "x", "=", "in", "*", "**", "+", "?", *ANSWER_WORDS]
        return unique_words(words, signed, DIGITS)

    def sample(self, length: int, rng: random.Random) -> Example:
        x = rng.choice(self.xs)
        terms = [(rng.choice(self.coeffs), rng.choice(self.degrees)) for _ in range(length)]
        value = sum(c * x**d for c, d in terms) % 10
        poly = " + ".join(f"{c} * x ** {d}" for c, d in terms)
        prompt = f"Evaluate at x = {x} in {poly} ?"
        return Example(prompt, answer_sentence(str(value)), length)
