"""FIRE, KERPLE-log, NoPE temperature and RoPE scaling, each against an independent reference:
the papers' formulas written out here, and transformers' modeling_rope_utils for RoPE."""

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, rotate_half

from nopeinterp import load_checkpoint, save_checkpoint
from nopeinterp._tl import TL4
from nopeinterp.models import rope_frequencies, set_rope_scaling
from nopeinterp.models.rotary import check_rope_scaling
from tests.conftest import TINY

pytestmark = pytest.mark.tl4


def tokens(batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["d_vocab"], (batch, length), generator=g)


def zero_queries(model):
    with torch.no_grad():
        for block in model.blocks:  # q.k = 0: the scores are the bias alone
            block.attn.W_Q.zero_()
            block.attn.b_Q.zero_()
    return model


# --- FIRE -------------------------------------------------------------------------------------
def test_fire_bias_is_the_papers_formula(tiny):
    model = zero_queries(tiny("fire", fire_hidden=5, fire_threshold=6.0))
    fire = model.fire_bias[0]
    with torch.no_grad():
        fire.c.fill_(0.7)
        fire.b_in.normal_()
        fire.b_out.normal_()
    T = 12
    _, cache = model.run_with_cache(tokens(1, T))
    W1, b1, W2, b2 = fire.W_in[0], fire.b_in, fire.W_out, fire.b_out
    c, L = 0.7, 6.0
    want = torch.full((TINY["n_heads"], T, T), float("nan"))
    for i in range(T):
        for j in range(i + 1):
            x = math.log(c * (i - j) + 1) / math.log(c * max(L, i) + 1)
            want[:, i, j] = torch.relu(x * W1 + b1) @ W2 + b2
    causal = torch.ones(T, T).tril().bool()
    for layer in range(TINY["n_layers"]):
        bias = cache[f"blocks.{layer}.attn.hook_position_bias"][0]
        torch.testing.assert_close(bias[:, causal], want[:, causal])
        scores = cache[f"blocks.{layer}.attn.hook_attn_scores"][0]
        torch.testing.assert_close(scores[:, causal], want[:, causal])


def test_fire_and_kerple_learn(tiny):
    """Their parameters get gradients from the loss."""
    for pe, attr in [("fire", "fire_bias"), ("kerple", "kerple_bias")]:
        model = tiny(pe)
        model(tokens(2, 10)).square().mean().backward()
        grads = [p.grad for p in getattr(model, attr).parameters()]
        assert grads and all(g is not None and g.abs().sum() > 0 for g in grads), pe


# --- KERPLE -----------------------------------------------------------------------------------
def test_kerple_log_bias_is_the_papers_formula(tiny):
    model = zero_queries(tiny("kerple", shared=False))
    r1 = torch.tensor([0.5, 1.0, 2.0, 0.001])  # the last is clamped to 1e-2
    r2 = torch.tensor([1.0, 0.3, 3.0, 1.0])
    with torch.no_grad():
        model.kerple_bias[1].r1.copy_(r1)
        model.kerple_bias[1].r2.copy_(r2)
    T = 9
    _, cache = model.run_with_cache(tokens(1, T))
    r1 = r1.clamp(min=1e-2)
    want = torch.zeros(TINY["n_heads"], T, T)
    for h in range(TINY["n_heads"]):
        for i in range(T):
            for j in range(i + 1):
                want[h, i, j] = -r1[h] * math.log(1 + r2[h] * (i - j))
    causal = torch.ones(T, T).tril().bool()
    got = cache["blocks.1.attn.hook_position_bias"][0]
    torch.testing.assert_close(got[:, causal], want[:, causal])
    # layer 0 has its own (default) parameters: -log(1 + d)
    got0 = cache["blocks.0.attn.hook_position_bias"][0]
    d = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp(min=0).float()
    torch.testing.assert_close(got0, (-torch.log(1 + d)).expand_as(got0))


