"""Checkpoints that load without running pickled code.

A `.pt` checkpoint is a dict of plain types and tensors written with `torch.save` and read
with `torch.load(weights_only=True)`, which refuses any pickle that would construct arbitrary
objects. `.safetensors` checkpoints hold the tensors, with the rest as JSON in a sidecar file
`<name>.json`. Writes go to a temporary file that is renamed into place (`_io.atomic_write`),
so a crash mid-save never leaves a broken file behind.

Every file is untrusted input: whatever its bytes (truncated, random, a pickle of objects,
a header of the wrong types, a config describing a model larger than the weights it holds),
loading it either succeeds or raises `CheckpointError` with one line naming the file and
the reason. `load_training_state` reads the trainer's `<out>.state.pt` under the same rules.
"""

from __future__ import annotations

import json
import os
import pickle
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nopeinterp._io import atomic_write, atomic_write_torch, versions
from nopeinterp.errors import CheckpointError
from nopeinterp.options import PE_TYPES

# nopeinterp.models (TransformerLens) is imported only to build a model: a bad file is
# reported before that import, in the time torch takes to read it.

FORMAT = "nopeinterp-checkpoint"
FORMAT_VERSION = 1
# Buffers recomputed from the config; not stored.
_DERIVED_BUFFERS = ("mask", "IGNORE", "rotary_sin", "rotary_cos")


@dataclass
class Checkpoint:
    model: torch.nn.Module
    tokenizer: object | None
    meta: dict = field(default_factory=dict)
    path: Path | None = None

    @property
    def pe(self) -> str:
        return self.meta["pe"]

    @property
    def task(self) -> str | None:
        return self.meta.get("task")


def _stored_state_dict(model, dtype) -> dict[str, torch.Tensor]:
    return {
        k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).detach().cpu()
        for k, v in model.state_dict().items()
        if k.rsplit(".", 1)[-1] not in _DERIVED_BUFFERS
    }


def _check_plain(value, where="meta"):
    """Meta must be plain data so weights_only loading can read it back."""
    if value is None or type(value) in (
        bool,
        int,
        float,
        str,
    ):  # not subclasses: they pickle as objects
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            _check_plain(v, where)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: keys must be str, got {k!r}")
            _check_plain(v, f"{where}.{k}")
        return
    raise TypeError(
        f"{where}: {type(value).__name__} is not a plain type (str/int/float/list/dict)"
    )


def save_checkpoint(model, path, *, tokenizer=None, dtype=None, **meta) -> Path:
    """Write `model` (+ tokenizer + meta) to `path` (.pt, or .safetensors + .json sidecar).

    `dtype=torch.float16` stores weights in half precision (loaded back as float32).
    `meta` must be plain data (str, int, float, bool, None, lists and dicts of them).
    """
    from nopeinterp.models import model_config
    from nopeinterp.tasks.tokenizer import tokenizer_to_json

    path = Path(path)
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    _check_plain(meta)
    meta = {**meta, "versions": meta.get("versions") or versions()}
    header = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "pe": model.pe,
        "config": model_config(model),
        "tokenizer": tokenizer_to_json(tokenizer) if tokenizer is not None else None,
        "meta": meta,
    }
    state = _stored_state_dict(model, dtype)
    if path.suffix == ".safetensors":
        from safetensors.torch import save

        atomic_write(path.with_suffix(".json"), lambda t: Path(t).write_text(json.dumps(header)))
        # serialised here, written by Python: a full disk is then an OSError (OutputError)
        data = save({k: v.contiguous() for k, v in state.items()})
        atomic_write(path, lambda t: Path(t).write_bytes(data))
    else:
        atomic_write_torch(path, {**header, "state_dict": state})
    return path


