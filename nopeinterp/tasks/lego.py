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
from .scratchpad import Step

VARIABLES = tuple(string.ascii_lowercase)


class LegoTask(Task):
    """Sign-chain resolution; see the module docstring for the format."""

    name = "lego"
    id_lengths = (1, 8)
    ood_lengths = (9, 16)
    separator = "?"
    max_length = len(VARIABLES)
    scratchpad_components = "icor"  # the official processor has no variables for LEGO

    def vocab(self) -> list[str]:
        words = ["If", "=", "+", "-", "1", ",", ".", "Then", "what", "is", "the", "value", "of"]
        return unique_words(words, ["?"], ANSWER_WORDS, VARIABLES, self.scratchpad_vocab())

    def sample(self, length: int, rng: random.Random) -> Example:
        names = rng.sample(VARIABLES, length)
        signs = [rng.choice("+-") for _ in range(length)]
        clauses = [f"{names[0]} = {signs[0]} 1"]
        clauses += [f"{names[i]} = {signs[i]} {names[i - 1]}" for i in range(1, length)]
        rng.shuffle(clauses)
        value = "-" if signs.count("-") % 2 else "+"
        prompt = f"If {' , '.join(clauses)} . Then , what is the value of {names[-1]} ?"
        answer = answer_sentence(f"{value} 1")
        return Example(prompt, self.target(answer, lambda: self.steps(clauses)), length)

    @staticmethod
    def steps(clauses: list[str]) -> list[Step]:
        """One variable per step, in the order the chain resolves (from the one set to 1);
        the computation substitutes the value of the variable it reads (empty for the first);
        the remaining input is the clauses not yet resolved, in the prompt's order (official
        processor)."""
        rules = {c.split(" = ")[0]: c.split(" = ")[1].split() for c in clauses}  # v -> [s, w]
        by_source = {w: v for v, (_, w) in rules.items()}
        values: dict[str, str] = {}
        steps, var, remaining = [], by_source["1"], list(clauses)
        while True:
            sign, source = rules[var]
            if source == "1":
                comp, value = "", sign
            else:
                comp = f"{sign} {source} = {sign} {values[source]} 1"
                value = "+" if (sign == "+") == (values[source] == "+") else "-"
            values[var] = value
            remaining = [c for c in remaining if c.split(" = ")[0] != var]
            steps.append(Step(var, comp, f"{value} 1", "", " , ".join(remaining)))
            if var not in by_source:
                return steps
            var = by_source[var]
