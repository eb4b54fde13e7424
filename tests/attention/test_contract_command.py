"""``python -m attnlab.attention.contract <module:Class>`` (issue 52.7): an extension author runs the registry's
contract on a plugin variant; it passes the example extension's variant and names what a broken one breaks."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from attnlab.attention import contract
from attnlab.attention.registry import ATTENTION_VARIANTS, Entry, NoOptions
from attnlab.attention.vanilla import DotProductAttention
from tests.conftest import REPO


class PeekingAttention(DotProductAttention):
    """Adds the mean of the whole input to every position: a causal position sees the future, padding leaks."""

    def forward(self, x, *args, **kwargs):
        return super().forward(x, *args, **kwargs) + x.mean(dim=1, keepdim=True)


class Float32Attention(DotProductAttention):
    """Always answers in float32, whatever the input's dtype."""

    def forward(self, x, *args, **kwargs):
        return super().forward(x, *args, **kwargs).float()


def _register(monkeypatch, name: str, cls) -> None:
    monkeypatch.setitem(ATTENTION_VARIANTS._entries, name, Entry(name, cls, NoOptions, "test"))
    monkeypatch.setattr(cls, "name", name, raising=False)


def test_the_example_plugin_variant_keeps_the_contract():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "attnlab.attention.contract", "my_extension:TemperedAttention"],
                         cwd=REPO / "examples" / "extension", capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "attention variant 'tempered': the contract holds" in out.stdout
    assert out.stdout.count("     ok  ") == len(contract.CHECKS)


def test_a_leaking_variant_fails_the_checks_it_breaks(monkeypatch, capsys):
    _register(monkeypatch, "peeking_test", PeekingAttention)
    assert contract.main(["peeking_test"]) == 1
    out = capsys.readouterr().out
    assert " FAILED  causal: no position sees a later one" in out
    assert " FAILED  padding changes nothing" in out
    assert "     ok  float64 and bfloat16" in out


def test_a_variant_that_changes_the_dtype_fails_the_dtype_check(monkeypatch):
    _register(monkeypatch, "float32_test", Float32Attention)
    results = {label: outcome for label, outcome, _ in contract.run_contract("float32_test")}
    assert results["float64 and bfloat16"] == "FAILED"
    assert results["shape and finite"] == "ok"
    assert torch.get_default_dtype() == torch.float32


def test_an_unregistered_class_is_one_line(capsys):
    assert contract.main(["attnlab.attention.vanilla:DotProductAttention"]) in (0, 2)
    assert contract.main(["nosuchmodule:X"]) == 2
    assert "cannot import nosuchmodule:X" in capsys.readouterr().err
