"""The report document (abl.present.report.document): one Markdown text, and the HTML report rendered
from it by markdown-it-py, so the two say the same thing."""

from __future__ import annotations

from html.parser import HTMLParser

from abl.present.report.document import Doc


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []
        self.srcs: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.srcs += [v for k, v in attrs if k == "src"]

    def handle_data(self, data):
        self.text.append(data)


def _doc() -> Doc:
    doc = Doc()
    doc.h(2, "Comparison: final val_loss")
    doc.p("probe_<task>_accuracy is a family & val_loss < 3 nats")
    doc.table(["cell", "a|b"], [["norm=rmsnorm", None], ["x|y", 1.5]], "a caption with <angles>")
    doc.image("loss_curves.png", b"\x89PNG fake", "loss curves at equal tokens")
    doc.details("every check (2 rows)", ["figure"], [["n_params"], ["flops_per_step"]], "folded")
    doc.pre('"model.norm" = ["rmsnorm"]')
    return doc


def test_html_is_the_markdown_rendered_with_the_plots_embedded_and_text_kept_as_text():
    doc = _doc()
    md, page = doc.markdown(), doc.html("abl report: t")
    parsed = _Text()
    parsed.feed(page)
    text = "".join(parsed.text)
    assert "task" not in parsed.tags and "angles" not in parsed.tags  # text, not tags
    assert "probe_<task>_accuracy is a family & val_loss < 3 nats" in text
    assert "a caption with <angles>" in text and "x|y" in text and "a|b" in text
    assert parsed.tags.count("h2") == 1 and parsed.tags.count("table") == 2
    assert parsed.srcs == ["data:image/png;base64," + __import__("base64").b64encode(b"\x89PNG fake").decode()]
    folded = page[page.index("<details>"):page.index("</details>")]
    assert folded.count("<tr>") == 3 and "flops_per_step" in folded
    # Markdown: the picture by file name, the folded table left out, the same sentences
    assert "![loss curves](loss_curves.png)" in md and "flops_per_step" not in md
    assert "probe_<task>_accuracy is a family & val_loss < 3 nats" in md and "| x\\|y | 1.5 |" in md
