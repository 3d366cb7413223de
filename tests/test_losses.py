"""The loss of one batch (losses.py): the task-loss tables against loops and hand-made
inputs, SMART's term as the step builds it, the distillation and SimCSE terms."""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import evaluation
import losses
import sbert
import settings
import simcse
import smart
import trainer
from base_bert import BertConfig
from bert import BertModel
from engine import runtime
from helpers import batch_loss, first_batch, sentence_batch, tiny_model_and_data, two_sets
from presets import Stage
from settings import OptimConfig, SimCSEConfig
from smart import EMATeacher, RngSnapshot, SmartConfig
from trainer import StepContext


def smart_value(model, batch, cfg, rt, teacher=None, task="sst"):
    """trainer.smart_term on one batch, its passes set up as train_step sets them up."""
    torch.manual_seed(0)
    stage = Stage((task,), 1e-5, 8, smart=cfg)
    with rt.autocast(float32=trainer.added_terms(stage, OptimConfig(), rt)[task].float32):
        draws = RngSnapshot(rt.device)
        embeds = model.embed(batch)
        out = model(task, batch, embeds)
        ctx = StepContext(rt, teacher=teacher)
        clean = trainer.Clean(task, batch, None, embeds, out, draws)
        return trainer.smart_term(model, stage, clean, ctx).item()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_r_s_responds_to_the_perturbation_under_autocast(tiny_env, precision):
    """bf16 resolves ~8e-3, fp16 ~1e-3: with shared masks R_s measures the perturbation
    alone, so its passes run in float32 and a 1e-5 perturbation is not rounded away."""
    model, task_data = tiny_model_and_data(tiny_env)
    model.train()
    batch = first_batch(task_data, "sst", 8)
    rt = runtime.make_runtime("cpu", precision)

    def r_s(eps, dropout="shared"):
        cfg = SmartConfig(lambda_s=1, mu=0, sigma=eps, eta=100 * eps, epsilon=eps, dropout=dropout)
        return smart_value(model, batch, cfg, rt)

    r = {eps: r_s(eps) for eps in (1e-9, 1e-5, 1e-4)}
    assert r[1e-9] < 1e-3 * r[1e-5]
    assert 30 < r[1e-4] / r[1e-5] < 300  # ~quadratic, as in float32
    assert r_s(1e-9, "independent") > 1e3 * r[1e-5]  # R-Drop: its own dropout noise


@pytest.mark.parametrize(
    ("precision", "variant"), [("bf16", "paper"), ("bf16", "reference"), ("fp16", "paper")]
)
def test_own_masks_keep_the_step_precision_and_what_r_s_measures(tiny_env, precision, variant):
    """With own masks R_s is dropout's difference (the paper's ascent) or a perturbation near
    1 per token (the reference's): both well above bf16's resolution, so the passes keep
    the step's precision, and R_s is float32's to a percent (the reference ascent under
    fp16 runs in float32: test_smart.py)."""
    model, task_data = tiny_model_and_data(tiny_env)
    batch = first_batch(task_data, "sst", 8)
    cfg = SmartConfig(lambda_s=1, mu=0, dropout="independent", variant=variant)
    rt = runtime.make_runtime("cpu", precision)
    assert not smart.passes_in_float32(cfg, rt.amp_dtype)
    assert smart.passes_in_float32(replace(cfg, variant="paper", dropout="shared"), rt.amp_dtype)
    model.train(variant == "paper")  # the reference's R_s without dropout: its perturbation's
    r = {
        p: smart_value(model, batch, cfg, runtime.make_runtime("cpu", p))
        for p in ("fp32", precision)
    }
    assert r["fp32"] > 1e-4
    assert r[precision] != r["fp32"]  # the passes did run at the step's precision
    assert r[precision] == pytest.approx(r["fp32"], rel=0.01)  # 0.2% on this model


