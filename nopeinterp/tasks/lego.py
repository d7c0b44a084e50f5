"""LEGO (Zhang et al. 2022): resolve a shuffled chain of sign assignments.

``If c = + 1 , a = - b , b = - c . Then , what is the value of a ?`` -> ``The answer is + 1 .``

The variables form one chain v1 = s1 1, v2 = s2 v1, ..., vL = sL v(L-1) (each s is + or -),
the clauses are shown in random order, and the question asks for the end of the chain, so
answering needs all L steps. Length = number of variables (at most 26).
"""

from __future__ import annotations

import random
import string

from .arithmetic import ANSWER_WORDS
from .base import Example, Task, answer_sentence, unique_words

VARIABLES = tuple(string.ascii_lowercase)


class LegoTask(Task):
    """Sign-chain resolution; see the module docstring for the format."""

    name = "lego"
    id_lengths = (1, 8)
    ood_lengths = (9, 16)
    separator = "?"
    max_length = len(VARIABLES)

    def vocab(self) -> list[str]:
        words = ["If", "=", "+", "-", "1", ",", ".", "Then", "what", "is", "the", "value", "of"]
        return unique_words(words, ["?"], ANSWER_WORDS, VARIABLES)

    def sample(self, length: int, rng: random.Random) -> Example:
        names = rng.sample(VARIABLES, length)
        signs = [rng.choice("+-") for _ in range(length)]
        clauses = [f"{names[0]} = {signs[0]} 1"]
        clauses += [f"{names[i]} = {signs[i]} {names[i - 1]}" for i in range(1, length)]
        rng.shuffle(clauses)
        value = "-" if signs.count("-") % 2 else "+"
        prompt = f"If {' , '.join(clauses)} . Then , what is the value of {names[-1]} ?"
        return Example(prompt, answer_sentence(f"{value} 1"), length)
