"""The config you see is the config that ran: ``--cfg job`` and the run folder's ``.hydra/config.yaml`` show
the config after the scale's ``at_scale`` blocks are applied, with the command line still winning."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from attnlab.cli.train import main as train_main
from tests.conftest import TINY, TINY_ALGO, train_cli


def _printed(argv: list[str], capsys):
    capsys.readouterr()
    train_main(argv)
    return capsys.readouterr().out


def test_cfg_job_prints_the_scaled_config_the_run_uses(capsys):
    shown = yaml.safe_load(_printed(["model=ut_base", "--cfg", "job"], capsys))
    # ut_base is the paper's 1024-wide model; its at_scale.cpu block makes it 128 wide at the default scale=cpu.
    assert shown["model"]["d_model"] == 128 and shown["model"]["encoder_layers"] == 4
    assert shown["task"]["train_max_len"] == 20 and shown["task"]["test_max_len"] == 200  # algo/copy at cpu
    assert shown["trainer"]["max_steps"] == 1500  # the cpu scale's budget
    paper = yaml.safe_load(_printed(["model=ut_base", "scale=paper", "--cfg", "job"], capsys))
    assert paper["model"]["d_model"] == 1024 and paper["task"]["train_max_len"] == 40


def test_cfg_job_keeps_command_line_over_at_scale_and_takes_package_and_resolve(capsys):
    assert _printed(["model=ut_base", "model.d_model=256", "-p", "model.d_model", "--cfg", "job"], capsys) == "256\n"
    model = _printed(["model=ut_base", "model.d_model=256", "--cfg", "job", "--package", "model"], capsys)
    assert model.startswith("# @package model\n")
    assert yaml.safe_load(model)["num_heads"] == 4  # the rest of the block still applies
    resolved = yaml.safe_load(_printed(["paths.run_id=r1", "--cfg", "job", "--resolve"], capsys))
    assert resolved["run_name"] == "transformer_small-vanilla-stacked"


def test_cfg_all_shows_the_scaled_job_and_hydra_section(capsys):
    shown = yaml.safe_load(_printed(["model=ut_base", "--cfg", "all"], capsys))
    assert shown["model"]["d_model"] == 128 and shown["hydra"]["job"]["name"] == "train"


@pytest.mark.parametrize("flags", [["--cfg", "job"], ["--cfg", "all"], ["--cfg", "job", "--resolve"],
                                   ["-p", "task", "--cfg", "job"]])
def test_the_printout_is_hydras_own_when_the_scale_changes_nothing(flags, capsys, monkeypatch):
    """With scale=paper (no at_scale block applies) the output equals what Hydra itself prints."""
    from hydra.core.global_hydra import GlobalHydra

    from attnlab.cli.train import hydra_main

    argv = ["scale=paper", "paths.run_id=fixed", *flags]
    ours = _printed(argv, capsys)
    GlobalHydra.instance().clear()
    monkeypatch.setattr(sys, "argv", ["attnlab-train", *argv])
    hydra_main()
    assert capsys.readouterr().out == ours


def test_a_bad_override_with_cfg_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        train_main(["model.d_modl=3", "--cfg", "job"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "model.d_modl" in err


def test_cfg_job_does_not_load_torch():
    """Printing a config stays as fast as Hydra's own (no torch or Lightning import)."""
    code = ("import sys; from attnlab.cli.train import main; main(['--cfg', 'job', '-p', 'seed']); "
            "assert 'torch' not in sys.modules and 'lightning' not in sys.modules, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout == "1234\n"


@pytest.fixture(scope="module")
def scaled_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("scaled")
    run_dir = root / "run"
    argv = [*TINY, *TINY_ALGO, "logger=csv", "callbacks=none", "seed=5", f"hydra.run.dir={run_dir}"]
    train_cli(root, argv)
    return run_dir, argv


def test_the_run_folder_holds_the_config_that_ran(scaled_run):
    run_dir, _ = scaled_run
    ran = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    # TINY_ALGO sets task.at_scale.cpu.train_size=64; the copy task's own (paper) size is 100000.
    assert ran["task"]["train_size"] == 64 and ran["task"]["train_max_len"] == 6
    before = yaml.safe_load((run_dir / ".hydra" / "config_before_scale.yaml").read_text())
    assert before["task"]["train_size"] == 100000


def test_the_record_hash_is_still_the_hash_of_the_config_as_asked(scaled_run):
    """Committed records are found by this hash: it is the scaled config's, before build fills values."""
    from attnlab.training.compose import compose_checked
    from attnlab.training.config_hash import asked_config_hash

    run_dir, argv = scaled_run
    record = json.loads((run_dir / "results.json").read_text())
    assert record["status"] == "completed"
    assert record["config_hash"] == asked_config_hash(compose_checked("train", argv))


def test_eval_rebuilds_the_same_config_from_a_scaled_run_folder(scaled_run):
    """attnlab-eval applies the scale again on the saved config: a no-op on one already scaled."""
    from attnlab.training.evaluation import load_run_config

    run_dir, _ = scaled_run
    cfg = load_run_config(run_dir, [])
    assert cfg.task.train_size == 64 and cfg.model.d_model == 64


def test_the_config_hash_does_not_depend_on_hydra_being_set_up():
    """Outside a Hydra run ``paths.run_dir`` (${hydra:runtime.output_dir}) cannot resolve; the hash, which
    leaves paths out, must still be the run's (before, it fell back to hashing the unresolved config, and a
    test or tool found no record by it depending on what had run before it in the process)."""
    from hydra.core.hydra_config import HydraConfig

    from attnlab.training.compose import compose, compose_checked
    from attnlab.training.config_hash import asked_config_hash

    argv = [*TINY, *TINY_ALGO, "seed=5"]
    saved = HydraConfig.instance().cfg
    try:
        HydraConfig.instance().cfg = None
        outside = asked_config_hash(compose_checked("train", argv))
        HydraConfig.instance().set_config(compose("train", argv, with_hydra=True))
        inside = asked_config_hash(compose_checked("train", argv))
    finally:
        HydraConfig.instance().cfg = saved
    assert outside == inside
