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

Evaluation sets
---------------
``generate`` samples with replacement (right for training batches). ``eval_set`` is what a
score is computed on: every distinct item at most once. Where a task can list all items of a
length (SCAN, the repeated-symbol copy splits) and the pool is no larger than asked for, the
whole pool is used; otherwise distinct items are drawn. ``eval_set("test")`` with no size is
the task's test set (``test_size``: the whole OOD pool where it can be listed, e.g. SCAN's
3,136 commands); ``eval_set("val")`` is drawn from the held-out part of the ID lengths.

Start token
-----------
``bos`` (a task option, default True) says whether every encoded sequence starts with
``<bos>``. The tokenizer built for the task carries it (``task_tokenizer``), so training,
evaluation, probes and ``model.to_tokens`` all see the same start (or none).
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

from nopeinterp.errors import NopeinterpError, TaskError, check_choice  # noqa: F401  (TaskError: re-exported)
from nopeinterp.options import MAX_TASK_LENGTH

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
    bos: bool = True  # every encoded sequence starts with <bos> (see the module docstring)
    # Items per length of the default eval sets; "all" = the whole pool (only where it is listed)
    test_size: int | str = 100
    val_size: int | str = 25
    # Scratchpad (see tasks/scratchpad.py): the components this task's steps have ('' = the
    # task has no scratchpad), the words its steps use, and the format chosen ('' = none).
    scratchpad_components: str = ""
    scratchpad_words: tuple[str, ...] = ()
    scratchpad: str = ""

    def __init__(
        self,
        *,
        id_lengths: tuple[int, int] | None = None,
        ood_lengths: tuple[int, int] | None = None,
        bos: bool | None = None,
        scratchpad: str | None = None,
    ) -> None:
        if scratchpad is not None:
            from .scratchpad import parse_format

            if not self.scratchpad_components:
                if parse_format(scratchpad, task=self.name):
                    raise TaskError(
                        f"{self.name} has no scratchpad (tasks with one: addition, summation, "
                        "parity, sorting, polynomial, lego)"
                    )
            else:
                allowed = self.scratchpad_components
                self.scratchpad = parse_format(scratchpad, task=self.name, allowed=allowed)
        if bos is not None:
            if not isinstance(bos, bool):
                raise TaskError(f"{self.name}: bos must be True or False, got {bos!r}")
            self.bos = bos
        if id_lengths is not None:
            self.id_lengths = tuple(id_lengths)
        if ood_lengths is not None:
            self.ood_lengths = tuple(ood_lengths)
        for lo, hi in (self.id_lengths, self.ood_lengths):
            if not (self.min_length <= lo <= hi <= self.max_length):
                raise TaskError(
                    f"{self.name}: length range ({lo}, {hi}) outside "
                    f"[{self.min_length}, {self.max_length}]"
                )

    # Limits on what sample() can produce; subclasses narrow them where needed.
    min_length: int = 1
    max_length: int = MAX_TASK_LENGTH

    @abstractmethod
    def vocab(self) -> list[str]:
        """Every word a prompt or target can contain, in a deterministic order."""

    @abstractmethod
    def sample(self, length: int, rng: random.Random) -> Example:
        """One example of exactly ``length``."""

    def has_length(self, length: int) -> bool:
        """Whether any example of this length exists (SCAN has gaps)."""
        return self.min_length <= length <= self.max_length

    def held_out(self, example: Example) -> bool:
        """Whether ``example`` is in the held-out (val/test) pool: ``is_held_out`` of its prompt
        (SCAN hashes the ``Solve :`` form, so its two variants hold out the same commands)."""
        return is_held_out(example.prompt)

    def pool(self, length: int) -> tuple[Example, ...] | None:
        """Every distinct example of ``length`` in a fixed order, or None where there are too
        many to list (random sequences). Tasks with small pools override this."""
        return None

    def is_correct(self, example: Example, prediction: str) -> bool:
        """Exact match of the answer words, ignoring whitespace differences; with a scratchpad,
        of the words after its closing marker (the scratchpad itself is scored by
        `scratchpad.score_steps`)."""
        if self.scratchpad:
            from .scratchpad import final_answer

            got = final_answer(prediction)
            return got is not None and got == final_answer(example.target)
        return normalize_words(prediction) == normalize_words(example.target)

    def scratchpad_vocab(self) -> list[str]:
        """The words a scratchpad adds to the vocabulary ([] without one)."""
        from .scratchpad import TEMPLATE_WORDS

        return [*TEMPLATE_WORDS, *self.scratchpad_words] if self.scratchpad else []

    def target(self, answer: str, steps) -> str:
        """The example's target: `answer` alone, or after the scratchpad of `steps` (a
        callable returning the `Step` list, only called when a scratchpad is on)."""
        if not self.scratchpad:
            return answer
        from .scratchpad import with_scratchpad

        return with_scratchpad(answer, steps(), self.scratchpad)

    def split_lengths(self, split: str) -> range:
        """Lengths of a split: "train"/"val" -> ID range, "test" -> OOD range (inclusive)."""
        check_choice(split, SPLITS, "split", error=TaskError)
        lo, hi = self.ood_lengths if split == "test" else self.id_lengths
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
            raise TaskError(
                f"{self.name}: invalid lengths {shown}: {self.name} has lengths "
                f"{self.min_length}-{self.max_length}"
            )
        return [n for n in out if self.has_length(n)]

    def eval_set(
        self,
        split: str = "test",
        *,
        n_per_length: int | str | None = None,
        lengths: LengthSpec = None,
        seed: int = 0,
    ) -> list[Example]:
        """The items a score is computed on: each distinct item at most once, sorted by length.

        ``split`` "test" (OOD lengths) or "val" (ID lengths, held-out part only); "train" is
        refused (training draws batches with ``generate``). ``n_per_length``: an int, "all"
        (the whole pool, only for tasks that can list their items: ``pool``) or None for the
        task's default (``test_size`` / ``val_size``). A listed pool no larger than asked for
        is used whole, a larger one is subsampled without replacement; otherwise distinct items
        are drawn, giving up on a length after ``MAX_TRIES_PER_LENGTH`` repeats in a row.
        """
        if split not in ("val", "test"):
            raise TaskError(f"eval_set: split must be 'val' or 'test', got {split!r}")
        if n_per_length is None:
            n_per_length = self.test_size if split == "test" else self.val_size
        if n_per_length == "all":
            n_per_length = None
        elif not isinstance(n_per_length, int) or n_per_length < 1:
            raise TaskError(f"eval_set: n_per_length must be >= 1 or 'all', got {n_per_length!r}")
        id_lo, id_hi = self.id_lengths
        out: list[Example] = []
        for length in self._resolve_lengths(lengths, split):
            rng = random.Random(f"nopeinterp/{self.name}/eval/{split}/{seed}/{length}")
            partitioned = id_lo <= length <= id_hi  # where train could produce the same item

            def keep(ex: Example, partitioned=partitioned) -> bool:
                return not partitioned or self.held_out(ex)

            listed = self.pool(length)
            if listed is not None:
                items = [ex for ex in listed if keep(ex)]
                if n_per_length is not None and len(items) > n_per_length:
                    items = rng.sample(items, n_per_length)
                out += items
                continue
            if n_per_length is None:
                raise TaskError(
                    f"{self.name}: the items of length {length} cannot be listed; give n_per_length"
                )
            seen: dict[str, Example] = {}
            misses = 0
            while len(seen) < n_per_length and misses < MAX_TRIES_PER_LENGTH:
                ex = self.sample(length, rng)
                if keep(ex) and ex.prompt not in seen:
                    seen[ex.prompt], misses = ex, 0
                else:
                    misses += 1
            out += seen.values()
        return out

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
        check_choice(split, SPLITS, "split", error=TaskError)
        candidates = self._resolve_lengths(lengths, split)
        if not candidates:
            raise TaskError(f"{self.name}: no examples exist for lengths {lengths}")
        id_lo, id_hi = self.id_lengths
        # str seeds are hashed with sha512 by random.Random: stable across runs.
        rng = random.Random(f"nopeinterp/{self.name}/{split}/{seed}")
        out: list[Example] = []
        while len(out) < n:
            if not candidates:
                raise TaskError(
                    f"{self.name}: no {split} examples available for lengths {lengths} "
                    "under the train/held-out partition"
                )
            length = rng.choice(candidates)
            # Partition applies wherever train could produce the same length.
            partitioned = split == "train" or id_lo <= length <= id_hi
            want_held_out = split != "train"
            for _ in range(MAX_TRIES_PER_LENGTH):
                ex = self.sample(length, rng)
                if not partitioned or self.held_out(ex) == want_held_out:
                    out.append(ex)
                    break
            else:
                candidates.remove(length)  # this side of the partition is (nearly) empty
        return out
