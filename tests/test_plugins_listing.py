"""``abl plugins`` as a reader sees it at 80 columns: whole sentences, readable origins and defaults."""

import re

from conftest import run_abl

from abl.contracts.registry import Param, first_sentence, show_default

PLUGIN = '''"""Centred RMSNorm: subtract the mean, then divide by the root mean square (as LayerNorm
without its bias; Zhang & Sennrich 2019, arXiv:1910.07467, sec. 3).

A second paragraph the listing does not show.
"""
import torch.nn as nn

from abl import Param, hookimpl


class CenterNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps, elementwise_affine=False)

    def forward(self, x):
        return self.norm(x)


@hookimpl
def register_components(register):
    register("norm", "centernorm", CenterNorm, params={"eps": Param(1e-6, doc="added to the variance")})
'''


def test_first_sentence_is_whole_and_keeps_its_citation():
    doc = """NoPE: no position information at all; a causal decoder can still infer
    order from the mask (Haviv et al. 2022; Kazemnejad et al. 2023). A second sentence.

    Details."""
    assert first_sentence(doc) == ("NoPE: no position information at all; a causal decoder can still infer order "
                                   "from the mask (Haviv et al. 2022; Kazemnejad et al. 2023).")
    # a citation's full stops (et al., arXiv ids, eq., sec. numbers) do not end the sentence
    assert first_sentence("y = x * g  (Zhang & Sennrich 2019, arXiv:1910.07467, eq. 4).\n\nMore.") == \
        "y = x * g (Zhang & Sennrich 2019, arXiv:1910.07467, eq. 4)."
    assert first_sentence("Router + experts; y = sum G FFN(x) (Shazeer et al. 2017, arXiv:1701.06538, "
                          "eq. 1). Routing follows.") == \
        "Router + experts; y = sum G FFN(x) (Shazeer et al. 2017, arXiv:1701.06538, eq. 1)."
    assert first_sentence("Attention (Mistral 7B, Jiang et al. 2023, sec. 2.1). Second.") == \
        "Attention (Mistral 7B, Jiang et al. 2023, sec. 2.1)."
    # nothing is cut out of what a docstring says, whatever it cites
    assert first_sentence("Attention (Mistral 7B; seeds 004). Second.") == "Attention (Mistral 7B; seeds 004)."
    assert first_sentence("Pre-tokenised uint16 .bin files (e.g. nanoGPT's). Then more.") == \
        "Pre-tokenised uint16 .bin files (e.g. nanoGPT's)."


def test_defaults_read_as_written():
    assert [show_default(v) for v in (1e-6, 10000.0, 0.1, 4.0, 8 / 3, 2, "x", True, False, None, [1, 2])] == \
        ["1e-06", "10000.0", "0.1", "4.0", "≈2.667", "2", '"x"', "true", "false", "unset", "[1, 2]"]
    assert Param(8 / 3).describe() == "float=≈2.667"


def test_listing_at_80_columns(tmp_path):
    (tmp_path / "centernorm.py").write_text(PLUGIN)
    r = run_abl(["--plugins-dir", str(tmp_path), "plugins"], env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out
    assert not re.search(r"seeds \d{3}", out)  # the sources cite papers (tests/test_no_notes_citations.py)
    flat = " ".join(out.split())  # sentences wrap over lines; whole once joined
    for sentence in (
            "NoPE: no position information at all; a causal decoder can still infer order from the mask "
            "(Haviv et al. 2022; Kazemnejad et al. 2023).",
            "y = x / sqrt(mean(x^2) + eps) * gamma (Zhang & Sennrich 2019).",
            "RoPE (Su et al. 2021): rotate each pair of q/k dims by p * theta_k.",
            "Grouped-query attention: n_kv_heads K/V groups (Ainslie et al. 2023)."):
        assert sentence in flat, sentence
    assert "ratio: float ≈ 2.667" in out and "2.6666" not in out
    assert re.search(r"^  rmsnorm  built-in \(abl \S+\)$", out, re.M)
    # the --plugins-dir plugin: its file, and the sentence of its module docstring (the class has none)
    assert re.search(r"^  centernorm  centernorm\.py from --plugins-dir$", out, re.M), out
    assert ("Centred RMSNorm: subtract the mean, then divide by the root mean square (as LayerNorm without its "
            "bias; Zhang & Sennrich 2019, arXiv:1910.07467, sec. 3).") in flat
    assert "second paragraph" not in out
    assert "eps: float = 1e-06 - added to the variance" in out


def test_skeleton_options_are_listed_beside_the_components():
    """Issue 24: logit scaling and the output z-loss are variants a grid sweeps (model.logit_scale,
    model.z_loss): options of the shared skeleton rather than components, and ``abl plugins`` lists them."""
    import dataclasses
    import json

    from abl.contracts.config import ModelConfig

    marked = {f.name for f in dataclasses.fields(ModelConfig) if f.metadata.get("variant")}
    assert {"logit_scale", "z_loss", "tie_embeddings"} <= marked
    r = run_abl(["plugins"], env={"COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    assert "skeleton options" in flat
    for name in marked:
        assert f"model.{name}" in flat, name
    assert "one of none, inv_sqrt_d_model" in flat
    assert "arXiv:2204.02311" in flat  # z-loss cites PaLM
    rows = json.loads(run_abl(["plugins", "--json"]).stdout)
    options = {r["name"]: r for r in rows if r["axis"] == "skeleton"}
    assert set(options) == {f"model.{n}" for n in marked}
    assert options["model.z_loss"]["default"] == 0.0
    assert options["model.logit_scale"]["choices"] == ["none", "inv_sqrt_d_model"]
