"""The training loop on the tiny BERT: stages and their losses, resume after a stage and from
inside one (kills, stops), the step log, non-finite losses, what scoring draws."""

import json
import math

import pytest
import torch

import batches
import datasets as data
import evaluation
import losses
import sbert
import trainer
from bert import BertModel
from commands import command, runfolder, runner
from engine import checkpoint, runtime
from evaluation import MULTITASK
from helpers import (
    assert_same_run,
    embeddings,
    interrupt_stage,
    run,
    sigterm_on_call,
    tiny_model_and_data,
    weights,
)
from presets import Stage
from settings import DataConfig, MultitaskConfig, OptimConfig, SimCSEConfig
from tokenizer import BertTokenizer
from trainer import StepContext


def test_resume_after_a_stage_equals_the_uninterrupted_run(tiny_env, tmp_path, monkeypatch):
    straight = run(tiny_env, tmp_path / "straight")
    interrupt_stage(monkeypatch, 3)
    with pytest.raises(SystemExit):  # main stops cleanly on the interrupt
        run(tiny_env, tmp_path / "resumed")
    monkeypatch.undo()
    command.main(["--resume", str(tmp_path / "resumed")])
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
        loader = batches.make_loader(task_data[task].train, 64, shuffle=False)
        with torch.no_grad():
            return sum(
                losses.loss_of(task, None).fn(model(task, b), b["labels"]).item() for b in loader
            )

    for task in MULTITASK:
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
    command.main(["--predict", str(tmp_path / "run")])  # the kept model still gives predictions
    for task in MULTITASK:
        assert (tmp_path / "run" / "predictions" / f"{task}-test-output.csv").is_file()


def test_simcse_stage_keeps_the_epoch_with_the_best_sts(tiny_env, tmp_path, monkeypatch):
    scores = iter([0.5, 0.9, 0.1])  # epoch 2 is best: its weights must be the ones kept
    kept = {}
    real_after = runner.BestEpoch.after_epoch

    def scripted(self, epoch):
        kept[epoch] = {k: v.cpu().clone() for k, v in self.model.state_dict().items()}
        real = runner.evaluate_split
        runner.evaluate_split = lambda *a, **k: {
            "sts": evaluation.TaskResult({"pearson": next(scores)})
        }
        try:
            real_after(self, epoch)
        finally:
            runner.evaluate_split = real

    monkeypatch.setattr(runner.BestEpoch, "after_epoch", scripted)
    run(tiny_env, tmp_path / "run", "--preset", "simcse", "--simcse_batch_size", "8")
    final = weights(tmp_path / "run" / "best.safetensors")
    assert all(torch.equal(final[k], kept[1][k]) for k in final)
    assert not all(torch.equal(final[k], kept[2][k]) for k in final)


def test_the_step_log_has_one_line_per_step_and_survives_a_resume(tiny_env, tmp_path, monkeypatch):
    interrupt_stage(monkeypatch, 3)
    with pytest.raises(SystemExit):
        run(tiny_env, tmp_path / "run")
    monkeypatch.undo()
    with open(tmp_path / "run" / "steps.jsonl", "a") as f:
        f.write('{"stage": 2, "st')  # the last line of a process killed while writing it
    command.main(["--resume", str(tmp_path / "run")])
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
    command.main(["--resume", str(tmp_path / "resumed")])
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
    command.main(["--resume", str(tmp_path / "killed")])
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
    sigterm_on_call(monkeypatch, runfolder.Run, "evaluated", 2)  # 1: the start row; 2: stage 1's
    with pytest.raises(SystemExit):
        run(tiny_env, tmp_path / "resumed", *flags)
    monkeypatch.undo()
    steps = (tmp_path / "resumed" / "steps.jsonl").read_text().splitlines()
    assert steps and all(json.loads(x)["stage"] == 0 for x in steps)  # stage 1 was kept
    command.main(["--resume", str(tmp_path / "resumed")])
    assert_same_run(straight, tmp_path / "straight", tmp_path / "resumed")


def test_split_dev_scores_both_halves_and_prints_what_choosing_on_dev_adds(
    tiny_env, tmp_path, capsys
):
    rows = run(tiny_env, tmp_path / "run", "--split_dev")
    assert all(len(row["halves"]) == 2 and "overall" in row["halves"][1] for row in rows)
    measures = json.loads((tmp_path / "run" / "forgetting.json").read_text())
    assert measures["selection"]["gap"] >= 0  # a half's own best is at least the other's pick
    assert "choosing on dev adds" in capsys.readouterr().out


def test_scoring_draws_nothing_from_the_random_generators(tiny_env):
    model, task_data = tiny_model_and_data(tiny_env)
    rt = runtime.make_runtime("cpu", "fp32")
    run = runfolder.Run(tiny_env[1], rt, MULTITASK, 8, seed=0)
    state = torch.get_rng_state()
    row = run.score(model, task_data)
    assert set(MULTITASK) <= set(row)
    assert torch.equal(torch.get_rng_state(), state)  # training's draws do not depend on it


