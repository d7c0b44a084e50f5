"""Per-layer positional encodings, devices and dropout (models/__init__.py, models/base.py)."""

import warnings

import pytest
import torch

from nopeinterp import build_model, load_checkpoint, save_checkpoint
from nopeinterp._tl import TL4, HookedTransformer, HookedTransformerConfig
from nopeinterp.models import layer_pes, model_config
from tests.conftest import TINY

pytestmark = pytest.mark.tl4

MIX = ["rotary", "t5", "nope", "alibi", "fire", "kerple", "t5"]
MIXED = {**TINY, "n_layers": len(MIX)}


def tokens(batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["d_vocab"], (batch, length), generator=g)


def mixed(**kw):
    return build_model("rotary", **{**MIXED, **kw}, layer_pe=MIX)


def test_each_layer_of_a_mix_is_the_block_of_a_pure_model():
    """Block i of the mixed model computes what block i of a model with PE MIX[i] in every
    layer computes, with the same weights (the bias modules copied across)."""
    model = mixed()
    resid = torch.randn(2, 11, TINY["d_model"], generator=torch.Generator().manual_seed(1))
    for layer, pe in enumerate(MIX):
        pure = build_model(pe, **MIXED)
        pure.load_state_dict(model.state_dict(), strict=False)  # blocks, embed, unembed
        if pe in ("t5", "fire", "kerple"):
            attr = {"t5": "rel_pos_bias", "fire": "fire_bias", "kerple": "kerple_bias"}[pe]
            getattr(pure, attr).load_state_dict(getattr(model, attr).state_dict())
        with torch.no_grad():
            ours = model.blocks[layer](resid)
            ref = pure.blocks[layer](resid)
            other = build_model("nope", **MIXED).blocks[layer]
            other.load_state_dict(model.blocks[layer].state_dict(), strict=False)
        torch.testing.assert_close(ours, ref)
        if pe != "nope":  # the PE really acts: the same block without it differs
            assert not torch.allclose(ours, other(resid), atol=1e-4)


def test_bias_pes_share_one_module_across_their_layers():
    model = mixed()
    assert len(model.rel_pos_bias) == 1
    t5_layers = [i for i, pe in enumerate(MIX) if pe == "t5"]
    assert model.blocks[t5_layers[0]].attn._position_bias[0] is model.rel_pos_bias[0]
    assert model.blocks[t5_layers[1]].attn._position_bias[0] is model.rel_pos_bias[0]
    assert sum(k.endswith("W_bias") for k in model.state_dict()) == 1
    per_layer = mixed(shared=False)
    assert len(per_layer.rel_pos_bias) == 2 and len(per_layer.fire_bias) == 1
    # hook points: only the layers with a bias have hook_position_bias, only rotary rotates
    names = set(model.hook_dict)
    for layer, pe in enumerate(MIX):
        has_bias = f"blocks.{layer}.attn.hook_position_bias" in names
        assert has_bias == (pe in ("t5", "alibi", "fire", "kerple"))
    _, cache = model.run_with_cache(tokens(1, 6), names_filter=lambda n: "hook_rot_q" in n)
    assert list(cache.keys()) == ["blocks.0.attn.hook_rot_q"]


def test_layer_pes_of_ours(tiny):
    assert layer_pes(mixed()) == MIX
    assert layer_pes(tiny("t5")) == ["t5"] * TINY["n_layers"]
    assert layer_pes(tiny("sinusoidal")) == ["sinusoidal"] * TINY["n_layers"]
    assert layer_pes(tiny("ape")) == ["ape"] * TINY["n_layers"]


