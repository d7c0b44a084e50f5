"""The T5 architecture (`build_model(..., arch="t5")`), the paper's own model.

The t5 build is held to transformers' own `T5Stack` (decoder, no encoder states) on logits and
attention patterns, with right and left padding and through the KV cache. The other PEs are
held to `reference_forward` below, a plain T5 decoder written from the official definitions
(McGill-NLP/length-generalization, src/models/custom_t5_decoder_only.py): GPT-J rotary on the
first 25% of each head, ALiBi as +slope * key position, sines-then-cosines absolute embedding.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nopeinterp._tl import init_kv_cache
from nopeinterp.models import build_model, model_config
from nopeinterp.models.codellm import load_t5_weights, t5_state_to_ours

pytestmark = pytest.mark.tl4

N_LAYERS, N_HEADS, D_HEAD, D_MODEL, D_FF, VOCAB = 2, 3, 16, 20, 40, 50
BUCKETS, MAX_DISTANCE = 8, 20  # small, so a 30-token input reaches the log and last buckets


def t5_model(pe, **kwargs):
    """A T5-architecture model of the test shape (3 heads of 16, d_model 20)."""
    shape = dict(n_layers=N_LAYERS, n_heads=N_HEADS, d_head=D_HEAD, d_model=D_MODEL, d_mlp=D_FF)
    return build_model(pe, arch="t5", d_vocab=VOCAB, **shape, **kwargs)


def t5_pair(seed=0):
    """(transformers T5Stack, our t5-PE T5-architecture model holding its weights)."""
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Stack

    config = T5Config(
        vocab_size=VOCAB,
        d_model=D_MODEL,
        d_kv=D_HEAD,
        num_heads=N_HEADS,
        d_ff=D_FF,
        num_layers=N_LAYERS,
        feed_forward_proj="relu",
        dropout_rate=0.0,
        relative_attention_num_buckets=BUCKETS,
        relative_attention_max_distance=MAX_DISTANCE,
        is_decoder=True,
        is_encoder_decoder=False,
        use_cache=True,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    stack = T5Stack(config).eval()
    with torch.no_grad():  # random norms and a strong bias, so that every weight matters
        for name, param in stack.named_parameters():
            if "layer_norm" in name:
                param.uniform_(0.5, 1.5)
            if "relative_attention_bias" in name:
                param.normal_(0, 2.0)
    model = t5_model("t5", n_ctx=64, num_buckets=BUCKETS, max_distance=MAX_DISTANCE)
    state = t5_state_to_ours(
        stack.state_dict(), n_layers=N_LAYERS, n_heads=N_HEADS, d_head=D_HEAD, pe="t5"
    )
    load_t5_weights(model, state)
    return stack, model


def t5_logits(stack, tokens, mask, **kwargs):
    out = stack(input_ids=tokens, attention_mask=mask, output_attentions=True, **kwargs)
    hidden = out.last_hidden_state * D_MODEL**-0.5  # the tied, rescaled output
    return hidden @ stack.embed_tokens.weight.T, out.attentions


def our_logits(model, tokens, mask):
    logits, cache = model.run_with_cache(
        tokens, attention_mask=mask, names_filter=lambda n: n.endswith("hook_pattern")
    )
    return logits, [cache[f"blocks.{i}.attn.hook_pattern"] for i in range(N_LAYERS)]


@pytest.mark.parametrize("padding", ["none", "right", "left"])
def test_t5_build_equals_transformers_t5stack(padding):
    stack, model = t5_pair()
    tokens = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 30, dtype=torch.long)
    if padding == "right":
        mask[1, 21:] = 0
    if padding == "left":
        mask[1, :9] = 0
    with torch.no_grad():
        want, want_patterns = t5_logits(stack, tokens, mask)
        got, got_patterns = our_logits(model, tokens, mask)
        fused = model(tokens, attention_mask=mask)  # the path without hooks
    real = mask.bool()  # compare real query rows (a padded row is not a prediction)
    assert (got - want)[real].abs().max() < 1e-5
    assert (fused - want)[real].abs().max() < 1e-5
    for ours, theirs in zip(got_patterns, want_patterns, strict=True):
        assert (ours - theirs).permute(0, 2, 1, 3)[real].abs().max() < 1e-5
    # the bias matters: without it the logits move well past the tolerance
    with torch.no_grad():
        model.rel_pos_bias[0].W_bias.zero_()
        assert (model(tokens, attention_mask=mask) - want)[real].abs().max() > 1e-2


def test_t5_build_equals_t5stack_through_the_kv_cache():
    from transformers import DynamicCache

    stack, model = t5_pair(seed=3)
    tokens = torch.randint(0, VOCAB, (2, 26), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 26, dtype=torch.long)
    mask[0, :5] = 0  # a left-padded prompt, as greedy decoding batches them
    prompt = 22
    cache = DynamicCache(config=stack.config)
    ours_cache = init_kv_cache(model, 2)
    with torch.no_grad():
        want, _ = t5_logits(stack, tokens[:, :prompt], mask[:, :prompt], cache=cache)
        got = model(tokens[:, :prompt], attention_mask=mask[:, :prompt], past_kv_cache=ours_cache)
        real = mask[:, :prompt].bool()
        assert (got - want)[real].abs().max() < 1e-5
        for t in range(prompt, 26):  # one token at a time, from the caches
            want, want_patterns = t5_logits(
                stack, tokens[:, t : t + 1], mask[:, : t + 1], cache=cache
            )
            got = model(
                tokens[:, t : t + 1],
                attention_mask=torch.ones(2, 1, dtype=torch.long),
                past_kv_cache=ours_cache,
            )
            assert (got - want).abs().max() < 1e-5
        full = model(tokens, attention_mask=mask)  # and the cache agrees with one pass
        assert (full[:, -1] - got[:, -1]).abs().max() < 1e-5


# --- the other encodings against a plain decoder written from the official definitions -------
def official_slopes(n):
    """custom_t5_decoder_only.CustomT5Stack.get_slopes (the ALiBi paper's rule)."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + official_slopes(2 * closest)[0::2][: n - closest]


def official_rotary(x, offset=0):
    """fixed_pos_embedding + apply_rotary_pos_emb on x [batch, pos, head, rotary_dim]."""
    dim, seq = x.shape[-1], offset + x.shape[1]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2) / dim))
    angles = torch.einsum("i,j->ij", torch.arange(seq), inv_freq).float()
    sin, cos = (
        t[None, offset:seq, None, :].repeat_interleave(2, 3) for t in (angles.sin(), angles.cos())
    )
    rotated = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)  # rotate_every_two
    return x * cos + rotated * sin


