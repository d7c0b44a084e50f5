"""from_hf: tiny random Hugging Face models (built offline from config classes) converted to
HookedTransformers must compute transformers' own logits, with and without left padding."""

import os

import pytest
import torch
import transformers as tf

from nopeinterp._tl import TL4
from nopeinterp.errors import NopeinterpError
from nopeinterp.models import layer_pes
from nopeinterp.models.hf import DEFAULT_MAX_CTX, SUPPORTED_ARCHITECTURES, HFModelError, from_hf

VOCAB = 48
ATOL = 1e-4
# A larger init than transformers' 0.02, so attention is far from uniform and a wrong position
# treatment (slopes, rotated dims, window) moves the logits well beyond ATOL.
INIT = 0.25

FAMILIES = {
    "gpt2": (tf.GPT2LMHeadModel, tf.GPT2Config, dict(n_embd=32, n_head=4, n_layer=2)),
    "gpt2-scaled": (
        tf.GPT2LMHeadModel,
        tf.GPT2Config,
        dict(n_embd=32, n_head=4, n_layer=2, scale_attn_by_inverse_layer_idx=True, n_inner=48),
    ),
    # Pythia: rotary on 25% of each head's dims, parallel attention + MLP.
    "neox": (
        tf.GPTNeoXForCausalLM,
        tf.GPTNeoXConfig,
        dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=96),
    ),
    "neox-sequential": (
        tf.GPTNeoXForCausalLM,
        tf.GPTNeoXConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_hidden_layers=2,
            intermediate_size=96,
            use_parallel_residual=False,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 500.0,
                "partial_rotary_factor": 0.5,
            },
        ),
    ),
    # 6 heads: not a power of two, where ALiBi's slope rule interleaves.
    "bloom": (tf.BloomForCausalLM, tf.BloomConfig, dict(hidden_size=48, n_head=6, n_layer=2)),
    "llama": (
        tf.LlamaForCausalLM,
        tf.LlamaConfig,
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=4,
            num_hidden_layers=2,
            intermediate_size=48,
            tie_word_embeddings=True,
        ),
    ),
    # grouped-query attention, head_dim != hidden_size / heads
    "llama-gqa": (
        tf.LlamaForCausalLM,
        tf.LlamaConfig,
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_hidden_layers=2,
            intermediate_size=48,
        ),
    ),
    "mistral-window": (
        tf.MistralForCausalLM,
        tf.MistralConfig,
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            num_hidden_layers=2,
            intermediate_size=48,
            sliding_window=4,
        ),
    ),
    "qwen2": (
        tf.Qwen2ForCausalLM,
        tf.Qwen2Config,
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=48,
        ),
    ),
    # NoPE in layers 1 and 3 (SmolLM3's `no_rope_layers`: 1 = RoPE, 0 = NoPE), GQA
    "smollm3": (
        tf.SmolLM3ForCausalLM,
        tf.SmolLM3Config,
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=4,
            intermediate_size=48,
            no_rope_layers=[1, 0, 1, 0],
            pad_token_id=0,
        ),
    ),
}
EXPECTED_PE = {"gpt2": "ape", "neox": "rotary", "bloom": "alibi", "llama": "rotary",
               "mistral": "rotary", "qwen2": "rotary"}  # fmt: skip
EXPECTED_TL_PE = {"ape": "standard", "rotary": "rotary", "alibi": "alibi"}


def expected_layer_pes(name, config):
    if name == "smollm3":
        return ["rotary" if flag else "nope" for flag in config.no_rope_layers]
    return [EXPECTED_PE[name.split("-")[0]]] * config.num_hidden_layers


def tiny_hf(name, seed=0, **overrides):
    model_cls, config_cls, kwargs = FAMILIES[name]
    config = config_cls(
        vocab_size=VOCAB, initializer_range=INIT, **{"max_position_embeddings": 64, **kwargs}
    )
    if model_cls is tf.GPT2LMHeadModel:
        config.n_positions = 64
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    return model_cls(config).eval()


def tokens(batch=3, length=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=g)


def left_padding(toks, pads=(0, 3, 7)):
    mask = torch.ones_like(toks)
    for row, n in enumerate(pads):
        mask[row, :n] = 0
    return mask


def assert_logits_match(model, hf, toks):
    with torch.no_grad():
        expected = hf(toks).logits
        got = model(toks)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", FAMILIES)
