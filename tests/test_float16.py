"""float16 with a gradient scaler, a T4's path, run on the CPU: the gradient unscaled before
accumulation, clipping and PCGrad; an overflow skipped; SMART under it; resume with the scaler."""

import json

import pytest
import torch

import sbert
import trainer
from bert import BertModel
from commands import command
from engine import checkpoint, runtime
from helpers import (
    assert_same_run,
    batch_loss,
    first_batch,
    gradient_of_one_step,
    pair_batch,
    run,
    sentence_batch,
    sigterm_on_call,
    tiny_model_and_data,
)
from optimizer import flatten_grads, pcgrad_backward
from presets import Stage
from settings import OptimConfig
from smart import EMATeacher, SmartConfig
from trainer import StepContext


def relative_gap(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over every gradient of the two steps."""
    diff = torch.stack([(a[k] - b[k]).norm() for k in b])
    return (
        torch.linalg.vector_norm(diff) / torch.stack([g.norm() for g in b.values()]).norm()
    ).item()


@pytest.mark.parametrize("weighting", ["random", "pcgrad"])
def test_a_float16_step_leaves_the_float32_gradient_unscaled(tiny_env, weighting):
    loss32, g32, _ = gradient_of_one_step(tiny_env, OptimConfig(lr=0.0), weighting)
    loss16, g16, _ = gradient_of_one_step(tiny_env, OptimConfig(lr=0.0), weighting, "fp16")
    assert loss16 == pytest.approx(loss32, rel=1e-2) and g16.keys() == g32.keys()
    assert relative_gap(g16, g32) < 2e-2  # float16's ~1e-3 rounding, not the scale 65536


def test_float16_accumulation_and_clipping_see_the_unscaled_gradient(tiny_env):
    _, whole, _ = gradient_of_one_step(tiny_env, OptimConfig(lr=0.0), precision="fp16")
    _, micro, _ = gradient_of_one_step(
        tiny_env, OptimConfig(lr=0.0, accumulate=3), precision="fp16"
    )
    assert relative_gap(micro, whole) < 2e-2
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in whole.values()])).item()
    clipped = OptimConfig(lr=0.0, max_grad_norm=norm / 4)  # clipped after unscaling
    _, g, _ = gradient_of_one_step(tiny_env, clipped, precision="fp16")
    total = torch.linalg.vector_norm(torch.stack([x.norm() for x in g.values()])).item()
    assert total == pytest.approx(norm / 4, rel=1e-3)


def test_an_overflowing_float16_step_is_skipped_and_the_scale_falls(tiny_env):
    model, task_data = tiny_model_and_data(tiny_env)
    rt = runtime.make_runtime("cpu", "fp16")
    rt.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)  # scaled gradients overflow
    optimizer = model.configure_optimizers(OptimConfig(lr=1e-3))
    stage, step = Stage(("sst",), 1e-3, 8), [("sst", first_batch(task_data, "sst", 8))]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loss, _ = trainer.train_step(model, optimizer, stage, step, StepContext(rt), torch.Generator())
    assert torch.isfinite(loss) and rt.scaler.get_scale() == 2.0**39  # halved, not stopped
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # skipped
    for _ in range(40):  # the run goes on: the scale falls until steps fit, then they train
        trainer.train_step(model, optimizer, stage, step, StepContext(rt), torch.Generator())
    assert rt.scaler.get_scale() < 2.0**20
    assert any(not torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_pcgrad_under_a_scaler_is_the_surgery_scaled(tiny_config):
    torch.manual_seed(0)
    model = sbert.SentenceBERT(BertModel(tiny_config), dropout=0.0).eval()
    batches = {"sst": sentence_batch(), "para": pair_batch(), "sts": pair_batch(seed=3)}
    batches["sst"]["labels"] = torch.tensor([0, 4, 2])
    batches["para"]["labels"] = torch.tensor([1.0, 0.0, 1.0])
    batches["sts"]["labels"] = torch.tensor([4.5, 0.5, 2.0])
    shared, stage = list(model.bert.parameters()), Stage(("sst",), 1e-5, 3)
    ctx = StepContext(runtime.make_runtime("cpu", "fp32"))

    def surgery(scaler):
        task_losses = [batch_loss(model, t, b, stage, ctx) for t, b in batches.items()]
        model.zero_grad(set_to_none=True)
        pcgrad_backward(shared, task_losses, scaler, torch.Generator().manual_seed(7))
        return flatten_grads(shared)

    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    plain = torch.amp.GradScaler("cpu", enabled=False)  # float32's and bfloat16's
    torch.testing.assert_close(surgery(scaler) / 1024, surgery(plain), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("dropout", ["shared", "independent"])
def test_smart_and_its_teacher_train_under_float16(tiny_env, dropout):
    model, task_data = tiny_model_and_data(tiny_env)
    rt = runtime.make_runtime("cpu", "fp16")
    smart = SmartConfig(lambda_s=10.0, mu=1.0, dropout=dropout)
    stage = Stage(("sst",), 1e-3, 8, smart=smart)
    optimizer = model.configure_optimizers(OptimConfig(lr=1e-3))
    ctx = StepContext(rt, teacher=EMATeacher(model, smart, 8))
    before = [p.detach().clone() for p in model.parameters()]
    batch = [("sst", first_batch(task_data, "sst", 8))]
    for _ in range(8):  # each pass draws its own dropout masks: eight different steps
        loss, _ = trainer.train_step(model, optimizer, stage, batch, ctx, torch.Generator())
        assert torch.isfinite(loss)
    # shared masks: float32 passes, no overflow; own masks: fp16 passes, whose gradient at
    # the scaler's first scale of 2^16 overflows once (the third step) before it settles
    assert rt.scaler.get_scale() == 65536.0 / (1 if dropout == "shared" else 2)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_a_float16_run_resumes_with_its_scaler_state(tiny_env, tmp_path, monkeypatch):
    real = torch.amp.GradScaler  # a high first scale: early steps overflow, the scale falls
    monkeypatch.setattr(
        torch.amp, "GradScaler", lambda *a, **k: real(*a, **(k | {"init_scale": 2.0**30}))
    )
    straight = run(tiny_env, tmp_path / "straight", "--precision", "fp16")
    with monkeypatch.context() as m:
        sigterm_on_call(m, trainer, "train_step", 8)
        with pytest.raises(SystemExit):
            run(tiny_env, tmp_path / "resumed", "--precision", "fp16")
    saved = checkpoint.read_tensors(tmp_path / "resumed" / checkpoint.STATE)[1]["scaler"]
    assert saved["scale"] < 2.0**30  # a fresh scaler would start elsewhere: this can fail
    command.main(["--resume", str(tmp_path / "resumed")])
    assert_same_run(straight, tmp_path / "straight", tmp_path / "resumed")


def test_a_step_the_scaler_skipped_is_logged_skipped_not_clipped(tiny_env, tmp_path, monkeypatch):
    """fp16 with a scale so large that the first steps overflow, and a --max_grad_norm any
    finite gradient exceeds: the overflow steps are 'skipped' and not 'clipped'."""
    real = torch.amp.GradScaler
    monkeypatch.setattr(
        torch.amp, "GradScaler", lambda *a, **k: real(*a, **(k | {"init_scale": 2.0**40}))
    )
    run(tiny_env, tmp_path / "run", "--precision", "fp16", "--max_grad_norm", "1e-9")
    lines = (tmp_path / "run" / "steps.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in lines]
    skipped = [s for s in steps if s["skipped"]]
    assert skipped and not any(s["clipped"] for s in skipped)
    assert all(s["clipped"] for s in steps if not s["skipped"])  # the finite ones were