def official_sinusoid(positions, d_model):
    """FixedAbsolutePositionalEmbedding: all sines, then all cosines."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d_model, 2).float() / d_model))
    angles = torch.einsum("i,j->ij", positions.float(), inv_freq)
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def reference_forward(model, tokens, layer_pe):
    """(logits, each layer's attention scores) of a T5 decoder with `model`'s weights, per
    layer PE, written out by hand."""
    sd = model.state_dict()
    T = tokens.shape[1]
    x = sd["embed.W_E"][tokens]
    if model.pe == "sinusoidal":
        x = x + official_sinusoid(torch.arange(T), D_MODEL)
    if model.pe == "ape":
        x = x + sd["pos_embed.W_pos"][:T]
    distance = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).float()
    causal = distance >= 0
    layer_scores = []
    for i, pe in enumerate(layer_pe):
        b = f"blocks.{i}"
        h = rms(x, sd[f"{b}.ln1.w"])
        q, k, v = (torch.einsum("bpd,hde->bphe", h, sd[f"{b}.attn.W_{n}"]) for n in "QKV")
        if pe == "rotary":
            r = D_HEAD // 4
            q = torch.cat([official_rotary(q[..., :r]), q[..., r:]], -1)
            k = torch.cat([official_rotary(k[..., :r]), k[..., r:]], -1)
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k)  # unscaled
        if pe == "alibi":
            slopes = torch.tensor(official_slopes(N_HEADS))
            scores = scores + slopes[:, None, None] * torch.arange(T).float()  # key positions
        if pe == "kerple":
            bias = model.kerple_bias[0]
            r1, r2 = bias.r1.clamp(min=1e-2), bias.r2.clamp(min=1e-2)
            scores = scores - r1[:, None, None] * torch.log1p(r2[:, None, None] * distance.clamp(0))
        if pe == "fire":
            f = model.fire_bias[0]
            c, L = f.c.abs(), f.threshold.abs()
            psi = torch.log(c * distance.clamp(0) + 1)
            norm = torch.log(c * torch.maximum(torch.arange(T).float(), L) + 1)[:, None]
            hidden = F.relu((psi / norm)[..., None] * f.W_in[0] + f.b_in)
            scores = scores + (hidden @ f.W_out + f.b_out).permute(2, 0, 1)
        layer_scores.append(scores)
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        pattern = F.softmax(scores.float(), dim=-1)
        z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
        x = x + torch.einsum("bqhe,hed->bqd", z, sd[f"{b}.attn.W_O"])
        h = rms(x, sd[f"{b}.ln2.w"])
        x = x + F.relu(h @ sd[f"{b}.mlp.W_in"]) @ sd[f"{b}.mlp.W_out"]
    x = rms(x, sd["ln_final.w"]) * D_MODEL**-0.5
    return x @ sd["embed.W_E"].T, layer_scores


@pytest.mark.parametrize(
    "pe, layer_pe",
    [
        ("nope", None),
        ("alibi", None),
        ("rotary", None),
        ("sinusoidal", None),
        ("ape", None),
        ("kerple", None),
        ("fire", None),
        ("rotary", ["rotary", "alibi"]),
    ],
)
def test_t5_architecture_equals_the_official_definitions(pe, layer_pe):
    model = t5_model(pe, layer_pe=layer_pe, n_ctx=32, seed=4)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".w"):  # the RMS norm weights, away from their init of 1
                param.uniform_(0.5, 1.5)
    tokens = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want, want_scores = reference_forward(model, tokens, layer_pe or [pe] * N_LAYERS)
        got = model(tokens)
        explicit, cache = model.run_with_cache(tokens, names_filter=lambda n: "scores" in n)
    assert (got - want).abs().max() < 1e-5
    assert (explicit - want).abs().max() < 1e-5
    causal = torch.ones(30, 30).tril().bool()
    for i, scores in enumerate(want_scores):  # the logits themselves, not only their softmax
        assert (cache[f"blocks.{i}.attn.hook_attn_scores"] - scores)[..., causal].abs().max() < 1e-4


def test_t5_architecture_layout():
    """No biases anywhere, tied output, d_model independent of heads x d_head, T5's init."""
    model = build_model(
        "rotary", arch="t5", n_layers=2, n_heads=2, d_head=64, d_model=96, d_vocab=40, n_ctx=16
    )
    names = dict(model.named_parameters())
    assert not [n for n in names if ".b_" in n or n.startswith("b_") or "unembed" in n]
    assert model.blocks[0].attn.W_Q.shape == (2, 96, 64)
    assert model.cfg.rotary_dim == 16 and model.cfg.rotary_adjacent_pairs
    assert not model.cfg.use_attn_scale
    assert torch.equal(model.W_U, model.embed.W_E.T * 96**-0.5)
    assert abs(model.embed.W_E.std().item() - 1.0) < 0.1  # T5: N(0, 1) embedding
    assert abs(model.blocks[0].attn.W_Q.std().item() - (96 * 64) ** -0.5) < 0.2 * (96 * 64) ** -0.5
    # the default architecture is unchanged: LayerNorm, biases, its own unembedding
    default = build_model("rotary", n_layers=1, n_heads=2, d_model=32, d_vocab=40, n_ctx=16)
    assert "unembed.W_U" in dict(default.named_parameters())
    assert not default.cfg.rotary_adjacent_pairs
    assert model_config(default)["arch"] == "default"


def test_t5_dropout_sites():
    """Dropout where T5 puts it: with every other site fixed, the ReLU and final-norm sites
    each change the training-mode output (the default architecture has neither)."""
    model = build_model(
        "nope",
        arch="t5",
        n_layers=1,
        n_heads=2,
        d_head=8,
        d_model=16,
        d_vocab=30,
        n_ctx=16,
        dropout=0.5,
    )
    tokens = torch.randint(0, 30, (1, 8))
    model.train()
    calls = []
    real = F.dropout

    def counting(x, p=0.5, training=True, inplace=False):
        calls.append(tuple(x.shape))
        return real(x, p, training, inplace)

    import nopeinterp.models.base as base
    import nopeinterp.models.t5_arch as arch

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(arch.F, "dropout", counting)
        mp.setattr(base.F, "dropout", counting)
        model(tokens)
    # embeddings, attention output, after the ReLU, MLP output, after the final norm (the
    # attention weights' dropout runs inside SDPA on this hook-free path)
    assert calls == [(1, 8, 16), (1, 8, 16), (1, 8, 64), (1, 8, 16), (1, 8, 16)]


def test_t5_checkpoint_round_trip(tmp_path):
    from nopeinterp.checkpoint import load_checkpoint, save_checkpoint

    model = build_model(
        "alibi", arch="t5", n_layers=2, n_heads=2, d_head=12, d_model=20, d_vocab=30, n_ctx=16
    )
    path = save_checkpoint(model, tmp_path / "m.pt")
    loaded = load_checkpoint(path)
    assert loaded.meta["config"]["arch"] == "t5" and loaded.model.arch == "t5"
    tokens = torch.randint(0, 30, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded.model(tokens), model(tokens))


def test_unknown_arch_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown arch 'gpt'"):
        build_model("nope", arch="gpt", n_layers=1, n_heads=1, d_model=8, d_vocab=9, n_ctx=8)


def test_sweep_arch_t5_trains_records_and_analyses(tmp_path, capsys):
    """`sweep --arch t5 --preset repro-t5` (the CPU grid's command, shrunk): each run's
    checkpoint is the T5 architecture at head width 64, and the analyses' CLI runs on it."""
    from nopeinterp.checkpoint import load_checkpoint
    from nopeinterp.cli import main

    out = tmp_path / "grid"
    args = ["sweep", "--tasks", "copy", "--pes", "rotary", "alibi", "--seeds", "0"]
    args += ["--out", str(out), "--arch", "t5", "--preset", "repro-t5", "--n-layers", "1"]
    args += ["--steps", "2", "--eval-every", "2", "--checkpoint-every", "2", "--eval-n", "2"]
    args += ["--batch-size", "8", "--train-lengths", "2-4", "--ood-lengths", "5-6"]
    args += ["--eval-n-record", "2"]
    assert main(args) == 0
    ckpts = sorted(out.rglob("*.pt"))
    ckpts = [p for p in ckpts if not p.name.endswith(".state.pt")]
    assert len(ckpts) == 2
    loaded = load_checkpoint(ckpts[0])
    config = loaded.meta["config"]
    assert (config["arch"], config["d_head"], config["n_heads"], config["attn_scale"]) == (
        "t5",
        64,
        2,
        False,
    )
    assert "unembed.W_U" not in dict(loaded.model.named_parameters())
    code = main(["probe-position", str(ckpts[0]), "--n-train", "16", "--n-eval", "8"])
    assert code == 0 and "position probes per layer" in capsys.readouterr().out


def test_paper_preset_is_the_t5_decoder_at_t5_base_size(tmp_path):
    from nopeinterp.training import make_config

    cfg = make_config("copy", "t5", tmp_path / "p.pt", preset="paper")
    assert (cfg.arch, cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.d_model, cfg.d_mlp) == (
        "t5",
        12,
        12,
        64,
        768,
        3072,
    )
    model = build_model(  # its shape builds (one layer, to stay small)
        "rotary",
        arch=cfg.arch,
        n_layers=1,
        n_heads=cfg.n_heads,
        d_head=cfg.d_head,
        d_model=cfg.d_model,
        d_mlp=cfg.d_mlp,
        d_vocab=20,
        n_ctx=8,
        attn_scale=cfg.attn_scale,
    )
    assert model.cfg.rotary_dim == 16  # 8 frequencies, as the paper's Rotary at d_head 64


# --- the paper's own checkpoints: custom_decoder_only_t5 directories ------------------------
def write_codellm_dir(
    path, stack, *, kind, dtype=torch.float32, fmt="safetensors", lm_head=True, tokenizer=True
):
    """A directory as the official `CustomDecoderOnlyT5.save_pretrained` writes it: official
    parameter names (the unused cross-attention included), config.json with its auto_map to
    Python files that would leave a marker if anything ran them."""
    import json

    path.mkdir()
    state = {f"decoder.{k}": v for k, v in stack.state_dict().items()}
    state["shared.weight"] = state.pop("decoder.embed_tokens.weight")
    if lm_head:
        state["lm_head.weight"] = state["shared.weight"]
    state = {k: v.detach().to(dtype).clone().contiguous() for k, v in state.items()}
    assert any(".layer.1.EncDecAttention." in k for k in state)
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path / "model.safetensors"))
    elif fmt == "sharded":  # two files and their index, as save_pretrained shards
        from safetensors.torch import save_file

        keys = sorted(state)
        shards = {"model-00001-of-00002.safetensors": keys[::2]}
        shards["model-00002-of-00002.safetensors"] = keys[1::2]
        for name, part in shards.items():
            save_file({k: state[k] for k in part}, str(path / name))
        index = {"weight_map": {k: name for name, part in shards.items() for k in part}}
        (path / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        torch.save(state, path / "pytorch_model.bin")
    c = stack.config
    config = {
        "architectures": ["CustomDecoderOnlyT5"],
        "model_type": "custom_decoder_only_t5",
        "auto_map": {
            "AutoConfig": "configuration_custom_t5.CustomT5Config",
            "AutoModelForCausalLM": "modeling_custom_t5.CustomDecoderOnlyT5",
        },
        "position_encoding_type": kind,
        "d_model": c.d_model,
        "d_kv": c.d_kv,
        "num_heads": c.num_heads,
        "num_layers": c.num_layers,
        "d_ff": c.d_ff,
        "feed_forward_proj": "relu",
        "dropout_rate": 0.1,
        "n_positions": 64,
        "vocab_size": c.vocab_size,
        "relative_attention_num_buckets": c.relative_attention_num_buckets,
        "relative_attention_max_distance": c.relative_attention_max_distance,
        "tie_word_embeddings": True,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    (path / "config.json").write_text(json.dumps(config))
    marker = path.parent / f"{path.name}-code-ran"
    for name in ("modeling_custom_t5.py", "configuration_custom_t5.py"):
        (path / name).write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    if tokenizer:
        from tokenizers import Tokenizer, models, pre_tokenizers

        vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i + 3 for i in range(VOCAB - 3)}}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.save(str(path / "tokenizer.json"))
        (path / "tokenizer_config.json").write_text(
            json.dumps({"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"})
        )
    return marker


