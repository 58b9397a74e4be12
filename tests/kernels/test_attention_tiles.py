"""On CUDA the attention launcher times its class's tiles once, keeps the fastest, and shares it.

No GPU here: the device query (``on_gpu``) and the timer (``triton.testing.do_bench``) are
mocked, and the launch records which tile it ran.
"""

from __future__ import annotations

import json

import pytest
import torch
import triton.testing

from abl.kernels import flash_attention as fa


class OutOfResources(Exception):
    """Named as triton's: a tile that does not fit the device."""


@pytest.fixture
def gpu(monkeypatch):
    monkeypatch.setattr(fa, "on_gpu", lambda x: True)
    monkeypatch.setattr(fa, "_chosen", {})
    monkeypatch.setattr(fa, "_tile_cache", [None])
    timings: dict = {}
    timed: list = []

    def do_bench(fn, warmup=0, rep=0):
        fn()
        cfg = ran[-1]
        timed.append(cfg)
        if timings.get(cfg) == "oom":
            raise OutOfResources("shared memory")
        return timings.get(cfg, 1.0)

    ran: list = []

    def launch(*cfg):
        ran.append(cfg)
        if timings.get(cfg) == "oom":
            raise OutOfResources("shared memory")

    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    return timings, timed, ran, launch


def _q(d=128, dtype=torch.bfloat16):
    return torch.zeros(1, 2, 8, d, dtype=dtype)


def test_the_fastest_tile_of_the_class_is_kept_and_later_launches_do_not_time(gpu):
    timings, timed, ran, launch = gpu
    tiles = fa._TILES["fwd"]["d128"]
    timings.update({tiles[0]: 0.9, tiles[1]: 0.5, tiles[2]: "oom"})
    fa._launch("fwd", _q(), launch, (True, False, False, 1024))
    assert set(ran) == set(tiles)  # every tile tried
    assert set(timed) == set(tiles) - {tiles[2]}  # the one that does not fit skipped
    assert ran[-1] == tiles[1]
    timed.clear()
    fa._launch("fwd", _q(), launch, (True, False, False, 1024))
    assert timed == [] and ran[-1] == tiles[1]
    # another class (head dim 64) and another length bucket are timed on their own
    fa._launch("fwd", _q(64), launch, (True, False, False, 1024))
    fa._launch("fwd", _q(), launch, (True, False, False, 4096))
    assert set(timed) == (set(fa._TILES["fwd"]["d64"]) | set(tiles)) - {tiles[2]}


def test_the_tile_cache_gives_a_later_process_the_same_tile_without_timing(gpu, tmp_path):
    timings, timed, ran, launch = gpu
    tiles = fa._TILES["bwd_dkdv"]["d128"]
    timings.update({tiles[-1]: 0.1})
    cache = tmp_path / "shapes" / "attention-tiles.json"
    fa.use_tile_cache(cache)
    fa._launch("bwd_dkdv", _q(), launch, (True, False, False, 2048))
    assert ran[-1] == tiles[-1]
    stored = json.loads(cache.read_text())
    assert list(stored.values()) == [list(tiles[-1])]
    # a new process: nothing in memory; the cache decides, even where timing now says otherwise
    fa._chosen.clear()
    timed.clear()
    timings.clear()
    timings.update({tiles[0]: 0.01})
    fa._launch("bwd_dkdv", _q(), launch, (True, False, False, 2048))
    assert timed == [] and ran[-1] == tiles[-1]


def test_an_unreadable_or_stale_tile_cache_is_timed_again(gpu, tmp_path):
    timings, timed, ran, launch = gpu
    tiles = fa._TILES["bwd_dq"]["d64"]
    timings.update({tiles[2]: 0.2})
    cache = tmp_path / "attention-tiles.json"
    cache.write_text("{not json")
    fa.use_tile_cache(cache)
    fa._launch("bwd_dq", _q(64), launch, (False, False, False, 512))
    assert ran[-1] == tiles[2] and len(timed) == len(tiles)
    # a stored tile that is no longer shipped (the tables changed) is not launched
    key = next(iter(json.loads(cache.read_text())))
    cache.write_text(json.dumps({key: [32, 64, 4, 2]}))
    fa._chosen.clear()
    timed.clear()
    fa._launch("bwd_dq", _q(64), launch, (False, False, False, 512))
    assert ran[-1] == tiles[2] and len(timed) == len(tiles)


def test_off_gpu_the_interpreter_tile_runs_and_nothing_is_timed(monkeypatch):
    monkeypatch.setattr(fa, "_chosen", {})
    ran: list = []
    monkeypatch.setattr(triton.testing, "do_bench", lambda *a, **k: pytest.fail("timed off the GPU"))
    fa._launch("fwd", _q(), lambda *cfg: ran.append(cfg), (True, False, False, 128))
    assert ran == [fa._INTERPRETER_TILE]