# --- NoPE temperature ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "opts",
    [
        {"logit_scale": 2.5},
        {"logit_scale": [0.5, 1.0, 2.0, 3.0]},
        {"log_scale": 0.3, "log_floor": 4},
    ],
)
def test_nope_temperature_scales_logits(opts, tiny):
    model = tiny("nope", **opts)
    plain = tiny("nope")
    T = 14
    names = lambda n: n.endswith("hook_attn_scores") or n.endswith("hook_logit_scale")  # noqa: E731
    _, cache = model.run_with_cache(tokens(1, T), names_filter=names)
    _, ref = plain.run_with_cache(tokens(1, T), names_filter=names)
    head = torch.as_tensor(opts.get("logit_scale", 1.0), dtype=torch.float).expand(TINY["n_heads"])
    pos = torch.arange(T).float()
    length = 1 + opts.get("log_scale", 0.0) * torch.log(
        torch.floor((pos + 1) / opts.get("log_floor", 1)) + 1
    )
    factor = head[:, None] * length[None, :]  # [head, query]
    torch.testing.assert_close(cache["blocks.0.attn.hook_logit_scale"][0, :, :, 0], factor)
    causal = torch.ones(T, T).tril().bool()
    # layer 0 sees the same input in both models: its scores are the plain ones times factor
    got = cache["blocks.0.attn.hook_attn_scores"][0]
    want = ref["blocks.0.attn.hook_attn_scores"][0] * factor[:, :, None]
    torch.testing.assert_close(got[:, causal], want[:, causal])


def test_learned_temperature_is_a_parameter_and_round_trips(tiny, tmp_path):
    model = tiny("nope", logit_scale="learned")
    names = [n for n, _ in model.named_parameters() if "logit_scale" in n]
    assert names == [f"blocks.{i}.attn.logit_scale.scale" for i in range(TINY["n_layers"])]
    with torch.no_grad():
        model.blocks[1].attn.logit_scale.scale.copy_(torch.tensor([0.1, 2.0, 3.0, 4.0]))
    loaded = load_checkpoint(save_checkpoint(model, tmp_path / "t.pt")).model
    torch.testing.assert_close(loaded(tokens(2, 10)), model(tokens(2, 10)))
    assert not torch.allclose(tiny("nope")(tokens(2, 10)), model(tokens(2, 10)))


def test_temperature_options_are_checked(tiny):
    with pytest.raises(ValueError, match="logit_scale"):
        tiny("nope", logit_scale="hot")
    with pytest.raises(ValueError, match="heads"):
        tiny("nope", logit_scale=[1.0, 2.0])


# --- RoPE scaling -----------------------------------------------------------------------------
def hf_config(rotary_dim, d_head, base, params, original):
    """A transformers config whose rope_parameters are ours (dynamic reads the original
    length from max_position_embeddings)."""
    return LlamaConfig(
        hidden_size=2 * d_head,
        num_attention_heads=2,
        head_dim=d_head,
        max_position_embeddings=original,
        rope_parameters={
            **params,
            "rope_theta": float(base),
            "partial_rotary_factor": rotary_dim / d_head,
        },
    )


CASES = (
    [{"rope_type": "linear", "factor": f} for f in (1.0, 2.0, 4.0, 8.0)]
    + [
        {"rope_type": "dynamic", "factor": f, "original_max_position_embeddings": 32}
        for f in (2.0, 4.0)
    ]
    + [
        {"rope_type": "yarn", "factor": f, "original_max_position_embeddings": n}
        for f in (2.0, 4.0, 16.0)
        for n in (16, 64, 2048)
    ]
    + [
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 16,
            "beta_slow": 2,
        },
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 64,
            "mscale": 0.7,
            "mscale_all_dim": 1.0,
        },
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "attention_factor": 1.5,
        },
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "truncate": False,
        },
    ]
)


@pytest.mark.parametrize("params", CASES, ids=lambda p: "-".join(str(v) for v in p.values()))
@pytest.mark.parametrize(
    "rotary_dim, d_head, base", [(8, 32, 10000), (16, 16, 500000), (4, 16, 10000)]
)
@pytest.mark.parametrize("seq_len", [10, 32, 100, 1000])
def test_rope_frequencies_match_transformers(params, rotary_dim, d_head, base, seq_len):
    original = params.get("original_max_position_embeddings", 32)
    config = hf_config(rotary_dim, d_head, base, params, original)
    want, want_factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, None, seq_len=seq_len)
    ours = check_rope_scaling(params, base, n_ctx=original)
    got, factor = rope_frequencies(rotary_dim, base, ours, seq_len)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert factor == pytest.approx(want_factor, rel=1e-12)


