import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# machine-wide caches (abl.store.cpupeak's measured peaks) go to a folder of this test session:
# a test never reads figures a developer's earlier runs left behind
if "ABL_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["ABL_CACHE_DIR"] = tempfile.mkdtemp(prefix="abl-test-cache-")


@pytest.fixture(scope="session")
def registry():
    from abl.contracts.plugin_manager import get_registry

    return get_registry()


@pytest.fixture
def tiny_model_config():
    from abl.contracts.config import ModelConfig

    return ModelConfig(d_model=32, n_layers=2, n_heads=4, context=16, vocab_size=64)


def run_abl(args, cwd=None, env=None, timeout=600):
    """Run the real CLI in a subprocess (what a user types)."""
    import subprocess

    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "abl.cli", *args], cwd=cwd or ROOT,
                          capture_output=True, text=True, env=full_env, timeout=timeout)
