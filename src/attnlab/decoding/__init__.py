"""Decoding: greedy and beam search over any encoder-decoder with incremental caches (``decoding.search``), and
the options that choose between them (``decoding.options``).

Import what you need from its submodule: the package itself loads nothing, so ``decoding.options`` imports
without torch (the config check reads it before any model library).
"""
