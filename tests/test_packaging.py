"""What a pip install carries: every third-party import is a declared dependency, and the wheel ships the
table specs and the papers' numbers, so attnlab-table builds paper tables without a checkout."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import tarfile
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


def _tracked_specs() -> list[str]:
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "experiments"], capture_output=True, text=True,
                             check=True).stdout.split()
    specs = [f for f in tracked if f.endswith(".yaml")]
    assert "experiments/paper_tables.yaml" in specs
    return specs


def test_the_package_data_declares_the_configs_the_specs_and_the_paper_numbers():
    """The declaration a build reads: without it a wheel would carry no specs (the build test below proves it)."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = setuptools["package-data"]
    assert "**/*.yaml" in data["attnlab.conf"]
    assert {"experiments/*.yaml", "experiments/**/*.yaml"} <= set(data["attnlab"])
    link = REPO / "src" / "attnlab" / "experiments"
    assert link.resolve() == (REPO / "experiments").resolve() and (link / "paper_tables.yaml").is_file()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to list the tracked specs")
def test_the_sdist_and_wheel_pass_twine_check_and_ship_every_table_spec_and_the_paper_numbers(tmp_path):
    """`python -m build` makes the sdist, then the wheel from the unpacked sdist (so the sdist is complete);
    both pass `twine check --strict` (metadata, README rendering) and both carry every tracked spec."""
    # A clean copy of what a build reads (symlinks kept), so no earlier build/ folder can fill the gaps.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("src", "experiments"):
        shutil.copytree(REPO / name, source / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dist = tmp_path / "dist"
    out = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (wheel,) = dist.glob("attnlab-*.whl")
    (sdist,) = dist.glob("attnlab-*.tar.gz")
    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("PASSED") == 2, check.stdout
    specs = _tracked_specs()
    shipped = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in specs if f"attnlab/{f}" not in shipped]
    assert not missing, f"not in the wheel: {missing}"
    with tarfile.open(sdist) as archive:
        in_sdist = {m.name.split("/", 1)[1] for m in archive.getmembers() if m.isfile()}
    missing = [f for f in specs if f"src/attnlab/{f}" not in in_sdist]
    assert not missing, f"not in the sdist: {missing}"
    assert any(f.startswith("attnlab/conf/experiment/demo/") for f in shipped)


def _readme_install_extras() -> set[str]:
    """The extras named on README's `pip install` line (`# extras: [slurm], [triton], ...`)."""
    text = (REPO / "README.md").read_text()
    (line,) = [ln for ln in text.splitlines() if "pip install -e" in ln and "# extras:" in ln]
    return set(re.findall(r"\[([a-z0-9_-]+)\]", line.split("# extras:", 1)[1]))


def test_every_extra_is_documented_on_the_readme_install_line():
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert _readme_install_extras() == extras - {"dev"}


def test_the_notebooks_extra_brings_a_notebook_front_end_and_nbconvert():
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["notebooks"]
    names = {_normal(re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0]) for r in extra}
    assert names & {"jupyterlab", "notebook"}, extra
    assert {"nbconvert", "ipykernel"} <= names, extra


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


def test_the_changelog_keeps_a_changelog_form():
    """CHANGELOG.md: an Unreleased section first, then dated sections newest first, each made of Keep a
    Changelog's kinds of change; a tagged version of pyproject.toml would have its own section."""
    text = (REPO / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## (.+)$", text, flags=re.M)
    assert sections[0] == "[Unreleased]", sections[0]
    dates = []
    for heading in sections[1:]:
        m = re.fullmatch(r"(?:\[(\d+\.\d+\.\d+)\] - )?(\d{4}-\d{2}-\d{2})(?: - .+)?", heading)
        assert m, f"CHANGELOG heading {heading!r} is neither [Unreleased] nor dated (YYYY-MM-DD)"
        dates.append(m.group(2))
    assert dates and dates == sorted(dates, reverse=True), "dated sections go newest first"
    kinds = set(re.findall(r"^### (.+)$", text, flags=re.M))
    assert kinds and kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds
    for body in re.split(r"^## .+$", text, flags=re.M)[1:]:
        assert re.search(r"^### ", body, flags=re.M) and re.search(r"^- ", body, flags=re.M), body[:200]
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    tagged = subprocess.run(["git", "-C", str(REPO), "tag", "--list", f"v{version}", version], capture_output=True,
                            text=True).stdout.split()
    if tagged:
        assert f"## [{version}] - " in text, f"version {version} is tagged but has no CHANGELOG section"
