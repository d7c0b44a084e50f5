"""The paper's own checkpoints as our T5-architecture model, without remote code.

The authors' models (`McGill-NLP/codellm_1b_{nope,rotary,alibi}`, and anything saved by the
official `CustomDecoderOnlyT5`) are directories with a `config.json` of `model_type
"custom_decoder_only_t5"` whose `auto_map` points at Python files in the directory. transformers
would have to run those files (`trust_remote_code`); here nothing in the directory runs: the
config is read as JSON, the weights through safetensors or the weights-only unpickler, the
tokenizer (if any) from `tokenizer.json`, and the model is `build_model(pe, arch="t5", ...)`.

Parameter names, as the official class saves them (a transformers `T5Stack` as `decoder`):
  shared.weight                                         -> embed.W_E
  decoder.block.{i}.layer.0.SelfAttention.{q,k,v,o}     -> blocks.{i}.attn.W_{Q,K,V,O}
  decoder.block.{i}.layer.0.layer_norm                  -> blocks.{i}.ln1.w
  decoder.block.{i}.layer.2.DenseReluDense.{wi,wo}      -> blocks.{i}.mlp.W_{in,out}
  decoder.block.{i}.layer.2.layer_norm                  -> blocks.{i}.ln2.w
  decoder.final_layer_norm                              -> ln_final.w
  decoder.block.0.layer.0.SelfAttention.relative_attention_bias -> rel_pos_bias.0.W_bias (t5)
  decoder.wpe.weight (abs_learned)                      -> pos_embed.W_pos
Ignored: `layer.1.EncDecAttention` (T5's cross-attention, instantiated and frozen, never run),
block 0's relative_attention_bias under any other PE, `lm_head` (tied to `shared`), fixed
tables (the sinusoid and ALiBi buffers, which are recomputed; the ALiBi slopes are checked).
The same mapping reads a bare transformers `T5Stack` state dict (no `decoder.` prefix,
`embed_tokens` for the embedding); tests/test_t5_arch.py holds the result to T5Stack.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch

from nopeinterp.errors import NopeinterpError

MODEL_TYPE = "custom_decoder_only_t5"
# official position_encoding_type -> our PE. "rotary_rerun" is "rotary" (the official class maps
# it so); "new_rotary" is the same rotation fed by position ids (a 4096-row table).
POSITION_ENCODINGS = {
    "none": "nope",
    "t5_relative_bias": "t5",
    "alibi": "alibi",
    "rotary": "rotary",
    "rotary_rerun": "rotary",
    "new_rotary": "rotary",
    "abs_sinusoid": "sinusoidal",
    "abs_learned": "ape",
}


class CodeLLMError(NopeinterpError, ValueError):
    """A custom_decoder_only_t5 directory that cannot be opened as it is."""


def _strip(state: dict) -> dict:
    """Keys without the official `decoder.` prefix; `shared` / `embed_tokens` -> `embed`."""
    out = {}
    for key, value in state.items():
        if key.startswith("decoder."):
            key = key[len("decoder.") :]
        if key in ("shared.weight", "embed_tokens.weight"):
            key = "embed"
        out.setdefault(key, value)  # `shared` and `decoder.embed_tokens` are one tensor
    return out


def t5_state_to_ours(state: dict, *, n_layers: int, n_heads: int, d_head: int, pe: str) -> dict:
    """Our T5-architecture state dict from a T5 decoder's (official names, or a bare T5Stack's).

    Raises CodeLLMError naming the first missing weight."""
    src = _strip(state)

    def take(key):
        if key not in src:
            raise CodeLLMError(f"missing weight {key!r}")
        return src[key]

    ours = {"embed.W_E": take("embed"), "ln_final.w": take("final_layer_norm.weight")}
    for i in range(n_layers):
        layer = f"block.{i}.layer"
        # T5's decoder blocks: 0 self-attention, 1 cross-attention, 2 feed-forward
        ff = next(
            (j for j in (2, 1) if f"{layer}.{j}.DenseReluDense.wi.weight" in src),
            2,
        )
        attn = f"{layer}.0.SelfAttention"
        for ours_name, theirs in (("W_Q", "q"), ("W_K", "k"), ("W_V", "v")):
            weight = take(f"{attn}.{theirs}.weight")  # [n_heads * d_head, d_model]
            ours[f"blocks.{i}.attn.{ours_name}"] = weight.reshape(n_heads, d_head, -1).transpose(
                1, 2
            )
        weight = take(f"{attn}.o.weight")  # [d_model, n_heads * d_head]
        ours[f"blocks.{i}.attn.W_O"] = weight.T.reshape(n_heads, d_head, -1)
        ours[f"blocks.{i}.ln1.w"] = take(f"{layer}.0.layer_norm.weight")
        ours[f"blocks.{i}.ln2.w"] = take(f"{layer}.{ff}.layer_norm.weight")
        ours[f"blocks.{i}.mlp.W_in"] = take(f"{layer}.{ff}.DenseReluDense.wi.weight").T
        ours[f"blocks.{i}.mlp.W_out"] = take(f"{layer}.{ff}.DenseReluDense.wo.weight").T
    if pe == "t5":
        key = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        ours["rel_pos_bias.0.W_bias"] = take(key)
    if pe == "ape":
        ours["pos_embed.W_pos"] = take("wpe.weight")
    return {k: v.contiguous() for k, v in ours.items()}


def load_t5_weights(model, state: dict) -> None:
    """Copy a `t5_state_to_ours` dict into `model`: every parameter, nothing else (TL's
    buffers stay as built). Raises CodeLLMError on a missing or unexpected weight or a shape
    that does not fit."""
    buffers = dict(model.named_buffers())
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # a shape mismatch
        line = next((x.strip() for x in str(err).splitlines() if "size mismatch" in x), str(err))
        raise CodeLLMError(f"weights do not fit the config: {line}") from None
    missing = [k for k in missing if k not in buffers]
    if missing or unexpected:
        raise CodeLLMError(f"weights do not fit the config (missing {missing}, extra {unexpected})")


# config.json fields read, with T5Config's defaults where it has one
_REQUIRED = ("d_model", "d_kv", "num_heads", "num_layers", "d_ff", "vocab_size")
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def is_codellm_dir(path) -> bool:
    """Whether `path` is a directory whose config.json says model_type custom_decoder_only_t5."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False


