"""Scratchpads: the official unified format of Kazemnejad et al. (2023), in our word form.

A scratchpad is a list of steps written before the answer. Each step has up to five
components, each on or off (a *format*, e.g. ``"icovr"``, ``"co"`` or ``""`` for none):

    i  input       what the step reads            marker ``in``
    c  computation what it computes               marker ``comp``
    o  output      what it writes                 marker ``out``
    v  variables   the state it carries on        between ``[`` and ``]``
    r  remaining   the input still to read        marker ``re``

The markers, their order and the step separator ``#`` are the official minimal template's
(``configs/data/minimal_template.jsonnet``); the scratchpad opens with ``Thinking step by step
:`` and closes with ``. Thus ,`` before the answer sentence. Every piece is written as
whitespace-separated words (digits spaced, punctuation its own word), so the official text and
ours are equal once spaces are removed. Each task defines its steps in ``scratchpad_steps``
(see the task modules); this module only formats, labels and scores them.

Scoring (`final_answer`, `score_steps`): the answer is what follows the first closing marker
(the official processors split there too); a step is right when its words equal the gold
step's at the same index (steps split on ``#``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import TaskError

COMPONENTS = "icovr"
COMPONENT_NAMES = {
    "i": "input",
    "c": "computation",
    "o": "output",
    "v": "variables",
    "r": "remaining",
}
MARKERS = {"i": "in", "c": "comp", "o": "out", "v": "[", "r": "re"}
VARIABLES_END = "]"
STEP_SEPARATOR = "#"
OPEN = ("Thinking", "step", "by", "step", ":")
CLOSE = (".", "Thus", ",")
TEMPLATE_WORDS = (*OPEN, *MARKERS.values(), VARIABLES_END, STEP_SEPARATOR, *CLOSE)
NONE = "none"
# Token regions of a labelled sequence, in display order: the start token, the prompt, then
# what `label_words` gives the words after the prompt.
START, PROMPT, MARKS, ANSWER = "start", "prompt", "markers", "answer"
REGIONS = (START, PROMPT, *COMPONENT_NAMES.values(), MARKS, ANSWER)


@dataclass(frozen=True)
class Step:
    """One scratchpad step's five components, each a string of words ('' = empty)."""

    input: str
    computation: str
    output: str
    variables: str
    remaining: str

    def component(self, letter: str) -> str:
        return getattr(self, COMPONENT_NAMES[letter])

    def text(self, fmt: str) -> str:
        """The step's words in format `fmt` (markers included)."""
        parts = []
        for letter in fmt:
            body = self.component(letter)
            if letter == "v":
                parts += [MARKERS["v"], body, VARIABLES_END]
            else:
                parts += [MARKERS[letter], body]
        return " ".join(p for p in parts if p)


def parse_format(value, *, task: str = "task", allowed: str = COMPONENTS) -> str:
    """A format in canonical order ('' for none) from 'icovr', 'co', 'none', None or ''.

    Raises TaskError naming the first letter that is not a component (or not one `task` has)
    and any repeated letter."""
    if value is None or value is False or value == "" or value == NONE:
        return ""
    if not isinstance(value, str):
        raise TaskError(
            f"{task}: scratchpad must be letters of {COMPONENTS} or 'none', got {value!r}"
        )
    for letter in value:
        if letter not in COMPONENTS:
            raise TaskError(
                f"{task}: unknown scratchpad component {letter!r} in {value!r}; components: "
                + ", ".join(f"{k} ({v})" for k, v in COMPONENT_NAMES.items())
                + ", or 'none'"
            )
        if letter not in allowed:
            raise TaskError(
                f"{task}: its scratchpad has no {COMPONENT_NAMES[letter]} component "
                f"({letter!r}); use letters of {allowed!r} or 'none'"
            )
    if len(set(value)) != len(value):
        raise TaskError(f"{task}: scratchpad {value!r} repeats a component letter")
    return "".join(letter for letter in COMPONENTS if letter in value)


def render(steps: list[Step], fmt: str) -> str:
    """The whole scratchpad: opening words, the steps joined by ``#``, closing words."""
    body = f" {STEP_SEPARATOR} ".join(step.text(fmt) for step in steps)
    return " ".join([*OPEN, body, *CLOSE]) if body else " ".join([*OPEN, *CLOSE])


def with_scratchpad(answer: str, steps: list[Step], fmt: str) -> str:
    """The target: the scratchpad then the answer sentence (the answer alone for fmt '')."""
    return f"{render(steps, fmt)} {answer}" if fmt else answer


