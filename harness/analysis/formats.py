"""Numbers and byte counts as every table prints them: the CLI summary, abl cost, the report, the dashboard.

One place so that a figure reads the same wherever it is shown. Callers pick the
precision (``digits``, ``decimals``) and the mark for a missing value (the dashboard
shows an en dash, text tables a hyphen); the rules are shared.
"""

from __future__ import annotations

import math
from typing import Any

from .units import FLOP_PER_S, TOKENS_PER_S

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def fmt(x: float | None, digits: int = 4, signed: bool = False, missing: str = "-") -> str:
    """A mean, difference or interval end at a fixed number of decimals (``signed``: always a sign)."""
    if _missing(x):
        return missing
    assert x is not None
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def fmt_p(p: float | None) -> str:
    """A p-value: four decimals, or ``<0.0001``."""
    if p is None:
        return "-"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def fmt_bytes(n: Any, decimals: int = 1, missing: str = "-") -> str:
    """A byte count in binary units (B, KiB, MiB, GiB, TiB): whole bytes, else ``decimals`` places."""
    if n is None:
        return missing
    x = float(n)
    if not math.isfinite(x):
        return missing
    for unit in _BYTE_UNITS:
        if abs(x) < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.{decimals}f} {unit}"
        x /= 1024
    raise AssertionError("unreachable: the last unit always returns")


_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def fmt_si(x: Any, unit: str = "", digits: int = 3, missing: str = "-") -> str:
    """A count in SI prefixes at ``digits`` significant figures: ``fmt_si(2.5e9, "FLOP")`` -> ``2.5 GFLOP``."""
    if _missing(x):
        return missing
    v = float(x)
    for scale, prefix in _SI:
        if abs(v) >= scale:
            return f"{v / scale:.{digits}g} {prefix}{unit}".rstrip()
    return f"{v:.{digits}g} {unit}".rstrip()


def fmt_speed(x: Any, unit: bool = True, missing: str = "-") -> str:
    """Tokens per second, always at one precision, whole tokens with separators (``24,584 tokens/s`` beside
    ``92 tokens/s``, never ``91.5038`` beside ``111``); ``unit=False`` for a column whose header names it."""
    if _missing(x):
        return missing
    return f"{float(x):,.0f}" + (" tokens/s" if unit else "")


def fmt_fraction(x: Any, missing: str = "-") -> str:
    """A share (MFU, CPU share) as a percentage with one decimal."""
    if _missing(x):
        return missing
    return f"{float(x):.1%}"


def fmt_count(x: Any, missing: str = "-") -> str:
    """A whole count (parameters, tokens) with thousands separators: ``268,231,000``."""
    if _missing(x):
        return missing
    return f"{float(x):,.0f}"


def fmt_unit(x: Any, unit: str, digits: int = 4, missing: str = "-") -> str:
    """A value in the unit the metric catalogue gives it (abl.analysis.metrics: ``Metric.unit``): bytes in
    binary units, FLOP and FLOP/s in SI prefixes (GFLOP), tokens/s as whole tokens, fractions as percentages,
    seconds with one decimal, unitless whole numbers with separators, anything else at ``digits`` decimals
    with its unit."""
    if _missing(x):
        return missing
    v = float(x)
    if unit == "bytes":
        return fmt_bytes(v, missing=missing)
    if unit in ("FLOP", FLOP_PER_S, "tokens"):
        return fmt_si(v, unit)
    if unit == TOKENS_PER_S:
        return fmt_speed(v)
    if unit == "fraction":
        return fmt_fraction(v)
    if unit == "s":
        return f"{v:,.1f} s"
    if not unit and v == int(v) and abs(v) >= 1000:
        return fmt_count(v)
    if abs(v) >= 1e5 or (v != 0 and abs(v) < 10 ** -digits):
        return f"{v:.{digits - 1}e} {unit}".rstrip()
    return f"{v:.{digits}f} {unit}".rstrip()


def fmt_decode_cache(per_token: Any, per_sequence: Any, missing: str = "-") -> str:
    """A decode cache (abl.model.costmodel.predict's ``kv_cache_bytes_per_token`` and
    ``state_bytes_per_sequence``): per token when it grows with the sequence (a KV cache), ``/seq fixed`` when
    its size is fixed (a sliding window's cache, a recurrent state), both when both; never a bare ``0 B`` for a
    cache that is not empty, and ``none`` for one that is."""
    if _missing(per_token) and _missing(per_sequence):
        return missing
    tok = 0.0 if _missing(per_token) else float(per_token)
    seq = 0.0 if _missing(per_sequence) else float(per_sequence)
    parts = ([f"{fmt_bytes(tok)}/tok"] if tok else []) + ([f"{fmt_bytes(seq)}/seq fixed"] if seq else [])
    return " + ".join(parts) or "none"