def read_config(path: Path) -> dict:
    """The build_model arguments of a custom_decoder_only_t5 directory's config.json, plus
    "bos_token_id". Raises CodeLLMError (one line) for anything we cannot express."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise CodeLLMError(f"{path}/config.json: not readable JSON ({err})") from None
    kind = config.get("position_encoding_type", "t5_relative_bias")  # the official default
    if kind not in POSITION_ENCODINGS:
        raise CodeLLMError(
            f"{path}: position_encoding_type {kind!r} is not supported; supported: "
            + ", ".join(POSITION_ENCODINGS)
        )
    missing = [k for k in _REQUIRED if not (type(config.get(k)) is int and config[k] > 0)]
    if missing:
        raise CodeLLMError(f"{path}/config.json: {missing[0]} must be a positive integer")
    checks = (
        ("feed_forward_proj", "relu"),
        ("tie_word_embeddings", True),
        ("layer_norm_epsilon", 1e-6),
        ("is_gated_act", False),
    )
    for key, supported in checks:
        if key in config and config[key] != supported:
            raise CodeLLMError(
                f"{path}: {key}={config[key]!r} is not supported (only {supported!r})"
            )
    pe = POSITION_ENCODINGS[kind]
    options = {}
    if pe == "t5":
        options = {
            "num_buckets": int(config.get("relative_attention_num_buckets", 32)),
            "max_distance": int(config.get("relative_attention_max_distance", 128)),
        }
    bos = config.get("bos_token_id")
    if bos is None:  # the official class sets bos = eos when it sees a tokenizer
        bos = config.get("eos_token_id")
    return {
        "pe": pe,
        "position_encoding_type": kind,
        "n_layers": config["num_layers"],
        "n_heads": config["num_heads"],
        "d_head": config["d_kv"],
        "d_model": config["d_model"],
        "d_mlp": config["d_ff"],
        "d_vocab": config["vocab_size"],
        "n_positions": config.get("n_positions"),
        "bos_token_id": bos if type(bos) is int and 0 <= bos < config["vocab_size"] else None,
        **options,
    }


def _wanted(key: str) -> bool:
    """The tensors the model uses: not T5's unused cross-attention, not the output head."""
    return ".EncDecAttention." not in key and not key.startswith("lm_head")


def read_weights(path: Path) -> dict:
    """The used tensors of a directory's safetensors or pytorch_model.bin (weights-only
    unpickler: tensors, never code), sharded or not."""
    name = next((n for n in _WEIGHT_FILES if (path / n).is_file()), None)
    if name is None:
        raise CodeLLMError(f"{path}: no weights ({' or '.join(_WEIGHT_FILES)})")
    files = [path / name]
    if name.endswith(".index.json"):
        try:
            weight_map = json.loads(files[0].read_text())["weight_map"]
            files = [path / f for f in dict.fromkeys(weight_map.values())]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CodeLLMError(f"{files[0]}: not a readable index ({err})") from None
    state = {}
    for file in files:
        if file.parent.resolve() != path.resolve():
            raise CodeLLMError(f"{path}: the index names a file outside the directory")
        try:
            if file.name.endswith(".safetensors"):
                from safetensors import safe_open

                with safe_open(str(file), framework="pt") as f:
                    for key in f.keys():
                        if _wanted(key):
                            state[key] = f.get_tensor(key)
            else:
                loaded = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
                if not isinstance(loaded, dict):
                    raise ValueError("not a dict of tensors")
                state.update({k: v for k, v in loaded.items() if _wanted(k)})
        except (OSError, ValueError, RuntimeError, pickle.UnpicklingError) as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise CodeLLMError(f"{file}: could not read the weights ({reason})") from None
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CodeLLMError(f"{path}: weight {bad[0]!r} is not a tensor")
    return state


