"""The checks of a training command before anything runs (a config composed and checked, its run or sweep folder,
a resumed folder's config, the devices asked for), and the config file a run folder keeps: each refusal is a
``UserError`` (one line) raised before Hydra starts a job. ``attnlab-train`` (``cli/train.py``) calls
:func:`check_run_folder` and :func:`check_resume_keeps_the_config` before a single run, :func:`check_sweep` before a
``-m`` sweep.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from attnlab.errors import ConfigError
from attnlab.results.record import CHECKPOINTS_DIR, RESOLVED_CONFIG
from attnlab.training.compose import USER_ERRORS, compose, compose_checked, one_line
from attnlab.training.storage import (
    RunFolderBusy,
    RunFolderLock,
    busy_message,
    check_can_create,
    check_inside,
    check_run_folder_entries,
)


def check_no_spawned_processes(cfg: DictConfig) -> None:
    """A sweep (``-m``) may not ask Lightning to start processes: each child it starts reruns the command,
    i.e. the whole sweep. Multi-device sweeps go through torchrun or SLURM tasks, which start every rank."""
    from attnlab.training.launch import processes_started_outside

    world = int(cfg.hardware.devices) * int(cfg.hardware.num_nodes)
    if world > 1 and not processes_started_outside():
        raise ConfigError(
            f"a -m sweep cannot run hardware={cfg.hardware.name} ({world} processes): Lightning would start "
            f"each process by rerunning the whole sweep; run one configuration per command, or launch the "
            f"sweep's ranks with torchrun (torchrun --nproc_per_node={cfg.hardware.devices} -m attnlab.train "
            f"-m ...) or SLURM (hydra/launcher=submitit_slurm_attnlab)")


def check_resume_keeps_the_config(cfg: DictConfig, run_dir: Path) -> list[str]:
    """Rerunning a command resumes its run folder: refuse a changed training key (the record would describe one
    run made of two configurations); returns the lines that name what it allows to change
    (``training.config.RESUMABLE_CHANGES``), for the run's log.
    Compares the scaled config with the one the folder's run saved (``.hydra/config.yaml``)."""
    from omegaconf import OmegaConf

    from attnlab.training.checkpointing import has_checkpoints
    from attnlab.training.config import resume_config_changes

    saved = run_dir / RESOLVED_CONFIG
    if cfg.get("ckpt_path") or cfg.get("resume", "auto") != "auto" or not saved.is_file() \
            or not has_checkpoints(run_dir / CHECKPOINTS_DIR):
        return []
    try:
        before = OmegaConf.to_container(OmegaConf.load(saved), resolve=False)
    except Exception:  # noqa: BLE001 - an unreadable saved config cannot be compared; the run itself decides
        return []
    changed, allowed = resume_config_changes(before, OmegaConf.to_container(cfg, resolve=False))
    if changed:
        shown = "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in changed[:4])
        more = f" (and {len(changed) - 4} more)" if len(changed) > 4 else ""
        raise ConfigError(f"{run_dir} holds a run of another configuration, and resuming it would make one record "
                          f"of two: {shown}{more}; rerun with its values, or start a new run (another "
                          f"paths.run_id)")
    if allowed:
        return [f"resuming {run_dir} with " + ", ".join(f"{k} {o!r} -> {n!r}" for k, o, n in allowed) + " changed"]
    return []


def check_sweep_group_choices(argv: list[str]) -> None:
    """Every value of a swept config group (``model/attention=vanilla,synth_dense``) names an option: Hydra
    composes a job only when it launches it, and a missing option then ends the whole sweep with a traceback
    (jobs before it done, the rest never started). Refused here in one line, before any job starts. Values
    (``optim.lr=0.1,oops``) are checked by each job, which fails alone and is named at the end."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    import attnlab.conf

    plain = [a for a in argv if not a.startswith("-")]
    parsed = OverridesParser.create().parse_overrides(plain)
    fixed = [a for a, o in zip(plain, parsed) if not o.is_sweep_override()]
    conf = Path(attnlab.conf.__file__).parent
    for override in parsed:
        key = override.get_key_element()
        group = key.lstrip("+~").split("@", 1)[0]
        if not (override.is_sweep_override() and override.is_discrete_sweep()) or "." in group \
                or ("/" not in group and not (conf / group).is_dir()):
            continue  # a value sweep (optim.lr, seed), or a range / interval
        for value in override.sweep_string_iterator():
            try:
                compose("train", [*fixed, f"{key}={value}"])
            except USER_ERRORS as exc:
                raise ConfigError(f"sweep choice {key}={value}: {one_line(exc)}; no job was started") from None


def check_sweep_resumes_keep_their_configs(argv: list[str]) -> list[str]:
    """A sweep into a folder that holds an earlier sweep (the same ``hydra.sweep.dir``: a resubmitted or
    continued sweep) resumes each job's folder: ``check_resume_keeps_the_config`` for every job whose folder
    exists, before Hydra starts (it rewrites a job's ``.hydra/config.yaml`` before the job runs, so the job
    itself could no longer see what its folder's run was)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, open_dict

    from attnlab.training.storage import StorageError, check_inside, check_run_folder_entries

    allowed: list[str] = []  # what the resumed jobs may change, for the log
    sweep_dir = Path(planned_dir(argv, "sweep").strip("'\""))
    plain = [a for a in argv if not a.startswith("-")]
    batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(plain), None)
    for number, job in enumerate(job for batch in batches for job in batch):
        layout = compose("train", job, with_hydra=True)
        with open_dict(layout):
            OmegaConf.update(layout, "hydra.job.num", number, force_add=True)
        job_dir = sweep_dir / str(layout.hydra.sweep.subdir)
        try:
            check_inside(job_dir, sweep_dir, "run_name or an interpolation in it", "hydra.sweep.dir")
        except StorageError as exc:
            raise ConfigError(f"sweep job {number} ({' '.join(job)}): {exc}; no job was started") from None
        if job_dir.is_dir():
            try:
                check_run_folder_entries(job_dir)  # Hydra rewrites the job's .hydra/*.yaml before the job can look
                allowed += check_resume_keeps_the_config(compose_checked("train", job), job_dir)
            except (ConfigError, StorageError) as exc:
                raise ConfigError(f"sweep job {number} ({' '.join(job)}): {exc}") from None
    return allowed


