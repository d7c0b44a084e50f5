"""nopeinterp: positional encodings, length generalization and attention, on TransformerLens.

The top-level names are imported lazily: importing TransformerLens takes seconds, and
`nopeinterp.tasks` or `nopeinterp --version` should not pay for it.
"""

from importlib.metadata import PackageNotFoundError, version

from nopeinterp._lazy import lazy_exports

try:
    __version__ = version("nopeinterp")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0+unknown"

_EXPORTS = {
    "PE_TYPES": "nopeinterp.models",
    "build_model": "nopeinterp.models",
    "model_config": "nopeinterp.models",
    "from_hf": "nopeinterp.models.hf",
    "layer_pes": "nopeinterp.models",
    "set_rope_scaling": "nopeinterp.models",
    "Checkpoint": "nopeinterp.checkpoint",
    "load_checkpoint": "nopeinterp.checkpoint",
    "save_checkpoint": "nopeinterp.checkpoint",
    "format_checkpoint_info": "nopeinterp.checkpoint",
    "load_training_state": "nopeinterp.checkpoint",
    "CheckpointError": "nopeinterp.errors",
    "NopeinterpError": "nopeinterp.errors",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["__version__", *_EXPORTS]
