"""Training: `train(make_config("copy", "nope", "out.pt", preset="tiny")) -> checkpoint path`;
grids of runs: `run_sweep(tasks, pes, seeds, out, ...)`, `collect(dir) -> DataFrame`.

The names are imported lazily (as the top-level package does): `TrainConfig` lives in the
light `nopeinterp.training.config`, which the command line reads without loading torch.
"""

from nopeinterp._lazy import lazy_exports

_EXPORTS = {
    "PRESETS": "nopeinterp.training.presets",
    "Preset": "nopeinterp.training.presets",
    "TrainConfig": "nopeinterp.training.config",
    "collect": "nopeinterp.training.sweep",
    "run_sweep": "nopeinterp.training.sweep",
    "make_config": "nopeinterp.training.trainer",
    "train": "nopeinterp.training.trainer",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = list(_EXPORTS)
