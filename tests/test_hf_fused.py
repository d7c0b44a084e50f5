"""The fused attention and GELU of imported models (TL 3.x HookedTransformers from `from_hf`):
the same values as TL's own attention, which runs only when a hook reads the scores or the
pattern, and as TL's GELU formula."""

import pytest
import torch

from nopeinterp._tl import TL4
from nopeinterp.models.hf import from_hf
from nopeinterp.models.hf_fused import fusable
from tests.test_hf import left_padding, tiny_hf, tokens

pytestmark = pytest.mark.skipif(TL4, reason="TL 4 imports models as bridges, not converted")

FUSED = ["gpt2", "gpt2-scaled", "neox", "neox-sequential", "llama", "llama-gqa", "qwen2"]
PADDING = ["none", "right", "left"]


def mask_for(toks, padding):
    if padding == "none":
        return toks, None
    if padding == "left":
        return toks, left_padding(toks)
    mask = torch.ones_like(toks)
    for row, pads in enumerate((0, 3, 7)):
        if pads:
            mask[row, -pads:] = 0
    return toks, mask


def explicit_hooks(model):
    """A do-nothing hook on every pattern: TL's explicit attention runs."""
    return [(f"blocks.{i}.attn.hook_pattern", lambda t, hook: t) for i in range(model.cfg.n_layers)]


@pytest.mark.parametrize("padding", PADDING)
@pytest.mark.parametrize("name", FUSED)
def test_fused_equals_tl_attention(name, padding):
    model = from_hf(tiny_hf(name))
    assert all(fusable(b.attn) for b in model.blocks)
    toks, mask = mask_for(tokens(), padding)
    real = torch.ones_like(toks, dtype=torch.bool) if mask is None else mask.bool()
    read = ("hook_resid_post", "hook_z", "hook_q", "hook_k", "hook_v")
    with torch.no_grad():
        fused, fused_cache = model.run_with_cache(
            toks, attention_mask=mask, names_filter=lambda n: n.endswith(read)
        )
        with model.hooks(fwd_hooks=explicit_hooks(model)):
            explicit, explicit_cache = model.run_with_cache(
                toks, attention_mask=mask, names_filter=lambda n: n.endswith(read)
            )
    assert fused_cache.keys() == explicit_cache.keys() and len(fused_cache) > 0
    torch.testing.assert_close(fused[real], explicit[real], atol=1e-5, rtol=1e-5)
    for key in fused_cache:
        a, b = fused_cache[key], explicit_cache[key]
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5, msg=key)


def test_scores_and_pattern_are_computed_only_when_read(monkeypatch):
    """Without a hook on the scores or pattern, no softmax over [batch, head, query, key] runs
    (the attention is SDPA's); with one, it runs once per layer."""
    model = from_hf(tiny_hf("llama-gqa"))
    calls = []
    softmax = torch.nn.functional.softmax
    monkeypatch.setattr(
        torch.nn.functional,
        "softmax",
        lambda x, *a, **k: calls.append(x.shape) or softmax(x, *a, **k),
    )
    toks, mask = mask_for(tokens(), "right")
    with torch.no_grad():
        model(toks, attention_mask=mask)
        model.run_with_cache(toks, names_filter=lambda n: n.endswith("hook_resid_post"))
        assert calls == []
        _, cache = model.run_with_cache(toks, names_filter=lambda n: n.endswith("hook_pattern"))
    assert len(calls) == model.cfg.n_layers
    rows = cache["blocks.0.attn.hook_pattern"].sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))


@pytest.mark.parametrize("name", ["bloom", "mistral-window"])
def test_unsupported_attention_keeps_tl_forward(name):
    """ALiBi and local windows change the scores SDPA would not see: TL's forward stays."""
    model = from_hf(tiny_hf(name))
    assert not any(fusable(b.attn) for b in model.blocks)
    assert all("forward" not in vars(b.attn) for b in model.blocks)


def tl_only(model):
    """The same model with TL's own attention forward and activation back on every block."""
    from transformer_lens.factories.activation_function_factory import ActivationFunctionFactory

    for block in model.blocks:
        vars(block.attn).pop("forward", None)
        block.mlp.act_fn = ActivationFunctionFactory.pick_activation_function(model.cfg)
    return model


