"""The fused attention path (F.scaled_dot_product_attention) against the explicit one."""

from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from nopeinterp import PE_TYPES, build_model
from nopeinterp.models.base import PEAttention
from tests.conftest import TINY

pytestmark = pytest.mark.tl4

VARIANTS = [(pe, {}) for pe in PE_TYPES] + [
    ("rotary", {"layer_pe": ["rotary", "t5", "nope", "fire"], "n_layers": 4}),
    ("alibi", {"layer_pe": ["kerple", "alibi", "rotary", "nope"], "n_layers": 4}),
    ("nope", {"logit_scale": [0.5, 1.0, 2.0, 3.0], "log_scale": 0.2, "log_floor": 3}),
    ("rotary", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}, "fraction": 1.0}),
    ("rotary", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "fraction": 1.0}),
    ("t5", {"attn_scale": False}),
]
IDS = [f"{pe}-{'-'.join(map(str, kw))}" for pe, kw in VARIANTS]


def tokens(batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["d_vocab"], (batch, length), generator=g)


def make(pe, kw):
    model = build_model(pe, **{**TINY, **kw})
    with torch.no_grad():  # biases away from 0 so they matter
        for p in model.parameters():
            if p.ndim == 1 and (p == 0).all():
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(p.numel()))
    return model


def forward_and_grads(model, toks, mask, fused):
    model.zero_grad(set_to_none=True)
    with (
        mock.patch.object(PEAttention, "fused", fused),
        mock.patch.object(
            F, "scaled_dot_product_attention", wraps=F.scaled_dot_product_attention
        ) as sdpa,
    ):
        logits = model(toks, attention_mask=mask)
        logits.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return logits.detach(), grads, sdpa.call_count


@pytest.mark.parametrize("pe, kw", VARIANTS, ids=IDS)
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_fused_equals_explicit_outputs_and_gradients(pe, kw, padding):
    model = make(pe, kw)
    toks = tokens(3, TINY["n_ctx"] if pe == "ape" else 3 * TINY["n_ctx"])
    mask = torch.ones_like(toks)
    if padding == "left":
        mask[0, :5] = 0
    elif padding == "right":
        mask[1, -4:] = 0
    fused, fused_grads, calls = forward_and_grads(model, toks, mask, True)
    explicit, explicit_grads, explicit_calls = forward_and_grads(model, toks, mask, False)
    assert calls == model.cfg.n_layers and explicit_calls == 0  # each path really ran
    real = mask.bool()
    torch.testing.assert_close(fused[real], explicit[real], rtol=1e-5, atol=1e-5)
    assert fused_grads.keys() == explicit_grads.keys()
    for name in explicit_grads:
        torch.testing.assert_close(
            fused_grads[name], explicit_grads[name], rtol=1e-4, atol=1e-6, msg=name
        )


@pytest.mark.parametrize("pe, kw", VARIANTS, ids=IDS)
def test_fused_kv_cache_decoding_equals_explicit_full_forward(pe, kw):
    model = make(pe, kw)
    seq = tokens(2, 14)
    cache = model.init_kv_cache(2)
    ones = torch.ones_like(seq)
    pieces = [model(seq[:, :5], past_kv_cache=cache, attention_mask=ones[:, :5])]
    for t in range(5, 14):
        pieces.append(model(seq[:, t : t + 1], past_kv_cache=cache, attention_mask=ones[:, :1]))
    with mock.patch.object(PEAttention, "fused", False):
        full = model(seq)
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pe, kw", VARIANTS, ids=IDS)
def test_attaching_a_hook_takes_the_explicit_path_with_the_same_logits(pe, kw):
    model = make(pe, kw)
    seq = tokens(2, 12)
    with mock.patch.object(
        F, "scaled_dot_product_attention", wraps=F.scaled_dot_product_attention
    ) as sdpa:
        plain = model(seq)
        assert sdpa.call_count == model.cfg.n_layers
        seen = []
        hooked = model.run_with_hooks(
            seq,
            fwd_hooks=[("blocks.0.attn.hook_pattern", lambda x, hook: seen.append(x) or x)],
        )
        assert sdpa.call_count == 2 * model.cfg.n_layers - 1  # layer 0 went explicit
        _, cache = model.run_with_cache(seq, names_filter=lambda n: n.endswith("hook_pattern"))
    assert len(seen) == 1
    torch.testing.assert_close(hooked, plain, rtol=1e-5, atol=1e-5)
    assert len(cache) == model.cfg.n_layers
    for layer in range(model.cfg.n_layers):
        torch.testing.assert_close(
            cache[f"blocks.{layer}.attn.hook_pattern"].sum(-1), torch.ones(2, 4, 12)
        )


def test_hooks_on_position_terms_take_the_explicit_path():
    model = make("t5", {})
    seq = tokens(1, 8)
    with mock.patch.object(
        F, "scaled_dot_product_attention", wraps=F.scaled_dot_product_attention
    ) as sdpa:
        doubled = model.run_with_hooks(
            seq, fwd_hooks=[("blocks.1.attn.hook_position_bias", lambda x, hook: 2 * x)]
        )
        assert sdpa.call_count == 1
    # the patched bias is the one used
    assert not torch.allclose(doubled, model(seq))
