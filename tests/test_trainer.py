"""The training loop: stages, the step, resume, PCGrad and non-finite losses (tiny BERT)."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

import datasets as data
import evaluation
import multitask_classifier as mt
import simcse
import trainer
from bert import BertModel
from config import DataConfig, ModelConfig, MultitaskConfig, OptimConfig
from helpers import (
    assert_same_run,
    interrupt_stage,
    pair_batch,
    run,
    sentence_batch,
    sigterm_on_call,
    weights,
)
from optimizer import flatten_grads, pcgrad, pcgrad_backward
from smart import EMATeacher, SameDropout, SmartConfig
from tokenizer import BertTokenizer


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


def tiny_model_and_data(tiny_env):
    """A MultitaskBERT on the tiny checkpoint (seed 0) and the tiny data, tokenized."""
    bert_dir, data_dir = tiny_env
    tok = BertTokenizer.from_pretrained(str(bert_dir))
    task_data = data.load_task_data(DataConfig(data_dir=str(data_dir)), tok, mt.MULTITASK, 0)
    torch.manual_seed(0)
    model = mt.model_factory(ModelConfig(bert=str(bert_dir)), mt.MULTITASK)()
    return model, task_data


def test_short_training_lowers_every_task_loss(tiny_env):
    model, task_data = tiny_model_and_data(tiny_env)
    optimizer = trainer.new_optimizer(model, OptimConfig(lr=1e-3))
    rt = trainer.make_runtime("cpu", amp=False)

    def loss_of(task):
        model.eval()
        loader = data.make_loader(task_data[task].train, 64, shuffle=False)
        with torch.no_grad():
            return sum(
                simcse.OUTPUT_LOSSES[evaluation.TASKS[task].losses[0]](
                    model(task, b), b["labels"]
                ).item()
                for b in loader
            )

    for task in mt.MULTITASK:
        before = loss_of(task)
        stage = trainer.Stage((task,), lr=1e-3, batch_size=8, epochs=5)
        steps = trainer.stage_steps(task_data, stage, torch.Generator().manual_seed(0))
        trainer.train_stage(model, optimizer, stage, steps, rt, task)
        assert loss_of(task) < 0.9 * before, task


def test_stages_check_their_fields():
    with pytest.raises(ValueError, match=r"unknown task 'qqp'; expected one of \['cfimdb'"):
        trainer.Stage(("qqp",), 1e-5, 32)
    with pytest.raises(ValueError, match="loss 'mnrl' does not fit task 'sst'"):
        trainer.Stage(("sst",), 1e-5, 32, losses={"sst": "mnrl"})
    with pytest.raises(ValueError, match="a multitask stage needs"):
        trainer.Stage(("sst", "para"), 1e-5, 32, kind="multitask")
    with pytest.raises(ValueError, match="unknown stage kind 'simcse'"):
        trainer.Stage((), 1e-5, 32, kind="simcse")


def test_nan_loss_stops_with_step_and_task_and_keeps_best(tiny_env, tmp_path, monkeypatch):
    real = simcse.OUTPUT_LOSSES["ce"]
    monkeypatch.setitem(simcse.OUTPUT_LOSSES, "ce", lambda out, y: real(out, y) * float("nan"))
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
        kept[epoch] = {k: v.clone() for k, v in self.model.state_dict().items()}
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
    rt = trainer.make_runtime("cpu", amp=False)
    smart = SmartConfig(lambda_s=0.0, mu=0.0)
    batches = {"sst": sentence_batch(), "para": pair_batch(), "sts": pair_batch(seed=3)}
    batches["sst"]["labels"] = torch.tensor([0, 4, 2])
    batches["para"]["labels"] = torch.tensor([1.0, 0.0, 1.0])
    batches["sts"]["labels"] = torch.tensor([4.5, 0.5, 2.0])
    shared = list(model.bert.parameters())

    def losses():
        return [trainer.batch_loss(model, t, b, smart, None, rt) for t, b in batches.items()]

    grads = []  # the reference: each task's encoder gradient alone, then PCGrad by hand
    for loss in losses():
        model.zero_grad(set_to_none=True)
        loss.backward()
        grads.append(flatten_grads(shared))
    expected = pcgrad(grads, torch.Generator().manual_seed(7))
    conflicts = sum(float(grads[i] @ grads[j]) < 0 for i in range(3) for j in range(i))
    assert conflicts > 0  # otherwise the surgery would be a plain sum

    model.zero_grad(set_to_none=True)
    pcgrad_backward(shared, losses(), torch.Generator().manual_seed(7))
    assert torch.allclose(flatten_grads(shared), expected, atol=1e-6)
    head = model.heads["sst"].weight.grad.clone()
    model.zero_grad(set_to_none=True)
    losses()[0].backward()
    assert torch.allclose(head, model.heads["sst"].weight.grad, atol=1e-7)  # own task only


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requested_without_cuda_says_so():
    with pytest.raises(SystemExit, match="no CUDA device is available"):
        trainer.make_runtime("cuda", amp=True)


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
        (8, ["--preset", "defended", "--distill", "5"]),  # the reference is the loaded model
        (8, ["--preset", "simcse", "--simcse_epochs", "3", "--simcse_batch_size", "8"]),
        (6, ["--preset", "simcse", "--simcse_epochs", "3", "--simcse_batch_size", "8"]),
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
    sigterm_on_call(monkeypatch, trainer.Run, "evaluate", 2)  # 1: the start row; 2: stage 1's
    with pytest.raises(SystemExit):
        run(tiny_env, tmp_path / "resumed", *flags)
    monkeypatch.undo()
    steps = (tmp_path / "resumed" / "steps.jsonl").read_text().splitlines()
    assert steps and all(json.loads(x)["stage"] == 0 for x in steps)  # stage 1 was kept
    mt.main(["--resume", str(tmp_path / "resumed")])
    assert_same_run(straight, tmp_path / "straight", tmp_path / "resumed")


# ---------------------------------------------------------------------------------------
# SMART's passes, and the update's tools (issue: a defense against forgetting)


def first_batch(task_data, task, size):
    return next(iter(data.make_loader(task_data[task].train, size, shuffle=False)))


def smart_value(model, batch, cfg, rt, teacher=None, task="sst"):
    """trainer.smart_term on one batch, its passes set up as batch_loss sets them up."""
    torch.manual_seed(0)
    with rt.autocast():
        shared = cfg.dropout == "shared"
        same_embed = SameDropout(rt.device) if shared else None
        embeds = model.embed(batch)
        masks = (same_embed, SameDropout(rt.device)) if shared else None
        out = model(task, batch, embeds)
        return trainer.smart_term(model, task, cfg, batch, embeds, out, teacher, rt, masks).item()


def test_r_s_responds_to_the_perturbation_under_bf16_autocast(tiny_env):
    model, task_data = tiny_model_and_data(tiny_env)
    model.train()
    batch = first_batch(task_data, "sst", 8)
    rt = trainer.Runtime(torch.device("cpu"), torch.bfloat16, None)

    def r_s(eps, dropout="shared"):
        cfg = SmartConfig(lambda_s=1, mu=0, sigma=eps, eta=100 * eps, epsilon=eps, dropout=dropout)
        return smart_value(model, batch, cfg, rt)

    r = {eps: r_s(eps) for eps in (1e-9, 1e-5, 1e-4)}
    # bf16 resolves ~8e-3: without float32 passes a 1e-5 perturbation would be rounded away
    assert r[1e-9] < 1e-3 * r[1e-5]
    assert 30 < r[1e-4] / r[1e-5] < 300  # ~quadratic, as in float32
    assert r_s(1e-9, "independent") > 1e3 * r[1e-5]  # R-Drop: bf16 dropout noise


def test_the_teacher_pass_shares_the_clean_pass_dropout(tiny_env):
    model, task_data = tiny_model_and_data(tiny_env)
    model.train()
    batch = first_batch(task_data, "sst", 8)
    rt = trainer.make_runtime("cpu", amp=False)
    teacher = EMATeacher(model)  # the model's own weights: only dropout can differ
    bregman = {
        d: smart_value(model, batch, SmartConfig(lambda_s=0, mu=1, dropout=d), rt, teacher)
        for d in ("shared", "independent")
    }
    assert bregman["shared"] < 1e-12 and bregman["independent"] > 1e-6


def gradient_of_one_step(tiny_env, optim, weighting="random"):
    """Gradients left by one multitask train_step (lr 0, eval mode: no dropout)."""
    model, task_data = tiny_model_and_data(tiny_env)
    model.eval()
    stage = trainer.Stage(
        mt.MULTITASK, 0.0, 7, kind="multitask", multitask=MultitaskConfig(weighting=weighting)
    )
    step = [(t, first_batch(task_data, t, 7)) for t in mt.MULTITASK]
    optimizer = trainer.new_optimizer(model, optim)
    rt = trainer.make_runtime("cpu", amp=False)
    generator = torch.Generator().manual_seed(3)
    loss = trainer.train_step(model, optimizer, stage, step, rt, None, generator, optim)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert len(grads) > 20  # the encoder's and the heads' (the unused pooler has none)
    return loss.item(), grads


def test_accumulated_micro_batches_give_the_whole_batch_gradient(tiny_env):
    loss, whole = gradient_of_one_step(tiny_env, OptimConfig(lr=0.0))
    for parts in (2, 3, 7):  # 7 = 3 + 3 + 1 for 3 parts: a short last micro-batch
        micro_loss, micro = gradient_of_one_step(tiny_env, OptimConfig(lr=0.0, accumulate=parts))
        assert micro_loss == pytest.approx(loss, rel=1e-6) and micro.keys() == whole.keys()
        # float32 sums in another order: 1e-6 of the largest gradient entry (the key bias's
        # gradient is 0 up to rounding, so no tolerance of its own would do)
        atol = 1e-6 * max(g.abs().max().item() for g in whole.values())
        for name, g in whole.items():
            torch.testing.assert_close(micro[name], g, rtol=1e-5, atol=atol, msg=name)


def test_clipping_scales_the_gradient_to_the_norm(tiny_env):
    _, free = gradient_of_one_step(tiny_env, OptimConfig(lr=0.0))
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in free.values()])).item()
    _, clipped = gradient_of_one_step(tiny_env, OptimConfig(lr=0.0, max_grad_norm=norm / 4))
    atol = 1e-6 * max(g.abs().max().item() for g in free.values())
    for name, g in free.items():
        torch.testing.assert_close(clipped[name], g / 4, rtol=1e-5, atol=atol, msg=name)


def test_heads_get_their_own_learning_rate(tiny_env):
    model, _ = tiny_model_and_data(tiny_env)
    optimizer = trainer.new_optimizer(model, OptimConfig(head_lr_scale=20))
    encoder, heads = (g["params"] for g in optimizer.param_groups)
    assert {id(p) for p in encoder} == {id(p) for p in model.bert.parameters()}
    assert {id(p) for p in encoder + heads} == {id(p) for p in model.parameters()}
    trainer.set_lr(optimizer, trainer.Stage(("sst",), 2e-5, 8), 0.5)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([1e-5, 2e-4])
    frozen = trainer.Stage(("sst",), 1e-3, 8, freeze_encoder=True)  # its lr is the heads'
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
    rt = trainer.make_runtime("cpu", amp=False)
    smart = SmartConfig(lambda_s=0, mu=0)
    for task in ("sst", "para"):  # one sentence per example; two (2B sentences)
        batch = first_batch(task_data, task, 6)
        plain = trainer.batch_loss(model, task, batch, smart, None, rt)
        pulled = trainer.batch_loss(model, task, batch, smart, None, rt, None, reference, 2.0)
        with torch.no_grad():  # each example's first sentence (a pair's: side 0)
            first = {k: v[0] if v.dim() == 3 else v for k, v in batch.items() if k != "ids"}
            z, z0 = model.sentences(first).tolist(), reference.sentences(first).tolist()
        gaps = [
            (cos_of(z[i], z[j]) - cos_of(z0[i], z0[j])) ** 2
            for i in range(len(z)) for j in range(len(z)) if i != j
        ]  # fmt: skip
        assert len(z) == 6
        assert sum(gaps) > 1e-6  # the perturbed model's cosines did move
        assert (pulled - plain).item() == pytest.approx(2.0 * sum(gaps) / len(gaps), rel=1e-4)
    assert not any(p.requires_grad for p in reference.parameters()) and not reference.training


def test_distillation_keeps_the_batch_cosines_of_the_untouched_encoder(tiny_env):
    def drift(distill):
        model, task_data = tiny_model_and_data(tiny_env)
        reference = trainer.frozen_copy(model)
        optim = OptimConfig(lr=1e-2, distill=distill)  # 8 steps that move the cosines far
        optimizer = trainer.new_optimizer(model, optim)
        stage = trainer.Stage(("sst",), 1e-2, 16)
        batch = first_batch(task_data, "sst", 16)
        rt = trainer.make_runtime("cpu", amp=False)
        for seed in range(8):
            model.train()
            generator = torch.Generator().manual_seed(seed)
            step = [("sst", batch)]
            trainer.train_step(model, optimizer, stage, step, rt, None, generator, optim, reference)
        model.eval()
        with torch.no_grad():
            return simcse.similarity_distillation(
                model.sentences(batch), reference.sentences(batch)
            ).item()

    assert drift(0.0) > 0.1 and drift(100.0) < 0.01 * drift(0.0)


def test_distillation_without_a_stage_that_trains_the_encoder_is_refused(tiny_env, tmp_path):
    for preset in ("simcse", "unsup-simcse"):  # contrastive, then heads on a frozen encoder
        with pytest.raises(SystemExit, match=f"no stage of --preset {preset} has one"):
            run(tiny_env, tmp_path / preset, "--preset", preset, "--distill", "1")


def test_tools_that_would_change_the_method_are_refused():
    rt = trainer.make_runtime("cpu", amp=False)
    simcse_stage = mt.simcse_stage(mt.parse_args(["--preset", "simcse"])[0])
    with pytest.raises(SystemExit, match="--accumulate 2: stage 'SimCSE \\(sup\\)' compares"):
        trainer.check_runtime([simcse_stage], rt, OptimConfig(accumulate=2))
    mnrl = trainer.Stage(("sts",), 1e-5, 8, losses={"sts": "mnrl"})
    with pytest.raises(SystemExit, match="micro-batches would change its loss"):
        trainer.check_runtime([mnrl], rt, OptimConfig(accumulate=2))
    pcgrad = mt.multitask_plan(mt.parse_args(["--preset", "multitask", "--weighting", "pcgrad"])[0])
    with pytest.raises(SystemExit, match="without --accumulate and --l2sp"):
        trainer.check_runtime(pcgrad, rt, OptimConfig(l2sp=0.1))
    trainer.check_runtime(pcgrad, rt, OptimConfig(max_grad_norm=1.0))  # clipping is fine
    sst = trainer.Stage(("sst",), 1e-5, 8)
    with pytest.raises(SystemExit, match="stage 'SST' compares each example"):
        trainer.check_runtime([sst], rt, OptimConfig(accumulate=2, distill=1.0))


def test_in_batch_negatives_under_torchrun_are_announced(capsys):
    two = trainer.Runtime(torch.device("cpu"), None, None, rank=0, world=2)
    mnrl = trainer.Stage(("sts",), 1e-5, 8, losses={"sts": "mnrl"})
    trainer.check_runtime([mnrl], two)
    assert "takes its in-batch negatives from each process's share" in capsys.readouterr().out
    trainer.check_runtime([trainer.Stage(("sts",), 1e-5, 8)], two)
    assert capsys.readouterr().out == ""  # nothing to say for a loss without negatives


def test_scoring_draws_nothing_from_the_random_generators(tiny_env):
    model, task_data = tiny_model_and_data(tiny_env)
    rt = trainer.make_runtime("cpu", amp=False)
    run = trainer.Run(tiny_env[1], rt, mt.MULTITASK, 8, seed=0)
    state = torch.get_rng_state()
    row = run.score(model, task_data)
    assert set(mt.MULTITASK) <= set(row)
    assert torch.equal(torch.get_rng_state(), state)  # training's draws do not depend on it
