"""The config hash a run asks for: what its record carries and what ``make reproduce-*`` looks up before training.

Imports only OmegaConf (no torch, no Lightning), so tools that hash many configs (``attnlab.training.record_hashes``)
stay quick. The hash itself and what it leaves out are ``results/record.py``'s (``DEFAULT_HASH_EXCLUDE``).
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from attnlab.results.record import DEFAULT_HASH_EXCLUDE, config_hash, is_excluded


def asked_config_hash(cfg: DictConfig) -> str | None:
    """The hash of a composed, scaled config as the run computes it before building (``training.run``)."""
    exclude = DEFAULT_HASH_EXCLUDE
    try:
        return config_hash(OmegaConf.to_container(cfg, resolve=True), exclude=exclude)
    except Exception:  # noqa: BLE001 - resolved below without the keys the hash leaves out
        pass
    # Outside a Hydra run (a tool, a test after another test cleared Hydra's state) ``paths.run_dir`` =
    # ${hydra:runtime.output_dir} cannot resolve; it is not hashed, so drop the excluded keys and resolve the
    # rest: the same hash as inside the run.
    trimmed = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    drop_excluded(trimmed, exclude, "")
    try:
        return config_hash(OmegaConf.to_container(trimmed, resolve=True), exclude=exclude)
    except Exception:  # noqa: BLE001 - an unresolvable config is hashed as written
        return config_hash(OmegaConf.to_container(cfg, resolve=False), exclude=exclude)


def drop_excluded(node: DictConfig, exclude: tuple[str, ...], prefix: str) -> None:
    """Delete from ``node`` (in place) the keys the hash leaves out, so the rest resolves without them."""
    for key in list(node.keys()):
        path = f"{prefix}{key}"
        if is_excluded(path, exclude):
            del node[key]
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none() \
                and not child._is_interpolation():
            drop_excluded(child, exclude, path + ".")
