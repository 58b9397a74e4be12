import numpy as np
import pytest

from abl.data.corpus import Batches, DataError, from_documents, from_text_file, from_token_bin
from abl.plugins.datasets import python_stdlib


def test_stdlib_corpus_is_real_deterministic_text():
    a = python_stdlib(max_bytes=2_000_000)
    b = python_stdlib(max_bytes=2_000_000)
    assert a.fingerprint == b.fingerprint
    assert a.vocab_size == 256 and a.tokenizer == "bytes"
    text = bytes(a.train[:200_000].astype(np.uint8)).decode("utf-8", errors="replace")
    assert "def " in text and "import " in text
    assert 0.03 < len(a.val) / (len(a.train) + len(a.val)) < 0.25
    assert python_stdlib(max_bytes=1_000_000).fingerprint != a.fingerprint


def test_document_split_is_by_name_not_order():
    docs = [(f"f{i}.py", f"content {i}\n".encode() * 50) for i in range(200)]
    a = from_documents(docs, 0.1, "x")
    b = from_documents(list(reversed(docs)), 0.1, "x")
    assert sorted(a.val.tolist()) == sorted(b.val.tolist())


def test_text_file_and_token_bin(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("hello world " * 1000)
    d = from_text_file(p, 0.1)
    assert len(d.val) == 1200 and d.vocab_size == 256
    toks = (np.arange(5000) % 1000).astype(np.uint16)
    b = tmp_path / "t.bin"
    toks.tofile(b)
    d = from_token_bin(b, vocab_size=0, val_fraction=0.2)
    assert d.vocab_size == 1000 and len(d.val) == 1000 and d.tokenizer == "pretokenized"
    with pytest.raises(DataError, match="does not exist"):
        from_token_bin(tmp_path / "missing.bin", 0)


def test_batches_are_seeded_and_validation_is_fixed():
    docs = [(f"f{i}", bytes(range(256)) * 4) for i in range(40)]
    data = from_documents(docs, 0.2, "x")
    a, b, c = Batches(data, 16, 4, seed=0), Batches(data, 16, 4, seed=0), Batches(data, 16, 4, seed=1)
    xa, ya = a.next_train()
    xb, _ = b.next_train()
    xc, _ = c.next_train()
    assert xa.shape == (4, 16) and (xa == xb).all() and not (xa == xc).all()
    assert (xa[:, 1:] == ya[:, :-1]).all()
    va = [x for x, _ in a.val_batches(2)]
    vc = [x for x, _ in c.val_batches(2)]
    assert all((p == q).all() for p, q in zip(va, vc))


def test_the_stdlib_walk_finds_the_files_and_order_the_full_glob_did(tmp_path):
    """pystdlib prunes the skipped folders instead of globbing under them (site-packages can hold most
    of the files): the same files in the same order, so the same corpus and the same token store."""
    import sysconfig
    from pathlib import Path

    from abl.plugins import datasets

    for root in (Path(sysconfig.get_paths()["stdlib"]), _odd_tree(tmp_path)):
        globbed = [p for p in sorted(root.rglob("*.py"))
                   if not datasets._SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])]
        assert datasets._stdlib_sources(root) == globbed


def _odd_tree(root):
    """Names whose string order differs from their part-by-part order, skipped folders deep down, and a
    symlinked folder."""
    for rel in ("a-b/x.py", "a/b.py", "a/tests/t.py", "a/site-packages/s.py", "z.py", "a/b/c.py", "a/b.txt",
                "test_x/y.py", "idle_test/q.py"):
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x = 1\n")
    (root / "linked").symlink_to(root / "a", target_is_directory=True)  # the glob does not follow it
    return root
