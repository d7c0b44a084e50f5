"""Copy and Reverse: reproduce a symbol sequence, as is or transformed.

With no ``variant`` the tasks are this project's first version (a 10-letter alphabet, random
sequences; the shipped checkpoints use it). ``variant=`` selects one of the paper's splits
(Kazemnejad et al. 2023, from its public dataset builders), over the 100 symbols of
``PAPER_SYMBOLS``; ``n`` = the task's length = number of source symbols:

=========  =========================================  ================================
variant    prompt (before ``[SEP]``)                  target
=========  =========================================  ================================
cmc        ``Copy : s1 .. sn``  (random symbols)      ``s1 .. sn``
cmc2x      ``Copy : s1 .. sn``                        ``s1 .. sn [NEXT] s1 .. sn``
rsc        ``Copy : a .. a``  (one symbol n times)    ``a .. a`` (n times)
rsc2x      ``Copy : a .. a``                          ``a .. a`` (2n times)
rdc        ``Replace a with b in a .. a``             ``b .. b`` (n times), a != b
mc         ``Reverse : s1 .. sn``                     ``sn .. s1``
mc2x       ``Reverse : s1 .. sn``                     ``sn .. s1 [NEXT] sn .. s1``
mcrv       ``Reverse : s1 .. sn``                     ``sn .. s1 [NEXT] s1 .. sn``
=========  =========================================  ================================

The paper's prompts read ``Copy: ...``; here ``Copy :`` is two words (as in the first version),
so ``:`` is a task word and not one of the symbols.
"""

from __future__ import annotations

import random
import string

from nopeinterp.errors import check_choice

from .base import Example, Task, TaskError

SEP = "[SEP]"
NEXT = "[NEXT]"
DEFAULT_ALPHABET = tuple(string.ascii_lowercase[:10])  # a..j

# The paper's builders take the first 100 symbols that its T5 tokenizer keeps as one token
# each: digits, letters, the punctuation of "!$%&()*+,-./:;<=>", then further vocabulary words.
# Which punctuation marks and words passed that filter needs the T5 vocabulary (not available
# offline); a word-level tokenizer gives every symbol its own id, so only the count (100) and
# the symbols being distinct from the task words matter. ":" is left out (a task word here).
_PUNCTUATION = tuple("!$%&()*+,-./;<=>")
_WORDS = (
    "the", "to", "is", "for", "on", "that", "by", "this", "at", "from", "it",
    "are", "be", "as", "was", "or", "an", "your", "will", "can", "not", "have",
)  # fmt: skip
PAPER_SYMBOLS = (
    *string.digits,
    *string.ascii_lowercase,
    *string.ascii_uppercase,
    *_PUNCTUATION,
    *_WORDS,
)
assert len(PAPER_SYMBOLS) == len(set(PAPER_SYMBOLS)) == 100


class _SequenceTask(Task):
    """Shared machinery: ``{instruction} : {seq} [SEP]`` -> the variant's target."""

    id_lengths = (2, 20)
    ood_lengths = (21, 40)
    separator = SEP
    instruction: str
    variants: tuple[str, ...]

    def __init__(
        self,
        *,
        variant: str | None = None,
        alphabet: tuple[str, ...] | None = None,
        **kwargs,
    ) -> None:
        if variant is not None:
            check_choice(variant, self.variants, f"{self.name} variant", error=TaskError)
        self.variant = variant
        if alphabet is None:
            alphabet = DEFAULT_ALPHABET if variant is None else PAPER_SYMBOLS
        alphabet = tuple(alphabet)
        if len(alphabet) < 2 or len(set(alphabet)) != len(alphabet):
            raise TaskError("alphabet needs at least 2 distinct words")
        if any(not isinstance(w, str) or len(w.split()) != 1 for w in alphabet):
            raise TaskError("alphabet entries must be single words")
        clash = set(alphabet) & set(self._task_words())
        if clash:
            raise TaskError(f"alphabet entries {sorted(clash)} are task words")
        self.alphabet = alphabet
        super().__init__(**kwargs)

    def _task_words(self) -> list[str]:
        if self.variant == "rdc":
            return ["Replace", "with", "in", SEP]
        words = [self.instruction, ":", SEP]
        return [*words, NEXT] if self.variant in ("cmc2x", "rsc2x", "mc2x", "mcrv") else words

    def vocab(self) -> list[str]:
        words = [w for w in self._task_words() if w != SEP]
        return [*words, *self.alphabet, SEP]

    def source(self, length: int, rng: random.Random) -> list[str]:
        """The n source symbols: one repeated symbol for rsc/rsc2x, random ones otherwise."""
        if self.variant in ("rsc", "rsc2x"):
            return [rng.choice(self.alphabet)] * length
        return [rng.choice(self.alphabet) for _ in range(length)]

    def transform(self, seq: list[str]) -> list[str]:
        raise NotImplementedError

    def _example(self, seq: list[str]) -> Example:
        prompt = f"{self.instruction} : {' '.join(seq)} {SEP}"
        return Example(prompt, " ".join(self.transform(seq)), len(seq))

    def sample(self, length: int, rng: random.Random) -> Example:
        if self.variant == "rdc":
            a, b = rng.sample(self.alphabet, 2)
            return self._replace_example(a, b, length)
        return self._example(self.source(length, rng))

    def _replace_example(self, a: str, b: str, length: int) -> Example:
        prompt = f"Replace {a} with {b} in {' '.join([a] * length)} {SEP}"
        return Example(prompt, " ".join([b] * length), length)

    def pool(self, length: int) -> tuple[Example, ...] | None:
        if self.variant in ("rsc", "rsc2x"):  # one item per symbol
            return tuple(self._example([a] * length) for a in self.alphabet)
        if self.variant == "rdc":  # one item per ordered pair a != b
            return tuple(
                self._replace_example(a, b, length)
                for a in self.alphabet
                for b in self.alphabet
                if a != b
            )
        return None


class CopyTask(_SequenceTask):
    """``Copy : a b c [SEP]`` -> ``a b c`` (variants: module docstring); length = n symbols."""

    name = "copy"
    instruction = "Copy"
    variants = ("cmc", "cmc2x", "rsc", "rsc2x", "rdc")

    def transform(self, seq: list[str]) -> list[str]:
        if self.variant == "cmc2x":
            return [*seq, NEXT, *seq]
        if self.variant == "rsc2x":
            return seq * 2
        return list(seq)


class ReverseTask(_SequenceTask):
    """``Reverse : a b c [SEP]`` -> ``c b a`` (variants: module docstring); length = n."""

    name = "reverse"
    instruction = "Reverse"
    variants = ("mc", "mc2x", "mcrv")

    def transform(self, seq: list[str]) -> list[str]:
        rev = seq[::-1]
        if self.variant == "mc2x":
            return [*rev, NEXT, *rev]
        if self.variant == "mcrv":
            return [*rev, NEXT, *seq]
        return rev
