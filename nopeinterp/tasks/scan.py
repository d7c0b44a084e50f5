"""SCAN (Lake & Baroni 2018) generated from its grammar, with a deterministic interpreter.

Grammar::

    C -> S and S | S after S | S
    S -> V twice | V thrice | V
    V -> D opposite D' | D around D' | D | U      (D' = the direction word of a D)
    D -> U left | U right | turn left | turn right
    U -> walk | look | run | jump

which yields exactly 20,910 commands (34 V, 102 S, 102 + 2 * 102**2 C). The task format is
``Solve : {command} [SEP]`` -> the action words; length = number of output actions
(1..48). The paper's length split trains on <= 25 actions and tests on 26-48: 17,774 ID
commands and 3,136 OOD ones (the test set is that whole pool, each command once).

Variants (the paper's two SCAN splits): ``mdlen`` (default) has the ``Solve :`` prefix;
``len`` has no instruction prefix and, by default, no ``<bos>`` either (``bos=False``, as in
the paper's T5 setup), so the first token a model sees is the command's first word.
``get_task("scan", variant="len", bos=True)`` is the control with a start token back.
"""

from __future__ import annotations

import random
from functools import lru_cache

from nopeinterp.errors import check_choice

from .base import Example, Task, TaskError, is_held_out

SEP = "[SEP]"
PRIMITIVES = ("walk", "look", "run", "jump")
DIRECTIONS = ("left", "right")
REPEATS = {"twice": 2, "thrice": 3}
ACTIONS = {
    "walk": "I_WALK",
    "look": "I_LOOK",
    "run": "I_RUN",
    "jump": "I_JUMP",
    "left": "I_TURN_LEFT",
    "right": "I_TURN_RIGHT",
}


def _interpret_v(words: list[str]) -> list[str]:
    """V: ``u``, ``u dir``, ``u opposite dir``, ``u around dir`` (u may be ``turn`` if dir)."""
    verb, rest = words[0], words[1:]
    if verb not in PRIMITIVES and verb != "turn":
        raise ValueError(f"unknown verb {verb!r}")
    act = [ACTIONS[verb]] if verb != "turn" else []  # "turn" contributes only its turns
    if not rest:
        if verb == "turn":
            raise ValueError("'turn' needs a direction")
        return act
    if rest[-1] not in DIRECTIONS or len(rest) > 2:
        raise ValueError(f"bad direction phrase {' '.join(rest)!r}")
    turn = ACTIONS[rest[-1]]
    if len(rest) == 1:
        return [turn, *act]
    if rest[0] == "opposite":
        return [turn, turn, *act]
    if rest[0] == "around":
        return [turn, *act] * 4
    raise ValueError(f"unknown modifier {rest[0]!r}")


def _interpret_s(words: list[str]) -> list[str]:
    """S: ``V``, ``V twice``, ``V thrice``."""
    if words and words[-1] in REPEATS:
        return _interpret_v(words[:-1]) * REPEATS[words[-1]]
    return _interpret_v(words)


def interpret(command: str) -> list[str]:
    """Action sequence for a SCAN command, e.g. ``"jump left"`` -> ``["I_TURN_LEFT", "I_JUMP"]``.

    ``x1 and x2`` runs x1 then x2; ``x1 after x2`` runs x2 then x1.
    """
    words = command.split()
    for conj in ("and", "after"):
        if conj in words:
            i = words.index(conj)
            left, right = _interpret_s(words[:i]), _interpret_s(words[i + 1 :])
            return left + right if conj == "and" else right + left
    return _interpret_s(words)


def _v_phrases() -> list[str]:
    out: list[str] = []
    for d in DIRECTIONS:
        for u in (*PRIMITIVES, "turn"):
            out += [f"{u} opposite {d}", f"{u} around {d}"]
    out += [f"{u} {d}" for d in DIRECTIONS for u in (*PRIMITIVES, "turn")]
    return out + list(PRIMITIVES)


@lru_cache(maxsize=1)
def all_commands() -> tuple[str, ...]:
    """Every command of the grammar (20,910), in a fixed order."""
    s_phrases = [f"{v}{suffix}" for v in _v_phrases() for suffix in ("", " twice", " thrice")]
    out = list(s_phrases)
    for conj in ("and", "after"):
        out += [f"{a} {conj} {b}" for a in s_phrases for b in s_phrases]
    return tuple(out)


@lru_cache(maxsize=1)
def commands_by_length() -> dict[int, tuple[str, ...]]:
    """Commands grouped by number of output actions (computed once, cached)."""
    groups: dict[int, list[str]] = {}
    for cmd in all_commands():
        groups.setdefault(len(interpret(cmd)), []).append(cmd)
    return {n: tuple(cmds) for n, cmds in sorted(groups.items())}


class ScanTask(Task):
    """``Solve : jump twice [SEP]`` -> ``I_JUMP I_JUMP``; length = number of actions."""

    name = "scan"
    id_lengths = (1, 25)
    ood_lengths = (26, 48)
    separator = SEP
    max_length = 48
    variants = ("mdlen", "len")
    # SCAN's test set is the whole OOD pool, every command once (the paper's); validation keeps
    # the default 25 held-out commands per ID length (n_per_length="all": every held-out one).
    test_size = "all"

    def __init__(self, *, variant: str = "mdlen", bos: bool | None = None, **kwargs) -> None:
        check_choice(variant, self.variants, "scan variant", error=TaskError)
        self.variant = variant
        if bos is None:
            bos = variant != "len"
        super().__init__(bos=bos, **kwargs)

    @property
    def prefix(self) -> str:
        """The words before the command: ``"Solve : "`` (mdlen) or nothing (len)."""
        return "Solve : " if self.variant == "mdlen" else ""

    def vocab(self) -> list[str]:
        modifiers = ["opposite", "around", *REPEATS, "and", "after", "turn"]
        words = [*self.prefix.split(), *PRIMITIVES, *DIRECTIONS, *modifiers, SEP]
        return words + list(dict.fromkeys(ACTIONS.values()))

    def has_length(self, length: int) -> bool:
        return length in commands_by_length()

    def _example(self, command: str, length: int) -> Example:
        return Example(f"{self.prefix}{command} {SEP}", " ".join(interpret(command)), length)

    def sample(self, length: int, rng: random.Random) -> Example:
        pool = commands_by_length().get(length)
        if not pool:
            raise TaskError(f"no SCAN command has {length} actions")
        return self._example(rng.choice(pool), length)

    def held_out(self, example: Example) -> bool:
        return is_held_out("Solve : " + example.prompt.removeprefix(self.prefix))

    def pool(self, length: int) -> tuple[Example, ...] | None:
        return tuple(self._example(c, length) for c in commands_by_length().get(length, ()))
