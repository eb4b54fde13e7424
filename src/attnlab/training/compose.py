"""Composing a config as the commands do (Hydra's compose over the packaged ``attnlab.conf``), and the checks that
need only the composed config: no Lightning, no model (``benchmarks/bench_refusal.py`` times a refusal).

Importing this module registers the resolvers the configs name (``attnlab_log_file``, ``attnlab_run_id``), so a
config composed here resolves as it does under ``attnlab-train``.
"""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from attnlab.errors import ConfigError
from attnlab.training.launch import log_file_name, shared_run_id

# The run folder's log file, per process of a DDP run (hydra/job_logging/attnlab.yaml).
OmegaConf.register_new_resolver("attnlab_log_file", lambda: log_file_name(), replace=True)
# The run's name, the same in every rank of a launch (paths.run_id, the multirun folder).
OmegaConf.register_new_resolver("attnlab_run_id", lambda: shared_run_id(), replace=True)


def compose(config_name: str, overrides: list[str], *, with_hydra: bool = False) -> DictConfig:
    """The config Hydra composes for ``config_name`` (plus Hydra's own section with ``with_hydra``, named
    as ``@hydra.main`` in ``cli/<config_name>.py`` names its job)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="attnlab.conf", version_base="1.3", job_name=config_name):
        return hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=with_hydra)


def compose_checked(config_name: str, overrides: list[str]) -> DictConfig:
    """Compose, apply the scale and validate (the root keys too), as the run will; raises ``UserError``s
    (``attnlab.errors``) and Hydra's parse errors. Neither Lightning nor the model is needed for that."""
    from attnlab.training.config import validate
    from attnlab.training.scale import apply_scale

    cfg = compose(config_name, overrides)
    apply_scale(cfg, overrides)
    validate(cfg)
    return cfg


def check_group_choices(overrides: list[str]) -> None:
    """A group choice (``experiment=...``, ``model/attention=...``) names a file under its folder of the config
    tree: refuse ``..`` and absolute paths before Hydra (or an error message) follows them out of the tree."""
    import attnlab.conf

    conf = Path(attnlab.conf.__file__).parent
    for override in overrides:
        if "=" not in override or override.startswith("-"):
            continue
        key, value = override.split("=", 1)
        key = key.lstrip("+~").split("@", 1)[0]
        if "." in key or not key or not ((conf / key).is_dir() or key.startswith("hydra/")):
            continue
        parts = re.split(r"[,/()\[\]\s'\"]+", value)
        if ".." in parts or value.lstrip("'\"").startswith("/") or "\\" in value:
            root = conf / key
            options = sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml")) \
                if root.is_dir() else []
            valid = ", ".join(options) if options else f"see conf/{key}"
            raise ConfigError(f"{key}={value!r}: a choice of {key} names a preset under conf/{key} (no '..' or "
                              f"absolute paths); valid options of {key}: {valid}")