@pytest.mark.parametrize(
    "kind, dtype, fmt",
    [
        ("t5_relative_bias", torch.float32, "safetensors"),
        ("none", torch.bfloat16, "safetensors"),
        ("none", torch.float32, "bin"),
        ("t5_relative_bias", torch.bfloat16, "sharded"),
    ],
)
def test_from_hf_opens_a_codellm_directory_without_its_code(tmp_path, kind, dtype, fmt):
    import nopeinterp

    stack, _ = t5_pair(seed=6)
    if kind == "none":  # T5Stack without its bias table is the official "none" model
        with torch.no_grad():
            stack.block[0].layer[0].SelfAttention.relative_attention_bias.weight.zero_()
    stack = stack.to(dtype).float()  # the reference sees the weights the directory holds
    marker = write_codellm_dir(tmp_path / "m", stack, kind=kind, dtype=dtype, fmt=fmt)
    model = nopeinterp.from_hf(tmp_path / "m")
    assert not marker.exists()  # no file of the directory ran
    assert (model.pe, model.arch, model.cfg.dtype) == (
        {"none": "nope"}.get(kind, "t5"),
        "t5",
        dtype,
    )
    tokens = torch.randint(3, VOCAB, (2, 30), generator=torch.Generator().manual_seed(7))
    tokens[:, 0] = 0
    mask = torch.ones_like(tokens)
    with torch.no_grad():
        want, _ = t5_logits(stack, tokens, mask)
        got = model.float()(tokens)
    assert (got - want).abs().max() < 1e-5
    assert model.bos_token_id == 0 and model.tokenizer.bos_token == "<bos>"


