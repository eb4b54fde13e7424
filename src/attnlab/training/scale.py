"""Sizing a composed config to its scale (``scale=cpu|gpu|paper``): the ``at_scale.<scale.name>`` blocks.

Imports only OmegaConf and the (torch-free) run record files, so ``attnlab-train --cfg job`` and the preflight
can apply the scale without loading torch or Lightning.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from attnlab.results.record import BEFORE_SCALE_CONFIG, RESOLVED_CONFIG, atomic_write_text

log = logging.getLogger("attnlab")


def apply_scale(cfg: DictConfig, cli_overrides: list[str] | tuple[str, ...] = ()) -> None:
    """Apply the ``at_scale.<scale.name>`` blocks of ``model``, ``task`` and the root config.

    A preset states its paper-size values as plain keys, its laptop-size values under ``at_scale.cpu`` and its
    one-GPU values under ``at_scale.gpu``.
    Each key of a block is a path relative to where the block sits (``d_model``, ``attention.block_size``,
    or at the root ``trainer.max_steps``) and its value replaces what is at that path, whole: a block
    entry ``train: {source: local, ...}`` swaps the data source rather than blending two of them. The
    root block is applied last, after the scale group's own budget, so a laptop-native preset keeps its
    steps. What the user set on the command line wins: a dotted key protects itself and everything below
    it, a nested group choice (``model/attention=...``) protects that section; top-level group choices
    (``model=...``, ``task=...``) protect nothing. A block entry skipped because the command line sets a key
    *inside* it (``task.mixing.epoch_examples=...`` against a block's ``mixing: {...}``) is logged: the rest of
    that section then keeps the preset's paper-scale values, which is easy to miss.
    """
    explicit = []
    for override in cli_overrides:
        if "=" not in override:
            continue
        key = override.split("=", 1)[0].lstrip("+~")
        if "." in key or "/" in key:
            explicit.append(key.replace("/", "."))

    def protected(path: str) -> bool:
        return any(path == e or path.startswith(e + ".") or e.startswith(path + ".") for e in explicit)

    def inside(path: str) -> list[str]:
        return [e for e in explicit if e.startswith(path + ".")]

    scale = cfg.scale.name
    # A debug mode comes last in the defaults and must keep winning, over an experiment's root block too.
    sections = ("model", "task") if cfg.get("debug_mode") else ("model", "task", None)
    with open_dict(cfg):
        for section in sections:
            node = cfg if section is None else cfg[section]
            block = OmegaConf.select(node, f"at_scale.{scale}")
            if not block:
                continue
            prefix = "" if section is None else f"{section}."
            for key, value in block.items_ex(resolve=False):
                path = prefix + str(key)
                if not protected(path):
                    OmegaConf.update(node, str(key), value, merge=False, force_add=True)
                elif inside(path):
                    log.warning("scale=%s: the at_scale entry %s is not applied because the command line sets %s "
                                "inside it, so the rest of %s keeps the preset's paper-scale values; set those "
                                "keys on the command line too if you want the laptop ones", scale, path,
                                ", ".join(inside(path)), path)


def save_config_that_runs(cfg: DictConfig, overrides: list[str], hydra_dir: Path) -> None:
    """Apply the scale to ``cfg`` and rewrite ``.hydra/config.yaml`` with it: Hydra saved the config before
    ``at_scale`` blocks were applied, and the run folder must hold the config that runs. The composition
    before the scale is kept as ``.hydra/config_before_scale.yaml``."""
    before = OmegaConf.to_yaml(cfg)
    apply_scale(cfg, overrides)  # run() applies it again: a no-op on a scaled config
    atomic_write_text(hydra_dir / BEFORE_SCALE_CONFIG.name, before)
    atomic_write_text(hydra_dir / RESOLVED_CONFIG.name, OmegaConf.to_yaml(cfg))
