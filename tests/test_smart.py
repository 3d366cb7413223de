"""SMART's regularizer (smart.py): divergences against per-example loops, the ascent and its
projection, the reference variant against mt-dnn's computation; the teacher and the loop's
contract are in test_smart_training.py."""

import math

import pytest
import torch
from torch import nn

import mtdnn_smart
from commands import command
from smart import (
    SmartConfig,
    adversarial_regularizer,
    divergence,
    reference_regularizer,
    smart_loss,
)
from smart_models import TOL, TinyClassifier, batch


def ref_sym_kl(P: list[list[float]], Q: list[list[float]]) -> float:
    """Batch mean of KL(P||Q) + KL(Q||P), written as explicit sums of p * log(p / q)."""
    total = 0.0
    for p, q in zip(P, Q, strict=True):
        total += sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))
        total += sum(qi * math.log(qi / pi) for pi, qi in zip(p, q, strict=True))
    return total / len(P)


def softmax(row: list[float]) -> list[float]:
    exps = [math.exp(x) for x in row]
    return [e / sum(exps) for e in exps]


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_symmetric_kl_matches_loop():
    torch.manual_seed(0)
    p, q = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    ref = ref_sym_kl([softmax(r) for r in p.tolist()], [softmax(r) for r in q.tolist()])
    assert abs(divergence(p, q, "classification").item() - ref) < TOL
    # float32 inputs (what training uses) against the same float64 loop
    p32, q32 = p.float() * 3, q.float() * 3
    ref = ref_sym_kl(
        [softmax(r) for r in p32.double().tolist()], [softmax(r) for r in q32.double().tolist()]
    )
    assert abs(divergence(p32, q32, "classification").item() - ref) < TOL * max(1.0, ref)


def test_symmetric_kl_nonnegative_symmetric_zero_only_when_equal():
    torch.manual_seed(0)
    for _ in range(20):
        p, q = torch.randn(3, 5) * 4, torch.randn(3, 5) * 4
        d = divergence(p, q, "classification")
        assert d.item() > 0
        assert abs(d.item() - divergence(q, p, "classification").item()) < TOL
    p = torch.randn(3, 5)
    assert divergence(p, p.clone(), "classification").item() == 0.0
    # logits shifted by a constant give the same distribution: still zero
    assert abs(divergence(p, p + 7.0, "classification").item()) < TOL


def test_binary_uses_two_class_distribution():
    torch.manual_seed(0)
    p, q = torch.randn(6, dtype=torch.float64) * 2, torch.randn(6, dtype=torch.float64) * 2
    two_class = lambda v: [[1 - sigmoid(x), sigmoid(x)] for x in v.tolist()]  # noqa: E731
    ref = ref_sym_kl(two_class(p), two_class(q))
    assert ref > 0.01  # a softmax over the single logit would give 0 here
    assert abs(divergence(p, q, "binary").item() - ref) < TOL
    # a (B, 1) head output is the same thing
    assert abs(divergence(p[:, None], q[:, None], "binary").item() - ref) < TOL
    # very large logits stay finite (logsigmoid, not log(sigmoid))
    big = torch.tensor([80.0, -80.0])
    assert torch.isfinite(divergence(big, -big, "binary"))


def test_regression_is_mean_squared_error_over_a_short_batch():
    p, q = torch.tensor([1.0, 2.0, 4.0]), torch.tensor([0.0, 2.5, 4.0])
    assert abs(divergence(p, q, "regression").item() - (1.0 + 0.25 + 0.0) / 3) < TOL


def test_divergence_rejects_bad_input():
    with pytest.raises(ValueError, match="kind must be one of"):
        divergence(torch.zeros(2, 3), torch.zeros(2, 3), "multiclass")
    with pytest.raises(ValueError, match="differ in shape"):
        divergence(torch.zeros(2, 3), torch.zeros(3, 3), "classification")
    with pytest.raises(ValueError, match=r"\(B,\) or \(B, 1\)"):
        divergence(torch.zeros(2, 3), torch.zeros(2, 3), "binary")


def test_perturbation_in_epsilon_ball_and_not_on_padding():
    model = TinyClassifier().eval()
    ids, mask = batch()
    embeds = model.bert.embed(ids)
    clean = model.head_on(embeds, mask)
    seen = []

    def f(e):
        seen.append(e.detach())
        return model.head_on(e, mask)

    eps = 1e-2  # large enough that float32 rounding of (embeds + noise) - embeds is negligible
    cfg = SmartConfig(sigma=1e-3, eta=0.1, epsilon=eps)
    adversarial_regularizer(f, embeds, clean, "classification", mask, cfg)
    noise = seen[-1] - embeds.detach()  # the perturbation of the final pass
    assert noise.abs().max().item() <= eps * (1 + 1e-4)
    assert noise[mask == 0].abs().max().item() == 0.0
    # eta >> eps: the ascent pushed every example to the boundary of the ball
    per_example = noise.abs().amax(dim=(1, 2))
    assert torch.allclose(per_example, torch.full_like(per_example, eps), rtol=1e-3)