def test_a_euclidean_threshold_is_fit_on_distances(tiny_env, tiny_config):
    bert_dir, data_dir = tiny_env

    tokenizer = BertTokenizer.from_pretrained(str(bert_dir))
    task_data = data.load_task_data(DataConfig(data_dir=str(data_dir)), tokenizer, ("para",), 0)
    bert = BertModel.from_pretrained(str(bert_dir))
    model = sbert.SentenceBERT(
        bert, ("para",), dropout=0.0, readouts={"para": "cosine"}, siamese="euclidean"
    )
    rt = runtime.make_runtime("cpu", "fp32")
    evaluation.fit_thresholds(model, task_data, rt, 16)
    pairs = task_data["para"].train
    with torch.no_grad():
        batch = pairs.collate(list(range(len(pairs))))
        u, v = embeddings(model.eval(), batch)
    d = (u - v).norm(dim=-1).numpy()
    best = evaluation.best_threshold(d, batch["labels"].numpy())
    assert model.para_threshold.item() == pytest.approx(best, abs=1e-5)


def test_every_epoch_of_a_multitask_plan_trains_the_same_examples(tiny_env):
    """Broadhurst & Maffezzoli train one standardized set of 12,080 per task for six epochs:
    the epochs (stages) reshuffle it but never draw another."""
    _, task_data = tiny_model_and_data(tiny_env)
    multitask = MultitaskConfig(examples_per_task=20, mixing="simultaneous")
    stage = Stage(MULTITASK, 1e-5, 4, kind="multitask", multitask=multitask)

    def examples(epoch, seed=3):
        order = torch.Generator().manual_seed(1000 * seed + epoch)  # as run_stage seeds it
        drawn = {task: [] for task in MULTITASK}
        for step in trainer.stage_steps(task_data, stage, order, seed):
            for task, batch in step:
                drawn[task] += batch["ids"]
        return drawn

    first, second = examples(0), examples(1)
    for task in MULTITASK:
        assert len(first[task]) == 20 < len(task_data[task].train)  # a subset, drawn once
        assert sorted(first[task]) == sorted(second[task]) and first[task] != second[task]
    assert sorted(examples(0, seed=4)["sst"]) != sorted(first["sst"])  # another run, another set


def test_a_constant_sts_head_prints_nan_and_its_stage_is_never_kept(
    tiny_env, tmp_path, monkeypatch, capsys
):
    """STS's output forced constant when the row after the second stage is scored: its
    Pearson r is nan (as scipy's), the table prints nan, the overall score is nan, and the
    kept stage is another."""
    import sbert
    from commands import runfolder

    constant, calls, score = [False], [], runfolder.Run.scored

    def scored(self, model, task_data, train=False):
        calls.append(1)
        constant[0] = len(calls) == 3  # the start row is call 1
        try:
            return score(self, model, task_data, train)
        finally:
            constant[0] = False

    to_score = sbert.cosine_to_score
    monkeypatch.setattr(runfolder.Run, "scored", scored)
    monkeypatch.setattr(
        sbert, "cosine_to_score", lambda c: to_score(c) * 0 + 2.5 if constant[0] else to_score(c)
    )
    rows = run(tiny_env, tmp_path / "run")
    assert math.isnan(rows[1]["sts"]["pearson"]) and math.isnan(rows[1]["overall"])
    assert not any(math.isnan(r["overall"]) for k, r in enumerate(rows) if k != 1)
    out = capsys.readouterr().out
    assert f"{rows[1]['stage']}" in out and "nan" in out
    kept = evaluation.kept_row([{"stage": "start", "sst": {}, "para": {}, "sts": {}}, *rows])
    assert kept["stage"] != rows[1]["stage"]
    assert f"best stage: {kept['stage']}" in out


def test_a_stage_adds_only_its_active_terms_and_keeps_the_generators_where_one_replays():
    """trainer.added_terms, built once a stage: a plain stage adds nothing, keeps no
    generators and leaves the run's autocast alone; SMART's term only where the task has a
    head (a pair loss has none), distillation's where the encoder trains, the added SimCSE's
    where it is weighed, in that order. The generators are kept where SMART's shared
    dropout or distillation's reference pass replays the clean pass's masks; none for
    SMART with masks of its own or a frozen encoder's distillation."""
    from smart import SmartConfig

    rt = runtime.make_runtime("cpu", "bf16")

    def added(smart=None, distill=0.0, freeze=False, headed=True, simcse=0.0):
        smart = smart or SmartConfig.off()
        task, losses = ("sst", {}) if headed else ("para", {"para": "contrastive"})
        contrastive = SimCSEConfig(simcse_weight=simcse) if simcse else None
        stage = Stage((task,), 1e-3, 1, smart=smart, losses=losses, freeze_encoder=freeze)
        stage.contrastive = contrastive  # a task stage's added SimCSE term
        return trainer.added_terms(stage, OptimConfig(distill=distill), rt)[task]

    shared, own = SmartConfig(lambda_s=1.0), SmartConfig(lambda_s=1.0, dropout="independent")
    assert added() == trainer.AddedTerms((), (), False, False)
    assert not any(added(s, d, f).replay for s, d, f in [(own, 0, 0), (None, 0.5, 1)])
    assert all(added(s, d).replay for s, d in [(shared, 0), (None, 0.5), (own, 0.5)])
    assert not added(shared, headed=False).replay and added(shared, 0.5, headed=False).replay
    assert added(shared).float32 and not added(own).float32  # the paper's R_s under bf16
    every = added(shared, 0.5, simcse=0.1)
    assert every.terms == (trainer.smart_term, trainer.distillation_term)
    assert every.after == (trainer.simcse_term,)  # its own passes, outside the batch's autocast
    assert added(shared, 0.5, headed=False, simcse=0.1).terms == every.terms[1:]
    assert added(own, 0.5, freeze=True).terms == (trainer.smart_term,)