@pytest.mark.skipif(TL4, reason="TransformerLens 4 removed HookedTransformer")
def test_layer_pes_of_stock_transformerlens():
    for kind, name in [("rotary", "rotary"), ("standard", "ape")]:
        extra = {"rotary_dim": 4} if kind == "rotary" else {}
        cfg = HookedTransformerConfig(
            n_layers=3,
            d_model=16,
            n_heads=2,
            d_head=8,
            n_ctx=8,
            d_vocab=10,
            act_fn="relu",
            positional_embedding_type=kind,
            **extra,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            stock = HookedTransformer(cfg)
        assert layer_pes(stock) == [name] * 3


def test_mixed_checkpoint_round_trip(tmp_path):
    model = mixed(dropout=0.1, num_buckets=8, max_distance=20, fire_hidden=4)
    config = model_config(model)
    assert config["layer_pe"] == MIX and config["dropout"] == 0.1
    path = save_checkpoint(model, tmp_path / "mix.pt")
    ckpt = load_checkpoint(path)
    assert layer_pes(ckpt.model) == MIX
    assert model_config(ckpt.model) == config
    seq = tokens(2, 12)
    torch.testing.assert_close(ckpt.model(seq), model(seq))
    st = save_checkpoint(model, tmp_path / "mix.safetensors")
    torch.testing.assert_close(load_checkpoint(st).model(seq), model(seq))


def test_uniform_layer_pe_is_the_plain_model(tiny):
    a = tiny("t5", layer_pe=["t5"] * TINY["n_layers"])
    assert model_config(a) == model_config(tiny("t5"))
    assert model_config(a)["layer_pe"] is None


@pytest.mark.parametrize(
    "layer_pe, match",
    [
        (["rotary"], "2 entries|1 entries"),
        (["rotary", "ape"], "not a per-layer PE"),
        (["nope", "t5"], "must be one of layer_pe"),
    ],
)
def test_bad_layer_pe_is_a_clear_error(layer_pe, match):
    with pytest.raises(ValueError, match=match):
        build_model("rotary", **TINY, layer_pe=layer_pe)


def test_options_of_an_absent_pe_are_refused():
    with pytest.raises(TypeError, match="num_buckets"):
        build_model("rotary", **TINY, layer_pe=["rotary", "nope"], num_buckets=8)


# --- dropout ----------------------------------------------------------------------------------
@pytest.mark.parametrize("pe", ["nope", "sinusoidal", "t5"])
def test_dropout_only_in_training_mode(pe, tiny):
    seq = tokens(2, 12)
    plain, dropped = tiny(pe), tiny(pe, dropout=0.3)
    torch.testing.assert_close(dropped(seq), plain(seq))  # eval mode: no dropout
    dropped.train()
    plain.train()
    torch.manual_seed(0)
    a = dropped(seq)
    b = dropped(seq)
    assert not torch.allclose(a, b)  # a fresh mask each call
    assert not torch.allclose(a, plain(seq))
    torch.testing.assert_close(plain(seq), plain.eval()(seq))  # dropout=0: train == eval


def test_dropout_sites(tiny):
    """Embedding, attention weights, attention output and MLP output each get dropout: with
    the MLP and attention outputs zeroed, only embedding dropout remains, and it zeroes a
    fraction close to p of the residual entries."""
    model = tiny("nope", dropout=0.5)
    model.train()
    torch.manual_seed(0)
    _, cache = model.run_with_cache(tokens(4, 16), names_filter="blocks.0.hook_resid_pre")
    resid = cache["blocks.0.hook_resid_pre"]
    zero_fraction = (resid == 0).float().mean().item()
    assert 0.4 < zero_fraction < 0.6
    model.eval()
    _, cache = model.run_with_cache(tokens(4, 16), names_filter="blocks.0.hook_resid_pre")
    assert (cache["blocks.0.hook_resid_pre"] == 0).float().mean().item() < 0.01


def test_bad_dropout():
    with pytest.raises(ValueError, match="dropout"):
        build_model("nope", **TINY, dropout=1.0)


# --- devices ----------------------------------------------------------------------------------
def test_device_argument_cpu(tiny):
    model = tiny("t5", device="cpu")
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert torch.device(model.cfg.device).type == "cpu"
    assert build_model("nope", **TINY).cfg.device is not None  # device=None resolves


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("pe", ["nope", "t5", "alibi", "rotary", "sinusoidal", "fire", "kerple"])
def test_cuda_model_matches_cpu(pe, tiny, tmp_path):
    cpu, gpu = tiny(pe, device="cpu"), tiny(pe, device="cuda")
    seq = tokens(2, 40)
    assert all(p.device.type == "cuda" for p in gpu.parameters())
    torch.testing.assert_close(gpu(seq.cuda()).cpu(), cpu(seq), atol=1e-4, rtol=1e-4)
    path = save_checkpoint(cpu, tmp_path / "m.pt")
    loaded = load_checkpoint(path, device="cuda").model
    torch.testing.assert_close(loaded(seq.cuda()).cpu(), cpu(seq), atol=1e-4, rtol=1e-4)


# --- a SmolLM3-style hybrid stack -------------------------------------------------------------
SMOL = ["rotary", "rotary", "rotary", "nope"]


def test_smollm3_style_stack_trains_on_copy_and_its_nope_layer_ignores_order(tmp_path):
    """Rotary in three layers, NoPE in the fourth (SmolLM3's no_rope_layers pattern): it
    learns copy at ID lengths, and block 3 (NoPE) maps a permutation of the earlier positions
    of its input to the same output at the last position, which rotary block 0 does not."""
    from nopeinterp.evaluation import exact_match
    from nopeinterp.tasks import get_task
    from nopeinterp.training import TrainConfig, train

    small = {"id_lengths": (2, 5), "ood_lengths": (6, 10)}
    cfg = TrainConfig(
        task="copy",
        pe="rotary",
        out=str(tmp_path / "smol.pt"),
        steps=300,
        batch_size=32,
        lr=3e-3,
        d_model=64,
        n_layers=4,
        n_heads=4,
        eval_every=300,
        eval_n=50,
        checkpoint_every=300,
        task_options=small,
        pe_options={"layer_pe": SMOL, "fraction": 0.5},
        progress=False,
    )
    ckpt = load_checkpoint(train(cfg))
    assert layer_pes(ckpt.model) == SMOL
    task = get_task("copy", **small)
    val = task.generate(100, seed=1, split="val")
    acc = sum(exact_match(ckpt.model, ckpt.tokenizer, task, val)) / len(val)
    assert acc >= 0.8, acc

    model = ckpt.model
    seq = tokens(1, 12) % model.cfg.d_vocab
    _, cache = model.run_with_cache(seq, names_filter=lambda n: n.endswith("hook_resid_pre"))
    perm = torch.cat(
        [torch.randperm(11, generator=torch.Generator().manual_seed(0)), torch.tensor([11])]
    )
    for layer, invariant in [(3, True), (0, False)]:
        resid = cache[f"blocks.{layer}.hook_resid_pre"]
        with torch.no_grad():
            out = model.blocks[layer](resid)[:, -1]
            shuffled = model.blocks[layer](resid[:, perm])[:, -1]
        if invariant:
            torch.testing.assert_close(shuffled, out, rtol=1e-5, atol=1e-5)
        else:
            assert not torch.allclose(shuffled, out, atol=1e-3)
