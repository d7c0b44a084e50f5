import math
import warnings

import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from nopeinterp import PE_TYPES, build_model
from nopeinterp._tl import TL4, HookedTransformer, HookedTransformerConfig
from nopeinterp.models import alibi_slopes
from tests.conftest import TINY

pytestmark = pytest.mark.tl4

# TL 3.9's own components: the reference our forwards were written against
needs_tl3 = pytest.mark.skipif(
    TL4, reason="TransformerLens 4 removed the reference (TL 3.9's HookedTransformer)"
)

N_CTX = TINY["n_ctx"]


def tokens(batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["d_vocab"], (batch, length), generator=g)


# --- every PE -----------------------------------------------------------------------------------
@pytest.mark.parametrize("pe", PE_TYPES)
def test_forward_cache_pattern_and_length(pe, tiny):
    model = tiny(pe)
    length = 4 * N_CTX
    if pe == "ape":
        with pytest.raises(ValueError, match=f"{N_CTX} positions"):
            model(tokens(2, length))
        length = N_CTX
    logits, cache = model.run_with_cache(
        tokens(2, length), names_filter=lambda name: name == "blocks.0.attn.hook_pattern"
    )
    assert logits.shape == (2, length, TINY["d_vocab"])
    assert list(cache.keys()) == ["blocks.0.attn.hook_pattern"]
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert pattern.shape == (2, TINY["n_heads"], length, length)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(2, TINY["n_heads"], length))
    assert (pattern.triu(diagonal=1) == 0).all()


