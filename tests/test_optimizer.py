"""Our AdamW against torch.optim.AdamW and the CS224n handout reference; PCGrad against
hand computations and a plain-Python reference loop."""

import copy
import io
import math
from pathlib import Path

import pytest
import torch

import references  # grader/references.py: the TA's definitions written out
from optimizer import (
    AdamW,
    flatten_grads,
    l2_sp,
    lr_factor,
    pcgrad,
    project_conflicting,
    write_flat_grads,
)

REPO = Path(__file__).resolve().parent.parent


def make_mlp(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def two_groups(model: torch.nn.Sequential) -> list[dict]:
    """Different lr and weight decay per group; the second group takes the defaults' decay."""
    return [
        {"params": model[0].parameters(), "lr": 1e-2, "weight_decay": 0.1},
        {"params": model[2].parameters(), "lr": 3e-3},
    ]


def train(model, optimizer, steps: int, seed: int = 1) -> None:
    """`steps` steps of MSE regression on random batches drawn from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=gen)  # (B, in)
        y = torch.randn(16, 4, generator=gen)  # (B, out)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


# ---------------------------------------------------------------- AdamW


@pytest.mark.parametrize("foreach", [False, True])
def test_adamw_matches_torch_adamw(foreach):
    ours_model = make_mlp()
    torch_model = copy.deepcopy(ours_model)
    hyper = dict(betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01)
    ours = AdamW(two_groups(ours_model), foreach=foreach, **hyper)
    ref = torch.optim.AdamW(two_groups(torch_model), foreach=foreach, **hyper)
    train(ours_model, ours, steps=100)
    train(torch_model, ref, steps=100)
    for (name, p), q in zip(ours_model.named_parameters(), torch_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0, msg=f"parameter {name}")
        torch.testing.assert_close(
            ours.state[p]["exp_avg"], ref.state[q]["exp_avg"], atol=1e-7, rtol=0
        )
        torch.testing.assert_close(
            ours.state[p]["exp_avg_sq"], ref.state[q]["exp_avg_sq"], atol=0, rtol=1e-5
        )
        assert ours.state[p]["step"] == ref.state[q]["step"].item() == 100
    # the test would notice a broken optimizer: the parameters did move
    assert not torch.allclose(ours_model[0].weight, make_mlp()[0].weight, atol=1e-2)


def test_foreach_gives_the_same_numbers_as_the_loop():
    """Includes a parameter that only gets a gradient every other step (so step counts differ
    inside one group) and one that never gets a gradient."""
    models = [torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)]
    models[1].load_state_dict(models[0].state_dict())
    extras = [torch.nn.Parameter(torch.ones(4)) for _ in models]
    unused = [torch.nn.Parameter(torch.ones(2)) for _ in models]
    opts = [
        AdamW([*m.parameters(), e, u], lr=1e-2, weight_decay=0.05, foreach=f)
        for m, e, u, f in zip(models, extras, unused, (False, True), strict=True)
    ]
    gen = torch.Generator().manual_seed(0)
    for step in range(30):
        x = torch.randn(7, 5, generator=gen)  # (B, in)
        for model, extra, opt in zip(models, extras, opts, strict=True):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            if step % 2 == 0:
                loss = loss + (extra * x[0, :4]).sum()
            loss.backward()
            opt.step()
    for p, q in zip(
        [*models[0].parameters(), extras[0]], [*models[1].parameters(), extras[1]], strict=True
    ):
        torch.testing.assert_close(p, q, atol=1e-7, rtol=0)
    assert opts[1].state[extras[1]]["step"] == 15
    assert unused[1] not in opts[1].state and torch.equal(unused[1], torch.ones(2))


def test_correct_bias_first_step_by_hand():
    lr, beta1, beta2, eps = 0.1, 0.9, 0.999, 1e-6
    p0 = torch.tensor([1.0, -2.0, 0.5])
    g = torch.tensor([0.3, -0.02, 4.0])
    after = {}
    for correct_bias in (True, False):
        p = torch.nn.Parameter(p0.clone())
        p.grad = g.clone()
        AdamW([p], lr=lr, betas=(beta1, beta2), eps=eps, correct_bias=correct_bias).step()
        after[correct_bias] = p.detach()
    for k in range(3):
        gk = g[k].item()
        m, v = (1 - beta1) * gk, (1 - beta2) * gk * gk  # first moments, no correction
        uncorrected = p0[k].item() - lr * m / (math.sqrt(v) + eps)
        corrected = p0[k].item() - lr * gk / (abs(gk) + eps)  # m_hat = g, v_hat = g^2
        assert after[False][k].item() == pytest.approx(uncorrected, abs=1e-6)
        assert after[True][k].item() == pytest.approx(corrected, abs=1e-6)
    # without correction the first step is about sqrt(1 - beta2) / (1 - beta1) = 0.32 as long
    assert (after[True] - after[False]).abs().min() > 0.05


@pytest.mark.parametrize("foreach", [False, True])
def test_state_dict_round_trip(foreach):
    straight_model = make_mlp()
    resumed_model = copy.deepcopy(straight_model)
    straight = AdamW(two_groups(straight_model), weight_decay=0.01, foreach=foreach)
    train(straight_model, straight, steps=100)

    first = AdamW(two_groups(resumed_model), weight_decay=0.01, foreach=foreach)
    train(resumed_model, first, steps=50)
    buffer = io.BytesIO()
    torch.save({"model": resumed_model.state_dict(), "optimizer": first.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer)
    fresh_model = make_mlp(seed=123)  # different weights, overwritten by the checkpoint
    fresh_model.load_state_dict(checkpoint["model"])
    fresh = AdamW(two_groups(fresh_model), weight_decay=0.01, foreach=foreach)
    fresh.load_state_dict(checkpoint["optimizer"])
    assert set(fresh.state[fresh_model[0].weight]) == {"step", "exp_avg", "exp_avg_sq"}
    # the second half must see the batches the straight run saw at steps 50..99
    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
    for _ in range(50):
        x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
        fresh.zero_grad()
        torch.nn.functional.mse_loss(fresh_model(x), y).backward()
        fresh.step()
    for p, q in zip(fresh_model.parameters(), straight_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=0, rtol=0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(lr=-1e-3), "lr must be >= 0"),
        (dict(betas=(1.0, 0.999)), r"beta1 must be in \[0, 1\)"),
        (dict(betas=(0.9, -0.1)), r"beta2 must be in \[0, 1\)"),
        (dict(betas=0.9), "betas must be a pair"),
        (dict(eps=-1e-8), "eps must be >= 0"),
        (dict(weight_decay=-0.1), "weight_decay must be >= 0"),
    ],
)
def test_bad_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdamW([torch.nn.Parameter(torch.zeros(2))], **kwargs)


def test_bad_hyperparameter_in_a_group_names_the_group():
    model = make_mlp()
    groups = [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": -1.0}]
    with pytest.raises(ValueError, match="parameter group 1: lr must be >= 0"):
        AdamW(groups)


def test_sparse_gradient_is_refused():
    embedding = torch.nn.Embedding(10, 4, sparse=True)
    opt = AdamW(embedding.parameters())
    embedding(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradient"):
        opt.step()


def test_step_returns_the_closure_loss():
    p = torch.nn.Parameter(torch.tensor([2.0]))
    opt = AdamW([p], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (p**2).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == pytest.approx(4.0)
    assert p.item() == pytest.approx(1.9, abs=1e-6)  # first step moves lr * sign(g)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("foreach", [False, True])
def test_adamw_on_cuda_matches_torch_adamw(foreach):
    ours_model = make_mlp().cuda()
    torch_model = copy.deepcopy(ours_model)
    ours = AdamW(two_groups(ours_model), weight_decay=0.01, foreach=foreach)
    ref = torch.optim.AdamW(two_groups(torch_model), weight_decay=0.01, eps=1e-6)
    gen = torch.Generator().manual_seed(1)
    for _ in range(100):
        x, y = torch.randn(16, 8, generator=gen).cuda(), torch.randn(16, 4, generator=gen).cuda()
        for model, opt in ((ours_model, ours), (torch_model, ref)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    for p, q in zip(ours_model.parameters(), torch_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)


# ---------------------------------------------------------------- PCGrad


def test_pcgrad_conflicting_pair_by_hand():
    g1, g2 = torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 1.0])  # g1 . g2 = -1
    p1, p2 = project_conflicting([g1, g2])
    assert abs(torch.dot(p1, g2).item()) < 1e-6  # each ends orthogonal to the other
    assert abs(torch.dot(p2, g1).item()) < 1e-6
    torch.testing.assert_close(p1, torch.tensor([0.5, 0.5]), atol=1e-6, rtol=0)
    torch.testing.assert_close(p2, torch.tensor([0.0, 1.0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(pcgrad([g1, g2]), torch.tensor([0.5, 1.5]), atol=1e-6, rtol=0)
    assert torch.equal(g1, torch.tensor([1.0, 0.0]))  # inputs untouched


def test_pcgrad_agreeing_pair_is_a_plain_sum():
    g1, g2 = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, -0.1, 1.0])  # g1 . g2 > 0
    assert torch.equal(pcgrad([g1, g2]), g1 + g2)


def test_pcgrad_matches_reference_on_random_vectors():
    vectors = torch.randn(3, 6, generator=torch.Generator().manual_seed(4))  # (T, P)
    grads = list(vectors)
    dots = vectors @ vectors.T  # (T, T)
    assert (dots < 0).any(), "the test needs at least one conflicting pair"
    ours = pcgrad(grads, generator=torch.Generator().manual_seed(7))
    expected = references.pcgrad(vectors.tolist(), torch.Generator().manual_seed(7))
    torch.testing.assert_close(ours, torch.tensor(expected), atol=1e-5, rtol=0)
    assert not torch.allclose(ours, vectors.sum(0), atol=1e-3)


def test_pcgrad_projection_order_comes_from_the_generator():
    # g0 conflicts with g1 and g2; projecting off g1 first or g2 first ends in
    # (-0.12, 0.24) or (-0.12, -0.24).
    grads = [torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 0.5]), torch.tensor([-1.0, -0.5])]
    results = {}
    for seed in range(12):
        first = pcgrad(grads, generator=torch.Generator().manual_seed(seed))
        again = pcgrad(grads, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(first, again)
        expected = references.pcgrad(
            [g.tolist() for g in grads], torch.Generator().manual_seed(seed)
        )
        torch.testing.assert_close(first, torch.tensor(expected), atol=1e-6, rtol=0)
        results[tuple(round(v, 5) for v in first.tolist())] = seed
    assert len(results) > 1, "different orders should give different results"


def test_pcgrad_rejects_bad_shapes():
    with pytest.raises(ValueError, match="empty list"):
        pcgrad([])
    with pytest.raises(ValueError, match=r"task 1 has shape \(3,\)"):
        pcgrad([torch.zeros(2), torch.zeros(3)])


def test_flatten_and_write_back_grads():
    model = torch.nn.Linear(3, 2)
    unused = torch.nn.Parameter(torch.zeros(4))
    params = [*model.parameters(), unused]
    model(torch.ones(5, 3)).sum().backward()
    flat = flatten_grads(params)
    assert flat.shape == (6 + 2 + 4,)
    torch.testing.assert_close(flat[:6], model.weight.grad.reshape(-1), atol=0, rtol=0)
    assert torch.equal(flat[8:], torch.zeros(4))  # None counts as zeros
    write_flat_grads(params, torch.arange(12.0))
    assert torch.equal(model.weight.grad, torch.arange(6.0).view(2, 3))
    assert torch.equal(model.bias.grad, torch.tensor([6.0, 7.0]))
    assert torch.equal(unused.grad, torch.arange(8.0, 12.0))
    with pytest.raises(ValueError, match="expected a flat vector of 12 values"):
        write_flat_grads(params, torch.zeros(11))


def test_pcgrad_training_step_without_conflict_equals_summed_loss():
    """Two tasks whose gradients are parallel: surgery changes nothing, so the written-back
    gradient is that of loss1 + loss2 (checks flatten/write ordering end to end)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    x = torch.randn(8, 4)  # (B, in)
    losses = [lambda: model(x).pow(2).mean(), lambda: 3 * model(x).pow(2).mean()]
    grads = []
    for loss in losses:
        model.zero_grad()
        loss().backward()
        grads.append(flatten_grads(model.parameters()))
    write_flat_grads(model.parameters(), pcgrad(grads))
    surgery = flatten_grads(model.parameters())
    model.zero_grad()
    (losses[0]() + losses[1]()).backward()
    torch.testing.assert_close(surgery, flatten_grads(model.parameters()), atol=1e-6, rtol=1e-5)


def test_random_loss_weights_sum_to_one_and_vary():
    from optimizer import random_loss_weights

    g = torch.Generator().manual_seed(0)
    draws = torch.stack([random_loss_weights(3, g) for _ in range(50)])  # (50, 3)
    assert torch.allclose(draws.sum(1), torch.ones(50), atol=1e-6)
    assert (draws > 0).all()
    assert draws.std(0).min() > 0.05  # they change from step to step
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(random_loss_weights(3, g1), random_loss_weights(3, g2))


# ---------------------------------------------------------------- schedule and L2-SP


def test_lr_factor_warms_up_then_decays_linearly():
    # 8 updates, 2 of warmup: 1/2, 1, then 6 steps down by 1/7 each, never reaching 0
    expected = [0.5, 1.0] + [1 - k / 7 for k in range(1, 7)]
    assert [lr_factor(i, 8, 0.25, "linear") for i in range(1, 9)] == pytest.approx(expected)
    assert [lr_factor(i, 8, 0.25) for i in range(1, 9)] == pytest.approx([0.5] + [1.0] * 7)
    assert [lr_factor(i, 3) for i in (1, 2, 3)] == [1.0, 1.0, 1.0]  # the thesis: constant
    with pytest.raises(ValueError, match="step must lie in"):
        lr_factor(0, 8)


def test_l2_sp_is_half_the_squared_distance_and_pulls_back():
    torch.manual_seed(0)
    anchors = [torch.randn(3, 4), torch.randn(5)]
    params = [(a + torch.randn_like(a)).requires_grad_() for a in anchors]
    value = l2_sp(params, anchors)
    naive = 0.0
    for p, a in zip(params, anchors, strict=True):
        for x, y in zip(p.detach().flatten().tolist(), a.flatten().tolist(), strict=True):
            naive += (x - y) ** 2 / 2
    assert value.item() == pytest.approx(naive, rel=1e-6)
    value.backward()
    for p, a in zip(params, anchors, strict=True):  # gradient w - w0: back toward the anchor
        torch.testing.assert_close(p.grad, p.detach() - a)
