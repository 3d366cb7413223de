"""SMART: divergences against per-example loops, the ascent and its projection, the EMA
teacher, and the contract with the training loop (zero weights = a plain step)."""

import math
from contextlib import nullcontext

import pytest
import torch
from torch import nn

import losses
import mtdnn_smart
from base_bert import BertConfig
from bert import BertModel
from evaluation import TASKS
from smart import (
    EMATeacher,
    SameDropout,
    SmartConfig,
    adversarial_regularizer,
    beta_schedule,
    bregman_divergence,
    divergence,
    passes_in_float32,
    reference_regularizer,
    smart_loss,
)

TOL = 1e-6


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


def tiny_bert(seed: int = 0, dropout: float = 0.0) -> BertModel:
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    return BertModel(config)


class TinyClassifier(nn.Module):
    """Tiny BERT + a linear head on the pooled [CLS]: what the loop's heads look like."""

    def __init__(self, seed: int = 0, n_out: int = 3, dropout: float = 0.0):
        super().__init__()
        self.bert = tiny_bert(seed, dropout)
        self.head = nn.Linear(32, n_out)

    def head_on(self, embeds, mask):  # (B, T, H) -> (B, n_out)
        return self.head(self.bert.encode(embeds, mask)["pooler_output"])

    def forward(self, ids, mask):
        return self.head_on(self.bert.embed(ids), mask)


def batch(B: int = 4, T: int = 7, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 5:] = 0  # two rows with padding
    mask[2, 3:] = 0
    return ids * mask, mask


# ---------------------------------------------------------------- divergence


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


# ---------------------------------------------------------------- adversarial regularizer


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


# ---------------------------------------------------------------- momentum teacher


def test_beta_schedule():
    # the thesis's listings: Beta = 0.999 from batch n == 54 of SST's 1,068 batches of 8,
    # n == 38 of STS's 755 and n == 1769 of QQP's 35,376 (0-based)
    for switch, batches in ((54, 1068), (38, 755), (1769, 35376)):
        assert beta_schedule(0, batches) == beta_schedule(switch - 1, batches) == 0.99
        assert beta_schedule(switch, batches) == beta_schedule(batches - 1, batches) == 0.999
    assert beta_schedule(99, 1000, warmup_frac=0.1) == 0.99
    assert beta_schedule(100, 1000, warmup_frac=0.1) == 0.999
    assert beta_schedule(0, 10, warmup_frac=0.0) == 0.999
    with pytest.raises(ValueError, match="total_steps"):
        beta_schedule(0, 0)


def test_ema_update_matches_formula():
    lin = nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        lin.bias.copy_(torch.tensor([0.5, -0.5]))
    teacher = EMATeacher(lin)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[-1.0, 0.0], [10.0, 4.0]]))
        lin.bias.copy_(torch.tensor([1.5, 0.5]))
    # the copy was made at construction: changing the model did not move the teacher
    assert torch.equal(teacher.params["weight"], torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    teacher.update(lin, beta=0.9)
    expected_w = 0.9 * torch.tensor([[1.0, 2.0], [3.0, 4.0]]) + 0.1 * lin.weight.detach()
    expected_b = 0.9 * torch.tensor([0.5, -0.5]) + 0.1 * lin.bias.detach()
    assert torch.allclose(teacher.params["weight"], expected_w, atol=TOL, rtol=0)
    assert torch.allclose(teacher.params["bias"], expected_b, atol=TOL, rtol=0)
    # the teacher's forward is the model's forward with the teacher's weights
    x = torch.randn(3, 2)
    out = teacher.forward(lin, x)
    assert torch.allclose(out, x @ expected_w.T + expected_b, atol=TOL, rtol=0)
    assert not out.requires_grad
    assert torch.equal(lin.weight, torch.tensor([[-1.0, 0.0], [10.0, 4.0]]))  # model untouched


def test_teacher_moves_after_an_optimizer_step():
    model = TinyClassifier()
    teacher = EMATeacher(model)
    before = {n: p.clone() for n, p in teacher.params.items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids, mask = batch()
    nn.functional.cross_entropy(model(ids, mask), torch.tensor([0, 1, 2, 0])).backward()
    opt.step()
    teacher.update(model, beta=0.99)
    name = "bert.encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(teacher.params[name], before[name])
    for n, p in model.named_parameters():
        assert torch.allclose(teacher.params[n], 0.99 * before[n] + 0.01 * p.detach(), atol=TOL)


# ---------------------------------------------------------------- the loop's contract


def train_step(model: TinyClassifier, cfg: SmartConfig, teacher: EMATeacher | None) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids, mask = batch()
    embeds = model.bert.embed(ids)
    logits = model.head_on(embeds, mask)
    loss = nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 0]))
    teacher_out = teacher.forward(model, ids, mask) if teacher is not None else None
    f = lambda e: model.head_on(e, mask)  # noqa: E731
    loss = loss + smart_loss(f, embeds, logits, "classification", teacher_out, cfg, mask)
    loss.backward()
    opt.step()


