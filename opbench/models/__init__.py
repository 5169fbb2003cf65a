"""Model configurations: one dataclass, loaders for Primus' list schema and Hugging Face config.json."""

from .config import ModelConfig, load_model_configs, select_models

__all__ = ["ModelConfig", "load_model_configs", "select_models"]