def linear_head(B, T, H, scale=1.0):
    """A regression head f(e) = sum(w * e) on random (B, T, H) embeddings, and f wrapped to
    record every input it sees: (w, embeds, f, recording_f, seen)."""
    torch.manual_seed(0)
    w = torch.randn(T, H, dtype=torch.float64) * scale
    embeds = torch.randn(B, T, H, dtype=torch.float64)
    f = lambda e: (e * w).sum(dim=(1, 2))  # noqa: E731
    seen = []

    def recording_f(e):
        seen.append(e.detach())
        return f(e)

    return w, embeds, f, recording_f, seen


def test_ascent_step_matches_hand_derived_update():
    """Regression head f(e) = sum(w * e): the gradient w.r.t. noise n_b is (2/B)(w.n_b) w,
    so one step is n_b + eta * sign(w.n_b) * w / max|w|, per example, then clipped."""
    B, T, H = 3, 4, 5
    w, embeds, f, recording_f, seen = linear_head(B, T, H)
    sigma, eta, eps = 0.1, 0.05, 0.12
    torch.manual_seed(1)
    cfg = SmartConfig(sigma=sigma, eta=eta, epsilon=eps)
    adversarial_regularizer(recording_f, embeds, f(embeds), "regression", None, cfg)
    torch.manual_seed(1)
    n0 = (torch.randn(B, T, H, dtype=torch.float64) * sigma).clamp(-eps, eps)
    sign = torch.sign((n0 * w).sum(dim=(1, 2)))[:, None, None]  # (B, 1, 1)
    expected = (n0 + eta * sign * w / w.abs().max()).clamp(-eps, eps)
    assert torch.allclose(seen[-1] - embeds, expected, atol=1e-12)


@pytest.mark.parametrize("scale", [1.0, 1e-9])
def test_reference_ascent_matches_the_reference_codes_update(scale):
    """The same head as above, the batch-summed squared error: g_b = 2 (w.n_b) w, and the
    reference's update per token t is s = n + eta g, n <- s / (max_h |s_bt| + 1e-6): per
    token, no clipping, every token's largest coordinate near 1 whatever the scale of g."""
    B, T, H = 3, 4, 5
    w, embeds, f, recording_f, seen = linear_head(B, T, H, scale)
    sigma, eta = 0.1, 0.05
    torch.manual_seed(1)
    cfg = SmartConfig(
        sigma=sigma, eta=eta, epsilon=0.12, dropout="independent", variant="reference"
    )
    r_s = reference_regularizer(recording_f, embeds, f(embeds), "regression", cfg)
    torch.manual_seed(1)
    n0 = torch.randn(B, T, H, dtype=torch.float64) * sigma
    expected = torch.empty_like(n0)
    for b in range(B):
        g = 2 * (n0[b] * w).sum() * w  # (T, H)
        for t in range(T):
            step = n0[b, t] + eta * g[t]
            expected[b, t] = step / (step.abs().max() + 1e-6)
    assert torch.allclose(seen[-1] - embeds, expected, atol=1e-12, rtol=1e-9)
    assert r_s.item() == pytest.approx(((expected * w).sum(dim=(1, 2)) ** 2).mean().item())
    largest = expected.abs().amax(dim=-1)  # (B, T): far outside any ball of radius sigma
    assert torch.allclose(largest, torch.ones_like(largest), atol=1e-4)


