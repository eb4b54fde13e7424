"""What a pip install carries: every third-party import is a declared dependency, and the wheel ships the
table specs and the papers' numbers, so attnlab-table builds paper tables without a checkout."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
import tomllib

from tests.conftest import REPO


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    return {_normal(re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0]) for r in reqs}


def test_every_third_party_import_is_a_declared_dependency():
    imported = set()
    for path in (REPO / "src" / "attnlab").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    distributions = md.packages_distributions()
    undeclared = sorted(
        f"{module} ({', '.join(distributions.get(module, ['?']))})"
        for module in imported - set(sys.stdlib_module_names) - {"attnlab"}
        if not any(_normal(d) in _declared() for d in distributions.get(module, [module]))
    )
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to list the tracked specs")
def test_the_wheel_ships_every_table_spec_and_the_paper_numbers(tmp_path):
    # A clean copy of what a build reads (symlinks kept), so no earlier build/ folder can fill the gaps.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("src", "experiments"):
        shutil.copytree(REPO / name, source / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                          "-q", "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("attnlab-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "experiments"], capture_output=True, text=True,
                             check=True).stdout.split()
    specs = [f for f in tracked if f.endswith(".yaml")]
    assert "experiments/paper_tables.yaml" in specs
    missing = [f for f in specs if f"attnlab/{f}" not in shipped]
    assert not missing, f"not in the wheel: {missing}"


def test_without_a_checkout_the_tables_come_from_the_packaged_specs(tmp_path, monkeypatch):
    """A wheel install (no checkout root) standing in an empty folder still finds specs and paper numbers."""
    import attnlab.results.paper as paper
    from attnlab.cli.table import main as table_main

    monkeypatch.setattr(paper, "repo_root", lambda: None)
    monkeypatch.chdir(tmp_path)
    packaged = paper.default_experiments_dir()
    assert packaged.parent.name == "attnlab" and (packaged / "paper_tables.yaml").is_file()
    assert paper.load_paper_tables().found
    (tmp_path / "runs").mkdir()
    table_main(["table=ut/table4_copy", "runs=runs", "out=out"])
    assert (tmp_path / "out" / "ut" / "table4_copy.md").is_file()
