"""abl: a plugin-based benchmark and ablation harness for decoder-only LMs."""

__version__ = "0.1.0"