def _find(words: list[str], sub: tuple[str, ...], start: int = 0) -> int:
    """Index of the first occurrence of `sub` in `words` at or after `start`, else -1."""
    n = len(sub)
    for i in range(start, len(words) - n + 1):
        if tuple(words[i : i + n]) == sub:
            return i
    return -1


def final_answer(text: str) -> str | None:
    """The words after the first closing marker (``. Thus ,``); None if there is none."""
    words = text.split()
    at = _find(words, CLOSE)
    return None if at < 0 else " ".join(words[at + len(CLOSE) :])


def steps_of(text: str) -> list[str]:
    """The step texts of a scratchpad (opening words dropped when present, cut at the closing
    marker when present), split on ``#``; [] when there is no step text."""
    words = text.split()
    if tuple(words[: len(OPEN)]) == OPEN:
        words = words[len(OPEN) :]
    at = _find(words, CLOSE)
    if at >= 0:
        words = words[:at]
    if not words:
        return []
    steps, current = [], []
    for w in words:
        if w == STEP_SEPARATOR:
            steps.append(" ".join(current))
            current = []
        else:
            current.append(w)
    steps.append(" ".join(current))
    return steps


@dataclass(frozen=True)
class StepScore:
    """How a prediction's scratchpad compares with the gold one, step by step."""

    n_steps: int  # gold steps
    n_right: int  # predicted steps equal to the gold step at the same index
    first_wrong: int | None  # index of the first wrong or missing step (n_steps: an extra one)

    @property
    def share_right(self) -> float:
        return self.n_right / self.n_steps if self.n_steps else float("nan")


def score_steps(target: str, prediction: str) -> StepScore:
    """Per-step score of `prediction` against the gold `target` (both full targets)."""
    gold, pred = steps_of(target), steps_of(prediction)
    right = [i < len(pred) and pred[i] == g for i, g in enumerate(gold)]
    first = next((i for i, ok in enumerate(right) if not ok), None)
    if first is None and len(pred) > len(gold):
        first = len(gold)
    return StepScore(len(gold), sum(right), first)


def label_words(words: list[str], fmt: str) -> list[str]:
    """The region of each word of a target (what follows the prompt): a component name
    (`COMPONENT_NAMES`), "markers" (opening and closing words, component markers, ``#``) or
    "answer" (after the closing marker). Works on any generated text: a component runs from
    its marker to the next marker of a later component of `fmt` in the same step (markers of
    components outside `fmt` are content words); with fmt '' every word is "answer"."""
    if not fmt:
        return [ANSWER] * len(words)
    labels = []
    state = MARKS  # before the first component marker: the opening words
    order = {MARKERS[c]: k for k, c in enumerate(fmt)}
    k_now = -1  # index in fmt of the current component
    i = 0
    while i < len(words):
        w = words[i]
        if tuple(words[i : i + len(CLOSE)]) == CLOSE and state != ANSWER:
            labels += [MARKS] * len(CLOSE)
            i += len(CLOSE)
            state = ANSWER
            continue
        if state == ANSWER:
            labels.append(ANSWER)
        elif w == STEP_SEPARATOR:
            labels.append(MARKS)
            state, k_now = MARKS, -1
        elif state != "variables" and w in order and order[w] > k_now:
            letter = fmt[order[w]]
            labels.append(MARKS)
            state, k_now = COMPONENT_NAMES[letter], order[w]
        elif state == "variables" and w == VARIABLES_END:
            labels.append(MARKS)
            state = MARKS
        else:
            labels.append(state)
        i += 1
    return labels


def components_of(target: str, fmt: str) -> list[dict[str, str]]:
    """Each step's component texts, read back from a target by `label_words`:
    [{"input": ..., "computation": ..., ...}] for the components of `fmt`."""
    words = target.split()
    labels = label_words(words, fmt)
    steps: list[dict[str, list[str]]] = [{}]
    for w, lab in zip(words, labels, strict=True):
        if lab == ANSWER:
            break
        if w == STEP_SEPARATOR and lab == MARKS:
            steps.append({})
        elif lab in COMPONENT_NAMES.values():
            steps[-1].setdefault(lab, []).append(w)
    names = [COMPONENT_NAMES[c] for c in fmt]
    return [{n: " ".join(step.get(n, [])) for n in names} for step in steps]
