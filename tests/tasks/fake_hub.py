"""One fake Hugging Face hub for the task tests: serves given rows in the hub's schema, offline."""

from __future__ import annotations

import attnlab.tasks.families  # noqa: F401 - see serve_hub
from attnlab.tasks import sources as sources_module

# Every module that binds ``load_hub_dataset`` by name at import.
LOADER_MODULES = ("glue", "text_lm", "lra_bytes", "translation", "summarization", "sva")


def serve_hub(monkeypatch, splits: dict[str, list[dict]]) -> list[tuple]:
    """Serve ``splits`` as every hub dataset; returns the (hub_id, config) pairs asked for."""
    asked: list[tuple] = []

    def fake(hub_id, config, *, local_hint):
        asked.append((hub_id, config))
        return splits

    # Every loader module is imported first (at the top of this file): one imported while sources is patched
    # (build_task imports them all) would bind the fake for good, and later offline tests would see a hub that
    # answers.
    for module in LOADER_MODULES:
        monkeypatch.setattr(f"attnlab.tasks.{module}.load_hub_dataset", fake)
    monkeypatch.setattr(sources_module, "load_hub_dataset", fake)
    return asked


def cache_hub_dataset(monkeypatch, cache_root, hub_id: str, splits: dict[str, list[dict]],
                      config: str | None = None) -> None:
    """Put ``splits`` into a Hugging Face datasets cache at ``cache_root`` as ``load_dataset(hub_id, config)``
    leaves it after a download (``<namespace>___<name>/<config>/<version>/<hash>/``, Arrow files and
    ``dataset_info.json``), and switch ``datasets`` to that cache in offline mode, as a cluster job with
    ``HF_DATASETS_OFFLINE=1`` after a download on the login node."""
    import json
    import shutil
    from pathlib import Path

    import datasets
    import huggingface_hub

    cache_root = Path(cache_root)
    sources = cache_root.parent / f"{cache_root.name}-sources"
    sources.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, rows in splits.items():
        path = sources / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files[split] = str(path)
    build = cache_root.parent / f"{cache_root.name}-build"
    builder = datasets.load_dataset_builder("json", data_files=files, cache_dir=str(build))
    builder.dataset_name, builder.repo_id = hub_id.split("/")[-1], hub_id  # the hub's cache naming
    builder.config.name = config or "default"
    builder._cache_dir = builder._build_cache_dir()
    builder.download_and_prepare()
    rel = Path(builder.cache_dir).relative_to(build).parts  # ns___name / config-<data files hash> / ver / hash
    shutil.copytree(builder.cache_dir, cache_root / rel[0] / (config or "default") / rel[2] / rel[3])
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache_root))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache_root))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
