"""The model protocol under TransformerLens 3.9 and 4.x. `make test-tl4` runs the tests marked
`tl4` (this module among them) in a TL 4 environment; the main environment runs them under 3.9.

Imported models (`from_hf`: a HookedTransformer under 3.9, a TransformerBridge under 4.x)
compute what the transformers model computes and go through the analyses with their defaults;
our own models and every shipped checkpoint give the same logits under both and go through
the analyses."""

from pathlib import Path

import pytest
import torch
import transformers as tf
from test_hf_analyses import VOCAB, word_tokenizer

from nopeinterp.models.hf import from_hf
from nopeinterp.probing import distance_dependence, probe_position
from nopeinterp.similarity import compare_attention

pytestmark = pytest.mark.tl4

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"


def tiny(name, seed=0):
    common = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2)
    model_cls, config = {
        "gpt2": (tf.GPT2LMHeadModel, tf.GPT2Config(n_embd=32, n_head=4, n_layer=2, n_positions=64, **common)),
        "llama": (tf.LlamaForCausalLM, tf.LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, intermediate_size=48, max_position_embeddings=64, **common)),
        "neox": (tf.GPTNeoXForCausalLM, tf.GPTNeoXConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48, max_position_embeddings=64, rotary_pct=0.5, **common)),
    }[name]  # fmt: skip
    torch.manual_seed(seed)
    return model_cls(config).eval()


@pytest.mark.parametrize("name", ["gpt2", "llama", "neox"])
def test_imported_models_compute_the_transformers_logits_and_hidden_states(name):
    hf = tiny(name)
    model = from_hf(hf)
    toks = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(toks, output_hidden_states=True)
        wanted = {"blocks.0.hook_resid_post", "blocks.1.attn.hook_pattern"}
        logits, cache = model.run_with_cache(toks, names_filter=lambda n: n in wanted)
    torch.testing.assert_close(logits, want.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        cache["blocks.0.hook_resid_post"], want.hidden_states[1], atol=1e-4, rtol=1e-4
    )
    pattern = cache["blocks.1.attn.hook_pattern"]
    assert pattern.shape == (2, 4, 12, 12)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 4, 12))
    assert model.cfg.n_layers == 2 and model.hf_architecture == type(hf).__name__


def test_analyses_run_with_their_defaults_on_an_imported_gpt2():
    tok = word_tokenizer()
    model, other = from_hf(tiny("gpt2"), tokenizer=tok), from_hf(tiny("gpt2", 1), tokenizer=tok)
    probe = probe_position(model, progress=False)
    assert set(probe.table["model"]) == {"trained", "random_init", "shuffled", "constant"}
    assert probe.table["value"].notna().all() and "ID" in set(probe.table["split"])
    dist = distance_dependence(model, progress=False)
    assert set(dist.table["layer"]) == {0, 1}
    same = compare_attention(model, {"other": other}, progress=False)
    assert set(same.ranking["ref"]) == {"other"} and (same.ranking["mean"] > 0).all()


def test_cli_probe_position_on_an_imported_directory(tmp_path, cli):
    tiny("llama").save_pretrained(tmp_path / "llama")
    r = cli("probe-position", "--hf", str(tmp_path / "llama"), "--n-train", "24",
            "--n-eval", "8", "--id-lengths", "4-10", "--ood-lengths", "14-20")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "random_init" in r.stdout and "OOD" in r.stdout


# Left padding of the three reference rows (tests/data/checkpoint_logits.pt: tokens and the
# last position's logits of every shipped checkpoint, recorded under TL 3.9 before our models
# moved off TL's HookedTransformer).
LEFT_PADS = (0, 3, 7)


@pytest.mark.parametrize("name", sorted(p.name for p in CHECKPOINTS.glob("*.pt")))
def test_every_shipped_checkpoint_gives_its_recorded_logits(name):
    from nopeinterp.checkpoint import load_checkpoint

    ref = torch.load(Path(__file__).parent / "data" / "checkpoint_logits.pt")
    i = ref["names"].index(name)
    tokens, d_vocab = ref["tokens"][i].long(), ref["d_vocab"][i]
    start = sum(3 * v for v in ref["d_vocab"][:i])
    want = ref["logits"][start : start + 3 * d_vocab].reshape(3, d_vocab)
    mask = torch.ones_like(tokens)
    for row, pads in enumerate(LEFT_PADS):
        mask[row, :pads] = 0
    model = load_checkpoint(CHECKPOINTS / name, device="cpu").model
    with torch.no_grad():
        logits = model(tokens, attention_mask=mask)[:, -1]
    torch.testing.assert_close(logits, want, atol=1e-5, rtol=0)


def test_analyses_run_on_a_shipped_checkpoint():
    path = CHECKPOINTS / "copy-nope.pt"
    probe = probe_position(path, n_train=24, n_eval=8, progress=False)
    assert {"trained", "random_init"} <= set(probe.table["model"])
    assert probe.table["value"].notna().all() and "OOD" in set(probe.table["split"])
    dist = distance_dependence(path, n_eval=8, progress=False)
    assert set(dist.table["layer"]) == {0, 1, 2, 3}
    same = compare_attention(path, {"other": CHECKPOINTS / "copy-nope-seed1.pt"}, n_per_length=1, progress=False)  # fmt: skip
    assert (same.ranking["mean"] > 0).all()


def test_cli_probe_position_on_a_shipped_checkpoint(cli):
    r = cli("probe-position", str(CHECKPOINTS / "copy-t5.pt"), "--n-train", "16", "--n-eval", "4")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "random_init" in r.stdout
