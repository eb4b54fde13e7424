"""The attention contract, checkable on any registered variant, your own included:

    python -m attnlab.attention.contract my_extension:TemperedAttention     # module:Class (imported, registered)
    python -m attnlab.attention.contract tempered --plugin my_extension.py  # a registered name, from a plugin file

Each check builds the variant small (d_model 32, 4 heads, max_len 64, its default options) and tests what every
model of attnlab relies on: the output has the input's shape and is finite; a causal form never lets a position
see a later one; padding changes nothing for the real positions; incremental decoding (one token at a time
with the cache) equals the full causal forward; the captured attention weights are the post-mask softmax the
output used (rows sum to 1 over allowed keys, masked keys get 0, capturing changes nothing); the module runs
in float64 and bfloat16 and answers in the input's dtype. Checks of a capability the variant does not declare
(``capabilities.causal``, ``.incremental``) are skipped and said so. attnlab's own test suite runs the same
contract over every registered variant (tests/attention/test_registry_contract.py).

Exit status: 0 every check passed, 1 a check failed, 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from attnlab.attention.capture import capture_attention_weights
from attnlab.attention.masks import causal_allowed
from attnlab.attention.registry import available, build_attention, get_entry
from attnlab.plugins import PluginError, load_plugins

D_MODEL, HEADS, MAX_LEN = 32, 4, 64
_TOL = {"atol": 1e-5, "rtol": 1e-5}


class Skip(Exception):
    """A check of a capability the variant does not declare."""


def _make(name: str, *, causal: bool = False, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_attention(name, d_model=D_MODEL, num_heads=HEADS, max_len=MAX_LEN, causal=causal, dropout=0.0,
                           cross=False).to(dtype).eval()


def _causal(name: str) -> None:
    if not get_entry(name).cls.capabilities.causal:
        raise Skip("no causal form (capabilities.causal is False)")


def check_shape_and_finite(name: str) -> None:
    for causal in (False, True) if get_entry(name).cls.capabilities.causal else (False,):
        x = torch.randn(2, 30, D_MODEL)
        y = _make(name, causal=causal)(x)
        assert y.shape == x.shape, f"output shape {tuple(y.shape)} != input shape {tuple(x.shape)}"
        assert torch.isfinite(y).all(), "non-finite output"


def check_causal_never_leaks(name: str, make: Callable[..., torch.nn.Module] = _make) -> None:
    """``make(name, causal=True)`` builds the module (the test suite passes its own small options)."""
    _causal(name)
    m = make(name, causal=True)
    x = torch.randn(2, 30, D_MODEL)
    y = m(x)
    for t in (0, 13, 29):
        changed = x.clone()
        changed[:, t:] = torch.randn_like(changed[:, t:])
        torch.testing.assert_close(m(changed)[:, :t], y[:, :t], **_TOL,
                                   msg=lambda s, t=t: f"positions before {t} saw position {t} or later: {s}")


def check_padding_changes_nothing(name: str, make: Callable[..., torch.nn.Module] = _make) -> None:
    """A padded row equals the row alone, and what stands in the padding changes nothing."""
    for causal in (False, True) if get_entry(name).cls.capabilities.causal else (False,):
        m = make(name, causal=causal)
        # 32 positions = 8 blocks of 4: the second row's padding stays within the block count its real
        # length needs (BigBird's plan is a function of the padded block count, see its docstring).
        lengths = [32, 29]
        x = torch.randn(2, 32, D_MODEL)
        pad = torch.arange(32)[None] >= torch.tensor(lengths)[:, None]
        y = m(x, key_padding_mask=pad)
        for b, n in enumerate(lengths):
            torch.testing.assert_close(y[b, :n], m(x[b:b + 1, :n])[0], **_TOL,
                                       msg=lambda s: f"a padded row differs from the same row unpadded: {s}")
        noisy = x.clone()
        noisy[pad] = 100 * torch.randn_like(noisy[pad])
        torch.testing.assert_close(m(noisy, key_padding_mask=pad)[~pad], y[~pad], **_TOL,
                                   msg=lambda s: f"the values in the padding changed the output: {s}")


def check_incremental_equals_full(name: str) -> None:
    _causal(name)
    if not get_entry(name).cls.capabilities.incremental:
        raise Skip("no incremental decoding (capabilities.incremental is False)")
    m = _make(name, causal=True)
    x = torch.randn(2, 30, D_MODEL)
    full = m(x)
    cache: dict = {}
    steps = [m(x[:, :5], cache=cache)] + [m(x[:, t:t + 1], cache=cache) for t in range(5, 30)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **_TOL,
                               msg=lambda s: f"decoding with the cache differs from the full forward: {s}")


def check_captured_weights(name: str) -> None:
    m = _make(name)
    n, lengths = 30, [30, 23]
    x = torch.randn(2, n, D_MODEL)
    pad = torch.arange(n)[None] >= torch.tensor(lengths)[:, None]
    normal = m(x, key_padding_mask=pad)
    with capture_attention_weights(m) as captured:
        again = m(x, key_padding_mask=pad)
    assert len(captured) == 1, f"{len(captured)} captures for one forward"
    assert captured[0].available, f"no weights captured: {captured[0].note}"
    torch.testing.assert_close(again, normal, **_TOL, msg=lambda s: f"capturing changed the output: {s}")
    weights, allowed = captured[0].dense()
    real = (~pad)[:, None, :, None].expand_as(weights)
    may_see = (~pad)[:, None, None, :].expand_as(weights)
    assert (weights >= 0).all(), "negative attention weights"
    assert weights[real & ~may_see].abs().max() == 0, "weight on a padding key"
    sums = (weights * allowed).sum(-1)[real[..., 0]]
    torch.testing.assert_close(sums, torch.ones_like(sums), msg=lambda s: f"rows do not sum to 1: {s}")
    assert causal_allowed(n, n).shape == (n, n)


def check_dtypes(name: str) -> None:
    for dtype in (torch.float64, torch.bfloat16):
        x = torch.randn(2, 16, D_MODEL, dtype=dtype)
        y = _make(name, dtype=dtype)(x)
        assert y.dtype == dtype, f"a {dtype} input gave a {y.dtype} output"
        assert torch.isfinite(y.float()).all(), f"non-finite output in {dtype}"


CHECKS: dict[str, Callable[[str], None]] = {
    "shape and finite": check_shape_and_finite,
    "causal: no position sees a later one": check_causal_never_leaks,
    "padding changes nothing": check_padding_changes_nothing,
    "incremental decoding equals the full forward": check_incremental_equals_full,
    "captured weights are the ones the output used": check_captured_weights,
    "float64 and bfloat16": check_dtypes,
}


def run_contract(name: str) -> list[tuple[str, str, str]]:
    """(check, "ok" | "skipped" | "FAILED", detail) for every check of the registered variant ``name``."""
    results = []
    for label, check in CHECKS.items():
        try:
            check(name)
        except Skip as exc:
            results.append((label, "skipped", str(exc)))
        except AssertionError as exc:
            results.append((label, "FAILED", str(exc).splitlines()[0] if str(exc) else "assertion failed"))
        else:
            results.append((label, "ok", ""))
    return results


def resolve_variant(target: str, plugin: str | None = None) -> str:
    """The registered name of ``module:Class`` (imported, so it registers) or of a name itself."""
    if plugin:
        try:
            load_plugins({"plugins": [plugin]})
        except PluginError as exc:
            raise ValueError(str(exc)) from None
    if ":" in target:
        module, cls_name = target.split(":", 1)
        sys.path.insert(0, str(Path.cwd()))
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot import {target}: {exc}") from None
        names = [n for n in available() if get_entry(n).cls is cls]
        if not names:
            raise ValueError(f"{target} is not registered: decorate it with @register_attention(\"<name>\", ...)")
        return names[0]
    if target not in available():
        raise ValueError(f"no attention variant {target!r}; registered: {', '.join(available())}")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.attention.contract", description=__doc__.splitlines()[0])
    parser.add_argument("variant", help="module:Class of your variant, or a registered name")
    parser.add_argument("--plugin", help="a plugin file to import first (as attnlab-train +plugins=[...])")
    args = parser.parse_args(argv)
    try:
        name = resolve_variant(args.variant, args.plugin)
    except ValueError as exc:
        print(f"contract: error: {exc}", file=sys.stderr)
        return 2
    results = run_contract(name)
    for label, outcome, detail in results:
        print(f"{outcome:>7}  {label}" + (f": {detail}" if detail else ""))
    failed = sum(outcome == "FAILED" for _, outcome, _ in results)
    print(f"attention variant {name!r}: " + (f"{failed} check(s) FAILED" if failed else "the contract holds"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
