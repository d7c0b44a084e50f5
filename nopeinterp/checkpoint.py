"""Checkpoints that load without running pickled code.

A `.pt` checkpoint is a dict of plain types and tensors written with `torch.save` and read
with `torch.load(weights_only=True)`, which refuses any pickle that would construct arbitrary
objects. `.safetensors` checkpoints hold the tensors, with the rest as JSON in a sidecar file
`<name>.json`. Writes go to a temporary file that is renamed into place, so a crash mid-save
never leaves a broken file behind.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nopeinterp.errors import CheckpointError
from nopeinterp.models import (
    ARCH_DEFAULTS,
    PE_TYPES,
    build_model,
    model_config,
    set_rope_scaling,
)

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


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(model, path, *, tokenizer=None, dtype=None, **meta) -> Path:
    """Write `model` (+ tokenizer + meta) to `path` (.pt, or .safetensors + .json sidecar).

    `dtype=torch.float16` stores weights in half precision (loaded back as float32).
    `meta` must be plain data (str, int, float, bool, None, lists and dicts of them).
    """
    from nopeinterp.tasks.tokenizer import tokenizer_to_json

    path = Path(path)
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    _check_plain(meta)
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
        from safetensors.torch import save_file

        _atomic_write(path.with_suffix(".json"), lambda t: Path(t).write_text(json.dumps(header)))
        _atomic_write(path, lambda t: save_file({k: v.contiguous() for k, v in state.items()}, t))
    else:
        _atomic_write(path, lambda t: torch.save({**header, "state_dict": state}, t))
    return path


def _read(path: Path) -> dict:
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        sidecar = path.with_suffix(".json")
        try:
            header = json.loads(sidecar.read_text())
            state = load_file(path)
        except FileNotFoundError as e:
            raise CheckpointError(f"{path}: missing metadata file {sidecar.name}") from e
        except (json.JSONDecodeError, SafetensorError, OSError) as e:
            raise CheckpointError(f"{path}: damaged safetensors checkpoint ({e})") from e
        return {**header, "state_dict": state}
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before refusing
            warnings.simplefilter("ignore", UserWarning)
            data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        with open(path, "rb") as f:
            magic = f.read(2)
        if magic[:1] == b"\x80" or magic == b"PK":  # a pickle, or torch's zip of one
            # The weights-only unpickler met something other than plain data: an object that
            # a full unpickle would construct, which can run arbitrary code. Never do that.
            raise CheckpointError(
                f"{path}: refused: the file holds pickled objects that are not plain data "
                "(loading them could run code); nopeinterp only loads weights-only checkpoints"
            ) from None
        raise CheckpointError(f"{path}: not a readable checkpoint (not a torch file)") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        reason = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{path}: not a readable checkpoint (truncated or not a torch file: {reason})"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a nopeinterp checkpoint (no '{FORMAT}' header)")
    return data


def load_checkpoint(path, device=None, rope_scaling=None) -> Checkpoint:
    """Load a checkpoint; returns `.model` (eval mode, on `device`: see build_model),
    `.tokenizer`, `.meta`. `rope_scaling`: RoPE scaling for a rotary model (see
    nopeinterp.models.set_rope_scaling).

    `.meta` holds "pe", "config" and whatever was saved with it (task, seed, step, ...).
    Raises CheckpointError with a one-line message for any bad file.
    """
    from nopeinterp.tasks.tokenizer import tokenizer_from_json

    path = Path(path)
    data = _read(path)
    if data.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: written by a newer nopeinterp (format {data['format_version']})"
        )
    config = dict(data.get("config") or {})
    pe = config.pop("pe", data.get("pe"))
    if pe not in PE_TYPES:
        raise CheckpointError(
            f"{path}: unknown positional encoding {pe!r} (known: {', '.join(PE_TYPES)})"
        )
    tokenizer = tokenizer_from_json(data["tokenizer"]) if data.get("tokenizer") else None
    try:
        model = build_model(pe, tokenizer=tokenizer, device=device, **{**ARCH_DEFAULTS, **config})
        if rope_scaling is not None:
            set_rope_scaling(model, rope_scaling)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: invalid model config: {e}") from None
    _load_weights(model, data.get("state_dict"), path)
    model.eval()
    meta = {**data.get("meta", {}), "pe": pe, "config": {"pe": pe, **config}}
    return Checkpoint(model=model, tokenizer=tokenizer, meta=meta, path=path)


def _load_weights(model, state, path):
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: checkpoint has no state_dict")
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
    dtype = next(model.parameters()).dtype
    model.load_state_dict(
        {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}, strict=False
    )