def test_zero_weights_give_a_plain_step_bitwise():
    off = SmartConfig(lambda_s=0.0, mu=0.0)
    assert not off.active
    plain, smart = TinyClassifier(dropout=0.1), TinyClassifier(dropout=0.1)
    torch.manual_seed(5)  # dropout draws the same masks in both steps
    ids, mask = batch()
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    loss = nn.functional.cross_entropy(plain(ids, mask), torch.tensor([0, 1, 2, 0]))
    loss.backward()
    opt.step()
    torch.manual_seed(5)
    train_step(smart, off, None)
    for (n, a), b in zip(plain.named_parameters(), smart.parameters(), strict=True):
        assert torch.equal(a, b), n
    # and the test can fail: an active regularizer changes the step
    other = TinyClassifier(dropout=0.1)
    torch.manual_seed(5)
    train_step(other, SmartConfig(lambda_s=10.0, mu=0.0, sigma=1e-3, epsilon=1e-2), None)
    assert not torch.equal(other.head.weight, plain.head.weight)


def test_smart_loss_combines_both_terms():
    model = TinyClassifier().eval()
    teacher = EMATeacher(model)
    with torch.no_grad():
        for p in teacher.params.values():
            p.add_(0.05 * torch.randn_like(p))
    ids, mask = batch()
    embeds = model.bert.embed(ids)
    clean = model.head_on(embeds, mask)
    t_out = teacher.forward(model, ids, mask)
    f = lambda e: model.head_on(e, mask)  # noqa: E731
    cfg = SmartConfig(lambda_s=10.0, mu=2.0, sigma=1e-3, epsilon=1e-2)
    torch.manual_seed(0)
    total = smart_loss(f, embeds, clean, "classification", t_out, cfg, mask)
    torch.manual_seed(0)
    r_s = adversarial_regularizer(
        f, embeds, clean, "classification", mask, SmartConfig(sigma=1e-3, eta=1e-3, epsilon=1e-2)
    )
    d_breg = bregman_divergence(clean, t_out, "classification")
    assert abs(total.item() - (10.0 * r_s.item() + 2.0 * d_breg.item())) < TOL
    with pytest.raises(ValueError, match="needs teacher_out"):
        smart_loss(f, embeds, clean, "classification", None, cfg, mask)


@pytest.mark.parametrize("term", ["r_s", "d_breg"])
def test_gradients_reach_the_encoder(term):
    model = TinyClassifier().eval()
    teacher = EMATeacher(model)
    with torch.no_grad():  # a teacher different from the model: at equality the gradient is 0
        for p in teacher.params.values():
            p.add_(0.05 * torch.randn_like(p))
    ids, mask = batch()
    embeds = model.bert.embed(ids)
    clean = model.head_on(embeds, mask)
    f = lambda e: model.head_on(e, mask)  # noqa: E731
    if term == "r_s":
        cfg = SmartConfig(lambda_s=1.0, mu=0.0, sigma=1e-3, epsilon=1e-2)
        loss = smart_loss(f, embeds, clean, "classification", None, cfg, mask)
    else:
        cfg = SmartConfig(lambda_s=0.0, mu=1.0)
        loss = smart_loss(
            f, embeds, clean, "classification", teacher.forward(model, ids, mask), cfg
        )
    loss.backward()
    for name in (
        "bert.embeddings.word_embeddings.weight",
        "bert.encoder.layer.0.attention.self.query.weight",
        "bert.encoder.layer.1.output.dense.weight",
    ):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().max() > 0, name
    assert all(p.grad is None for p in teacher.params.values())


def test_bregman_treats_the_teacher_as_a_constant():
    student = torch.randn(4, 3, requires_grad=True)
    teacher_out = torch.randn(4, 3, requires_grad=True)
    bregman_divergence(student, teacher_out, "classification").backward()
    assert teacher_out.grad is None
    assert student.grad is not None and student.grad.abs().max() > 0


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="lambda_s and mu"):
        SmartConfig(lambda_s=-1.0)
    with pytest.raises(ValueError, match="beta_end"):
        SmartConfig(beta_end=1.0)
    assert SmartConfig().active
    with pytest.raises(ValueError, match="dropout must be one of"):
        SmartConfig(dropout="rdrop")


# ---------------------------------------------------------------- dropout masks of the passes


