"""Shared by the task tests: tokenizers trained by a test go to its tmp folder, never ~/.cache or the shared data."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_tokenizer_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_TOKENIZER_CACHE", str(tmp_path / "tokenizers"))