def test_logits_match_transformers(name):
    hf = tiny_hf(name)
    toks = tokens()
    with torch.no_grad():
        before = hf(toks).logits
    model = from_hf(hf)
    with torch.no_grad():
        torch.testing.assert_close(model(toks), before, atol=ATOL, rtol=0)
        # converting left transformers' model as it was, and shares no weights with it
        torch.testing.assert_close(hf(toks).logits, before, atol=0, rtol=0)
        for param in model.parameters():
            param.zero_()
        torch.testing.assert_close(hf(toks).logits, before, atol=0, rtol=0)


@pytest.mark.parametrize("name, tied", [("gpt2", True), ("llama", True), ("llama-gqa", False)])
def test_weights_are_held_once_as_in_transformers(name, tied):
    """A tied LM head stays tied: the unembedding is the embedding's storage, so the model holds
    as many weight bytes as transformers' (TL's converter would hold a second copy)."""
    hf = tiny_hf(name)
    assert hf.config.tie_word_embeddings == tied
    model = from_hf(hf)
    if TL4:  # reported as a skip, not a pass: nothing of ours holds the weights there
        pytest.skip("under TL 4 from_hf gives a bridge over transformers' own modules")
    W_E, W_U = model.embed.W_E, model.unembed.W_U
    assert (W_U.untyped_storage().data_ptr() == W_E.untyped_storage().data_ptr()) == tied
    held = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()
    }
    hf_bytes = sum(p.numel() * p.element_size() for p in hf.parameters())  # unique parameters
    # beyond transformers' weights: only the zero biases TL's blocks have, not a second W_E
    assert 0 <= sum(held.values()) - hf_bytes < W_E.numel() * W_E.element_size()
    with torch.no_grad():
        toks = tokens()
        torch.testing.assert_close(model(toks), hf(toks).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", FAMILIES)
def test_left_padding_matches_transformers(name):
    """Each left-padded row's logits at its real tokens equal transformers' logits for that row
    alone, and transformers' own padded forward (positions counted from the first real token,
    as `generate` does)."""
    hf = tiny_hf(name)
    model = from_hf(hf)
    toks = tokens()
    mask = left_padding(toks)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        got = model(toks, attention_mask=mask)
        padded = hf(toks, attention_mask=mask, position_ids=position_ids).logits
        for row in range(toks.shape[0]):
            real = mask[row].bool()
            alone = hf(toks[row : row + 1, real]).logits[0]
            torch.testing.assert_close(got[row, real], alone, atol=ATOL, rtol=0)
            torch.testing.assert_close(got[row, real], padded[row, real], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", FAMILIES)
def test_local_directory_round_trip(name, tmp_path, capfd):
    hf = tiny_hf(name)
    hf.save_pretrained(tmp_path)
    capfd.readouterr()
    model = from_hf(tmp_path)
    assert capfd.readouterr() == ("", "")  # no progress bars, no device messages
    assert_logits_match(model, hf, tokens())
    assert model.tokenizer is None  # none was saved
    assert model.hf_architecture == type(hf).__name__


@pytest.mark.parametrize("name", FAMILIES)
def test_pe_metadata_and_hooks(name):
    """What the analyses read without TL: layer_pes(model), cfg; hook values are transformers'
    hidden states (nothing folded or centred)."""
    hf = tiny_hf(name)
    model = from_hf(hf)
    expected = expected_layer_pes(name, hf.config)
    assert layer_pes(model) == expected
    assert model.cfg.positional_embedding_type == EXPECTED_TL_PE[expected[0]]
    toks = tokens()
    with torch.no_grad():
        hidden = hf(toks, output_hidden_states=True).hidden_states
        _, cache = model.run_with_cache(
            toks, names_filter=lambda n: n.endswith(("hook_resid_pre", "hook_pattern"))
        )
    for layer in range(model.cfg.n_layers):
        # hidden_states[i] is block i's input (Bloom's after its embedding LayerNorm)
        torch.testing.assert_close(
            cache[f"blocks.{layer}.hook_resid_pre"], hidden[layer], atol=ATOL, rtol=0
        )
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        assert pattern.shape == (3, model.cfg.n_heads, 12, 12)
        assert (pattern.triu(diagonal=1) == 0).all()


def test_rotary_options_follow_the_config():
    neox = from_hf(tiny_hf("neox"))
    assert neox.cfg.rotary_dim == 4  # 25% of 16 dims per head, transformers' default for NeoX
    assert neox.pe_options == {"fraction": 0.25, "base": 10000.0}
    seq = from_hf(tiny_hf("neox-sequential"))
    assert seq.pe_options == {"fraction": 0.5, "base": 500.0}
    assert not seq.cfg.parallel_attn_mlp
    gqa = from_hf(tiny_hf("llama-gqa"))
    assert (gqa.cfg.d_head, gqa.cfg.n_key_value_heads, gqa.cfg.rotary_dim) == (16, 2, 16)


def test_sliding_window_is_used():
    """The window changes the logits at this length, so matching transformers means TL's local
    attention reproduces it (and the match in the tests above is not vacuous)."""
    toks = tokens()
    windowed = tiny_hf("mistral-window")
    full = tiny_hf("mistral-window", sliding_window=None)
    with torch.no_grad():
        assert (windowed(toks).logits - full(toks).logits).abs().max() > 100 * ATOL
    assert from_hf(windowed).cfg.window_size == 4


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_unembed_not_folded_when_d_vocab_equals_d_model(name):
    hf = tiny_hf(name, vocab_size=32)
    hf = type(hf)(hf.config).eval()  # rebuild at the new vocabulary size
    assert hf.config.vocab_size == hf.get_input_embeddings().weight.shape[1] == 32
    assert_logits_match(from_hf(hf), hf, tokens() % 32)


def test_tokenizer_from_the_directory_is_attached(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(VOCAB - 1)} | {"<unk>": VOCAB - 1}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>")
    hf = tiny_hf("gpt2")
    hf.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model = from_hf(tmp_path)
    assert model.tokenizer is not None
    assert model.tokenizer("w3 w5 w7")["input_ids"] == [3, 5, 7]
    assert model.cfg.tokenizer_prepends_bos is False
    given = from_hf(hf, tokenizer=tok)
    assert given.tokenizer is tok


def test_context_length():
    assert from_hf(tiny_hf("gpt2")).cfg.n_ctx == 64  # GPT-2's learned positions
    assert from_hf(tiny_hf("gpt2"), n_ctx=16).cfg.n_ctx == 16
    with pytest.raises(HFModelError, match="exceeds its 64 learned positions"):
        from_hf(tiny_hf("gpt2"), n_ctx=65)
    assert from_hf(tiny_hf("llama")).cfg.n_ctx == 64
    long = tiny_hf("llama", max_position_embeddings=131072)
    assert from_hf(long).cfg.n_ctx == DEFAULT_MAX_CTX
    assert from_hf(long, n_ctx=4096).cfg.n_ctx == 4096


def one_line_error(call, match):
    with pytest.raises(NopeinterpError, match=match) as info:
        call()
    assert "\n" not in str(info.value)
    return str(info.value)


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    opt = tf.OPTForCausalLM(
        tf.OPTConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_attention_heads=2,
            num_hidden_layers=1,
            ffn_dim=32,
            word_embed_proj_dim=16,
        )  # fmt: skip
    )
    message = one_line_error(lambda: from_hf(opt), "unsupported architecture 'OPTForCausalLM'")
    assert all(arch in message for arch in SUPPORTED_ARCHITECTURES)
    # a directory is refused from its config, before any weights are read (none are saved);
    # without `architectures` the config's model_type names the causal-LM class
    opt.config.save_pretrained(tmp_path)
    one_line_error(lambda: from_hf(tmp_path), "unsupported architecture 'OPTForCausalLM'")
    opt.config.architectures = ["OPTForCausalLM"]
    opt.config.save_pretrained(tmp_path)
    one_line_error(lambda: from_hf(tmp_path), "unsupported architecture 'OPTForCausalLM'")
    # a headless model is not a causal LM
    base = tf.GPT2Model(tiny_hf("gpt2").config)
    one_line_error(lambda: from_hf(base), "unsupported architecture 'GPT2Model'")


def test_bad_inputs_are_one_line_errors(tmp_path):
    one_line_error(lambda: from_hf(tmp_path / "missing"), "not a local directory")
    one_line_error(lambda: from_hf("gpt2"), "never downloads")
    one_line_error(lambda: from_hf(tmp_path), "not a readable Hugging Face model directory")
    one_line_error(lambda: from_hf(42), "transformers model or a local directory, got int")
    hf = tiny_hf("gpt2")
    hf.config.save_pretrained(tmp_path)  # a config but no weights
    one_line_error(lambda: from_hf(tmp_path), "could not load the weights")


class _RunsCode:
    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_pickled_weights_never_run_code(tmp_path):
    """A pytorch_model.bin whose pickle would make a directory is refused, and nothing runs."""
    evil = _RunsCode()
    evil.path = str(tmp_path / "ran")
    model_dir = tmp_path / "model"
    tiny_hf("gpt2").config.save_pretrained(model_dir)
    torch.save({"transformer.wte.weight": evil}, model_dir / "pytorch_model.bin")
    one_line_error(lambda: from_hf(model_dir), "could not load the weights")
    assert not (tmp_path / "ran").exists()
    # and the payload is real: unrestricted unpickling does run it
    torch.load(model_dir / "pytorch_model.bin", weights_only=False)
    assert (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    "name, overrides, what",
    [
        ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                       "rope_theta": 10000.0}}, "RoPE scaling 'linear'"),
        ("llama", {"attention_bias": True}, "attention_bias=True"),
        ("qwen2", {"sliding_window": 4, "use_sliding_window": True}, "sliding-window"),
        ("bloom", {"apply_residual_connection_post_layernorm": True}, "post_layernorm"),
        ("neox", {"hidden_act": "quick_gelu"}, "activation 'quick_gelu'"),
        ("smollm3", {"sliding_window": 4, "use_sliding_window": True}, "sliding-window"),
        ("smollm3", {"rope_parameters": {"rope_type": "llama3", "factor": 2.0, "rope_theta": 1e4,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 16}},
         "RoPE scaling 'llama3'"),
    ],
)  # fmt: skip
def test_unsupported_options_are_refused(name, overrides, what):
    hf = tiny_hf(name, **overrides)
    one_line_error(lambda: from_hf(hf), what)