def check_devices_present(cfg: DictConfig) -> None:
    """A GPU preset on a machine without the GPUs it asks for: one line naming the fix, before any folder
    exists (Lightning would fail after the folder is made, with a traceback)."""

    if cfg.hardware.accelerator not in ("gpu", "cuda"):
        return
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < int(cfg.hardware.devices):
        found = "no CUDA GPU" if have == 0 else f"{have} CUDA GPU(s)"
        raise ConfigError(f"hardware={cfg.hardware.name} asks for {cfg.hardware.devices} GPU(s) but this machine has "
                          f"{found}; use hardware=cpu (or cpu_bf16), or run on a machine with the GPUs")


def check_sweep_spawns_no_processes(argv: list[str]) -> None:
    """Before a sweep starts: refuse it (``check_no_spawned_processes``) if any of its hardware choices asks
    for several processes that Lightning would start itself. A SLURM launcher starts every rank as a task."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser

    plain = [a for a in argv if not a.startswith("-")]
    if any(a.startswith("hydra/launcher=submitit") for a in plain):
        return
    parsed = OverridesParser.create().parse_overrides(plain)
    fixed = [a for a, o in zip(plain, parsed) if not o.is_sweep_override()]
    choices = []
    for o in parsed:
        if o.is_sweep_override() and o.get_key_element().lstrip("+~").startswith("hardware"):
            values = [str(v) for v in o.sweep_string_iterator()] if o.is_discrete_sweep() else []
            choices.append([f"{o.get_key_element()}={v}" for v in values] or [None])
    for combination in itertools.product(*choices) if choices else [()]:
        cfg = compose("train", [*fixed, *(c for c in combination if c is not None)])
        check_no_spawned_processes(cfg)


# What a run folder's name is made of, for the line that refuses one outside paths.runs_dir.
RUN_DIR_PARTS = "task name, run_name, paths.run_id or an interpolation in them"


def given(argv: list[str], key: str) -> bool:
    """Whether the user's command line sets ``key`` itself (then its folder is theirs to choose)."""
    return any(a.lstrip("+").startswith(key + "=") for a in argv)


def fixed_overrides(argv: list[str]) -> list[str]:
    """The overrides of ``argv`` that are neither flags nor sweeps."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    plain = [a for a in argv if not a.startswith("-")]
    parsed = OverridesParser.create().parse_overrides(plain)
    return [a for a, o in zip(plain, parsed) if not o.is_sweep_override()]


def planned_run_dir(argv: list[str]) -> str:
    """Where Hydra will put this single run (timestamps may differ by a second; only the parent matters)."""
    return planned_dir(argv, "run")


def planned_dir(argv: list[str], mode: str) -> str:
    """``hydra.run.dir`` or ``hydra.sweep.dir`` as Hydra will resolve it (sweep values and flags left out)."""
    cfg = compose("train", fixed_overrides(argv), with_hydra=True)
    return str(cfg.hydra.run.dir if mode == "run" else cfg.hydra.sweep.dir)


def check_run_folder(argv: list[str]) -> tuple[DictConfig, Path]:
    """The config of a single run, composed and checked, and the folder Hydra will give it: the devices it asks for
    are there, the folder lies under ``paths.runs_dir`` (unless ``hydra.run.dir`` is given), can be made, holds
    nothing planted and is not in use by a live run (``RunFolderBusy``)."""
    cfg = compose_checked("train", argv)
    check_devices_present(cfg)
    run_dir = Path(planned_run_dir(argv))
    if not given(argv, "hydra.run.dir"):
        check_inside(run_dir, str(cfg.paths.runs_dir), RUN_DIR_PARTS)
    check_can_create(run_dir)
    check_run_folder_entries(run_dir)
    owner = RunFolderLock.owner(run_dir)
    if owner is not None:
        raise RunFolderBusy(busy_message(run_dir, owner))
    return cfg, run_dir


def check_sweep(argv: list[str]) -> list[str]:
    """The checks of a ``-m`` sweep before its first job: its folder lies under ``paths.runs_dir`` (unless
    ``hydra.sweep.dir`` is given), every choice of every swept group exists, no job would spawn processes, no job
    would resume a folder of another configuration. Returns what the resumes allow to change, for the jobs' log."""
    if not given(argv, "hydra.sweep.dir"):
        check_inside(planned_dir(argv, "sweep"), str(compose("train", fixed_overrides(argv)).paths.runs_dir),
                     "hydra.sweep.dir's parts")
    check_sweep_group_choices(argv)
    check_sweep_spawns_no_processes(argv)
    return check_sweep_resumes_keep_their_configs(argv)
