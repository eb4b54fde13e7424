"""One root for user errors (issue 51): every exception class attnlab defines is a ``UserError`` (bad input, one
line, exit 2) or a ``RunFault`` (one line, exit 1), or is named below as something a command never reports as
a refusal; and the commands report a ``UserError`` by its root, so a new or renamed class needs no listing."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from attnlab.cli.common import failures_reported
from attnlab.errors import ConfigError, RunFault, UserError

SRC = Path(__file__).resolve().parents[1] / "src"

# Exceptions that are not refusals of input: what each is instead.
NOT_REFUSALS = {
    "attnlab.training.checkpointing.Preempted": "a stop signal after a checkpoint; exit 128+signal, resumable",
    "attnlab.training.stop_signals.StoppedBySignal": "a stop signal (a Preempted)",
    "attnlab.training.stop_signals.Interrupted": "Ctrl-C (a Preempted)",
    "attnlab.attention.contract.Skip": "a check of the attention contract that does not apply to a variant",
    "attnlab.tasks.listops._TooLong": "internal: a generated expression over the length, drawn again",
}


def exception_classes() -> dict[str, type]:
    """``module.Class`` -> class, for every class defined in attnlab whose bases name an exception (found in the
    source, then imported to follow the bases for real)."""
    found = {}
    for path in sorted((SRC / "attnlab").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.bases]
        if not names:
            continue
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        module_name = ".".join(parts)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # an optional dependency (Triton) missing here: its classes are not ours to see
            if "triton" in str(exc).lower():
                continue
            raise
        for name in names:
            cls = getattr(module, name, None)
            if isinstance(cls, type) and issubclass(cls, BaseException) and cls.__module__ == module_name:
                found[f"{module_name}.{name}"] = cls
    return found


def test_every_attnlab_exception_is_a_user_error_or_a_run_fault_or_named_as_neither():
    classes = exception_classes()
    assert "attnlab.tasks.base.DataError" in classes and "attnlab.errors.TableError" in classes  # the walk sees them
    stray = sorted(name for name, cls in classes.items()
                   if not issubclass(cls, (UserError, RunFault)) and name not in NOT_REFUSALS)
    assert not stray, (f"exception classes neither a UserError (bad input) nor a RunFault (a fault of the run): "
                       f"{stray}; subclass one of attnlab.errors, or name the class in NOT_REFUSALS with why")
    gone = sorted(set(NOT_REFUSALS) - set(classes))
    assert not gone, f"NOT_REFUSALS names classes that no longer exist: {gone}"


def test_user_errors_and_run_faults_are_apart():
    for name, cls in exception_classes().items():
        assert not (issubclass(cls, UserError) and issubclass(cls, RunFault)), name


def test_the_registries_refuse_an_unknown_name_with_a_user_error():
    from attnlab.attention.registry import ATTENTION_VARIANTS
    from attnlab.models.recurrence import RECURRENCES
    from attnlab.tasks.registry import TASK_FAMILIES
    from attnlab.tasks.schemas import TASK_SCHEMAS
    from attnlab.tasks.trivial import BASELINES

    for registry in (ATTENTION_VARIANTS, RECURRENCES, TASK_FAMILIES, TASK_SCHEMAS, BASELINES):
        with pytest.raises(UserError, match="valid: "):
            registry.get("no-such-name")


class _NewlyNamed(UserError):
    """A user error no command has heard of by name."""


def test_the_wrapper_turns_any_user_error_into_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as info, failures_reported(prog="attnlab-x"):
        raise _NewlyNamed("bad thing; fix it so")
    assert info.value.code == 2
    assert capsys.readouterr().err == "attnlab-x: error: bad thing; fix it so\n"


def test_the_wrapper_turns_a_run_fault_into_exit_1_and_lets_a_bug_through(capsys):
    with pytest.raises(SystemExit) as info, failures_reported(prog="attnlab-x"):
        raise RunFault("disk full")
    assert info.value.code == 1 and capsys.readouterr().err == "attnlab-x: error: disk full\n"
    with pytest.raises(KeyError), failures_reported():
        raise KeyError("a bug keeps its traceback")


@pytest.mark.parametrize("command", ["evaluate", "train"])
def test_a_command_reports_a_user_error_it_never_named_in_one_line(command, capsys, monkeypatch, tmp_path):
    """A renamed or new error class is reported by its root: here raised from inside the command's work."""
    monkeypatch.chdir(tmp_path)
    if command == "evaluate":
        import attnlab.cli.evaluate as cli

        monkeypatch.setattr(cli, "evaluate", lambda *a, **k: (_ for _ in ()).throw(_NewlyNamed("no such run")))
        argv = [str(tmp_path)]
    else:
        import attnlab.cli.train as cli

        def refuse(*args, **kwargs):
            raise _NewlyNamed("no such run")

        monkeypatch.setattr(cli, "check_group_choices", refuse)
        argv = ["seed=1"]
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.endswith("error: no such run\n") and err.count("\n") == 1, err


def test_config_error_has_one_home():
    import attnlab.plugins
    import attnlab.training.config

    assert attnlab.training.config.ConfigError is ConfigError is attnlab.plugins.ConfigError
    assert issubclass(ConfigError, ValueError)  # callers that caught ValueError still do
