"""Cached decoding, cache accounting and length extrapolation (harness/decode.py), for every
mixer x position; and the parallel block."""

import itertools
from types import SimpleNamespace

import pytest
import torch

from abl.contracts.config import ConfigError, EvalConfig, ModelConfig
from abl.contracts.precision import Precision
from abl.contracts.registry import Registry
from abl.grid.gridfile import expand
from abl.model.decode import (
    analytic_state_bytes,
    cache_bytes,
    decode_metrics,
    extrapolation_metrics,
    greedy_generate,
    recompute_generate,
)
from abl.model.decoder import DecoderLM, ForwardContext
from abl.train.evaluations import TrainedRun, run_evaluations

CPU = torch.device("cpu")
FP32 = Precision()

MIXERS = ["mha", "gqa", "mqa", "sliding_window", "linear", "mla"]
POSITIONS = ["learned", "sinusoidal", "rope", "alibi", "t5", "nope"]
# small enough to be quick, long enough that decoding crosses the window and the chunks
MIXER_PARAMS = {"sliding_window": {"window": 5}, "linear": {"chunk_size": 4}}
VOCAB = 48


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def components(registry, mixer, position, block="pre", mixer_params=None):
    out = {}
    for axis, name in (("norm", "rmsnorm"), ("block", block), ("position", position), ("mixer", mixer),
                       ("ffn", "gelu")):
        given = (mixer_params or MIXER_PARAMS.get(mixer, {})) if axis == "mixer" else {}
        params, errs = registry.get(axis, name).resolve_params(given, name)
        assert not errs
        out[axis] = {"name": name, "params": params}
    return out


def build(registry, mixer, position, context=16, n_heads=4, block="pre", mixer_params=None, seed=0):
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=n_heads, context=context, vocab_size=VOCAB,
                      init_std=0.2, mixer=mixer, position=position, block=block)
    torch.manual_seed(seed)
    comps = components(registry, mixer, position, block, mixer_params)
    model = DecoderLM(cfg, comps, registry).eval()
    if position == "t5":
        torch.nn.init.normal_(model.position.bias.weight)
    return cfg, comps, model


def rejected(registry, mixer, position):
    comp = registry.get("mixer", mixer)
    cfg = ModelConfig(mixer=mixer, position=position)
    return bool(comp.check and registry.call_with_position(comp.check, cfg, comp.resolve_params({}, mixer)[0]))


COMBOS = list(itertools.product(MIXERS, POSITIONS))