def _check_alibi(state: dict, n_heads: int, path: Path) -> None:
    """The official ALiBi buffer (slope * position), when saved, must hold our slopes."""
    from nopeinterp.models.alibi import alibi_slopes

    table = _strip(state).get("alibi")
    if table is None or table.shape[-1] < 2:
        return
    theirs = table.reshape(n_heads, -1)[:, 1].float()
    if not torch.allclose(theirs, alibi_slopes(n_heads), rtol=1e-2):
        raise CodeLLMError(f"{path}: its ALiBi slopes differ from BLOOM's for {n_heads} heads")


def _tokenizer(path: Path):
    """tokenizer.json as a fast tokenizer (special tokens from tokenizer_config.json), or None."""
    if not (path / "tokenizer.json").is_file():
        return None
    from transformers import PreTrainedTokenizerFast

    special = {}
    config = path / "tokenizer_config.json"
    if config.is_file():
        try:
            data = json.loads(config.read_text())
        except (OSError, ValueError) as err:
            raise CodeLLMError(f"{config}: not readable JSON ({err})") from None
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = data.get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                special[key] = value
    try:
        return PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"), **special)
    except Exception as err:  # the tokenizers library's own parse errors
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise CodeLLMError(f"{path}/tokenizer.json: not a readable tokenizer ({reason})") from None


def from_codellm(path, *, tokenizer=None, device=None, n_ctx: int | None = None):
    """A `custom_decoder_only_t5` directory (the paper's 1B code LMs, or any model saved by the
    official class) as our T5-architecture model, in the weights' dtype; nothing in the
    directory runs. `n_ctx`: default the config's n_positions (learned `abs_learned`: its
    table's rows), capped at 2048 like `from_hf`. Raises CodeLLMError (one line)."""
    from nopeinterp.models import build_model
    from nopeinterp.models.hf import _ctx

    path = Path(path)
    config = read_config(path)
    state = read_weights(path)
    pe = config.pop("pe")
    kind = config.pop("position_encoding_type")
    bos = config.pop("bos_token_id")
    limit = config.pop("n_positions")
    if pe == "alibi":
        _check_alibi(state, config["n_heads"], path)
    if pe == "ape":
        rows = _strip(state).get("wpe.weight")
        limit = rows.shape[0] if rows is not None else limit
    try:
        ours = t5_state_to_ours(state, n_layers=config["n_layers"], pe=pe, **_heads(config))
    except CodeLLMError as err:
        raise CodeLLMError(f"{path}: {err}") from None
    except RuntimeError as err:  # a q/k/v/o weight that is not n_heads x d_kv wide
        reason = (str(err).strip().splitlines() or ["shape"])[0]
        raise CodeLLMError(f"{path}: weights do not fit the config ({reason})") from None
    del state
    dtype = ours["embed.W_E"].dtype
    ctx = _ctx(limit, n_ctx, "custom_decoder_only_t5", hard=pe == "ape")
    if pe == "ape" and ctx != ours["pos_embed.W_pos"].shape[0]:
        ours["pos_embed.W_pos"] = ours["pos_embed.W_pos"][:ctx]
    if tokenizer is None:
        tokenizer = _tokenizer(path)
    model = build_model(
        pe, arch="t5", n_ctx=ctx, dtype=dtype, device="cpu", init_weights=False, **config
    )
    try:
        load_t5_weights(model, ours)
    except CodeLLMError as err:
        raise CodeLLMError(f"{path}: {err}") from None
    if tokenizer is not None:
        model.tokenizer = tokenizer  # as given: TL's set_tokenizer would re-load it by name
        model.cfg.tokenizer_prepends_bos = len(tokenizer.encode("")) > 0
    if bos is None and tokenizer is not None:
        bos = tokenizer.bos_token_id
    model.bos_token_id = bos  # the data layer puts it first, as the authors prepend <bos>
    model.hf_architecture = f"{MODEL_TYPE} ({kind})"
    if device is not None:
        model.to(device, print_details=False)
    return model.eval()


def _heads(config: dict) -> dict:
    return {"n_heads": config["n_heads"], "d_head": config["d_head"]}


__all__ = [
    "MODEL_TYPE",
    "POSITION_ENCODINGS",
    "CodeLLMError",
    "from_codellm",
    "is_codellm_dir",
    "load_t5_weights",
    "t5_state_to_ours",
]
