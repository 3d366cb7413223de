"""The update's tools in one training step (tiny BERT): PCGrad's surgery, micro-batches, clipping,
the heads' own learning rate, warmup and decay, L2-SP, distillation."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

import sbert
import simcse
import trainer
from base_bert import hf_to_ours
from bert import BertModel
from engine import runtime
from helpers import (
    batch_loss,
    first_batch,
    gradient_of_one_step,
    pair_batch,
    run,
    sentence_batch,
    tiny_model_and_data,
    weights,
)
from optimizer import flatten_grads, pcgrad, pcgrad_backward
from presets import Stage
from settings import OptimConfig
from trainer import StepContext


def test_pcgrad_applies_the_surgery_to_the_shared_encoder(tiny_config):
    torch.manual_seed(0)
    model = sbert.SentenceBERT(BertModel(tiny_config), dropout=0.0).train()
    for m in model.modules():  # deterministic forwards so both computations see one graph
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    rt = runtime.make_runtime("cpu", "fp32")
    stage = Stage(("sst",), 1e-5, 3)  # SMART off, the default losses
    batches = {"sst": sentence_batch(), "para": pair_batch(), "sts": pair_batch(seed=3)}
    batches["sst"]["labels"] = torch.tensor([0, 4, 2])
    batches["para"]["labels"] = torch.tensor([1.0, 0.0, 1.0])
    batches["sts"]["labels"] = torch.tensor([4.5, 0.5, 2.0])
    shared = list(model.bert.parameters())

    def task_losses():
        ctx = StepContext(rt)
        return [batch_loss(model, t, b, stage, ctx) for t, b in batches.items()]

    grads = []  # the reference: each task's encoder gradient alone, then PCGrad by hand
    for loss in task_losses():
        model.zero_grad(set_to_none=True)
        loss.backward()
        grads.append(flatten_grads(shared))
    expected = pcgrad(grads, torch.Generator().manual_seed(7))
    conflicts = sum(float(grads[i] @ grads[j]) < 0 for i in range(3) for j in range(i))
    assert conflicts > 0  # otherwise the surgery would be a plain sum

    model.zero_grad(set_to_none=True)
    pcgrad_backward(shared, task_losses(), rt.scaler, torch.Generator().manual_seed(7))
    assert torch.allclose(flatten_grads(shared), expected, atol=1e-6)
    head = model.heads["sst"].weight.grad.clone()
    model.zero_grad(set_to_none=True)
    task_losses()[0].backward()
    assert torch.allclose(head, model.heads["sst"].weight.grad, atol=1e-7)  # own task only


def test_accumulated_micro_batches_give_the_whole_batch_gradient(tiny_env):
    loss, whole, _ = gradient_of_one_step(tiny_env, OptimConfig(lr=0.0))
    for parts in (2, 3, 7):  # 7 = 3 + 3 + 1 for 3 parts: a short last micro-batch
        micro_loss, micro, _ = gradient_of_one_step(tiny_env, OptimConfig(lr=0.0, accumulate=parts))
        assert micro_loss == pytest.approx(loss, rel=1e-6) and micro.keys() == whole.keys()
        # float32 sums in another order: 1e-6 of the largest gradient entry (the key bias's
        # gradient is 0 up to rounding, so no tolerance of its own would do)
        atol = 1e-6 * max(g.abs().max().item() for g in whole.values())
        for name, g in whole.items():
            torch.testing.assert_close(micro[name], g, rtol=1e-5, atol=atol, msg=name)


def test_the_step_log_keeps_the_norm_before_clipping(tiny_env, tmp_path):
    run(tiny_env, tmp_path / "run", "--max_grad_norm", "1e-4")
    steps = [json.loads(x) for x in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert steps and all(s["clipped"] and s["grad_norm"] > 1e-3 for s in steps)


def test_clipping_scales_the_gradient_to_the_norm_and_reports_the_norm_before(tiny_env):
    _, free, reported = gradient_of_one_step(tiny_env, OptimConfig(lr=0.0))
    norm = math.sqrt(sum(g.double().pow(2).sum().item() for g in free.values()))  # by hand
    assert reported == pytest.approx(norm, rel=1e-6)
    cut = OptimConfig(lr=0.0, max_grad_norm=norm / 4)
    _, clipped, reported = gradient_of_one_step(tiny_env, cut)
    assert reported == pytest.approx(norm, rel=1e-6)  # what was cut, not the cut
    atol = 1e-6 * max(g.abs().max().item() for g in free.values())
    for name, g in free.items():
        torch.testing.assert_close(clipped[name], g / 4, rtol=1e-5, atol=atol, msg=name)


def test_heads_get_their_own_learning_rate(tiny_env):
    model, _ = tiny_model_and_data(tiny_env)
    optimizer = model.configure_optimizers(OptimConfig(head_lr_scale=20))
    encoder, heads = (g["params"] for g in optimizer.param_groups)
    assert {id(p) for p in encoder} == {id(p) for p in model.bert.parameters()}
    assert {id(p) for p in encoder + heads} == {id(p) for p in model.parameters()}
    trainer.set_lr(optimizer, Stage(("sst",), 2e-5, 8), 0.5)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([1e-5, 2e-4])
    frozen = Stage(("sst",), 1e-3, 8, freeze_encoder=True)  # its lr is the heads'
    trainer.set_lr(optimizer, frozen)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([1e-3, 1e-3])


def test_the_step_log_follows_warmup_and_linear_decay(tiny_env, tmp_path):
    run(tiny_env, tmp_path / "run", "--warmup", "0.5", "--decay", "linear")
    steps = [json.loads(x) for x in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    for stage in {s["stage"] for s in steps}:
        lrs = [s["lr"] for s in steps if s["stage"] == stage]
        n, w = len(lrs), round(0.5 * len(lrs))
        expected = [
            1e-3 * (i / w if i <= w else 1 - (i - w) / (n - w + 1)) for i in range(1, n + 1)
        ]
        assert lrs == pytest.approx(expected), stage


def test_l2sp_keeps_the_encoder_near_its_pretrained_weights(tiny_env, tmp_path):
    start = load_file(tiny_env[0] / "model.safetensors")

    def drift(*flags):
        run(tiny_env, tmp_path / "-".join(flags or ("plain",)), *flags)
        trained = weights(tmp_path / "-".join(flags or ("plain",)) / "state.safetensors")
        sq = [(trained[f"bert.{hf_to_ours(k)}"] - v).pow(2).sum() for k, v in start.items()]
        return torch.stack(sq).sum().sqrt().item()

    assert drift("--l2sp", "1000") < 0.5 * drift()


def test_distillation_keeps_the_batch_cosines_of_the_untouched_encoder(tiny_env):
    def drift(distill):
        model, task_data = tiny_model_and_data(tiny_env)
        reference = trainer.frozen_copy(model)
        optim = OptimConfig(lr=1e-2, distill=distill)  # 8 steps that move the cosines far
        optimizer = model.configure_optimizers(optim)
        stage = Stage(("sst",), 1e-2, 16)
        batch = first_batch(task_data, "sst", 16)
        rt = runtime.make_runtime("cpu", "fp32")
        for seed in range(8):
            model.train()
            generator = torch.Generator().manual_seed(seed)
            step = [("sst", batch)]
            ctx = StepContext(rt, optim, reference=reference)
            trainer.train_step(model, optimizer, stage, step, ctx, generator)
        model.eval()
        with torch.no_grad():
            return simcse.similarity_distillation(
                model.sentences(batch), reference.sentences(batch)
            ).item()

    assert drift(0.0) > 0.1 and drift(100.0) < 0.01 * drift(0.0)