def test_a_float32_smart_step_under_autocast_runs_each_pass_once(tiny_env):
    """Where SMART's passes need float32 (shared masks under bf16), the clean pass runs in
    float32 too and serves the task loss, R_s and D_Breg: four encoder passes (clean,
    ascent, perturbed, teacher), no bf16 clean pass beside a float32 one, and the
    gradients of a float32 step."""
    model, task_data = tiny_model_and_data(tiny_env)
    model.train()
    batch = first_batch(task_data, "sst", 8)
    stage = Stage(("sst",), 1e-5, 8, smart=SmartConfig(lambda_s=10, mu=1))
    teacher = EMATeacher(model)
    for p in teacher.params.values():  # a teacher some steps behind: D_Breg is not 0
        p.add_(1e-3 * torch.randn_like(p))
    passes, grads = [], {}
    layer = model.bert.bert_layers[0]
    hook = layer.register_forward_hook(lambda *_: passes.append(torch.is_autocast_enabled("cpu")))
    for precision in ("fp32", "bf16"):
        passes.clear()
        model.zero_grad()
        torch.manual_seed(1)  # the same dropout masks in both steps
        ctx = StepContext(runtime.make_runtime("cpu", precision), teacher=teacher)
        batch_loss(model, "sst", batch, stage, ctx).backward()
        grads[precision] = torch.cat(
            [p.grad.flatten() for p in model.parameters() if p.grad is not None]
        )
        assert passes == [False] * 4
    hook.remove()
    assert grads["fp32"].abs().max() > 0
    torch.testing.assert_close(grads["bf16"], grads["fp32"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("dropout", ["shared", "independent"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_teacher_equal_to_the_model_agrees_with_it_under_autocast(tiny_env, precision, dropout):
    """D_Breg compares the teacher's pass with the clean one: both in one precision, so a
    teacher with the model's own weights gives 0 (with own masks: without dropout)."""
    model, task_data = tiny_model_and_data(tiny_env)
    model.train(dropout == "shared")
    batch = first_batch(task_data, "sst", 8)
    rt = runtime.make_runtime("cpu", precision)
    cfg = SmartConfig(lambda_s=0, mu=1, dropout=dropout)
    assert smart_value(model, batch, cfg, rt, EMATeacher(model)) < 1e-12


def test_the_teacher_pass_shares_the_clean_pass_dropout(tiny_env):
    model, task_data = tiny_model_and_data(tiny_env)
    model.train()
    batch = first_batch(task_data, "sst", 8)
    rt = runtime.make_runtime("cpu", "fp32")
    teacher = EMATeacher(model)  # the model's own weights: only dropout can differ
    bregman = {
        d: smart_value(model, batch, SmartConfig(lambda_s=0, mu=1, dropout=d), rt, teacher)
        for d in ("shared", "independent")
    }
    assert bregman["shared"] < 1e-12 and bregman["independent"] > 1e-6


def cos_of(u: list[float], v: list[float]) -> float:
    dot = sum(a * b for a, b in zip(u, v, strict=True))
    return dot / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))


def test_distillation_adds_the_gap_between_the_batch_cosines_and_the_reference(tiny_env):
    model, task_data = tiny_model_and_data(tiny_env)
    reference = trainer.frozen_copy(model)
    with torch.no_grad():  # the model moves away; its frozen copy must not follow
        for p in model.bert.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.eval()  # no dropout: the same sentence embeddings in every pass
    rt = runtime.make_runtime("cpu", "fp32")
    stage = Stage(("sst",), 1e-5, 6)  # SMART off, the default losses
    pull = StepContext(rt, OptimConfig(distill=2.0), reference=reference)
    for task in ("sst", "para"):  # one sentence per example; two (2B sentences)
        batch = first_batch(task_data, task, 6)
        plain = batch_loss(model, task, batch, stage, StepContext(rt))
        pulled = batch_loss(model, task, batch, stage, pull)
        with torch.no_grad():  # each example's first sentence (a pair's: side 0)
            first = {k: v[0] if v.dim() == 3 else v for k, v in batch.items() if k != "ids"}
            z, z0 = model.sentences(first).tolist(), reference.sentences(first).tolist()
        gaps = [
            (cos_of(z[i], z[j]) - cos_of(z0[i], z0[j])) ** 2
            for i in range(len(z))
            for j in range(len(z))
            if i != j
        ]
        assert len(z) == 6
        assert sum(gaps) > 1e-6  # the perturbed model's cosines did move
        assert (pulled - plain).item() == pytest.approx(2.0 * sum(gaps) / len(gaps), rel=1e-4)
    assert not any(p.requires_grad for p in reference.parameters())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_distillation_rests_at_the_loaded_weights_with_dropout_on(tiny_env, precision):
    """At step 0 the model is its frozen copy: with dropout on and SMART's passes too, the
    term adds nothing and its gradient is 0 (an eval-mode copy made it pull at once)."""
    model, task_data = tiny_model_and_data(tiny_env)
    model.train()
    rt = runtime.make_runtime("cpu", precision)
    pull = StepContext(rt, OptimConfig(distill=30.0), reference=trainer.frozen_copy(model))
    smart = SmartConfig(lambda_s=1.0, mu=0.0)
    for task, stage_losses, smart_cfg in [
        ("sst", {}, SmartConfig.off()),
        ("para", {}, smart),
        ("sts", {"sts": "cosine_mse"}, SmartConfig.off()),  # a pair loss, no head
    ]:
        stage = Stage((task,), 1e-5, 8, losses=stage_losses, smart=smart_cfg)
        encoder = list(model.bert.parameters())
        batch = first_batch(task_data, task, 8)
        grads = []
        for ctx in (StepContext(rt), pull):
            model.zero_grad()
            torch.manual_seed(1)  # the same dropout masks in both steps
            loss = batch_loss(model, task, batch, stage, ctx)
            loss.backward()
            grads.append(torch.cat([p.grad.flatten() for p in encoder if p.grad is not None]))
        assert grads[0].abs().sum() > 0  # the task's own gradient reaches the encoder
        torch.testing.assert_close(grads[1], grads[0], atol=1e-12, rtol=0)
    with torch.no_grad():  # once the encoder moves, the same term pulls
        for p in model.bert.parameters():
            p.add_(0.05 * torch.randn_like(p))
    stage = Stage(("sst",), 1e-5, 8)
    batch = first_batch(task_data, "sst", 8)
    torch.manual_seed(1)
    plain = batch_loss(model, "sst", batch, stage, StepContext(rt)).item()
    torch.manual_seed(1)
    assert batch_loss(model, "sst", batch, stage, pull).item() > plain + 1e-4


def test_task_losses_on_hand_made_inputs():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    labels = torch.tensor([0, 2])
    p0 = math.exp(2) / (math.exp(2) + 1 + math.exp(-1))
    expected = (-math.log(p0) - math.log(1 / 3)) / 2
    assert losses.loss_of("sst", "ce").fn(logits, labels).item() == pytest.approx(expected, 1e-6)
    logit, y = torch.tensor([0.0, 2.0, -1.0]), torch.tensor([1.0, 0.0, 0.0])
    sig = [0.5, 1 / (1 + math.exp(-2)), 1 / (1 + math.exp(1))]
    bce = -(math.log(sig[0]) + math.log(1 - sig[1]) + math.log(1 - sig[2])) / 3
    assert losses.loss_of("para", "bce").fn(logit, y).item() == pytest.approx(bce, 1e-6)
    score, target = torch.tensor([1.0, 4.0, 2.5]), torch.tensor([0.0, 5.0, 2.5])
    assert losses.loss_of("sts", "mse").fn(score, target).item() == pytest.approx(2 / 3, 1e-6)


def test_the_loss_table_drives_flags_heads_and_checks():
    """Every task has a table; --para_loss / --sts_loss, the cosine read-out and the in-batch
    checks are read from it, so a new entry reaches them all."""
    from settings import MultitaskConfig

    assert set(losses.TASK_LOSSES) == set(evaluation.TASKS)
    for task in ("para", "sts"):
        meta = MultitaskConfig.__dataclass_fields__[f"{task}_loss"].metadata
        assert meta["choices"] == tuple(losses.TASK_LOSSES[task])
        assert meta["help"] == settings.loss_help(task)
        for name, loss in losses.TASK_LOSSES[task].items():
            assert f"{name} ({loss.help})" in settings.loss_help(task)
    cosine = {n for n, x in losses.TASK_LOSSES["sts"].items() if x.cosine}
    assert cosine == {"cosine_mse", "cosine_sbert", "mnrl"}
    assert losses.loss_of("para", "mnrl").in_batch and not losses.loss_of("para", None).in_batch
    assert losses.loss_of("sts", None) is losses.TASK_LOSSES["sts"]["mse"]


def test_sbert_target_is_the_cosine_against_score_over_5():
    cos = torch.tensor([0.9, 0.1, -0.3, 0.5])
    scores = torch.tensor([4.5, 0.0, 1.0, 2.5])
    out = cos * 2.5 + 2.5  # what the STS head returns
    naive = sum((c - y / 5) ** 2 for c, y in zip(cos.tolist(), scores.tolist(), strict=True)) / 4
    assert losses.loss_of("sts", "cosine_sbert").fn(out, scores).item() == pytest.approx(naive)


def test_auslins_distance_margin_matches_a_loop():
    u, v = two_sets()
    labels = torch.tensor([1, 0, 1, 0, 0])
    d = simcse.euclidean_distance(u, v)
    expected = [math.dist(a, b) for a, b in zip(u.tolist(), v.tolist(), strict=True)]
    assert d.tolist() == pytest.approx(expected, rel=1e-5)
    report = 0.0  # Auslin et al.'s formula as printed, on d: y = 1 pays the margin term
    for dist, y in zip(expected, labels.tolist(), strict=True):
        report += 0.5 * (max(0.0, 0.5 - dist) ** 2 if y == 1 else dist * dist)
    got = losses.loss_of("para", "distance_margin").fn(u, v, labels, "binary")
    assert got.item() == pytest.approx(report / 5, rel=1e-5)
    near = losses.loss_of("para", "distance_margin").fn(u, u + 0.01, torch.ones(5), "binary")
    assert near.item() > 0  # close paraphrases are pushed past the margin
    same = u.clone().requires_grad_()
    losses.loss_of("para", "distance_margin").fn(same, u, torch.ones(5), "binary").backward()
    assert torch.isfinite(same.grad).all()  # d = 0 has a finite gradient


def test_sigmoid_losses_match_loops():
    out = torch.tensor([-2.0, -0.1, 0.3, 3.0])
    y = torch.tensor([0, 1, 1, 0])
    p = [1 / (1 + math.exp(-x)) for x in out.tolist()]
    mse = sum((a - b) ** 2 for a, b in zip(p, y.tolist(), strict=True)) / 4
    l1 = sum(abs(a - b) for a, b in zip(p, y.tolist(), strict=True)) / 4
    margin = (
        sum(
            0.5 * (a * a if b == 0 else max(0.0, 0.5 - a) ** 2)
            for a, b in zip(p, y.tolist(), strict=True)
        )
        / 4
    )
    table = {name: loss.fn for name, loss in losses.TASK_LOSSES["para"].items()}
    assert table["sigmoid_mse"](out, y).item() == pytest.approx(mse, rel=1e-6)
    assert table["sigmoid_l1"](out, y).item() == pytest.approx(l1, rel=1e-6)
    assert table["sigmoid_margin"](out, y).item() == pytest.approx(margin, rel=1e-6)
    # a paraphrase past the margin and a non-paraphrase far below pay (almost) nothing
    assert table["sigmoid_margin"](torch.tensor([4.0, -9.0]), torch.tensor([1, 0])) < 1e-4


def test_cosine_mse_targets_follow_the_task():
    u, v = two_sets(1)
    cos = F.cosine_similarity(u, v, dim=-1).tolist()
    y = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0])
    loss = losses.loss_of("para", "cosine_mse").fn
    binary = sum((c - t) ** 2 for c, t in zip(cos, y.tolist(), strict=True)) / 5
    assert loss(u, v, y, "binary").item() == pytest.approx(binary, rel=1e-5)
    scores = torch.tensor([0.0, 2.5, 5.0, 1.0, 4.0])
    target = [s / 2.5 - 1 for s in scores.tolist()]  # 0-5 to [-1, 1]
    regression = sum((c - t) ** 2 for c, t in zip(cos, target, strict=True)) / 5
    assert loss(u, v, scores, "regression").item() == pytest.approx(regression, rel=1e-5)


def test_a_simcse_term_adds_the_weighted_loss_of_two_dropout_views(tiny_config):
    torch.manual_seed(0)
    quiet = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    bert = BertModel(BertConfig(**tiny_config.to_dict() | quiet))  # two equal views
    model = sbert.SentenceBERT(bert, dropout=0.0).train()
    rt = runtime.make_runtime("cpu", "fp32")
    term = SimCSEConfig(simcse_weight=0.3)
    plain = Stage(("sst",), 1e-3, 3)
    with_term = Stage(("sst",), 1e-3, 3, contrastive=term)
    batch = sentence_batch() | {"labels": torch.tensor([0, 3, 4])}
    base = batch_loss(model, "sst", batch, plain, StepContext(rt))
    z = model.sentences(batch)
    expected = base + 0.3 * simcse.unsup_simcse_loss(z, z, term.temperature)
    got = batch_loss(model, "sst", batch, with_term, StepContext(rt))
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    assert got.item() > base.item()
