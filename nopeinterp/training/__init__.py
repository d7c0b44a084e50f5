"""Training: `train(make_config("copy", "nope", "out.pt", preset="tiny")) -> checkpoint path`;
grids of runs: `run_sweep(...)`, `collect(dir)`."""

from nopeinterp.training.presets import PRESETS, Preset
from nopeinterp.training.trainer import TrainConfig, make_config, train

__all__ = ["PRESETS", "Preset", "TrainConfig", "make_config", "train"]
