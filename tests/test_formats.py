"""abl.analysis.formats: the one number and byte format of every table (CLI, abl cost, report, dashboard)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

from abl.analysis import formats

ROOT = Path(__file__).resolve().parent.parent


def test_byte_counts_in_binary_units():
    assert formats.fmt_bytes(512) == "512 B"
    assert formats.fmt_bytes(1536) == "1.5 KiB"
    assert formats.fmt_bytes(3 * 2**30, decimals=2) == "3.00 GiB"
    assert formats.fmt_bytes(5 * 2**40) == "5.0 TiB"
    assert formats.fmt_bytes(None) == "-" and formats.fmt_bytes(math.nan, missing="–") == "–"


def test_numbers_signed_and_missing():
    assert formats.fmt(-0.04391, signed=True) == "-0.0439"
    assert formats.fmt(0.04391, signed=True) == "+0.0439"
    assert formats.fmt(None) == "-" and formats.fmt(math.inf) == "-"
    assert formats.fmt_p(3e-5) == "<0.0001"


def _byte_units_spelled(source: str) -> list[int]:
    """Lines of ``source`` that spell a byte unit the way a byte formatter does.

    A bare unit name (``"KiB"``, ``"GiB"``, ``"TiB"``: a formatter's unit table) or a
    formatted number followed by one of them (``f"{n / GiB:.1f} GiB"``: a formatter's
    output). MiB as a fixed column or axis unit stays allowed ("peak MiB"), and so does
    a unit in prose after a literal number ("copies of 256 KiB").
    """
    units = ("KiB", "GiB", "TiB")
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and node.value in units:
            lines.append(node.lineno)
        if isinstance(node, ast.JoinedStr):
            for before, after in zip(node.values, node.values[1:]):
                if isinstance(before, ast.FormattedValue) and isinstance(after, ast.Constant) \
                        and str(after.value).lstrip().startswith(units):
                    lines.append(node.lineno)
    return lines


def test_the_byte_unit_scan_sees_a_formatter_in_an_f_string():
    """The scan missed ``f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"`` (abl.run.admission)."""
    planted = 'def fmt(n):\n    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"\n'
    assert _byte_units_spelled(planted) == [2]
    assert _byte_units_spelled('UNITS = ("B", "KiB")\n') == [1]
    assert _byte_units_spelled('A = f"{n} MiB"\nB = f"copies of 256 KiB, {n} threads"\n') == []


def test_no_other_module_spells_the_byte_units():
    """A second byte formatter would drift (it did: 1 and 2 decimals, GiB or TiB as the top unit)."""
    found = []
    for folder in ("harness", "dashboard", "plugins"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "harness" / "analysis" / "formats.py":
                continue
            found += [f"{path.relative_to(ROOT)}:{n}" for n in _byte_units_spelled(path.read_text())]
    assert not found, "byte units spelled outside abl.analysis.formats: " + ", ".join(found)


def test_units_of_the_catalogue():
    from abl.analysis import metrics

    assert formats.fmt_si(2.5e9, "FLOP") == "2.5 GFLOP"
    assert metrics.display("peak_mem_bytes", 3.53001e8) == "336.6 MiB"  # not 3.53001e+08
    assert metrics.display("n_params", 268231000) == "268,231,000"  # not 268231000
    assert metrics.display("flops_per_token", 2.5e9) == "2.5 GFLOP"
    assert metrics.display("mfu", 0.1234) == "12.3%"
    assert metrics.display("val_loss", 2.74712) == "2.7471"
    assert metrics.display("val_loss", None, missing="–") == "–"


def test_speeds_at_one_precision():
    """``91.5038*`` beside ``111*``: every tokens/s figure is whole tokens per second."""
    from abl.analysis import verdicts

    texts = [verdicts.value_text(m, v) for m, v in (("decode_tokens_per_s", 91.5038), ("tokens_per_s", 111.0),
                                                     ("train_tokens_per_s", 24584.4))]
    assert texts == ["92", "111", "24,584"]
    assert formats.fmt_speed(91.5038) == "92 tokens/s"


def test_a_fixed_size_decode_cache_is_not_zero_bytes():
    """sliding_window and linear printed ``KV/tok 0 B``: their cache is a fixed size per sequence."""
    assert formats.fmt_decode_cache(0, 65536) == "64.0 KiB/seq fixed"
    assert formats.fmt_decode_cache(2048, 0) == "2.0 KiB/tok"
    assert formats.fmt_decode_cache(None, None) == "-"
    assert formats.fmt_decode_cache(0, 0) == "none"
