"""Every task config under conf/task/ (found from the files, so a new task cannot escape) trains a tiny model for
a few steps at scale=cpu and lands the metrics it declares in the run record.

Tasks with local data need the shared data folder (skipped with the path when it is absent); generated tasks
always run; hub-only tasks are skipped here ("hub only: ...") and covered in the default tier by fixture
tests in the hub's row schema (tests/tasks/test_hub_fixtures.py checks that each one has one). Example counts,
lengths and vocabularies are capped by key name (tests/tasks/task_inventory.py), so the whole file takes a
few minutes on 2 cores.
"""

from __future__ import annotations

import pytest

from attnlab.training.run import run
from tests.conftest import TINY, compose, require_shared_data
from tests.tasks.task_inventory import TASK_OPTIONS, data_needs, declared_metrics, shrink, task_config

pytestmark = pytest.mark.slow

MODULE_METRICS = ("test/acc", "test/seq_acc", "test/ppl", "test/mse")


@pytest.fixture(scope="module")
def tokenizer_cache(tmp_path_factory):
    # one cache for the file: tasks that share training text (a mixture and its members) share tokenizers
    return tmp_path_factory.mktemp("tokenizers")


@pytest.mark.parametrize("option", TASK_OPTIONS)
def test_task_trains_and_reports_its_declared_metrics(option, tmp_path, tokenizer_cache, monkeypatch):
    task = task_config(option)
    needs = data_needs(task)
    if needs.kind == "hub":
        pytest.skip(f"hub only: {', '.join(needs.hub)} (no local copy at scale=cpu); covered by the hub fixture "
                    f"tests (tests/tasks/test_hub_fixtures.py)")
    root = require_shared_data(*needs.files) if needs.kind == "local" else tmp_path / "data"
    monkeypatch.setenv("ATTNLAB_TOKENIZER_CACHE", str(tokenizer_cache))
    cfg = compose([*TINY, "debug=fdr", f"task={option}", f"paths.data_root={root}"], run_dir=tmp_path / "run")
    shrink(cfg.task)
    record = run(cfg, run_dir=tmp_path / "run", command=f"pytest {option}")
    assert record["status"] == "completed"
    final = record["metrics"]["final"]
    declared = declared_metrics(task)
    for metric in declared:
        found = [k for k in final if k == f"test/{metric}" or (k.startswith("test") and k.endswith(f"/{metric}"))]
        assert found, f"{option} declares {metric!r}; final metrics: {sorted(final)}"
    if not declared:  # nothing declared: the module's own metric must be there
        assert any(k in final for k in MODULE_METRICS), f"{option}: none of {MODULE_METRICS} in {sorted(final)}"
