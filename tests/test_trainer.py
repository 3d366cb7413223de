"""The training loop: stages, the step, resume, PCGrad and non-finite losses (tiny BERT)."""

import json
import math
import sys

import pytest
import torch
from safetensors.torch import load_file

import checkpoint
import datasets as data
import evaluation
import losses
import multitask_classifier as mt
import runfolder
import runtime
import simcse
import trainer
from bert import BertModel
from config import DataConfig, MultitaskConfig, OptimConfig
from helpers import (
    assert_same_run,
    embeddings,
    first_batch,
    interrupt_stage,
    pair_batch,
    run,
    sentence_batch,
    sigterm_on_call,
    tiny_flags,
    tiny_model_and_data,
    weights,
)
from optimizer import flatten_grads, pcgrad, pcgrad_backward
from plans import Stage
from smart import EMATeacher, SmartConfig
from tokenizer import BertTokenizer
from trainer import StepContext


def test_resume_after_a_stage_equals_the_uninterrupted_run(tiny_env, tmp_path, monkeypatch):
    straight = run(tiny_env, tmp_path / "straight")
    interrupt_stage(monkeypatch, 3)
    with pytest.raises(SystemExit):  # main stops cleanly on the interrupt
        run(tiny_env, tmp_path / "resumed")
    monkeypatch.undo()
    mt.main(["--resume", str(tmp_path / "resumed")])
    resumed = [
        json.loads(x) for x in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    ][1:]
    drop = ("seconds",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed] == [
        {k: v for k, v in r.items() if k not in drop} for r in straight
    ]
    a = weights(tmp_path / "straight" / "state.safetensors")
    b = weights(tmp_path / "resumed" / "state.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_short_training_lowers_every_task_loss(tiny_env):
    model, task_data = tiny_model_and_data(tiny_env)
    optimizer = model.configure_optimizers(OptimConfig(lr=1e-3))
    rt = runtime.make_runtime("cpu", "fp32")

    def loss_of(task):
        model.eval()
        loader = data.make_loader(task_data[task].train, 64, shuffle=False)
        with torch.no_grad():
            return sum(
                losses.loss_of(task, None).fn(model(task, b), b["labels"]).item() for b in loader
            )

    for task in mt.MULTITASK:
        before = loss_of(task)
        stage = Stage((task,), lr=1e-3, batch_size=8, epochs=5)
        steps = trainer.stage_steps(task_data, stage, torch.Generator().manual_seed(0))
        trainer.train_stage(model, optimizer, stage, steps, StepContext(rt))
        assert loss_of(task) < 0.9 * before, task


def test_nan_loss_stops_with_step_and_task_and_keeps_best(tiny_env, tmp_path, monkeypatch):
    real = losses.loss_of("sst", "ce").fn
    nan = losses.Loss(lambda out, y: real(out, y) * float("nan"), "cross-entropy times nan")
    monkeypatch.setitem(losses.TASK_LOSSES["sst"], "ce", nan)
    with pytest.raises(
        SystemExit,
        match=r"loss is nan at step 1 of stage 'loop 1: SST' \(task sst\).*best.safetensors",
    ):
        run(tiny_env, tmp_path / "run")
    assert (tmp_path / "run" / "best.safetensors").is_file()
    monkeypatch.undo()
    mt.main(["--predict", str(tmp_path / "run")])  # the kept model still gives predictions
    for task in mt.MULTITASK:
        assert (tmp_path / "run" / "predictions" / f"{task}-test-output.csv").is_file()


def test_simcse_stage_keeps_the_epoch_with_the_best_sts(tiny_env, tmp_path, monkeypatch):
    scores = iter([0.5, 0.9, 0.1])  # epoch 2 is best: its weights must be the ones kept
    kept = {}
    real_after = trainer.BestEpoch.after_epoch

    def scripted(self, epoch):
        kept[epoch] = {k: v.cpu().clone() for k, v in self.model.state_dict().items()}
        real = trainer.evaluate_split
        trainer.evaluate_split = lambda *a, **k: {
            "sts": evaluation.TaskResult({"pearson": next(scores)})
        }
        try:
            real_after(self, epoch)
        finally:
            trainer.evaluate_split = real

    monkeypatch.setattr(trainer.BestEpoch, "after_epoch", scripted)
    run(tiny_env, tmp_path / "run", "--preset", "simcse", "--simcse_batch_size", "8")
    final = weights(tmp_path / "run" / "best.safetensors")
    assert all(torch.equal(final[k], kept[1][k]) for k in final)
    assert not all(torch.equal(final[k], kept[2][k]) for k in final)


def test_pcgrad_applies_the_surgery_to_the_shared_encoder(tiny_config):
    torch.manual_seed(0)
    model = mt.MultitaskBERT(BertModel(tiny_config), dropout=0.0).train()
    for m in model.modules():  # deterministic forwards so both computations see one graph
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    for layer in model.bert.encoder["layer"]:
        layer.attention["self"].dropout_p = 0.0
    rt = runtime.make_runtime("cpu", "fp32")
    stage = Stage(("sst",), 1e-5, 3)  # SMART off, the default losses
    batches = {"sst": sentence_batch(), "para": pair_batch(), "sts": pair_batch(seed=3)}
    batches["sst"]["labels"] = torch.tensor([0, 4, 2])
    batches["para"]["labels"] = torch.tensor([1.0, 0.0, 1.0])
    batches["sts"]["labels"] = torch.tensor([4.5, 0.5, 2.0])
    shared = list(model.bert.parameters())

    def task_losses():
        ctx = StepContext(rt)
        return [losses.batch_loss(model, t, b, stage, ctx) for t, b in batches.items()]

    grads = []  # the reference: each task's encoder gradient alone, then PCGrad by hand
    for loss in task_losses():
        model.zero_grad(set_to_none=True)
        loss.backward()
        grads.append(flatten_grads(shared))
    expected = pcgrad(grads, torch.Generator().manual_seed(7))
    conflicts = sum(float(grads[i] @ grads[j]) < 0 for i in range(3) for j in range(i))
    assert conflicts > 0  # otherwise the surgery would be a plain sum

    model.zero_grad(set_to_none=True)
    pcgrad_backward(shared, task_losses(), torch.Generator().manual_seed(7))
    assert torch.allclose(flatten_grads(shared), expected, atol=1e-6)
    head = model.heads["sst"].weight.grad.clone()
    model.zero_grad(set_to_none=True)
    task_losses()[0].backward()
    assert torch.allclose(head, model.heads["sst"].weight.grad, atol=1e-7)  # own task only


def test_the_step_log_has_one_line_per_step_and_survives_a_resume(tiny_env, tmp_path, monkeypatch):
    interrupt_stage(monkeypatch, 3)
    with pytest.raises(SystemExit):
        run(tiny_env, tmp_path / "run")
    monkeypatch.undo()
    with open(tmp_path / "run" / "steps.jsonl", "a") as f:
        f.write('{"stage": 2, "st')  # the last line of a process killed while writing it
    mt.main(["--resume", str(tmp_path / "run")])
    steps = [json.loads(x) for x in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[1:]
    # 48 tiny examples in batches of 8: 6 steps for QQP, STS and SST, 1 for QQP 3%
    assert [(s["stage"], s["step"]) for s in steps] == [
        (k, n + 1) for k, count in enumerate((6, 6, 6, 1)) for n in range(count)
    ]
    assert len(metrics) == 4 and steps[0]["tasks"] == "para" and steps[7]["tasks"] == "sts"
    for s in steps:
        assert s["lr"] == 1e-3 and s["grad_norm"] > 0 and s["examples_per_s"] > 0
        assert s["clipped"] is False  # no --max_grad_norm
    sst = [s["loss"] for s in steps if s["stage"] == 2]
    assert json.loads(metrics[2])["train_loss"] == pytest.approx(sum(sst) / len(sst))


@pytest.mark.parametrize(
    ("kill_at", "flags"),
    [
        (8, ["--preset", "thesis-smart", "--smart_batch_size", "8"]),  # the teacher is restored
        (
            8,
            [
                "--preset",
                "thesis-smart",
                "--smart_batch_size",
                "8",
                "--smart_dropout",
                "shared",
                "--warmup",
                "0.3",
                "--decay",
                "linear",
                "--l2sp",
                "0.5",
                "--head_lr_scale",
                "10",
                "--accumulate",
                "2",
                "--max_grad_norm",
                "1",
            ],
        ),  # every tool of the update
        (4, ["--preset", "multitask", "--multitask_epochs", "1", "--weighting", "random"]),
        (8, ["--precision", "fp16"]),  # the T4's path: the scaler's state is restored too
        (8, ["--preset", "defended", "--distill", "5"]),  # the reference is the loaded model
        (8, ["--preset", "simcse", "--simcse_epochs", "3", "--simcse_batch_size", "8"]),
        (6, ["--preset", "simcse", "--simcse_epochs", "3", "--simcse_batch_size", "8"]),
        # --patience inside a stage of three epochs: its best epoch so far is kept too
        (14, ["--preset", "sequential", "--sequential_epochs", "1", "3", "1", "--patience", "1"]),
    ],
)  # the second stage's 2nd step; step 4 of 6; epoch 2 of SimCSE; the end of its epoch 1
def test_a_stage_killed_midway_resumes_bit_for_bit(tiny_env, tmp_path, monkeypatch, kill_at, flags):
    straight = run(tiny_env, tmp_path / "straight", *flags)
    sigterm_on_call(monkeypatch, trainer, "train_step", kill_at)
    with pytest.raises(SystemExit):  # the run saves and stops
        run(tiny_env, tmp_path / "resumed", *flags)
    monkeypatch.undo()
    mt.main(["--resume", str(tmp_path / "resumed")])
    assert_same_run(straight, tmp_path / "straight", tmp_path / "resumed")
    logged = (tmp_path / "resumed" / "steps.jsonl").read_text().splitlines()
    assert logged and len(logged) == len(
        (tmp_path / "straight" / "steps.jsonl").read_text().splitlines()
    )


class Killed(BaseException):
    """A stop that saves nothing: the VM reset of a Colab session."""


def test_without_stage_checkpoints_a_kill_loses_only_the_steps_after_the_last_one(
    tiny_env, tmp_path, monkeypatch
):
    """--no_stage_checkpoints writes the state and the best model when a checkpoint is due
    and at the end, never after a stage as such; killed mid-stage without a chance to save,
    the run goes on from its last checkpoint and ends as the unbroken run did."""
    straight = run(tiny_env, tmp_path / "straight")
    written = []
    real_write = checkpoint.atomic_write
    monkeypatch.setattr(
        checkpoint,
        "atomic_write",
        lambda data, path: [written.append(path.name), real_write(data, path)],
    )
    monkeypatch.setattr(runfolder.Run, "due", lambda self: False)
    run(tiny_env, tmp_path / "once", "--no_stage_checkpoints")
    assert_same_run(straight, tmp_path / "straight", tmp_path / "once")  # bit for bit
    assert written.count("state.safetensors") == written.count("best.safetensors") == 1

    # 6 steps a stage; `due` is asked after each step and at each stage's end
    calls = iter(range(1, 1000))
    monkeypatch.setattr(runfolder.Run, "due", lambda self: next(calls) == 11)  # stage 2, step 4
    real_step, steps = trainer.train_step, iter(range(1, 1000))

    def killed_step(*args, **kwargs):
        if next(steps) == 12:  # stage 2, step 6: steps 5 and 6 are lost
            raise Killed
        return real_step(*args, **kwargs)

    monkeypatch.setattr(trainer, "train_step", killed_step)
    written.clear()
    with pytest.raises(Killed):
        run(tiny_env, tmp_path / "killed", "--no_stage_checkpoints")
    assert written.count("state.safetensors") == written.count("best.safetensors") == 1
    saved = checkpoint.read_tensors(tmp_path / "killed" / checkpoint.STATE)[1]
    assert (saved["next_stage"], saved["within"]["step"]) == (1, 4)
    monkeypatch.undo()
    mt.main(["--resume", str(tmp_path / "killed")])
    assert_same_run(straight, tmp_path / "straight", tmp_path / "killed")
    a, b = (weights(tmp_path / run_dir / checkpoint.BEST) for run_dir in ("straight", "killed"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "flags",
    [
        ["--preset", "simcse", "--simcse_epochs", "2", "--simcse_batch_size", "8"],
        ["--preset", "thesis-smart", "--smart_batch_size", "8"],
    ],
)
def test_a_stop_during_the_stage_evaluation_keeps_the_trained_stage(
    tiny_env, tmp_path, monkeypatch, flags
):
    straight = run(tiny_env, tmp_path / "straight", *flags)
    sigterm_on_call(monkeypatch, runfolder.Run, "evaluate", 2)  # 1: the start row; 2: stage 1's
    with pytest.raises(SystemExit):
        run(tiny_env, tmp_path / "resumed", *flags)
    monkeypatch.undo()
    steps = (tmp_path / "resumed" / "steps.jsonl").read_text().splitlines()
    assert steps and all(json.loads(x)["stage"] == 0 for x in steps)  # stage 1 was kept
    mt.main(["--resume", str(tmp_path / "resumed")])
    assert_same_run(straight, tmp_path / "straight", tmp_path / "resumed")


# ---------------------------------------------------------------------------------------
# SMART's passes, and the update's tools (issue: a defense against forgetting)


def gradient_of_one_step(tiny_env, optim, weighting="random", precision="fp32"):
    """(loss, gradients, the norm it reports) of one multitask train_step (lr 0, eval mode:
    no dropout); under float16 the scaler's step leaves the gradients unscaled."""
    model, task_data = tiny_model_and_data(tiny_env)
    model.eval()
    stage = Stage(
        mt.MULTITASK, 0.0, 7, kind="multitask", multitask=MultitaskConfig(weighting=weighting)
    )
    step = [(t, first_batch(task_data, t, 7)) for t in mt.MULTITASK]
    optimizer = model.configure_optimizers(optim)
    rt = runtime.make_runtime("cpu", precision)
    generator = torch.Generator().manual_seed(3)
    loss, norm = trainer.train_step(
        model, optimizer, stage, step, StepContext(rt, optim), generator
    )
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert len(grads) > 20  # the encoder's and the heads' (the unused pooler has none)
    return loss.item(), grads, norm.item()


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


def test_split_dev_scores_both_halves_and_prints_what_choosing_on_dev_adds(
    tiny_env, tmp_path, capsys
):
    rows = run(tiny_env, tmp_path / "run", "--split_dev")
    assert all(len(row["halves"]) == 2 and "overall" in row["halves"][1] for row in rows)
    measures = json.loads((tmp_path / "run" / "forgetting.json").read_text())
    assert measures["selection"]["gap"] >= 0  # a half's own best is at least the other's pick
    assert "choosing on dev adds" in capsys.readouterr().out


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
        sq = [(trained[f"bert.{k}"] - v).pow(2).sum() for k, v in start.items()]
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


def test_scoring_draws_nothing_from_the_random_generators(tiny_env):
    model, task_data = tiny_model_and_data(tiny_env)
    rt = runtime.make_runtime("cpu", "fp32")
    run = runfolder.Run(tiny_env[1], rt, mt.MULTITASK, 8, seed=0)
    state = torch.get_rng_state()
    row = run.score(model, task_data)
    assert set(mt.MULTITASK) <= set(row)
    assert torch.equal(torch.get_rng_state(), state)  # training's draws do not depend on it


def test_a_euclidean_threshold_is_fit_on_distances(tiny_env, tiny_config):
    bert_dir, data_dir = tiny_env

    tokenizer = BertTokenizer.from_pretrained(str(bert_dir))
    task_data = data.load_task_data(DataConfig(data_dir=str(data_dir)), tokenizer, ("para",), 0)
    bert = BertModel.from_pretrained(str(bert_dir))
    model = mt.MultitaskBERT(bert, ("para",), dropout=0.0, cosine=("para",), siamese="euclidean")
    rt = runtime.make_runtime("cpu", "fp32")
    evaluation.fit_thresholds(model, task_data, rt, 16)
    pairs = task_data["para"].train
    with torch.no_grad():
        batch = pairs.collate(list(range(len(pairs))))
        u, v = embeddings(model.eval(), batch)
    d = (u - v).norm(dim=-1).numpy()
    best = evaluation.best_threshold(d, batch["labels"].numpy())
    assert model.para_threshold.item() == pytest.approx(best, abs=1e-5)


# ---------------------------------------------------------------------------------------
# float16 with a gradient scaler (a T4's path), run on the CPU


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
    model = mt.MultitaskBERT(BertModel(tiny_config), dropout=0.0).eval()
    batches = {"sst": sentence_batch(), "para": pair_batch(), "sts": pair_batch(seed=3)}
    batches["sst"]["labels"] = torch.tensor([0, 4, 2])
    batches["para"]["labels"] = torch.tensor([1.0, 0.0, 1.0])
    batches["sts"]["labels"] = torch.tensor([4.5, 0.5, 2.0])
    shared, stage = list(model.bert.parameters()), Stage(("sst",), 1e-5, 3)
    ctx = StepContext(runtime.make_runtime("cpu", "fp32"))

    def surgery(scaler):
        task_losses = [losses.batch_loss(model, t, b, stage, ctx) for t, b in batches.items()]
        model.zero_grad(set_to_none=True)
        pcgrad_backward(shared, task_losses, torch.Generator().manual_seed(7), None, scaler)
        return flatten_grads(shared)

    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    torch.testing.assert_close(surgery(scaler) / 1024, surgery(None), rtol=1e-5, atol=1e-9)


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
    monkeypatch.setattr(torch.amp, "GradScaler", lambda device: real(device, init_scale=2.0**30))
    straight = run(tiny_env, tmp_path / "straight", "--precision", "fp16")
    with monkeypatch.context() as m:
        sigterm_on_call(m, trainer, "train_step", 8)
        with pytest.raises(SystemExit):
            run(tiny_env, tmp_path / "resumed", "--precision", "fp16")
    saved = checkpoint.read_tensors(tmp_path / "resumed" / checkpoint.STATE)[1]["scaler"]
    assert saved["scale"] < 2.0**30  # a fresh scaler would start elsewhere: this can fail
    mt.main(["--resume", str(tmp_path / "resumed")])
    assert_same_run(straight, tmp_path / "straight", tmp_path / "resumed")


def test_every_epoch_of_a_multitask_plan_trains_the_same_examples(tiny_env):
    """Broadhurst & Maffezzoli train one standardized set of 12,080 per task for six epochs:
    the epochs (stages) reshuffle it but never draw another."""
    _, task_data = tiny_model_and_data(tiny_env)
    multitask = MultitaskConfig(examples_per_task=20, mixing="simultaneous")
    stage = Stage(mt.MULTITASK, 1e-5, 4, kind="multitask", multitask=multitask)

    def examples(epoch, seed=3):
        order = torch.Generator().manual_seed(1000 * seed + epoch)  # as run_stage seeds it
        drawn = {task: [] for task in mt.MULTITASK}
        for step in trainer.stage_steps(task_data, stage, order, seed):
            for task, batch in step:
                drawn[task] += batch["ids"]
        return drawn

    first, second = examples(0), examples(1)
    for task in mt.MULTITASK:
        assert len(first[task]) == 20 < len(task_data[task].train)  # a subset, drawn once
        assert sorted(first[task]) == sorted(second[task]) and first[task] != second[task]
    assert sorted(examples(0, seed=4)["sst"]) != sorted(first["sst"])  # another run, another set


def test_tensorboard_holds_every_step_once_also_after_a_resume(tiny_env, tmp_path, monkeypatch):
    """Read back with tensorboard's own reader: 19 steps (6 + 6 + 6 + 1), each once, though
    the run was killed at its 8th step and resumed; dev scores at the start and after each
    stage, at the step that ended it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sigterm_on_call(monkeypatch, trainer, "train_step", 8)
    with pytest.raises(SystemExit):
        run(tiny_env, tmp_path / "run", "--tensorboard")
    monkeypatch.undo()
    mt.main(["--resume", str(tmp_path / "run")])
    board = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    board.Reload()
    tags = set(board.Tags()["scalars"])
    assert {f"train/{k}" for k in ("loss", "lr", "grad_norm", "examples_per_s")} <= tags
    assert {"dev/sst", "dev/para", "dev/sts", "dev/overall"} <= tags
    steps = [e.step for e in board.Scalars("train/loss")]
    assert sorted(steps) == list(range(1, 20))
    logged = [
        json.loads(x)["loss"] for x in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()
    ]
    assert [
        e.value for e in sorted(board.Scalars("train/loss"), key=lambda e: e.step)
    ] == pytest.approx(logged)
    assert [e.step for e in board.Scalars("dev/overall")] == [0, 6, 12, 18, 19]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [e.value for e in board.Scalars("dev/overall")] == pytest.approx(
        [r["overall"] for r in rows]
    )


def test_tensorboard_without_its_package_says_how_to_install_it(tiny_env, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard fails
    with pytest.raises(
        SystemExit, match="--tensorboard needs the tensorboard package: pip install"
    ):
        run(tiny_env, tmp_path / "run", "--tensorboard")
    assert not (tmp_path / "run").exists()


def test_patience_stops_the_schedule_and_the_stopped_run_is_finished(
    tiny_env, tmp_path, monkeypatch, capsys
):
    """Selection scores 0.5, 0.6, 0.55, 0.58 with --patience 2: the fourth stage is the
    second in a row without a new best, so the run stops there. It is a finished run: the
    kept model is the second stage's, its predictions are written, and --resume trains
    nothing more."""
    scores = [0.5, 0.6, 0.55, 0.58]
    monkeypatch.setattr(runfolder.Run, "select", lambda self, row: scores[row["index"]])
    rows = run(tiny_env, tmp_path / "run", "--loops", "2", "--patience", "2")
    assert [r["stage"] for r in rows] == ["QQP", "loop 1: STS", "loop 1: SST", "loop 1: QQP 3%"]
    out = capsys.readouterr().out
    assert "--patience 2: no new best since loop 1: STS; the run stops" in out
    assert "best stage: loop 1: STS" in out
    kept = checkpoint.read_tensors(tmp_path / "run" / checkpoint.BEST)[1]["row"]
    assert kept["stage"] == "loop 1: STS"
    assert (tmp_path / "run" / "predictions" / "sst-dev-output.csv").is_file()
    mt.main(["--resume", str(tmp_path / "run")])
    assert "stopped after stage 4/7 (--patience): best rescored" in capsys.readouterr().out
    after = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(after) == 5  # the start row and the four stages: nothing trained again


def test_patience_counts_stages_since_the_best():
    ran_out = [runfolder.patience_ran_out(2, k, best) for k, best in ((0, None), (1, 0), (2, 0))]
    assert ran_out == [False, False, True]
    assert not runfolder.patience_ran_out(0, 30, 0)  # 0: every stage runs
    assert runfolder.patience_ran_out(1, 0, None)  # a first stage that is not a number


def test_patience_stops_a_stage_of_several_epochs_and_keeps_its_best_epoch(
    tiny_env, tmp_path, monkeypatch
):
    """The individual preset's stages run 3 epochs; with every epoch scored worse than the
    one before, --patience 1 stops each after its second and keeps the first: the model of
    a run of one epoch (the same batches and learning rates up to there)."""

    calls = []

    def falling(self, row):  # every selection score below the one before
        calls.append(row)
        return 1.0 - len(calls) / 100

    monkeypatch.setattr(runfolder.Run, "select", falling)
    scored, score = [], runfolder.Run.score
    monkeypatch.setattr(runfolder.Run, "score", lambda *a, **k: scored.append(1) or score(*a, **k))
    flags = "--preset individual --batch_size 8 --lr 1e-3 --max_length 64 --individual_epochs"
    mt.main(tiny_flags(tiny_env, tmp_path / "patient", flags, "3", "--patience", "1"))
    assert len(scored) == 3 * 3  # per task: the start and two epochs; the kept one not again
    mt.main(tiny_flags(tiny_env, tmp_path / "one", flags, "1"))
    for task in ("sst", "para", "sts"):
        logged = (tmp_path / "patient" / task / "steps.jsonl").read_text().splitlines()
        assert {json.loads(x)["epoch"] for x in logged} == {0, 1}  # the third never ran
    # the first model's (the later ones start from the RNG as its extra epoch left it)
    a, b = (weights(tmp_path / d / "sst" / "best.safetensors") for d in ("patient", "one"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    patient, one = (
        json.loads((tmp_path / d / "sst" / "metrics.jsonl").read_text().splitlines()[1])
        for d in ("patient", "one")
    )
    assert patient["sst"] == one["sst"]  # the kept epoch's dev row, scored when it was kept


def test_a_constant_sts_head_prints_nan_and_its_stage_is_never_kept(
    tiny_env, tmp_path, monkeypatch, capsys
):
    """STS's output forced constant when the row after the second stage is scored: its
    Pearson r is nan (as scipy's), the table prints nan, the overall score is nan, and the
    kept stage is another."""
    import multitask_classifier as mt
    import runfolder

    constant, calls, score = [False], [], runfolder.Run.score

    def scored(self, model, task_data, train=False):
        calls.append(1)
        constant[0] = len(calls) == 3  # the start row is call 1
        try:
            return score(self, model, task_data, train)
        finally:
            constant[0] = False

    to_score = mt.cosine_to_score
    monkeypatch.setattr(runfolder.Run, "score", scored)
    monkeypatch.setattr(
        mt, "cosine_to_score", lambda c: to_score(c) * 0 + 2.5 if constant[0] else to_score(c)
    )
    rows = run(tiny_env, tmp_path / "run")
    assert math.isnan(rows[1]["sts"]["pearson"]) and math.isnan(rows[1]["overall"])
    assert not any(math.isnan(r["overall"]) for k, r in enumerate(rows) if k != 1)
    out = capsys.readouterr().out
    assert f"{rows[1]['stage']}" in out and "nan" in out
    kept = evaluation.kept_row([{"stage": "start", "sst": {}, "para": {}, "sts": {}}, *rows])
    assert kept["stage"] != rows[1]["stage"]
    assert f"best stage: {kept['stage']}" in out


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
