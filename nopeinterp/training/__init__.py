"""Training loop for the task suite: `train(TrainConfig(...)) -> checkpoint path`."""

from nopeinterp.training.trainer import TrainConfig, train

__all__ = ["TrainConfig", "train"]