@pytest.mark.parametrize("kind", ["rotary", "alibi"])
def test_codellm_rotary_and_alibi_are_the_official_ones(tmp_path, kind):
    import nopeinterp

    stack, _ = t5_pair(seed=8)
    write_codellm_dir(tmp_path / "m", stack, kind=kind, lm_head=False, tokenizer=False)
    model = nopeinterp.from_hf(tmp_path / "m")
    assert model.pe == kind and model.cfg.n_ctx == 64
    assert "rel_pos_bias" not in dict(model.named_modules())  # block 0's table is unused here
    tokens = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        want, _ = reference_forward(model, tokens, [kind] * N_LAYERS)
        assert (model(tokens) - want).abs().max() < 1e-5


def test_cli_probes_codellm_directories_and_refuses_unsupported_ones(tmp_path, capsys):
    from nopeinterp.cli import main

    stack, _ = t5_pair(seed=10)
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        marker = write_codellm_dir(tmp_path / name, stack, kind="rotary", dtype=dtype)
        args = ["probe-position", "--hf", str(tmp_path / name), "--n-train", "16", "--n-eval", "8"]
        args += ["--id-lengths", "4-12", "--ood-lengths", "13-20"]
        assert main(args) == 0
        assert not marker.exists()
    capsys.readouterr()
    write_codellm_dir(tmp_path / "xl", stack, kind="transformer_xl_relative_encoding")
    assert main(["probe-position", "--hf", str(tmp_path / "xl")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "transformer_xl_relative_encoding" in err and "t5_relative_bias" in err
    # damaged directories: one line each, exit 2, nothing run
    import json
    import pickle

    bad = tmp_path / "bad"
    marker = write_codellm_dir(bad, stack, kind="none", tokenizer=False)
    (bad / "model.safetensors").unlink()
    assert main(["probe-position", "--hf", str(bad)]) == 2
    assert "no weights" in capsys.readouterr().err

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (bad / "pytorch_model.bin").write_bytes(pickle.dumps({"shared.weight": Evil()}))
    assert main(["probe-position", "--hf", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "could not read the weights" in err
    assert not marker.exists()
    config = json.loads((bad / "config.json").read_text())
    (bad / "pytorch_model.bin").unlink()
    write_codellm_dir(tmp_path / "three", stack, kind="none", tokenizer=False)
    config["num_layers"] = 3  # the config says more layers than the weights hold
    (tmp_path / "three" / "config.json").write_text(json.dumps(config))
    assert main(["probe-position", "--hf", str(tmp_path / "three")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing weight 'block.2." in err


def test_every_analysis_runs_on_the_t5_architecture():
    """Hook names are the default architecture's: the analyses, erasure and the explorer run
    on T5-architecture models (a per-layer mix included) unchanged."""
    from nopeinterp.probing import distance_dependence, probe_position
    from nopeinterp.probing.erasure import erase_position
    from nopeinterp.probing.heads import attention_sinks
    from nopeinterp.similarity import compare_attention
    from nopeinterp.similarity.explorer import explorer_data

    def small(pe, layer_pe=None, seed=0):
        return build_model(
            pe, arch="t5", layer_pe=layer_pe, n_layers=2, n_heads=2, d_head=8, d_model=12,
            d_vocab=VOCAB, n_ctx=32, seed=seed,
        )  # fmt: skip

    nope, alibi = small("nope"), small("alibi", seed=1)
    mixed = small("rotary", ["rotary", "nope"], seed=2)
    small = {"id_lengths": (4, 8), "ood_lengths": (10, 12), "progress": False}
    probe = probe_position(mixed, n_train=24, n_eval=8, **small)
    assert set(probe.table.layer_pe) == {"embed", "rotary", "nope"}
    assert probe.table.value.notna().all()
    dist = distance_dependence(alibi, n_eval=4, **small)
    assert len(dist.table) == 2 * 2 * 2  # split x layer x head
    cmp = compare_attention(nope, {"alibi": alibi, "mixed": mixed}, n_per_length=1, **small)
    assert set(cmp.ranking["ref"]) == {"alibi", "mixed"} and (cmp.ranking["mean"] > 0).all()
    sinks = attention_sinks(alibi, n_eval=4, **small)
    assert len(sinks.table)
    erased = erase_position(nope, layers=[1], n_train=40, n_eval=10, task_metrics=False, **small)
    assert {"none", "leace", "random"} <= set(erased.table.condition)
    examples = [torch.tensor([0, 5, 6, 7, 8]), torch.tensor([0, 9, 3, 3])]
    data = explorer_data({"nope": nope, "alibi": alibi}, examples)
    assert data.models == ["nope", "alibi"]


@pytest.mark.parametrize("pe", ["alibi", "rotary", "sinusoidal", "fire"])
def test_t5_architecture_under_left_padding_and_the_kv_cache(pe):
    """A left-padded sequence gets the logits it gets alone (positions count from its first
    real token), and decoding through the KV cache gives what one full pass gives."""
    model = t5_model(pe, n_ctx=32, seed=11)
    tokens = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(12))
    mask = torch.ones_like(tokens)
    mask[0, :6] = 0
    with torch.no_grad():
        alone = model(tokens[:1, 6:])
        padded = model(tokens, attention_mask=mask)
        assert (padded[0, 6:] - alone[0]).abs().max() < 1e-5
        cache = init_kv_cache(model, 2)
        model(tokens[:, :15], attention_mask=mask[:, :15], past_kv_cache=cache)
        for t in range(15, 20):
            step = model(
                tokens[:, t : t + 1], attention_mask=mask[:, t : t + 1], past_kv_cache=cache
            )
        assert (step[:, -1] - padded[:, -1]).abs().max() < 1e-5