# --- reading untrusted files ----------------------------------------------------------------------
def _reason(e: BaseException) -> str:
    """The reader's own reason, whole, without torch's advice to load with weights_only=False."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    paragraphs = [p.strip() for p in str(e).split("\n\n") if p.strip()]
    kept = [
        p
        for p in paragraphs
        if "weights_only" not in p and "weights only" not in p.lower() and "documentation" not in p
    ]
    text = " ".join((kept or [""])[0].split())
    # torch appends boilerplate after the first sentence of a reader error ("This is an
    # internal miniz error. If you are seeing this error, ..."); the first sentence is the reason.
    head, sep, _ = text.partition(". ")
    if sep:
        text = head
    return text.rstrip(".") or type(e).__name__


def _check_file(path: Path, what: str) -> None:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except OSError as e:  # name too long, permission denied on a folder, a loop of links
        raise CheckpointError(f"{path}: cannot open {what} ({e.strerror or e})") from None
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a {what} file")
    if not path.is_file():
        raise CheckpointError(f"{path}: not a regular file, not a {what}")
    if not os.access(path, os.R_OK):
        raise CheckpointError(f"{path}: cannot open {what} (permission denied)")
    if st.st_size == 0:
        raise CheckpointError(f"{path}: empty file, not a {what}")


def _torch_load(path: Path, what: str):
    """torch.load(weights_only=True); every failure a CheckpointError naming `path`."""
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before refusing
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        with open(path, "rb") as f:
            magic = f.read(2)
        if magic[:1] == b"\x80" or magic == b"PK":  # a pickle, or torch's zip of one
            # The weights-only unpickler met something other than plain data: an object that
            # a full unpickle would construct, which can run arbitrary code. Never do that.
            raise CheckpointError(
                f"{path}: refused: the file holds pickled data that is not plain ({_reason(e)}); "
                f"loading it could run code, and nopeinterp only reads weights-only {what}s"
            ) from None
        raise CheckpointError(f"{path}: not a readable {what} ({_reason(e)})") from None
    except Exception as e:  # an untrusted file: whatever the reader trips on, the file is bad
        raise CheckpointError(
            f"{path}: not a readable {what} (truncated or not a torch file: {_reason(e)})"
        ) from None


def _read(path: Path) -> dict:
    _check_file(path, "checkpoint")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        sidecar = path.with_suffix(".json")
        if not sidecar.is_file():
            raise CheckpointError(f"{path}: missing metadata file {sidecar.name}")
        try:
            header = json.loads(sidecar.read_text(encoding="utf-8"))
        except (ValueError, OSError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise CheckpointError(f"{sidecar}: damaged metadata file ({_reason(e)})") from None
        if not isinstance(header, dict):
            raise CheckpointError(
                f"{sidecar}: not a nopeinterp metadata file (a JSON {type(header).__name__}, "
                "not an object)"
            )
        try:
            state = load_file(path)
        except Exception as e:  # SafetensorError, OSError, or whatever a crafted header trips
            raise CheckpointError(
                f"{path}: damaged safetensors checkpoint ({_reason(e)})"
            ) from None
        data = {**header, "state_dict": state}
    else:
        data = _torch_load(path, "checkpoint")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a nopeinterp checkpoint (no '{FORMAT}' header)")
    return data


def load_training_state(path, *, required: Iterable[str] = ()) -> dict:
    """Read a trainer's training state (`<out>.state.pt`) with weights-only loading.

    Returns the dict that was saved. Raises CheckpointError (one line, naming the file) if
    the file is missing, truncated, not a torch file, holds pickled objects that are not
    plain data, is not a dict, or lacks any of the `required` keys.
    """
    path = Path(path)
    _check_file(path, "training state")
    state = _torch_load(path, "training state")
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{path}: not a nopeinterp training state (a {type(state).__name__}, not a dict)"
        )
    missing = sorted(set(required) - set(state))
    if missing:
        raise CheckpointError(
            f"{path}: not a nopeinterp training state (missing {', '.join(missing)})"
        )
    return state


_SCALARS = (bool, int, float, str)


def _config_value(value) -> bool:
    """A config value a model can be built from: None, a scalar, a list of scalars (per-layer
    PEs, per-head scales) or a flat dict of them (RoPE scaling)."""
    if value is None or type(value) in _SCALARS:
        return True
    if type(value) is list:
        return all(v is None or type(v) in _SCALARS for v in value)
    if type(value) is dict:
        return all(type(k) is str and (v is None or type(v) in _SCALARS) for k, v in value.items())
    return False


def _positive_int(value) -> bool:
    return type(value) is int and value >= 1


# Config values that size the model, each against the weight in the file that has that size:
# (config key, weight, axis, the PEs that store the weight or None for all). Checked before the
# model is built, so a config can never describe a model larger than the weights it came with.
_SIZED_BY_WEIGHTS = (
    ("d_vocab", "embed.W_E", 0, None),
    ("d_model", "embed.W_E", 1, None),
    ("n_heads", "blocks.0.attn.W_Q", 0, None),
    ("d_head", "blocks.0.attn.W_Q", 2, None),
    ("d_mlp", "blocks.0.mlp.W_in", 1, None),
    ("n_ctx", "pos_embed.W_pos", 0, ("ape",)),
    ("num_buckets", "rel_pos_bias.0.W_bias", 0, ("t5",)),
)


def _check_config(config: dict, state: dict, pe: str, path: Path) -> None:
    bad = [k for k in config if not isinstance(k, str)]
    if bad:
        raise CheckpointError(f"{path}: invalid model config: keys must be str, got {bad[0]!r}")
    for key in ("n_layers", "n_heads", "d_model", "d_vocab", "n_ctx"):
        if key not in config:
            raise CheckpointError(f"{path}: invalid model config: no {key}")
    for key, value in config.items():
        if not _config_value(value):
            raise CheckpointError(
                f"{path}: invalid model config: {key} is a {type(value).__name__} "
                "(config values are scalars, lists of them or flat str-keyed dicts)"
            )
    sizes = ("n_layers", "n_heads", "d_model", "d_vocab", "n_ctx", "d_mlp", "d_head", "num_buckets")
    for key in sizes:
        if key in config and not (key in ("d_mlp", "d_head") and config[key] is None):
            if not _positive_int(config[key]):
                raise CheckpointError(
                    f"{path}: invalid model config: {key} must be a positive integer, "
                    f"got {config[key]!r}"
                )
    blocks = {k.split(".")[1] for k in state if k.startswith("blocks.") and k.count(".") >= 2}
    if len(blocks) != config["n_layers"]:
        raise CheckpointError(
            f"{path}: weights do not match the config: {len(blocks)} blocks in the file but "
            f"n_layers={config['n_layers']} in the config"
        )
    for key, weight, axis, pes in _SIZED_BY_WEIGHTS:
        if config.get(key) is None or (pes is not None and pe not in pes):
            continue
        if weight not in state:
            raise CheckpointError(f"{path}: weights do not match the config: missing {weight}")
        shape = tuple(state[weight].shape)
        if len(shape) <= axis or shape[axis] != config[key]:
            raise CheckpointError(
                f"{path}: weights do not match the config: {weight} has shape {shape} in the "
                f"file but {key}={config[key]} in the config"
            )


def load_checkpoint(path, device=None, rope_scaling=None) -> Checkpoint:
    """Load a checkpoint; returns `.model` (eval mode, on `device`: see build_model),
    `.tokenizer`, `.meta`. `rope_scaling`: RoPE scaling for a rotary model (see
    nopeinterp.models.set_rope_scaling).

    `.meta` holds "pe", "config" and whatever was saved with it (task, seed, step, ...).
    Raises CheckpointError with a one-line message for any bad file.
    """
    path = Path(path)
    data = _read(path)
    version = data.get("format_version", 0)
    if type(version) is not int:
        raise CheckpointError(f"{path}: invalid format_version {version!r}")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{path}: written by a newer nopeinterp (format {version})")
    config, meta, state = data.get("config"), data.get("meta"), data.get("state_dict")
    for name, value in (("config", config), ("meta", meta)):
        if value is not None and not isinstance(value, dict):
            raise CheckpointError(f"{path}: invalid {name}: a {type(value).__name__}, not a dict")
    if not isinstance(state, dict) or not state:
        raise CheckpointError(f"{path}: checkpoint has no state_dict")
    bad = [k for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{path}: state_dict entry {bad[0]!r} is not a named tensor")
    config = dict(config or {})
    pe = config.pop("pe", data.get("pe"))
    if not isinstance(pe, str) or pe not in PE_TYPES:
        raise CheckpointError(
            f"{path}: unknown positional encoding {pe!r} (known: {', '.join(PE_TYPES)})"
        )
    _check_config(config, state, pe, path)
    tokenizer = _read_tokenizer(data.get("tokenizer"), config["d_vocab"], path)
    from nopeinterp.models import ARCH_DEFAULTS, build_model, set_rope_scaling

    try:
        model = build_model(pe, tokenizer=tokenizer, device=device, **{**ARCH_DEFAULTS, **config})
        if rope_scaling is not None:
            set_rope_scaling(model, rope_scaling)
    except Exception as e:  # a crafted config: whatever the constructors reject
        raise CheckpointError(f"{path}: invalid model config: {_reason(e)}") from None
    _load_weights(model, state, path)
    model.eval()
    meta = {**(meta or {}), "pe": pe, "config": {"pe": pe, **config}}
    return Checkpoint(model=model, tokenizer=tokenizer, meta=meta, path=path)


def _read_tokenizer(text, d_vocab: int, path: Path):
    from nopeinterp.tasks.tokenizer import tokenizer_from_json

    if text is None or text == "":
        return None
    if not isinstance(text, str):
        raise CheckpointError(f"{path}: invalid tokenizer: a {type(text).__name__}, not JSON text")
    try:
        tokenizer = tokenizer_from_json(text)
    except Exception as e:  # JSON, format or the tokenizers library's own parser
        raise CheckpointError(f"{path}: invalid tokenizer ({_reason(e)})") from None
    if len(tokenizer) > d_vocab:
        raise CheckpointError(
            f"{path}: the tokenizer has {len(tokenizer)} tokens but the model only {d_vocab}"
        )
    return tokenizer


def _load_weights(model, state, path):
    expected = _stored_state_dict(model, None)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {missing[:3]}{'...' if len(missing) > 3 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}")
        raise CheckpointError(f"{path}: weights do not match the config: {'; '.join(parts)}")
    for key, ref in expected.items():
        if tuple(state[key].shape) != tuple(ref.shape):
            raise CheckpointError(
                f"{path}: weights do not match the config: {key} has shape "
                f"{tuple(state[key].shape)} in the file but {tuple(ref.shape)} in the config"
            )
        if state[key].is_floating_point() != ref.is_floating_point() or state[key].is_complex():
            raise CheckpointError(
                f"{path}: weights do not match the config: {key} is {state[key].dtype}, "
                f"expected {ref.dtype}"
            )
        if state[key].is_floating_point() and not bool(torch.isfinite(state[key]).all()):
            bad = int((~torch.isfinite(state[key])).sum())
            raise CheckpointError(
                f"{path}: weight {key} holds {bad} non-finite value{'s' * (bad != 1)} "
                "(NaN or infinity): a diverged or damaged run"
            )
    dtype = next(model.parameters()).dtype
    model.load_state_dict(
        {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}, strict=False
    )


# --- info ------------------------------------------------------------------------------------------
def _portable(value):
    """`value` with absolute paths (of the machine that wrote the file) cut to their file name."""
    if isinstance(value, str) and os.path.isabs(value) and len(value) > 1:
        return Path(value).name
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_portable(v) for v in value]
    return value


def _inline(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_inline(v)}" for k, v in value.items()) or "{}"
    if isinstance(value, list):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    return str(value)


def format_checkpoint_info(path) -> str:
    """A checkpoint's PE, parameter count, config and meta as aligned `key: value` lines.

    Absolute paths stored in the file (the training machine's) are shown as file names;
    `versions` are the ones recorded at save time, `installed` the ones running now.
    Raises CheckpointError for a bad file, like `load_checkpoint`.
    """
    ckpt = load_checkpoint(path)
    rows = [
        ("checkpoint", str(path)),
        ("pe", ckpt.pe),
        ("parameters", f"{sum(p.numel() for p in ckpt.model.parameters()):,}"),
        ("config", _inline(ckpt.meta["config"])),
    ]
    rows += [
        (str(k), _inline(_portable(v))) for k, v in ckpt.meta.items() if k not in ("pe", "config")
    ]
    rows.append(("installed", _inline(versions())))
    width = max(len(k) for k, _ in rows) + 2
    return "\n".join(f"{k + ':':<{width}}{v}" for k, v in rows)
