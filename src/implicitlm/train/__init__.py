"""Training: one configuration (``TrainConfig``) and one trainer (``train``) for every task."""

from .config import TrainConfig
from .trainer import resume_config, train

__all__ = ["TrainConfig", "resume_config", "train"]
