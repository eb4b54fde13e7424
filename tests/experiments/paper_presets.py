"""What the experiment tests know about the paper presets: where they live and which paper table each
folder reproduces. Shared by test_presets.py and test_rules.py; reads files only (no Hydra, no torch)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import CONF, REPO

EXPERIMENT_CONF = CONF / "experiment"
SPECS = REPO / "experiments"
PAPER_TABLES = SPECS / "paper_tables.yaml"

# Preset folder <paper> -> key of that paper in paper_tables.yaml.
PAPERS = {
    "ut": "universal_transformer",
    "lra": "lra",
    "synthesizer": "synthesizer",
    "qknorm": "qknorm",
    "bigbird": "bigbird",
}
# Preset folder <paper>/<table> -> table key in paper_tables.yaml (when it is not the folder name itself).
TABLES = {
    "ut/table1": "table1_babi",
    "ut/table3": "table3_lambada",
    "ut/table4": "table4_algorithmic",
    "ut/table5": "table5_lte_memorization",
    "synthesizer/fixed_table2": "table2",  # pre-registered fixed-n test of Table 2 LM (D+V vs Transformer)
    "ut/fixed_table5": "table5_lte_memorization",  # pre-registered fixed-n replication of Table 5 reverse
    "ut/fixed_table4": "table4_algorithmic",  # pre-registered fixed-n rerun of Table 4 copy/reverse (test_ood)
    "ut/fixed_table6": "table6_lte_program",  # pre-registered reduced Table 6 addition
    "ut/fixed2_table6": "table6_lte_program",  # the same at 6000 updates, a second pre-registered protocol
    "ut/table6": "table6_lte_program",
    "ut/table7": "table7_wmt14_ende",
    "qknorm/table1": "table_main_bleu",
    "qknorm/fixed_table1": "table_main_bleu",  # pre-registered fixed-n test of the gl-en column
    "bigbird/table1": "table1_building_blocks",
    "bigbird/table10": "table10_mlm_bpc",
}


def paper_table_key(table_dir: str) -> tuple[str, str]:
    """``"ut/table4"`` -> ``("universal_transformer", "table4_algorithmic")``."""
    paper, table = table_dir.split("/")
    return PAPERS[paper], TABLES.get(table_dir, table)


# Preset folders that hold a multi-step pipeline rather than the rows of one table, each checked by its own
# tests: synthesizer/t5 = span-corruption pre-training + GLUE / SuperGLUE multitask presets of Tables 4-5
# (tests/tasks/test_t5_path.py).
PIPELINE_DIRS = {"synthesizer/t5"}


def table_dirs() -> list[str]:
    """Every ``<paper>/<table>`` preset folder (demo and pipelines excluded), sorted."""
    out = []
    for paper in sorted(PAPERS):
        root = EXPERIMENT_CONF / paper
        if root.is_dir():
            out.extend(f"{paper}/{d.name}" for d in sorted(root.iterdir())
                       if d.is_dir() and f"{paper}/{d.name}" not in PIPELINE_DIRS)
    return out


def presets(table_dir: str) -> list[str]:
    """The experiment names (``ut/table4/ut_copy``) of one table folder, sorted."""
    return sorted(f"{table_dir}/{p.stem}" for p in (EXPERIMENT_CONF / table_dir).glob("*.yaml"))


def preset_yaml(experiment: str) -> dict:
    return yaml.safe_load((EXPERIMENT_CONF / f"{experiment}.yaml").read_text(encoding="utf-8"))


def spec_files(table_dir: str) -> list[Path]:
    """``experiments/<paper>/<table>.yaml`` and ``<table>_*.yaml`` (one spec per task of a multi-task table)."""
    paper, table = table_dir.split("/")
    root = SPECS / paper
    return sorted({*root.glob(f"{table}.yaml"), *root.glob(f"{table}_*.yaml")})


def paper_tables() -> dict:
    return yaml.safe_load(PAPER_TABLES.read_text(encoding="utf-8"))


def probe_dirs() -> list[str]:
    """Every ``probes/<paper>`` preset folder (mechanism probes: experiments/probes/), sorted."""
    root = EXPERIMENT_CONF / "probes"
    return sorted(f"probes/{d.name}" for d in root.iterdir() if d.is_dir()) if root.is_dir() else []


def probe_paper(probe_dir: str) -> str:
    """``probes/ut2`` -> ``ut``: the paper a probe folder probes (a trailing number is the probe's redesign)."""
    return probe_dir.split("/")[1].rstrip("0123456789")


def gpu_presets() -> list[str]:
    """Every paper preset with a one-GPU protocol (a root ``at_scale.gpu`` block), sorted."""
    from attnlab.results.gpu_estimate import gpu_protocol_experiments

    return gpu_protocol_experiments(EXPERIMENT_CONF)


def gpu_tables() -> list[str]:
    """The preset folders with a one-GPU protocol."""
    return sorted({e.rsplit("/", 1)[0] for e in gpu_presets()})