def smoothness(eps: float, shared: bool, seed: int = 0) -> float:
    """R_s of TinyClassifier in train mode (dropout 0.3) at radius eps (sigma = eps, ascent
    step 100 eps as the paper's ratio), with the clean pass's dropout masks or new ones."""
    model = TinyClassifier(dropout=0.3).train()
    ids, mask = batch()
    torch.manual_seed(seed)
    embeds = model.bert.embed(ids)
    same = SameDropout(torch.device("cpu"))
    clean = model.head_on(embeds, mask)

    def f(e):
        with same.replay() if shared else nullcontext():
            return model.head_on(e, mask)

    r_s = adversarial_regularizer(
        f, embeds, clean, "classification", mask, SmartConfig(sigma=eps, eta=100 * eps, epsilon=eps)
    )
    return r_s.item()


def test_shared_masks_make_r_s_vanish_with_epsilon_and_grow_with_it():
    r = {eps: smoothness(eps, shared=True) for eps in (1e-8, 1e-5, 1e-4, 1e-3)}
    assert r[1e-8] < 1e-12  # no perturbation, no divergence: dropout no longer counts
    assert r[1e-5] < r[1e-4] < r[1e-3]
    assert 30 < r[1e-4] / r[1e-5] < 300  # ~quadratic in a small radius


def test_independent_masks_measure_dropout_instead():
    r = {eps: smoothness(eps, shared=False) for eps in (1e-8, 1e-5)}
    # the thesis's R_s: dropout noise, the same whatever the perturbation, and ~1e5 times
    # what a radius of 1e-5 causes with the clean pass's masks
    assert r[1e-5] == pytest.approx(r[1e-8], rel=0.01)
    assert r[1e-5] > 1e4 * smoothness(1e-5, shared=True)


def test_replay_draws_the_same_masks_and_leaves_the_generator_alone():
    torch.manual_seed(5)
    same = SameDropout(torch.device("cpu"))
    first = torch.nn.functional.dropout(torch.ones(1000), 0.5)
    after = torch.get_rng_state()
    with same.replay():
        again = torch.nn.functional.dropout(torch.ones(1000), 0.5)
    assert torch.equal(first, again)
    assert torch.equal(torch.get_rng_state(), after)  # the global stream goes on untouched


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_the_reference_variant_in_training_is_smart_perturbation_step_for_step(tiny_env, task):
    """In train mode, with one generator for both: R_s of --smart_variant reference, as a
    training step computes it (losses.smart_term), against mt-dnn's SmartPerturbation
    transcribed, which runs the embedding again (its own dropout mask) before the noise:
    the value and every parameter's gradient."""
    import runtime
    from helpers import first_batch, tiny_model_and_data
    from trainer import StepContext

    model, task_data = tiny_model_and_data(tiny_env)
    model.train()
    batch, kind = first_batch(task_data, task, 4), TASKS[task].kind
    cfg = SmartConfig(
        sigma=1e-3, eta=1e-3, lambda_s=1.0, mu=0.0, dropout="independent", variant="reference"
    )
    ctx = StepContext(runtime.make_runtime("cpu", "fp32"))

    def pairs(out):  # mt-dnn's heads give a binary task two logits: (0, x)
        out = out.float()
        return torch.stack([torch.zeros_like(out), out], -1) if kind == "binary" else out

    def ours():
        embeds = model.embed(batch)
        out = model.readout(task, batch, model.sentences(batch, embeds))
        return losses.smart_term(model, task, cfg, batch, embeds, out, ctx, None)

    def theirs():
        clean = pairs(model(task, batch))  # the clean pass
        embed = model.embed(batch)  # SmartPerturbation's own embedding forward
        f = lambda e: pairs(model(task, batch, e))  # noqa: E731
        return mtdnn_smart.smart_r_s(f, embed, clean, kind == "regression", 1e-3, 1e-3)

    params = [p for p in model.parameters() if p.requires_grad]
    results = []
    for compute in (ours, theirs):
        torch.manual_seed(7)
        value = compute()
        grads = torch.autograd.grad(value, params, allow_unused=True, materialize_grads=True)
        results.append((value.item(), grads))
    (a, ga), (b, gb) = results
    assert a == pytest.approx(b, abs=1e-7) and a > 0
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_the_reference_ascent_runs_in_float32_under_float16_only():
    """Its gradient is added to the noise unnormalized, and float16's backward runs in the
    forward's dtype: under fp16 its passes run in float32; bf16 (float32's range) keeps
    them, as does the paper's ascent with own masks (it normalizes adv by its value)."""
    reference = SmartConfig(dropout="independent", variant="reference")
    assert passes_in_float32(reference, torch.float16)
    assert not passes_in_float32(reference, torch.bfloat16)
    assert not passes_in_float32(SmartConfig(dropout="independent"), torch.float16)