@pytest.mark.parametrize("name", ["gpt2", "bloom", "neox"])
def test_dtype_and_device_are_kept(name):
    hf = tiny_hf(name).to(torch.float64)
    model = from_hf(hf, device="cpu")
    assert model.cfg.dtype == torch.float64
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert model.cfg.device == "cpu"
    toks = tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(toks), hf(toks).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "rope, length",
    [
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, 40),
        ({"rope_type": "linear", "factor": 2.0}, 40),
        # transformers grows dynamic NTK's base past max_position_embeddings (64 here)
        ({"rope_type": "dynamic", "factor": 2.0}, 100),
    ],
)
def test_smollm3_rope_scaling_matches_transformers(rope, length):
    """SmolLM3's rope_parameters become our rotary layers' RoPE scaling (nopeinterp's
    set_rope_scaling), at lengths where the scaling changes transformers' logits."""
    rope = {**rope, "rope_theta": 10000.0}
    hf = tiny_hf("smollm3", rope_parameters=rope)
    hf = type(hf)(hf.config).eval()  # rebuild with the scaled rotary embedding
    plain = tiny_hf("smollm3")
    toks = tokens(length=length)
    with torch.no_grad():  # the scaling changes transformers' logits: the match is not vacuous
        assert (hf(toks).logits - plain(toks).logits).abs().max() > 100 * ATOL
    model = from_hf(hf, n_ctx=128)
    assert model.pe_options["rope_scaling"]["rope_type"] == rope["rope_type"]
    assert_logits_match(model, hf, toks)
    mask = left_padding(toks)
    with torch.no_grad():
        got = model(toks, attention_mask=mask)
        for row in range(toks.shape[0]):
            real = mask[row].bool()
            alone = hf(toks[row : row + 1, real]).logits[0]
            torch.testing.assert_close(got[row, real], alone, atol=ATOL, rtol=0)


