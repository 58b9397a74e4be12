"""Citations travel with the code: nothing in the package points at the notes it was written from.

The design notes (a folder of numbered text files next to the repository, cited as "seeds 003 sec.
6.1.3" and the like) are not part of the package: a user or reader does not have them. A formula's
source is named by the paper (authors, year, arXiv id or venue, section or equation). This test
reads every file the package ships (the folders of pyproject.toml's package-dir mapping: harness/,
plugins/, dashboard/, ablations/) and README.md, and fails on any reference to the notes, naming
the file and line.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = {".py", ".toml", ".md"}

# What a reference to the notes looks like. Random seeds are everywhere in the package ("3 seeds",
# "the seeds of a grid", "seeds 1-3"), so the patterns name the notes' own marks: their three-digit
# numbers, their folder, their file names.
NOTE_REFERENCES = [
    re.compile(r"\bseeds?\s+0\d\d\b", re.I),                         # "seeds 003 sec. 6", "Seeds 000"
    re.compile(r"shared/seeds", re.I),                               # "../shared/seeds"
    re.compile(r"\.\./shared\b", re.I),                              # any path beside the repository
    re.compile(r"\bseeds?[ _-]notes?\b", re.I),                      # "the seed notes"
    re.compile(r"\b00\d_[0-9a-f]{16}\b", re.I),                      # a note's file name
    re.compile(r"\b00[0-4],? (?:sec|secs|eq|eqs|note|part)\b", re.I),  # "... 002 sec. 1.2" after "seeds"
]


def package_files(root: Path) -> list[Path]:
    """Every text file the package ships under ``root``, plus its README.md and docs/*.md."""
    pyproject = root / "pyproject.toml"
    folders = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-dir"].values()
    files = [p for folder in sorted(set(folders)) for p in sorted((root / folder).rglob("*"))
             if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    return files + [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def note_references(root: Path) -> list[str]:
    """``path:line: text`` for every line of the package where a reference to the notes starts
    (the whole file is searched, so a reference wrapped over two lines is found too)."""
    found = []
    for path in package_files(root):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        starts = sorted({text.count("\n", 0, m.start()) for p in NOTE_REFERENCES for m in p.finditer(text)})
        found += [f"{path.relative_to(root)}:{i + 1}: {lines[i].strip()}" for i in starts]
    return found


def test_the_package_cites_papers_not_the_notes():
    found = note_references(ROOT)
    assert not found, "references to the notes (cite the paper instead):\n" + "\n".join(found)


def test_the_scan_covers_every_shipped_folder():
    scanned = {p.relative_to(ROOT).parts[0] for p in package_files(ROOT)}
    assert {"harness", "plugins", "dashboard", "ablations", "README.md", "docs"} <= scanned
    assert ROOT / "harness" / "kernels" / "rmsnorm.py" in package_files(ROOT)


def test_the_scan_catches_a_planted_reference(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"abl" = "harness"\n"abl.plugins" = "plugins"\n'
        '"abl.dashboard" = "dashboard"\n"abl.ablations" = "ablations"\n')
    planted = {
        "harness/model/cost.py": '"""Memory.\n\nActivations (seeds 003 sec. 6.1.3)."""\n',
        "harness/kernels/rope.py": '"""RoPE.\n\nSu et al. 2021; Seeds 002 sec. 1.5.4."""\n',
        "plugins/norms.py": '"""Norms.\n\nDefinitions: ../shared/seeds 000 sec. 3.7."""\n',
        "dashboard/app.py": "# see the seed notes for the formula\n",
        "dashboard/views/curves.py": '"""Curves.\n\nThe smoothing of the\nseeds\n004 slides."""\n',  # wrapped
        "ablations/ffn.toml": "# matched parameters\n# 2/3 of the width (Shazeer 2020; 002 sec. 2.1)\n",
    }
    for rel, text in planted.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "README.md").write_text("# abl\n\nBuilt from 003_571cdc68b4c6dbcb.txt.\n")
    found = note_references(tmp_path)
    assert [f.split(": ", 1)[0] for f in found] == [
        "ablations/ffn.toml:2", "dashboard/app.py:1", "dashboard/views/curves.py:4", "harness/kernels/rope.py:3",
        "harness/model/cost.py:3",
        "plugins/norms.py:3", "README.md:3"]


def test_random_seeds_are_not_references(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.package-dir]\n"abl" = "harness"\n')
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "grid.py").write_text(
        '"""Every cell runs once per seed: 3 seeds, the seeds of a grid, seeds 1-3, seeds 0,1,2.\n\n'
        'Zhang & Sennrich 2019, arXiv:1910.07467, eq. 4; Shazeer et al. 2017, sec. 2.1."""\n'
        'seed_txt = f"seeds {seeds}"\n')
    (tmp_path / "README.md").write_text("Run with 2 seeds (the papers above): `seeds = [0, 1]`.\n")
    assert note_references(tmp_path) == []
