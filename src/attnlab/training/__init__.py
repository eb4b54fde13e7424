"""Training floor: Lightning modules per task family, callbacks, schedules, config checks and ``run``."""

from attnlab.training.config import ConfigError, validate
from attnlab.training.run import build_datamodule, build_module, derive_batching, run

__all__ = ["ConfigError", "build_datamodule", "build_module", "derive_batching", "run", "validate"]