@pytest.mark.parametrize("name", ["gpt2", "gpt2-scaled"])
def test_tanh_gelu_is_one_kernel_with_tl_values(name, monkeypatch):
    """GPT-2's `gelu_new` runs as one GELU kernel (TL's formula keeps three or four
    [batch, pos, d_mlp] temporaries alive): no eager tanh, and TL's values at every hook
    (to float32 rounding: the kernel rounds once, the formula at each step)."""
    ours, theirs = from_hf(tiny_hf(name)), tl_only(from_hf(tiny_hf(name)))
    assert ours.cfg.act_fn == "gelu_new"
    toks, mask = mask_for(tokens(), "right")
    real = mask.bool()
    read = ("hook_pre", "hook_post", "hook_resid_post")
    with torch.no_grad():
        b, cache_b = theirs.run_with_cache(
            toks, attention_mask=mask, names_filter=lambda n: n.endswith(read)
        )
        tanh_calls = []
        real_tanh = torch.tanh
        monkeypatch.setattr(torch, "tanh", lambda x: tanh_calls.append(1) or real_tanh(x))
        a, cache_a = ours.run_with_cache(
            toks, attention_mask=mask, names_filter=lambda n: n.endswith(read)
        )
    assert tanh_calls == []
    assert cache_a.keys() == cache_b.keys() and len(cache_a) == 3 * ours.cfg.n_layers
    torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)
    for key in cache_a:
        torch.testing.assert_close(cache_a[key], cache_b[key], atol=1e-5, rtol=1e-5, msg=key)


def test_other_activations_keep_tl_functions():
    from transformer_lens.factories.activation_function_factory import ActivationFunctionFactory

    model = from_hf(tiny_hf("llama"))
    expected = ActivationFunctionFactory.pick_activation_function(model.cfg)
    assert all(block.mlp.act_fn is expected for block in model.blocks)


@pytest.mark.parametrize("padding", PADDING)
@pytest.mark.parametrize("name", ["gpt2-scaled", "neox", "llama-gqa"])
def test_explicit_path_gives_tl_values_at_every_hook(name, padding):
    """With a hook on the scores or pattern, the hook values and the outputs are TL's own."""
    ours, theirs = from_hf(tiny_hf(name)), tl_only(from_hf(tiny_hf(name)))
    toks, mask = mask_for(tokens(), padding)
    real = torch.ones_like(toks, dtype=torch.bool) if mask is None else mask.bool()
    read = ("hook_attn_scores", "hook_pattern", "hook_z", "hook_resid_post")
    with torch.no_grad():
        a, cache_a = ours.run_with_cache(
            toks, attention_mask=mask, names_filter=lambda n: n.endswith(read)
        )
        b, cache_b = theirs.run_with_cache(
            toks, attention_mask=mask, names_filter=lambda n: n.endswith(read)
        )
    assert cache_a.keys() == cache_b.keys() and len(cache_a) == 4 * ours.cfg.n_layers
    torch.testing.assert_close(a[real], b[real], atol=1e-6, rtol=1e-6)
    for key in cache_a:
        torch.testing.assert_close(cache_a[key], cache_b[key], atol=1e-6, rtol=1e-6, msg=key)


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa"])
def test_unembed_adds_its_bias_only_when_it_has_one(name, monkeypatch):
    """A Hugging Face LM head has no bias: the unembedding adds none (TL's zero `b_U` made it an
    addmm that broadcasts the bias into every logit first), and a bias set later is added."""
    import torch.nn.functional as F

    model = from_hf(tiny_hf(name))
    assert not model.unembed.b_U.any()
    toks = tokens()
    with torch.no_grad():
        before = model(toks)
        biased_calls = []
        linear = F.linear

        def spy(x, w, b=None):
            if b is not None and b.shape == model.unembed.b_U.shape:
                biased_calls.append(b)
            return linear(x, w, b)

        monkeypatch.setattr(F, "linear", spy)
        assert torch.equal(model(toks), before)
        assert biased_calls == []
        model.unembed.b_U.add_(torch.arange(model.cfg.d_vocab, dtype=before.dtype))
        shifted = model(toks)
    assert len(biased_calls) == 1
    expected = before + torch.arange(model.cfg.d_vocab, dtype=before.dtype)
    torch.testing.assert_close(shifted, expected)
