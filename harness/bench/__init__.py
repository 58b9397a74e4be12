"""Benchmarks: the kernel benchmark and the harness-overhead benchmark.

``abl bench kernels`` (kernelbench) and ``abl bench harness`` (harness). May
import ``abl.run`` and the layers below it; only the CLI sits above.
"""
