"""One fake Hugging Face hub for the task tests: serves given rows in the hub's schema, offline."""

from __future__ import annotations

from attnlab.tasks import sources as sources_module
from attnlab.tasks.base import _load_families

# Every module that binds ``load_hub_dataset`` by name at import.
LOADER_MODULES = ("glue", "text_lm", "lra_bytes", "translation", "summarization", "sva")


def serve_hub(monkeypatch, splits: dict[str, list[dict]]) -> list[tuple]:
    """Serve ``splits`` as every hub dataset; returns the (hub_id, config) pairs asked for."""
    asked: list[tuple] = []

    def fake(hub_id, config, *, local_hint):
        asked.append((hub_id, config))
        return splits

    # Every loader module is imported first: one imported while sources is patched (build_task imports them
    # all) would bind the fake for good, and later offline tests would see a hub that answers.
    _load_families()
    for module in LOADER_MODULES:
        monkeypatch.setattr(f"attnlab.tasks.{module}.load_hub_dataset", fake)
    monkeypatch.setattr(sources_module, "load_hub_dataset", fake)
    monkeypatch.setattr("attnlab.tasks.text_to_text.hub_reachable", lambda *a, **k: True)
    return asked
