"""Task interface shared by every synthetic task of the length-generalization suite.

A task turns a length and a random generator into one :class:`Example`. Prompts and targets
are whitespace-separated words (digits spaced, punctuation as separate words), so a
word-level tokenizer covers them exactly.

Split disjointness
------------------
``generate`` keeps train and held-out (val/test) examples disjoint with a stable hash
partition: an example is *held out* iff ``hash_bucket(prompt) < HELD_OUT_PERCENT``
(md5 of the prompt, so the same on every machine and Python run). "train" only emits
non-held-out examples, "val" only held-out ones. "test" uses OOD lengths, which train never
sees, so the rule is applied to test only for lengths that also lie in the ID range (e.g.
when ``lengths=`` is given explicitly).

Fallback for tiny lengths: some lengths have very few distinct examples (parity of 1 bit has
two), so one side of the partition can be empty. ``generate`` gives up on such a length
after ``MAX_TRIES_PER_LENGTH`` consecutive rejections and draws from the remaining lengths
instead, which keeps the splits disjoint at the cost of under-representing that length. If
every requested length is exhausted it raises ``ValueError``.
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

SPLITS = ("train", "val", "test")
HELD_OUT_PERCENT = 10
MAX_TRIES_PER_LENGTH = 200

LengthSpec = int | tuple[int, int] | Iterable[int] | None


@dataclass(frozen=True)
class Example:
    """One task instance.

    ``prompt`` is everything the model is given and ends with the task's separator word;
    ``target`` holds only the answer words (what is scored and trained on); ``length`` is the
    paper's notion of length for the task.
    """

    prompt: str
    target: str
    length: int


def normalize_words(text: str) -> str:
    """Collapse any whitespace run to one space and strip the ends."""
    return " ".join(text.split())


def hash_bucket(prompt: str) -> int:
    """Stable bucket in [0, 100) for a prompt (md5, independent of PYTHONHASHSEED)."""
    digest = hashlib.md5(normalize_words(prompt).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 100


def is_held_out(prompt: str) -> bool:
    """True iff the prompt belongs to the held-out pool reserved for val/test."""
    return hash_bucket(prompt) < HELD_OUT_PERCENT


def unique_words(*groups: Iterable[str]) -> list[str]:
    """Concatenate word groups, dropping repeats but keeping first-seen order."""
    return list(dict.fromkeys(w for group in groups for w in group))


def spaced_digits(n: int) -> str:
    """``-123`` -> ``"- 1 2 3"``: one word per digit, so numbers share the digit vocabulary."""
    sign = "- " if n < 0 else ""
    return sign + " ".join(str(abs(n)))


def answer_sentence(answer: str) -> str:
    """The paper's answer wording, e.g. ``"The answer is 4 6 ."``."""
    return f"The answer is {answer} ."


class Task(ABC):
    """Base class: subclasses set ``name``/length defaults and implement vocab and sample."""

    name: str
    id_lengths: tuple[int, int]
    ood_lengths: tuple[int, int]
    separator: str  # last word of every prompt

    def __init__(
        self,
        *,
        id_lengths: tuple[int, int] | None = None,
        ood_lengths: tuple[int, int] | None = None,
    ) -> None:
        if id_lengths is not None:
            self.id_lengths = tuple(id_lengths)
        if ood_lengths is not None:
            self.ood_lengths = tuple(ood_lengths)
        for lo, hi in (self.id_lengths, self.ood_lengths):
            if not (self.min_length <= lo <= hi <= self.max_length):
                raise ValueError(
                    f"{self.name}: length range ({lo}, {hi}) outside "
                    f"[{self.min_length}, {self.max_length}]"
                )

    # Limits on what sample() can produce; subclasses narrow them where needed.
    min_length: int = 1
    max_length: int = 10_000

    @abstractmethod
    def vocab(self) -> list[str]:
        """Every word a prompt or target can contain, in a deterministic order."""

    @abstractmethod
    def sample(self, length: int, rng: random.Random) -> Example:
        """One example of exactly ``length``."""

    def has_length(self, length: int) -> bool:
        """Whether any example of this length exists (SCAN has gaps)."""
        return self.min_length <= length <= self.max_length

    def is_correct(self, example: Example, prediction: str) -> bool:
        """Exact match of the answer words, ignoring whitespace differences."""
        return normalize_words(prediction) == normalize_words(example.target)

    def split_lengths(self, split: str) -> range:
        """Lengths of a split: "train"/"val" -> ID range, "test" -> OOD range (inclusive)."""
        if split in ("train", "val"):
            lo, hi = self.id_lengths
        elif split == "test":
            lo, hi = self.ood_lengths
        else:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        return range(lo, hi + 1)

    def _resolve_lengths(self, lengths: LengthSpec, split: str) -> list[int]:
        # A 2-tuple is an inclusive (lo, hi) range; any other iterable is an explicit list.
        if lengths is None:
            out = list(self.split_lengths(split))
        elif isinstance(lengths, int):
            out = [lengths]
        elif isinstance(lengths, tuple) and len(lengths) == 2:
            out = list(range(lengths[0], lengths[1] + 1))
        else:
            out = sorted(set(lengths))
        bad = [n for n in out if not (self.min_length <= n <= self.max_length)]
        if not out or bad:
            shown = bad or out
            shown = (
                shown if len(shown) <= 6 else f"{shown[:3]} ... {shown[-1]} ({len(shown)} lengths)"
            )
            raise ValueError(
                f"{self.name}: invalid lengths {shown}: {self.name} has lengths "
                f"{self.min_length}-{self.max_length}"
            )
        return [n for n in out if self.has_length(n)]

    def generate(
        self,
        n: int,
        *,
        lengths: LengthSpec = None,
        seed: int = 0,
        split: str = "train",
    ) -> list[Example]:
        """``n`` examples, deterministic in (task settings, seed, split, lengths).

        Lengths are drawn uniformly from the split's range unless ``lengths`` is given as an
        int, an inclusive ``(lo, hi)`` tuple or an iterable of ints. Each split draws from its
        own random stream, and the hash partition (module docstring) keeps train disjoint from
        val and test.
        """
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        candidates = self._resolve_lengths(lengths, split)
        if not candidates:
            raise ValueError(f"{self.name}: no examples exist for lengths {lengths}")
        id_lo, id_hi = self.id_lengths
        # str seeds are hashed with sha512 by random.Random: stable across runs.
        rng = random.Random(f"nopeinterp/{self.name}/{split}/{seed}")
        out: list[Example] = []
        while len(out) < n:
            if not candidates:
                raise ValueError(
                    f"{self.name}: no {split} examples available for lengths {lengths} "
                    "under the train/held-out partition"
                )
            length = rng.choice(candidates)
            # Partition applies wherever train could produce the same length.
            partitioned = split == "train" or id_lo <= length <= id_hi
            want_held_out = split != "train"
            for _ in range(MAX_TRIES_PER_LENGTH):
                ex = self.sample(length, rng)
                if not partitioned or is_held_out(ex.prompt) == want_held_out:
                    out.append(ex)
                    break
            else:
                candidates.remove(length)  # this side of the partition is (nearly) empty
        return out