@pytest.mark.parametrize("mixer,position", COMBOS, ids=[f"{m}-{p}" for m, p in COMBOS])
def test_causal_and_cached_decoding_equals_recomputation(registry, mixer, position):
    if rejected(registry, mixer, position):
        # the one incompatible pairing: linear attention has no scores to bias
        assert mixer == "linear" and position in ("alibi", "t5")
        with pytest.raises(ConfigError, match="linear attention does not form"):
            expand({"model": {"mixer": mixer, "position": position}}, registry)
        return
    cfg, comps, model = build(registry, mixer, position)
    a = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    # causality: changing the tokens after t never changes the outputs at <= t
    with torch.no_grad():
        for t in (3, 9):
            b = a.clone()
            b[:, t + 1:] = (b[:, t + 1:] + 7) % VOCAB
            la, lb = model(a)[0], model(b)[0]
            torch.testing.assert_close(la[:, :t + 1], lb[:, :t + 1], rtol=1e-5, atol=1e-5)
            assert not torch.allclose(la[:, t + 1:], lb[:, t + 1:])
    # cached greedy decoding: same tokens as recomputing the whole sequence every step
    prompt = a[:, :5]
    gen = greedy_generate(model, prompt, 11)
    torch.testing.assert_close(gen.tokens, recompute_generate(model, prompt, 11), rtol=0, atol=0)
    # ... and the same logits at every step as one full forward over the result
    seq = torch.cat((prompt, gen.tokens), dim=1)
    cache = {}
    with torch.no_grad():
        full = model(seq)[0]
        steps = [model(seq[:, :5], ctx=ForwardContext(position=model.position, cache=cache))[0]]
        for i in range(5, seq.size(1)):
            steps.append(model(seq[:, i:i + 1], ctx=ForwardContext(position=model.position, cache=cache,
                                                                   start=i))[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    # the live cache is what the registered cost function predicts
    analytic, missing = analytic_state_bytes(cfg, comps, registry, seq.size(1), torch.float32)
    assert not missing and cache_bytes(cache) == 2 * analytic


def test_mqa_kv_bytes_are_one_over_n_heads_of_mha(registry):
    val = torch.randint(0, VOCAB, (4000,))
    got = {}
    for mixer in ("mha", "mqa", "gqa"):
        cfg, comps, model = build(registry, mixer, "rope")
        got[mixer], _ = decode_metrics(model, cfg, comps, registry, val, CPU, FP32)
    for kind in ("kv_bytes_per_token", "kv_bytes_per_token_measured"):
        assert got["mha"][kind] == 2 * 2 * 4 * 8 * 4  # K and V, 2 layers, 4 heads x 8 dims, fp32
        assert got["mqa"][kind] == got["mha"][kind] / 4
        assert got["gqa"][kind] == got["mha"][kind] / 2
    for m in got.values():
        assert m["decode_agreement"] == 1.0 and m["decode_tokens_per_s"] > 0 and m["prefill_tokens_per_s"] > 0


@pytest.mark.parametrize("mixer", ["sliding_window", "linear", "mla"])
def test_state_bytes_of_bounded_and_latent_caches(registry, mixer):
    val = torch.randint(0, VOCAB, (4000,))
    cfg, comps, model = build(registry, mixer, "rope")
    m, notes = decode_metrics(model, cfg, comps, registry, val, CPU, FP32)
    assert not notes
    assert m["kv_bytes_per_token"] == m["kv_bytes_per_token_measured"]
    per_layer = {"sliding_window": 2 * 4 * 8 * 5,  # a rolling buffer of W = 5 tokens
                 "linear": 4 * (8 * 8 + 8),  # S and z per head, whatever the length
                 "mla": 16 * (4 * 8 + 4)}[mixer]  # latent + RoPE key per token
    assert m["kv_cache_bytes_measured"] == 2 * per_layer * 4


def test_bf16_cache_is_counted_at_the_run_dtype(registry):
    """The analytic bytes use the policy's compute_dtype; the measured ones what its autocast produced."""
    val = torch.randint(0, VOCAB, (4000,))
    cfg, comps, model = build(registry, "mla", "rope")
    bf16 = registry.get("precision", "bf16").factory()
    assert bf16.compute_dtype == torch.bfloat16
    m, _ = decode_metrics(model, cfg, comps, registry, val, CPU, bf16)
    assert m["kv_bytes_per_token"] == m["kv_bytes_per_token_measured"] == 2 * (4 * 8 + 4) * 2


def test_cache_bytes_counts_each_storage_once():
    t = torch.zeros(10, 4)
    assert cache_bytes({0: {"k": t, "v": t[2:]}, 1: [t, torch.zeros(3, dtype=torch.bfloat16)], "n": 5}) \
        == 10 * 4 * 4 + 3 * 2


def test_a_mixer_without_cache_support_is_noted_not_crashed(registry):
    class Stateless(torch.nn.Module):
        def __init__(self, cfg, position):
            super().__init__()
            self.proj = torch.nn.Linear(cfg.d_model, cfg.d_model)

        def forward(self, x, ctx):
            return self.proj(x)

    reg = Registry(components=dict(registry.components))
    reg.register("mixer", "stateless", Stateless)
    cfg, comps, model = build(reg, "stateless", "rope")
    m, notes = decode_metrics(model, cfg, comps, reg, torch.randint(0, VOCAB, (500,)), CPU, FP32)
    assert m == {} and "no state in ctx.cache" in notes[0]


# ------------------------------------------------------------ length extrapolation


def test_extrapolation_skips_positions_that_cannot_go_longer(registry):
    val = torch.randint(0, VOCAB, (3000,))
    _, _, learned = build(registry, "mha", "learned")
    m, notes = extrapolation_metrics(learned, val, 16, 8, 4, CPU, FP32)
    assert set(m) == {"val_loss_x1"}  # its trained length still has a figure
    assert len(notes) == 2 and all("max_positions" in n for n in notes)
    for position in ("rope", "alibi", "nope"):
        _, _, model = build(registry, "mha", position)
        m, notes = extrapolation_metrics(model, val, 16, 8, 4, CPU, FP32)
        assert set(m) == {"val_loss_x1", "val_loss_x2", "val_loss_x4"} and not notes


class Unigram(torch.nn.Module):
    """The same next-token distribution at every position: its loss depends only on the targets scored."""

    position = None

    def __init__(self, counts):
        super().__init__()
        self.logp = torch.log(counts.float() / counts.sum())

    def forward(self, idx, targets=None, ctx=None):
        return self.logp.expand(idx.size(0), idx.size(1), -1), None, ctx


def test_extrapolation_scores_identical_targets_at_every_scale():
    """Only the context may change between 1x, 2x and 4x: a unigram model must score them alike.

    The text drifts along the split (the first half draws from the low ids, the second from the high
    ones), so windows that cover different stretches of it give a unigram model different losses.
    """
    g = torch.Generator().manual_seed(0)
    val = torch.cat((torch.randint(0, VOCAB // 4, (1500,), generator=g),
                     torch.randint(0, VOCAB, (1500,), generator=g)))
    model = Unigram(torch.bincount(val, minlength=VOCAB) + 1)
    m, notes = extrapolation_metrics(model, val, 16, 12, 4, CPU, FP32, scales=(1, 2, 4))
    assert not notes
    assert m["val_loss_x2"] == pytest.approx(m["val_loss_x1"], rel=1e-6)
    assert m["val_loss_x4"] == pytest.approx(m["val_loss_x1"], rel=1e-6)


def test_extrapolation_targets_do_not_depend_on_the_model_or_its_reach(registry):
    """The scored targets are fixed by the data: a position that stops at 1x scores 1x on the same ones."""
    from abl.model.decode import extrapolation_ends, scored_targets

    val = torch.randint(0, VOCAB, (3000,))
    ends = extrapolation_ends(len(val), 16, 8)
    assert int(ends[0]) == 64 and int(ends[-1]) == len(val) - 1  # 4 x 16 tokens before the first end
    targets = scored_targets(val, 16, ends)
    assert targets.shape == (8, 16) and torch.equal(targets[0], val[49:65])
    for position in ("learned", "rope"):
        _, _, model = build(registry, "mha", position)
        m, _ = extrapolation_metrics(model, val, 16, 8, 4, CPU, FP32)
        with torch.no_grad():  # x1 by hand: each window's 16 inputs before its end, its 16 targets
            x = val[ends[:, None] + torch.arange(-16, 0)[None, :]]
            logits, _, _ = model(x, ctx=ForwardContext(position=model.position))
            want = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        assert m["val_loss_x1"] == pytest.approx(float(want), rel=1e-5)


def test_extrapolation_notes_a_failing_length_and_carries_on(registry):
    _, _, model = build(registry, "mha", "rope")
    real = model.forward

    def refuse_long(idx, *a, **k):
        if idx.size(1) > 16:
            raise RuntimeError("too long for this model\nsecond line")
        return real(idx, *a, **k)

    model.forward = refuse_long
    m, notes = extrapolation_metrics(model, torch.randint(0, VOCAB, (3000,)), 16, 8, 4, CPU, FP32)
    assert set(m) == {"val_loss_x1"} and "RuntimeError: too long for this model" in notes[0]


def test_extrapolation_needs_enough_validation_tokens(registry):
    _, _, model = build(registry, "mha", "rope")
    m, notes = extrapolation_metrics(model, torch.randint(0, VOCAB, (40,)), 16, 8, 4, CPU, FP32)
    assert set(m) == {"val_loss_x1", "val_loss_x2"} and "fewer than 65" in notes[0]


def test_post_training_evaluations_record_the_scales_the_position_reaches(registry):
    from abl.data.corpus import Batches, TokenData

    _, comps, model = build(registry, "gqa", "learned")
    data = TokenData(torch.randint(0, VOCAB, (5000,)).numpy(), torch.randint(0, VOCAB, (3000,)).numpy(),
                     VOCAB, "x", "random", "bytes")
    batches = Batches(data, 16, 4, 0)
    cell = SimpleNamespace(model=model.cfg, components=comps, train=SimpleNamespace(eval_batches=3))
    run = TrainedRun(model=model.train(), cell=cell, registry=registry, batches=batches, precision=FP32,
                     device=CPU)
    m, notes = run_evaluations(run, EvalConfig(extrapolation=True))
    assert model.training  # left as it was
    assert "val_loss_x1" in m  # the trained length, on the targets x2/x4 would score
    assert "val_loss_x2" not in m and "val_loss_x4" not in m
    assert any("val_loss_x2 not recorded" in n for n in notes)
    assert {"kv_bytes_per_token", "kv_bytes_per_token_measured", "decode_tokens_per_s",
            "prefill_tokens_per_s"} <= set(m)


def test_training_run_records_decode_and_extrapolation(registry):
    from abl.train.loop import train

    grid = {
        "experiment": {"name": "t", "seeds": [0]},
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 4, "context": 16, "position": "learned",
                  "mixer": "mqa"},
        "train": {"steps": 2, "batch_size": 4, "eval_every": 2, "eval_batches": 1, "threads": 1},
        "eval": {"extrapolation": True},
        "dataset": {"pystdlib": {"max_bytes": 200_000}},
    }

    class Sink:
        rows = []

        def log(self, step, metrics):
            self.rows.append((step, dict(metrics)))

    summary = train(expand(grid, registry).cells[0], registry, Sink())
    last = {k: v for step, m in Sink.rows if step == 2 for k, v in m.items()}
    assert last["kv_bytes_per_token"] == last["kv_bytes_per_token_measured"] == 2 * 8 * 4
    assert {"decode_tokens_per_s", "prefill_tokens_per_s", "val_loss", "val_loss_x1"} <= set(last)
    assert "val_loss_x4" not in last
    assert any("val_loss_x4 not recorded" in n and "max_positions" in n for n in summary["notes"])


# ------------------------------------------------------------ the parallel block


def test_parallel_block_is_one_norm_feeding_both_branches(registry):
    from abl.plugins.blocks import ParallelBlock

    cfg = ModelConfig(d_model=4, n_heads=1)
    norm = lambda x: 2.0 * x + 0.1  # noqa: E731
    mixer = lambda x, ctx=None: torch.tanh(0.7 * x)  # noqa: E731
    ffn = lambda x, ctx=None: torch.tanh(-1.3 * x)  # noqa: E731
    block = ParallelBlock(cfg, lambda d: norm, lambda: mixer, lambda: ffn)
    x = torch.linspace(-2, 2, 8).view(1, 2, 4)
    h = norm(x)
    torch.testing.assert_close(block(x, None), x + mixer(h) + ffn(h))
    built = ParallelBlock(cfg, lambda d: torch.nn.LayerNorm(d), lambda: torch.nn.Identity(),
                          lambda: torch.nn.Identity())
    assert ParallelBlock.final_norm and sum(isinstance(m, torch.nn.LayerNorm) for m in built.modules()) == 1


@pytest.mark.parametrize("mixer", ["mha", "linear", "mla"])
def test_parallel_block_decodes_like_it_recomputes(registry, mixer):
    _, _, model = build(registry, mixer, "rope", block="parallel")
    prompt = torch.randint(0, VOCAB, (1, 4))
    assert torch.equal(greedy_generate(model, prompt, 10).tokens, recompute_generate(model, prompt, 10))