def test_smollm3_layer_list_must_fit():
    hf = tiny_hf("smollm3")
    hf.config.no_rope_layers = [1, 0]  # transformers itself would fail to build this model
    one_line_error(lambda: from_hf(hf), "no_rope_layers has 2 entries for 4 layers")


def test_llama3_rope_scaling_matches_transformers():
    """Llama 3's RoPE scaling (NTK-by-parts) runs in TL's own rotary, at 40 tokens where it
    changes transformers' logits (past the 16 of its original context)."""
    rope = {"rope_type": "llama3", "factor": 4.0, "rope_theta": 10000.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}  # fmt: skip
    hf = tiny_hf("llama-gqa", rope_parameters=rope)
    hf = type(hf)(hf.config).eval()  # rebuild with the scaled rotary embedding
    toks = tokens(length=40)
    with torch.no_grad():
        assert (hf(toks).logits - tiny_hf("llama-gqa")(toks).logits).abs().max() > 100 * ATOL
    model = from_hf(hf)
    assert model.cfg.use_NTK_by_parts_rope and model.cfg.NTK_by_parts_factor == 4.0
    assert_logits_match(model, hf, toks)
    mask = left_padding(toks)
    with torch.no_grad():
        got = model(toks, attention_mask=mask)
        real = mask[2].bool()
        torch.testing.assert_close(got[2, real], hf(toks[2:, real]).logits[0], atol=ATOL, rtol=0)
