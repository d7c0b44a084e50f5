"""The fused attention of imported models (TL 3.x HookedTransformers from `from_hf`): the same
values as TL's own attention, which runs only when a hook reads the scores or the pattern."""

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
    """Without a hook on the scores or pattern, no [batch, head, query, key] tensor is made."""
    model = from_hf(tiny_hf("llama-gqa"))
    calls = []
    for block in model.blocks:
        original = block.attn.calculate_attention_scores
        monkeypatch.setattr(
            block.attn,
            "calculate_attention_scores",
            lambda q, k, original=original: calls.append(1) or original(q, k),
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