@pytest.mark.parametrize("pe", [pe for pe in PE_TYPES if pe != "ape"])
def test_long_inputs_8x(pe, tiny):
    logits = tiny(pe)(tokens(1, 8 * N_CTX))
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("pe", PE_TYPES)
def test_prefix_outputs_equal_full_outputs(pe, tiny):
    """Causality: logits at positions < L do not depend on tokens at positions >= L."""
    model = tiny(pe)
    full = tokens(3, N_CTX)
    torch.testing.assert_close(model(full[:, :7]), model(full)[:, :7], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pe", PE_TYPES)
def test_kv_cache_matches_full_forward(pe, tiny):
    """Decoding with the KV cache must see the same positions as a full forward pass."""
    model = tiny(pe)
    seq = tokens(2, 12)
    cache = model.init_kv_cache(2)
    ones = torch.ones_like(seq)
    pieces = [model(seq[:, :5], past_kv_cache=cache, attention_mask=ones[:, :5])]
    for t in range(5, 12):
        pieces.append(model(seq[:, t : t + 1], past_kv_cache=cache, attention_mask=ones[:, :1]))
    torch.testing.assert_close(torch.cat(pieces, 1), model(seq), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pe", PE_TYPES)
def test_standard_hooks_exist(pe, tiny):
    model = tiny(pe)
    names = set(model.hook_dict)
    expected = {"hook_embed"}
    for layer in range(TINY["n_layers"]):
        expected |= {f"blocks.{layer}.hook_resid_{s}" for s in ("pre", "mid", "post")}
        expected |= {
            f"blocks.{layer}.attn.hook_{s}" for s in ("q", "k", "v", "z", "attn_scores", "pattern")
        }
    assert expected <= names
    _, cache = model.run_with_cache(tokens(1, 8))
    assert (
        cache.accumulated_resid().shape[0] == TINY["n_layers"] + 1
    )  # ActivationCache helper works


@pytest.mark.parametrize("pe", PE_TYPES)
def test_same_seed_same_weights(pe, tiny):
    a, b, c = tiny(pe, seed=3), tiny(pe, seed=3), tiny(pe, seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


# --- our forwards vs TL 3.9's HookedTransformer components (same weights) -----------------
def _tl3_forward_and_grads(model, toks, mask):
    """Logits and parameter gradients of a TL 3.9 HookedTransformer given `model`'s weights
    (default architecture; its PE's terms added by TL's own rotary or ALiBi where TL has one,
    so this covers nope, rotary, ape; alibi via TL's ALiBi)."""
    cfg = model.cfg
    kind = {"rotary": "rotary", "ape": "standard", "nope": "rotary"}[model.pe]
    extra = {"rotary_dim": cfg.rotary_dim} if model.pe == "rotary" else {"rotary_dim": 2}
    ref_cfg = HookedTransformerConfig(
        n_layers=cfg.n_layers, n_heads=cfg.n_heads, d_model=cfg.d_model, d_head=cfg.d_head,
        d_mlp=cfg.d_mlp, d_vocab=cfg.d_vocab, n_ctx=cfg.n_ctx, act_fn=cfg.act_fn,
        positional_embedding_type=kind, **extra,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ref = HookedTransformer(ref_cfg)
    ref.load_state_dict(model.state_dict(), strict=False)
    if model.pe == "nope":  # TL has no NoPE: rotary on nothing (sin 0, cos 1)
        for block in ref.blocks:
            block.attn.rotary_sin.zero_()
            block.attn.rotary_cos.fill_(1.0)
    return _forward_and_grads(ref, toks, mask)


def _forward_and_grads(model, toks, mask):
    model.zero_grad(set_to_none=True)
    logits = model(toks, attention_mask=mask)
    logits.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return logits.detach(), grads


@needs_tl3
@pytest.mark.parametrize("pe", ["nope", "rotary", "ape"])
def test_forward_and_backward_match_transformerlens_3(pe, tiny):
    model = tiny(pe)
    with torch.no_grad():  # biases away from 0 so they matter
        for p in model.parameters():
            if p.ndim == 1 and (p == 0).all():
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(p.numel()))
    toks = tokens(3, N_CTX)
    mask = torch.ones_like(toks)
    mask[0, :3] = 0  # left padding, as batched generation uses
    ours, ours_grads = _forward_and_grads(model, toks, mask)
    ref, ref_grads = _tl3_forward_and_grads(model, toks, mask)
    real = mask.bool()
    torch.testing.assert_close(ours[real], ref[real], rtol=1e-5, atol=1e-5)
    for name in ours_grads:
        torch.testing.assert_close(ours_grads[name], ref_grads[name], rtol=1e-4, atol=1e-6)


def test_layernorm_hooks_still_fire_and_carry_tl_values(tiny):
    model = tiny("nope")
    toks = tokens(2, N_CTX)
    names = ("blocks.0.ln1.hook_scale", "blocks.1.ln2.hook_normalized", "ln_final.hook_scale")
    logits, cache = model.run_with_cache(toks, names_filter=lambda n: n in names)
    assert set(cache.keys()) == set(names)
    resid = model.run_with_cache(toks, names_filter="blocks.0.hook_resid_pre")[1]
    resid = resid["blocks.0.hook_resid_pre"]
    centred = resid - resid.mean(-1, keepdim=True)
    scale = (centred.pow(2).mean(-1, keepdim=True) + model.cfg.eps).sqrt()
    torch.testing.assert_close(cache["blocks.0.ln1.hook_scale"], scale)
    torch.testing.assert_close(logits, model(toks))  # hooked (TL) path = fused path


@needs_tl3
def test_learned_position_embedding_matches_transformerlens(tiny):
    from transformer_lens.components import PosEmbed

    pos_embed = tiny("ape").pos_embed
    toks = tokens(3, 8)
    right = torch.ones(3, 8, dtype=torch.long)
    right[0, 5:] = 0  # right padding: the sliced path
    right[2, :] = 0
    left = right.flip(1)  # left padding: the gathered path
    for mask, offset in [(None, 0), (right, 0), (left, 0), (right, 3)]:
        t = toks[:, offset:]
        ours = pos_embed(t, offset, mask)
        torch.testing.assert_close(ours, PosEmbed.forward(pos_embed, t, offset, mask))


def test_building_does_not_warn(tiny):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny("nope")


def test_unknown_pe_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown positional encoding 'bogus'.*nope"):
        build_model("bogus", **TINY)


# --- NoPE -------------------------------------------------------------------------------------
def test_nope_has_no_position_weights(tiny):
    model = tiny("nope")
    assert not [k for k in model.state_dict() if "pos" in k]
    assert "hook_pos_embed" not in model.hook_dict
    # Without a causal mask a NoPE model is permutation-equivariant; with it, position 0 sees only
    # itself: its output is the same whatever follows or precedes... check row 0 on shuffles.
    seq = tokens(1, 10)
    perm = torch.cat([seq[:, :1], seq[:, 1:].flip(1)], 1)
    torch.testing.assert_close(model(seq)[:, 0], model(perm)[:, 0])


# --- T5 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "num_buckets,max_distance", [(32, 128), (16, 64), (8, 20), (64, 512), (32, 40)]
)
def test_t5_buckets_match_transformers(num_buckets, max_distance, tiny):
    model = tiny("t5", num_buckets=num_buckets, max_distance=max_distance)
    table = model.rel_pos_bias[0]
    got = table.buckets(1001, 1001)  # [query, key]
    q = torch.arange(1001)[:, None]
    k = torch.arange(1001)[None, :]
    want = T5Attention._relative_position_bucket(
        k - q, bidirectional=False, num_buckets=num_buckets, max_distance=max_distance
    )
    causal = k <= q
    assert torch.equal(got[causal], want[causal])
    assert got[causal].max() == num_buckets - 1  # the far buckets are reached


def test_t5_bias_is_in_scores_and_has_its_hook(tiny):
    model = tiny("t5")
    with torch.no_grad():
        for block in model.blocks:  # q.k = 0: the scores are the bias alone
            block.attn.W_Q.zero_()
            block.attn.b_Q.zero_()
    _, cache = model.run_with_cache(tokens(1, 10))
    table = model.rel_pos_bias[0]
    expected = table.W_bias[table.buckets(10, 10)].permute(2, 0, 1)
    for layer in range(TINY["n_layers"]):
        bias = cache[f"blocks.{layer}.attn.hook_position_bias"][0]
        torch.testing.assert_close(bias, expected)
        scores = cache[f"blocks.{layer}.attn.hook_attn_scores"][0]
        causal = torch.ones(10, 10).tril().bool()
        torch.testing.assert_close(scores[:, causal], expected[:, causal])
        assert torch.isinf(scores[:, ~causal]).all()


def test_t5_shared_and_per_layer_tables(tiny):
    assert len(tiny("t5").rel_pos_bias) == 1
    per_layer = tiny("t5", shared=False)
    assert len(per_layer.rel_pos_bias) == TINY["n_layers"]
    assert sum("W_bias" in k for k in per_layer.state_dict()) == TINY["n_layers"]


# --- ALiBi --------------------------------------------------------------------------------------
def alibi_paper_slopes(n):
    """The ALiBi paper's reference code (Press et al., attention_with_linear_biases)."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest) + alibi_paper_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("n_heads", range(1, 17))
def test_alibi_slopes_match_paper(n_heads):
    torch.testing.assert_close(
        alibi_slopes(n_heads), torch.tensor(alibi_paper_slopes(n_heads), dtype=torch.float32)
    )


def test_alibi_scores_do_not_depend_on_earlier_longer_inputs(tiny):
    """TL 3.9 caches its ALiBi bias at the longest length seen; ours must not."""
    model = tiny("alibi", n_heads=3, d_model=24)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_Q.zero_()
            block.attn.b_Q.zero_()
    short = tokens(1, 6)
    _, before = model.run_with_cache(short)
    model(tokens(1, 40))
    _, after = model.run_with_cache(short)
    name = "blocks.1.attn.hook_attn_scores"
    torch.testing.assert_close(before[name], after[name])
    dist = (torch.arange(6)[:, None] - torch.arange(6)[None, :]).float()
    expected = -alibi_slopes(3)[:, None, None] * dist
    causal = dist >= 0
    torch.testing.assert_close(after[name][0][:, causal], expected[:, causal])


# --- Rotary -------------------------------------------------------------------------------------
@needs_tl3
def test_rotary_matches_stock_transformerlens(tiny):
    ours = tiny("rotary")
    assert ours.cfg.rotary_dim == 2  # 25% of d_head 8
    cfg = HookedTransformerConfig(**{**ours.cfg.to_dict(), "positional_embedding_type": "rotary"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        stock = HookedTransformer(cfg)
    stock.load_state_dict(ours.state_dict(), strict=False)
    seq = tokens(2, N_CTX)
    torch.testing.assert_close(ours(seq), stock(seq))
    # and the rotation really is applied: zeroing it changes the logits
    assert not torch.allclose(ours(seq), tiny("nope")(seq))


def test_rotary_fraction_option(tiny):
    assert tiny("rotary", fraction=1.0).cfg.rotary_dim == 8
    assert tiny("rotary", fraction=0.5).cfg.rotary_dim == 4
    with pytest.raises(ValueError):
        tiny("rotary", fraction=0)


# --- absolute embeddings ------------------------------------------------------------------------
def test_sinusoidal_embedding_values(tiny):
    model = tiny("sinusoidal")
    _, cache = model.run_with_cache(tokens(1, 40), names_filter="hook_pos_embed")
    emb = cache["hook_pos_embed"][0]
    pos = torch.arange(40.0)[:, None]
    i = torch.arange(0, 32, 2.0)[None, :]
    torch.testing.assert_close(emb[:, 0::2], torch.sin(pos / 10000 ** (i / 32)))
    torch.testing.assert_close(emb[:, 1::2], torch.cos(pos / 10000 ** (i / 32)))
    assert not [k for k, v in model.named_parameters() if "pos" in k]


@pytest.mark.parametrize("layout", ["interleaved", "halves"])
def test_sinusoidal_rows_are_looked_up_as_computed(tiny, layout):
    """The embedding's cached rows give what the formula gives at each token's position: no
    padding, left padding, a KV-cache offset, and positions past n_ctx (the table grows)."""
    from nopeinterp.models.ape import SinusoidalPosEmbed, sinusoidal_embedding

    model = tiny("sinusoidal")
    module = SinusoidalPosEmbed(model.cfg, layout)
    d, n_ctx = model.cfg.d_model, model.cfg.n_ctx
    toks = tokens(2, 6)
    got = module(toks)
    torch.testing.assert_close(
        got, sinusoidal_embedding(torch.arange(6), d, layout).expand(2, 6, d)
    )
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    want = sinusoidal_embedding(torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]]), d, layout)
    want[0, :2] = 0
    torch.testing.assert_close(module(toks, attention_mask=mask), want)
    far = module(tokens(1, 3), past_kv_pos_offset=n_ctx + 4)[0]
    torch.testing.assert_close(
        far, sinusoidal_embedding(torch.arange(n_ctx + 4, n_ctx + 7), d, layout)
    )
    got[:] = 0  # a caller writing into its embedding leaves the cached rows alone
    torch.testing.assert_close(module(toks)[0], sinusoidal_embedding(torch.arange(6), d, layout))


def test_pe_options_are_checked(tiny):
    with pytest.raises(TypeError, match="takes no options"):
        tiny("nope", num_buckets=3)
