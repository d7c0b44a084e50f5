"""The documented way of tokenising (model.to_tokens) gives what the model was trained on."""

from pathlib import Path

import pytest
import torch

from nopeinterp import build_model, load_checkpoint, save_checkpoint
from nopeinterp.tasks import encode_examples, get_task, task_tokenizer
from nopeinterp.tasks.tokenizer import BOS, EOS, SEP, SEP_WORD

SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints" / "scan-nope.pt"


def by_hand(tok, text):
    """Ids of `<bos> words...`, from the vocabulary alone (independent of the tokenizer code)."""
    vocab = tok.get_vocab()
    return [vocab[BOS]] + [vocab[SEP if w == SEP_WORD else w] for w in text.split()]


@pytest.mark.parametrize("task", ["copy", "scan"])
def test_to_tokens_equals_the_training_encoding(task, tmp_path):
    tok = task_tokenizer(task)
    model = build_model("nope", n_layers=1, n_heads=2, d_model=16, d_vocab=len(tok), n_ctx=64)
    ckpt = load_checkpoint(save_checkpoint(model, tmp_path / "m.pt", tokenizer=tok))
    examples = get_task(task).generate(6, seed=1)
    for ex in examples:
        prompt = encode_examples(ckpt.tokenizer, [ex], with_target=False).tokens
        assert prompt[0].tolist() == by_hand(tok, ex.prompt)  # encode_examples: unchanged
        assert torch.equal(ckpt.model.to_tokens(ex.prompt), prompt)
        full = encode_examples(ckpt.tokenizer, [ex]).tokens[0].tolist()
        assert full == by_hand(tok, f"{ex.prompt} {ex.target}") + [tok.get_vocab()[EOS]]
        assert ckpt.model.to_tokens(f"{ex.prompt} {ex.target}")[0].tolist() == full[:-1]
        assert ckpt.model.to_str_tokens(ex.prompt)[0] == BOS
    # a batch of prompts: right-padded, each row as encode_examples pads it
    batch = encode_examples(ckpt.tokenizer, examples, with_target=False).tokens
    assert torch.equal(ckpt.model.to_tokens([ex.prompt for ex in examples]), batch)


@pytest.mark.skipif(not SHIPPED.exists(), reason="shipped checkpoints not present")
def test_readme_example_on_a_shipped_checkpoint():
    ckpt = load_checkpoint(SHIPPED)
    text = "Solve : jump twice after walk left [SEP]"  # the README's line
    tokens = ckpt.model.to_tokens(text)
    assert tokens[0].tolist() == by_hand(ckpt.tokenizer, text)
    assert (tokens == ckpt.tokenizer.bos_token_id).sum() == 1
