"""Training: `train(make_config("copy", "nope", "out.pt", preset="tiny")) -> checkpoint path`;
grids of runs: `run_sweep(tasks, pes, seeds, out, ...)`, `collect(dir) -> DataFrame`."""

from nopeinterp.training.presets import PRESETS, Preset
from nopeinterp.training.sweep import collect, run_sweep
from nopeinterp.training.trainer import TrainConfig, make_config, train

__all__ = ["PRESETS", "Preset", "TrainConfig", "collect", "make_config", "run_sweep", "train"]
