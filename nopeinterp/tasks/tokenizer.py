"""Word-level Hugging Face fast tokenizer for the task suite (built locally, no download).

Ids: ``<pad>``=0, ``<bos>``=1, ``<sep>``=2, ``<eos>``=3, ``<unk>``=4, then the task words in
the order given. Prompts are split on whitespace only.

The tasks' separator word ``[SEP]`` is *normalised* to ``<sep>`` (a tokenizers ``Replace``
normaliser), so it gets the sep id but decodes / shows in ``to_str_tokens`` as ``<sep>``.
A post-processor prepends ``<bos>`` to every encoding; ``add_bos_token=True`` is recorded so
TransformerLens detects that and does not add a second one (nor try to download a
"bos-enabled" copy of the tokenizer). Built with ``bos=False`` (a task without a start token),
the tokenizer has no post-processor and ``add_bos_token=False``: nothing ever prepends
``<bos>`` (the id stays in the vocabulary, unused; ``bos_token`` is None). ``adds_bos`` tells which kind a tokenizer is;
the JSON form records ``"bos": false`` for such a tokenizer (absent means True: every
tokenizer written before the option existed adds ``<bos>``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, SEP, EOS, UNK = "<pad>", "<bos>", "<sep>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, SEP, EOS, UNK)
SEP_WORD = "[SEP]"
NAME = "nopeinterp-word-level"  # placeholder name_or_path; never resolved on the Hub
_JSON_FORMAT = "nopeinterp-word-tokenizer/1"


def _fast(backend: Tokenizer, **special) -> PreTrainedTokenizerFast:
    """The one construction of our fast tokenizers: right padding, no end token added, and a
    placeholder name (TransformerLens reads init_kwargs["name_or_path"] when handed one)."""
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, padding_side="right", add_eos_token=False, **special
    )
    tok.name_or_path = NAME
    tok.init_kwargs["name_or_path"] = NAME
    return tok


def _wrap(backend: Tokenizer, bos: bool) -> PreTrainedTokenizerFast:
    # transformers rebuilds the post-processor from add_bos_token (a "<bos> $A" template or "$A").
    # Without a start token bos_token is None: TransformerLens then keeps this tokenizer instead
    # of fetching a "bos-enabled" copy from the Hub (it sets bos_token = eos_token afterwards,
    # which adds nothing: add_bos_token stays False, and that is what ``adds_bos`` reads).
    return _fast(
        backend,
        bos_token=BOS if bos else None,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        sep_token=SEP,
        add_bos_token=bos,
    )


def wrap_bpe(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """A byte-level BPE backend (the language-modelling task's, ``tasks.lm``) as a fast
    tokenizer: ``<|endoftext|>`` ends documents and pads; no start token is ever added."""
    eot = "<|endoftext|>"
    return _fast(backend, bos_token=None, eos_token=eot, pad_token=eot, add_bos_token=False)


def adds_bos(tokenizer) -> bool:
    """Whether the tokenizer starts every encoding with ``<bos>`` (see the module docstring)."""
    return bool(getattr(tokenizer, "add_bos_token", True))


def build_tokenizer(words: Iterable[str], *, bos: bool = True) -> PreTrainedTokenizerFast:
    """Word-level tokenizer over ``words`` (duplicates and ``[SEP]`` folded in); ``bos=False``:
    no start token is ever added."""
    vocab: dict[str, int] = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for w in words:
        if not w or len(w.split()) != 1:
            raise ValueError(f"vocabulary entries must be single words, got {w!r}")
        if w != SEP_WORD and w not in vocab:
            vocab[w] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.normalizer = normalizers.Replace(SEP_WORD, SEP)
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
        )
    return _wrap(backend, bos)


def task_tokenizer(task) -> PreTrainedTokenizerFast:
    """Tokenizer covering one task's vocabulary and its start-token choice (``task.bos``);
    ``task`` is a Task or a task name."""
    if isinstance(task, str):
        from . import get_task

        task = get_task(task)
    return build_tokenizer(task.vocab(), bos=task.bos)


def tokenizer_to_json(tok: PreTrainedTokenizerFast) -> str:
    """Serialise a tokenizer from :func:`build_tokenizer` or :func:`wrap_bpe` to a plain JSON
    string (a BPE one is marked ``"kind": "byte-bpe"``)."""
    backend = json.loads(tok.backend_tokenizer.to_str())
    data = {"format": _JSON_FORMAT, "backend": backend}
    if backend.get("model", {}).get("type") == "BPE":
        data["kind"] = "byte-bpe"
    elif not adds_bos(tok):
        data["bos"] = False
    return json.dumps(data, sort_keys=True)


def tokenizer_from_json(s: str) -> PreTrainedTokenizerFast:
    """Inverse of :func:`tokenizer_to_json`."""
    data = json.loads(s)
    if data.get("format") != _JSON_FORMAT:
        raise ValueError(f"not a nopeinterp tokenizer JSON (format={data.get('format')!r})")
    if data.get("kind") == "byte-bpe":
        return wrap_bpe(Tokenizer.from_str(json.dumps(data["backend"])))
    bos = data.get("bos", True)
    if not isinstance(bos, bool):
        raise ValueError(f"tokenizer JSON: 'bos' must be true or false, got {bos!r}")
    return _wrap(Tokenizer.from_str(json.dumps(data["backend"])), bos)