@pytest.mark.parametrize("kind", ["classification", "binary", "regression"])
def test_reference_variant_is_the_reference_codes_computation(kind):
    """R_s of --smart_variant reference and its gradient on every parameter of a tiny BERT
    equal a step-by-step transcription of mt-dnn's SmartPerturbation (grader/mtdnn_smart.py):
    its ascent on stable_kl, and its loss whose KL terms each detach their target (so the
    gradient is half of a symmetric KL differentiated on both sides)."""
    model = TinyClassifier(n_out=3 if kind == "classification" else 1).eval()
    ids, mask = batch()

    def ours(embeds):  # (B, 3) class logits, else (B,)
        out = model.head_on(embeds, mask)
        return out if kind == "classification" else out.squeeze(-1)

    def theirs(embeds):  # mt-dnn's heads give a binary task two logits: (0, x)
        out = ours(embeds)
        return torch.stack([torch.zeros_like(out), out], -1) if kind == "binary" else out

    cfg = SmartConfig(sigma=1e-3, eta=1e-3, dropout="independent", variant="reference")
    grads = []
    for compute in (
        lambda e: reference_regularizer(ours, e, ours(e), kind, cfg),
        lambda e: mtdnn_smart.smart_r_s(theirs, e, theirs(e), kind == "regression", 1e-3, 1e-3),
    ):
        model.zero_grad()
        torch.manual_seed(7)  # the same noise
        loss = compute(model.bert.embed(ids))
        loss.backward()
        grads.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (a, ga), (b, gb) = grads
    # about 1.6e-4, each KL a sum of near-equal float32 terms: 1e-7 is their rounding
    assert a == pytest.approx(b, abs=1e-7) and a > 1e-5
    for name, g in gb.items():
        torch.testing.assert_close(ga[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_reference_variant_refuses_shared_masks_and_smart_loss_runs_it():
    with pytest.raises(ValueError, match="own dropout masks"):
        SmartConfig(variant="reference")
    with pytest.raises(ValueError, match="variant"):
        SmartConfig(variant="mt-dnn")
    w = torch.randn(4, 5)
    embeds = torch.randn(3, 4, 5)
    f = lambda e: (e * w).sum(dim=(1, 2))  # noqa: E731
    cfg = SmartConfig(lambda_s=2.0, mu=0.0, dropout="independent", variant="reference")
    torch.manual_seed(1)
    loss = smart_loss(f, embeds, f(embeds), "regression", None, cfg)
    torch.manual_seed(1)
    assert loss.item() == pytest.approx(
        2.0 * reference_regularizer(f, embeds, f(embeds), "regression", cfg).item()
    )


def test_regularizer_is_zero_for_a_head_that_ignores_its_input():
    bias = nn.Parameter(torch.randn(3))
    embeds = torch.randn(4, 6, 8, requires_grad=True)
    f = lambda e: bias.expand(e.size(0), 3)  # noqa: E731
    cfg = SmartConfig(sigma=0.1, epsilon=0.1)
    r_s = adversarial_regularizer(f, embeds, f(embeds), "classification", cfg=cfg)
    assert r_s.item() == 0.0


def test_ascent_increases_the_divergence():
    # With the paper's sigma = epsilon = 1e-5 the divergence is ~1e-12, below float32
    # rounding of the logits, so the comparison would measure noise; a ball of 0.05
    # makes the change of the output large against rounding.
    model = TinyClassifier().eval()
    ids, mask = batch()
    embeds = model.bert.embed(ids).detach()
    clean = model.head_on(embeds, mask).detach()
    f = lambda e: model.head_on(e, mask)  # noqa: E731
    kw = dict(sigma=1e-3, eta=0.05, epsilon=0.05)
    zero, one = SmartConfig(steps=0, **kw), SmartConfig(steps=1, **kw)
    for seed in range(3):
        torch.manual_seed(seed)
        before = adversarial_regularizer(f, embeds, clean, "classification", mask, zero)
        torch.manual_seed(seed)  # the same initial noise, then one ascent step
        after = adversarial_regularizer(f, embeds, clean, "classification", mask, one)
        assert after.item() > 10 * before.item() > 0


def test_ascent_leaves_parameter_grads_alone():
    model = TinyClassifier().eval()
    ids, mask = batch()
    embeds = model.bert.embed(ids)
    clean = model.head_on(embeds, mask)
    adversarial_regularizer(
        lambda e: model.head_on(e, mask),
        embeds,
        clean,
        "classification",
        mask,
        SmartConfig(steps=2),
    )
    assert all(p.grad is None for p in model.parameters())


def test_regularizer_gradient_flows_through_clean_and_perturbed_outputs():
    """The gradient of R_s is that of divergence(f(x + n), f(x)) with the final noise n a
    constant: both outputs carry gradient (the paper), the noise does not."""
    model = TinyClassifier().eval()
    ids, mask = batch()
    embeds = model.bert.embed(ids).detach().requires_grad_(True)
    clean = model.head_on(embeds, mask)
    seen = []

    def f(e):
        seen.append(e.detach())
        return model.head_on(e, mask)

    r_s = adversarial_regularizer(
        f, embeds, clean, "classification", mask, SmartConfig(sigma=1e-3, eta=0.1, epsilon=1e-2)
    )
    (grad,) = torch.autograd.grad(r_s, embeds)
    x = embeds.detach().clone().requires_grad_(True)
    noise = seen[-1] - embeds.detach()
    ref = divergence(model.head_on(x + noise, mask), model.head_on(x, mask), "classification")
    (ref_grad,) = torch.autograd.grad(ref, x)
    assert abs(r_s.item() - ref.item()) < 1e-7
    assert torch.allclose(grad, ref_grad, atol=1e-7, rtol=1e-4)
    # neither path alone gives that gradient
    (clean_only,) = torch.autograd.grad(
        divergence(
            model.head_on(x + noise, mask).detach(), model.head_on(x, mask), "classification"
        ),
        x,
    )
    assert not torch.allclose(grad, clean_only, atol=1e-7, rtol=1e-4)


def test_a_runs_smart_settings_are_smartconfigs_own_rules():
    """A stage's SMART settings come from SmartConfig.at_radius (the paper's sigma = epsilon,
    eta = 100 x epsilon; the reference variant's own masks), not from rules in the flags."""

    cfg, _ = command.parse_args(["--smart", "--smart_epsilon", "2e-5", "--lambda_sts", "3"])
    assert cfg.smart.for_task("sts") == SmartConfig(
        lambda_s=3.0, mu=1.0, sigma=2e-5, eta=2e-3, epsilon=2e-5, dropout="shared"
    )
    reference = SmartConfig.at_radius(1e-5, "reference", lambda_s=1.0)
    assert reference.dropout == "independent" and reference.eta == pytest.approx(1e-3)
    cfg, _ = command.parse_args(["--lambda_sst", "4"])  # SMART off: both weights 0
    assert not cfg.smart.for_task("sst").active
