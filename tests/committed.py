"""The committed tables built once per test process from the committed records, specs and baselines (about 25 s),
for the tests that hold rules and words over them (tests/results/test_committed_claims.py,
tests/experiments/test_readme_words.py)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=1)
def committed_tables() -> tuple:
    """(built table, its claim results) for every committed spec."""
    from attnlab.results.baselines import load_table_baselines
    from attnlab.results.build import build_table
    from attnlab.results.claims import evaluate_claims
    from attnlab.results.loading import load_records
    from attnlab.results.paper import load_paper_tables
    from attnlab.results.spec import list_specs, load_spec

    records, corrupt = load_records([ROOT / "results" / "runs"])
    papers = load_paper_tables()
    out = []
    for name in list_specs(ROOT / "experiments"):
        spec = load_spec(name, ROOT / "experiments")
        built = build_table(spec, records, papers, corrupt, load_table_baselines(ROOT / "results" / "baselines", name))
        out.append((built, evaluate_claims(built)))
    return tuple(out)
