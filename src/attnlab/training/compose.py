"""Composing a config as the commands do (Hydra's compose over the packaged ``attnlab.conf``), the checks that need
only the composed config (no Lightning, no model: ``benchmarks/bench_refusal.py`` times a refusal), and the
one-line form of a composition error (``one_line``).

Importing this module registers the resolvers the configs name (``attnlab_log_file``, ``attnlab_run_id``), so a
config composed here resolves as it does under ``attnlab-train``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, flag_override
from omegaconf.errors import OmegaConfBaseException
from yaml import YAMLError

from attnlab.errors import ConfigError, UserError
from attnlab.training.launch import log_file_name, shared_run_id
from attnlab.training.scale import apply_scale

# The run folder's log file, per process of a DDP run (hydra/job_logging/attnlab.yaml).
OmegaConf.register_new_resolver("attnlab_log_file", lambda: log_file_name(), replace=True)
# The run's name, the same in every rank of a launch (paths.run_id, the multirun folder).
OmegaConf.register_new_resolver("attnlab_run_id", lambda: shared_run_id(), replace=True)

# Bad input, as a command reports it in one line: attnlab's ``UserError`` and the parse errors of the libraries that
# read the user's config (a file that is not YAML, an override Hydra cannot parse).
USER_ERRORS: tuple[type[BaseException], ...] = (UserError, HydraException, OmegaConfBaseException,
                                                FileNotFoundError, YAMLError)


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

    cfg = compose(config_name, overrides)
    apply_scale(cfg, overrides)
    validate(cfg)
    return cfg


def compose_shown(overrides: list[str], *, job_only: bool, package: str | None) -> Any:
    """What ``attnlab-train --cfg job|all [-p PACKAGE]`` prints: the config composed as Hydra composes it, with the
    scale applied (the config the run will use); ``job_only`` drops Hydra's node. None: no such package."""
    cfg = compose("train", overrides, with_hydra=True)
    apply_scale(cfg, overrides)
    HydraConfig.instance().set_config(cfg)  # as Hydra does, so ${hydra:...} resolves
    OmegaConf.set_readonly(cfg.hydra, None)
    if job_only:
        with flag_override(cfg, ["struct", "readonly"], [False, False]):
            del cfg["hydra"]
    return cfg if package is None else OmegaConf.select(cfg, package)


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


def one_line(exc: BaseException) -> str:
    """A single line for users, rewritten from Hydra's multi-line messages where they are known."""
    text = str(exc).strip()
    if type(exc).__module__.startswith("yaml"):  # a config file that is not plain YAML (a python/... tag)
        mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
        where = f"{mark.name}, line {mark.line + 1}" if mark is not None else "a config file"
        problem = problem or text.splitlines()[0]
        tag = "; configs are plain YAML (tags that build Python objects are never run)" if "tag" in problem else ""
        return f"{where}: {problem}{tag}"
    override = getattr(exc, "override", None)
    if exc.__class__.__name__ == "OverrideParseException" and override is not None:
        first = text.splitlines()[0] if text else "cannot parse"
        if "=" not in override:
            return (f"argument {override!r} is not key=value ({first}); a value with spaces must be quoted for the "
                    f"shell as a whole: \"paths.data_root=/my data\"")
        return (f"cannot parse {override!r}: {first}; quote a value with spaces or special characters for Hydra "
                f"too: 'key=\"value\"'")
    cause = exc.__cause__ or exc.__context__
    if cause is not None and "not in struct" in str(cause):
        text = f"{text}\n{cause}"  # Hydra keeps the useful part ("Key 'x' is not in struct") in the cause
    missing = re.search(r"Could not find '([^']+)'", text)
    if missing:
        options = re.findall(r"^\t(\S+)$", text, flags=re.M)
        group = missing.group(1).rsplit("/", 1)[0]
        if not options:  # options in family folders (task=mt/...): Hydra lists none, so list the files
            group, options = _options_in_folders(missing.group(1))
        valid = ", ".join(options) if options else "see conf/" + group
        return f"unknown option '{missing.group(1)}'; valid options of {group}: {valid}"
    struct = re.search(r"Could not override '([^']+)'.*?Key '([^']+)' is not in struct", text, flags=re.S)
    if struct:
        key = struct.group(1)
        parent = key.rsplit(".", 1)[0] if "." in key else "the root config"
        return f"unknown key '{key}' (misspelled?); see the keys of {parent} with: attnlab-train --cfg job"
    if "Key '" in text and "not in struct" in text:
        return text.splitlines()[0] + " (misspelled key?)"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else exc.__class__.__name__


def _options_in_folders(name: str) -> tuple[str, list[str]]:
    """(group, options) for an unknown ``group/folder/.../option``: the options under the deepest folder of the
    name that exists, written as the user writes them after ``group=`` (``task=superglue/nope`` lists
    ``superglue/boolq, ...``; ``task=nope`` lists every task)."""

    import attnlab.conf

    conf = Path(attnlab.conf.__file__).parent
    group, *folders = name.split("/")[:-1] or [name]
    folders = [f for f in folders if f not in ("", ".", "..")]  # the listing never leaves the config tree
    root = conf / group
    if group in ("", ".", "..") or not root.is_dir():
        return group, []
    base = root
    for folder in folders:
        if not (base / folder).is_dir():
            break
        base = base / folder
    return group, sorted(str(p.relative_to(root).with_suffix("")) for p in base.rglob("*.yaml"))
