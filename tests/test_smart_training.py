"""SMART in training (smart.py): the momentum teacher, the loss a step takes with both terms,
the dropout masks its passes share or draw, and the reference variant step for step against
mt-dnn's SmartPerturbation on the tiny BERT."""

from contextlib import nullcontext

import pytest
import torch
from torch import nn

import mtdnn_smart
from evaluation import TASKS
from smart import (
    EMATeacher,
    RngSnapshot,
    SmartConfig,
    adversarial_regularizer,
    beta_schedule,
    bregman_divergence,
    passes_in_float32,
    smart_loss,
)
from smart_models import TOL, TinyClassifier, batch


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
    name = "bert.bert_layers.0.self_attention.query.weight"
    assert not torch.equal(teacher.params[name], before[name])
    for n, p in model.named_parameters():
        assert torch.allclose(teacher.params[n], 0.99 * before[n] + 0.01 * p.detach(), atol=TOL)


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
        "bert.word_embedding.weight",
        "bert.bert_layers.0.self_attention.query.weight",
        "bert.bert_layers.1.out_dense.weight",
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


def smoothness(eps: float, shared: bool, seed: int = 0) -> float:
    """R_s of TinyClassifier in train mode (dropout 0.3) at radius eps (sigma = eps, ascent
    step 100 eps as the paper's ratio), with the clean pass's dropout masks or new ones."""
    model = TinyClassifier(dropout=0.3).train()
    ids, mask = batch()
    torch.manual_seed(seed)
    embeds = model.bert.embed(ids)
    same = RngSnapshot(torch.device("cpu"))
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
    same = RngSnapshot(torch.device("cpu"))
    first = torch.nn.functional.dropout(torch.ones(1000), 0.5)
    after = torch.get_rng_state()
    with same.replay():
        again = torch.nn.functional.dropout(torch.ones(1000), 0.5)
    assert torch.equal(first, again)
    assert torch.equal(torch.get_rng_state(), after)  # the global stream goes on untouched


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_the_reference_variant_in_training_is_smart_perturbation_step_for_step(tiny_env, task):
    """In train mode, with one generator for both: R_s of --smart_variant reference, as a
    training step computes it (trainer.smart_term), against mt-dnn's SmartPerturbation
    transcribed, which runs the embedding again (its own dropout mask) before the noise:
    the value and every parameter's gradient."""
    import trainer
    from engine import runtime
    from helpers import first_batch, tiny_model_and_data
    from presets import Stage
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
        draws = RngSnapshot(ctx.rt.device)
        embeds = model.embed(batch)
        out = model.readout(task, batch, model.sentences(batch, embeds))
        stage = Stage((task,), 1e-5, 4, smart=cfg)
        return trainer.smart_term(
            model, stage, trainer.Clean(task, batch, None, embeds, out, draws), ctx
        )

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
