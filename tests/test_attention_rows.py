"""Attention read by blocks of query rows equals the model's own hook_pattern/hook_attn_scores."""

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from nopeinterp._tl import tl_deprecation_silenced
from nopeinterp.models import build_model
from nopeinterp.probing._stream import AttentionRows, row_blocks

ARCH = dict(n_layers=2, n_heads=3, d_model=24, d_vocab=20, n_ctx=32)
CASES = {
    "nope": dict(pe="nope"),
    "t5": dict(pe="t5"),
    "alibi": dict(pe="alibi"),
    "rotary": dict(pe="rotary"),
    "fire": dict(pe="fire"),
    "kerple": dict(pe="kerple"),
    "ape": dict(pe="ape"),
    "nope-temperature": dict(pe="nope", logit_scale=[0.5, 1.0, 2.0], log_scale=0.3),
    "mixed": dict(pe="rotary", layer_pe=["rotary", "nope"]),
    "mixed-bias": dict(pe="t5", layer_pe=["t5", "rotary"]),
}


def _data(left_pad: bool):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 20, (3, 13), generator=g)
    mask = torch.ones(3, 13, dtype=torch.long)
    if left_pad:
        mask[1, :4] = 0
        mask[2, :1] = 0
    else:
        mask[1, 9:] = 0
    return tokens, mask


def _reference(model, tokens, mask):
    _, cache = model.run_with_cache(tokens, attention_mask=mask)
    return {
        layer: (cache[f"blocks.{layer}.attn.hook_attn_scores"], cache["pattern", layer])
        for layer in range(model.cfg.n_layers)
    }


@pytest.mark.parametrize("left_pad", [False, True], ids=["right-pad", "left-pad"])
@pytest.mark.parametrize("case", list(CASES))
def test_blocks_of_rows_equal_the_full_pattern(case, left_pad):
    model = build_model(**CASES[case], **ARCH, seed=1).eval()
    tokens, mask = _data(left_pad)
    ref = _reference(model, tokens, mask)
    rows = AttentionRows(model, tokens, mask, [0, 1], scores=True)
    assert rows.by_rows  # our layers compute blocks from q and k
    T = tokens.shape[1]
    for layer in (0, 1):
        for r0, r1 in [(0, 1), (1, 5), (5, 6), (6, 13)]:
            scores, pattern = rows.rows(layer, r0, r1)
            assert pattern.shape == (3, 3, r1 - r0, r1)
            want_s, want_p = ref[layer]
            torch.testing.assert_close(pattern, want_p[:, :, r0:r1, :r1], atol=1e-6, rtol=1e-5)
            # every key after the block's last row carries no attention in the full pattern
            assert float(want_p[:, :, r0:r1, r1:].abs().sum()) == 0.0
            finite = torch.isfinite(want_s[:, :, r0:r1, :r1])
            assert torch.equal(torch.isfinite(scores), finite)
            torch.testing.assert_close(
                scores[finite], want_s[:, :, r0:r1, :r1][finite], atol=1e-5, rtol=1e-5
            )
    assert row_blocks(3, 3, T, cells=3 * 3 * T * 4) == [(0, 4), (4, 8), (8, 12), (12, 13)]


def test_rows_of_a_stock_transformerlens_model_are_slices_of_its_cache():
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=16, n_heads=2, d_head=8, n_ctx=16, d_vocab=20, act_fn="relu",
        positional_embedding_type="rotary", seed=0,
    )  # fmt: skip
    with tl_deprecation_silenced():
        model = HookedTransformer(cfg).eval()
    tokens, mask = _data(False)
    ref = _reference(model, tokens, mask)
    rows = AttentionRows(model, tokens, mask, [1], scores=True)
    assert not rows.by_rows
    scores, pattern = rows.rows(1, 3, 7)
    torch.testing.assert_close(pattern, ref[1][1][:, :, 3:7, :7])
    torch.testing.assert_close(scores, ref[1][0][:, :, 3:7, :7])
    # layer by layer from one pass: the same rows, each object holding its own layer only
    for layer, one in AttentionRows.each_layer(model, tokens, mask, [0, 1], scores=True):
        assert list(one.cache) == [layer]
        scores, pattern = one.rows(layer, 3, 7)
        torch.testing.assert_close(pattern, ref[layer][1][:, :, 3:7, :7])
        torch.testing.assert_close(scores, ref[layer][0][:, :, 3:7, :7])


def test_a_hook_on_the_pattern_still_sees_the_full_pattern_after_the_refactor():
    model = build_model("t5", **ARCH).eval()
    tokens, mask = _data(True)
    seen = []
    model.blocks[0].attn.hook_pattern.add_hook(lambda x, hook: seen.append(x.shape))
    model(tokens, attention_mask=mask)
    model.reset_hooks()
    assert seen == [torch.Size([3, 3, 13, 13])]


def test_a_hook_that_changes_the_attention_is_respected():
    """A patch on the scores must reach the analysis: the cached path runs instead."""
    model = build_model("nope", **ARCH).eval()
    tokens, mask = _data(False)

    def flat(scores, hook):
        return torch.zeros_like(scores)  # uniform attention over all keys (no causal mask)

    with model.hooks(fwd_hooks=[("blocks.1.attn.hook_attn_scores", flat)]):
        rows = AttentionRows(model, tokens, mask, [1])
        assert not rows.by_rows
        _, pattern = rows.rows(1, 2, 5)
    torch.testing.assert_close(pattern, torch.full_like(pattern, 1 / 13)[..., :5])
