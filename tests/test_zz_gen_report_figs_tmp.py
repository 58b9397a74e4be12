import os
import shutil

from test_report_sections import _report, norms_store  # noqa: F401


def test_gen(norms_store, tmp_path):  # noqa: F811
    _report(norms_store, tmp_path)
    out = os.environ["OUT"]
    for f in (tmp_path / "rep").rglob("*.png"):
        shutil.copy(f, out)
