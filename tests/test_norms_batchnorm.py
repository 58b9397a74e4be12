"""BatchNorm (plugins/norms.py) in a causal LM: its batch statistics leak future tokens in training.

Shown two ways: a token's training-mode output moves when a later token changes (in eval mode it
does not), and a model trained on uniformly random tokens, where no causal model beats ln V,
gets a training-mode loss below ln V while its eval-mode loss (running statistics) is above it."""

import math

import torch

from abl.grid.gridfile import expand
from abl.model.decoder import DecoderLM

V, T = 4, 16


def _model(registry, seed=0):
    raw = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "context": T, "vocab_size": V, "norm": "batchnorm",
                     "ffn": "gelu", "mixer": "mha", "position": "learned"}}
    cell = expand(raw, registry).cells[0]
    torch.manual_seed(seed)
    return DecoderLM(cell.model, cell.components, registry)


def test_batchnorm_normalises_over_every_token_of_the_batch(registry):
    norm = registry.get("norm", "batchnorm").factory(8)
    x = torch.randn(3, 5, 8) * 4 + 2
    y = norm(x)
    flat = y.reshape(-1, 8)
    torch.testing.assert_close(flat.mean(0), torch.zeros(8), atol=1e-5, rtol=0)
    torch.testing.assert_close(flat.var(0, unbiased=False), torch.ones(8), atol=1e-3, rtol=0)
    assert not torch.equal(norm.running_mean, torch.zeros(8))  # the running statistics moved
    norm.eval()
    before = norm.running_mean.clone()
    norm(x)
    assert torch.equal(norm.running_mean, before)


def test_training_mode_outputs_depend_on_future_tokens_and_eval_mode_ones_do_not(registry):
    model = _model(registry)
    x = torch.randint(0, V, (2, T))
    x2 = x.clone()
    x2[:, -1] = (x[:, -1] + 1) % V  # change only the last token
    for training, leaks in ((True, True), (False, False)):
        model.train(training)
        with torch.no_grad():
            a, b = model(x)[0][:, :-1], model(x2)[0][:, :-1]
        assert (not torch.allclose(a, b, atol=1e-6)) == leaks, f"training={training}"


def test_training_loss_beats_the_causal_bound_that_eval_mode_respects(registry):
    """Uniform random tokens: the expected loss of any causal model is >= ln V. Batch 1 (the leak is
    largest when the statistics come from one sequence); the same held-out sequences scored in both modes."""
    model = _model(registry)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(500):
        x = torch.randint(0, V, (1, T + 1), generator=gen)
        _, loss, _ = model(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    held = torch.randint(0, V, (64, 1, T + 1), generator=gen)

    def mean_loss(training):
        model.train(training)
        with torch.no_grad():
            return sum(float(model(s[:, :-1], s[:, 1:])[1]) for s in held) / len(held)

    train_mode, eval_mode = mean_loss(True), mean_loss(False)
    assert train_mode < math.log(V) - 0.05 < math.log(V) < eval_mode, (train_mode, eval_mode)