@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 16},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    ],
    ids=lambda p: p["rope_type"],
)
def test_scaled_rotary_model_rotates_as_transformers_llama(params, tiny):
    """hook_rot_q of a scaled model = transformers' Llama rotary embedding (its own cos, sin,
    attention scaling and dynamic update) applied to hook_q, at a length past n_ctx."""
    model = set_rope_scaling(tiny("rotary", fraction=1.0), params)
    T = 3 * TINY["n_ctx"]
    _, cache = model.run_with_cache(
        tokens(2, T), names_filter=lambda n: n.startswith("blocks.0.attn.hook_")
    )
    q = cache["blocks.0.attn.hook_q"]  # [batch, pos, head, d_head]
    d_head = model.cfg.d_head
    config = hf_config(d_head, d_head, 10000, params, TINY["n_ctx"])
    rope = LlamaRotaryEmbedding(config)
    cos, sin = rope(q, torch.arange(T)[None])  # [1, pos, d_head], already scaled
    want = q * cos[:, :, None, :] + rotate_half(q) * sin[:, :, None, :]
    torch.testing.assert_close(cache["blocks.0.attn.hook_rot_q"], want, rtol=1e-5, atol=1e-5)


def test_rope_scaling_changes_logits_only_when_set(tiny, tmp_path):
    model = tiny("rotary", fraction=1.0)
    seq = tokens(2, 40)
    plain = model(seq)
    set_rope_scaling(model, {"rope_type": "yarn", "factor": 4.0})
    scaled = model(seq)
    assert not torch.allclose(plain, scaled)
    assert model.pe_options["rope_scaling"]["original_max_position_embeddings"] == TINY["n_ctx"]
    set_rope_scaling(model, None)
    torch.testing.assert_close(model(seq), plain)
    # on load, without retraining
    path = save_checkpoint(model, tmp_path / "r.pt")
    loaded = load_checkpoint(path, rope_scaling={"rope_type": "yarn", "factor": 4.0}).model
    torch.testing.assert_close(loaded(seq), scaled)
    # and recorded in the config, so a scaled model saved reloads scaled
    again = load_checkpoint(save_checkpoint(loaded, tmp_path / "s.pt")).model
    torch.testing.assert_close(again(seq), scaled)


def test_rope_scaling_errors(tiny):
    with pytest.raises(ValueError, match="rope_type"):
        set_rope_scaling(tiny("rotary"), {"rope_type": "warp", "factor": 2.0})
    with pytest.raises(ValueError, match="factor"):
        set_rope_scaling(tiny("rotary"), {"rope_type": "linear"})
    with pytest.raises(ValueError, match="rotary layer"):
        set_rope_scaling(tiny("nope"), {"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="takes no"):
        set_rope_scaling(tiny("rotary"), {"rope_type": "linear", "factor": 2.0, "beta_fast": 3})


# --- left padding ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "pe", ["nope", "t5", "alibi", "rotary", "ape", "sinusoidal", "fire", "kerple"]
)
def test_left_padding_gives_each_sequence_its_unpadded_logits(tiny, pe):
    """Batched decoding left-pads prompts: a padded sequence must get the logits it gets alone
    (FIRE's bias reads the query's position, so it must count from the first real token)."""
    # FIRE: a threshold below the positions, else max(L, i) hides the query position
    model = tiny(pe, **({"fire_threshold": 2.0} if pe == "fire" else {})).eval()
    with torch.no_grad():
        for p in model.parameters():  # a non-trivial FIRE MLP and biases
            p.add_(0.05 * torch.randn_like(p))
    seq = tokens(2, 9, seed=3)
    pad = 4
    batch = seq.clone()
    batch[1, :pad] = 0
    mask = torch.ones_like(batch)
    mask[1, :pad] = 0
    with torch.no_grad():
        padded = model(batch, attention_mask=mask)
        alone = model(seq[1:, pad:])
    torch.testing.assert_close(padded[1, pad:], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(TL4, reason="TransformerLens 4 removed HookedTransformer")
def test_rope_scaling_on_a_stock_transformerlens_model_is_refused_clearly():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from nopeinterp._tl import tl_deprecation_silenced

    cfg = HookedTransformerConfig(
        n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=16, d_vocab=20, act_fn="relu",
        positional_embedding_type="rotary",
    )  # fmt: skip
    with tl_deprecation_silenced():
        stock = HookedTransformer(cfg)
    with pytest.raises(ValueError, match="nopeinterp's own rotary layers"):
        set_rope_scaling(stock, {"rope_type": "yarn", "factor": 2.0})
