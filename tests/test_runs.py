"""multitask_classifier.py end to end on a tiny random BERT: every preset's stages, resuming,
what each stage scores, --estimate and the demo's sizes."""

import io
import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

import batches
import datasets as data
import evaluation
import sbert
import trainer
from commands import command, estimate, runfolder, runner
from engine import checkpoint, runtime
from evaluation import MULTITASK
from helpers import (
    run,
    tiny_flags,
    weights,
)
from lab import explore, export
from tokenizer import BertTokenizer


def test_plan_runner_writes_table_checkpoint_and_predictions(tiny_env, tmp_path, capsys):
    rows = run(tiny_env, tmp_path / "run", "--loops", "2")
    names = [r["stage"] for r in rows]
    assert names == ["QQP", "loop 1: STS", "loop 1: SST", "loop 1: QQP 3%"] + [
        "loop 2: STS",
        "loop 2: SST",
        "loop 2: QQP 3%",
    ]
    for r in rows:
        overall = (r["sst"]["accuracy"] + r["para"]["accuracy"] + (r["sts"]["pearson"] + 1) / 2) / 3
        assert r["overall"] == pytest.approx(overall)
    out = capsys.readouterr().out
    assert "SST acc" in out and "best stage:" in out
    _, best = checkpoint.read_tensors(tmp_path / "run" / "best.safetensors")
    assert best["row"]["overall"] == max(r["overall"] for r in rows)
    for task in ("sst", "para", "sts"):
        for split in ("dev", "test"):
            assert (tmp_path / "run" / "predictions" / f"{task}-{split}-output.csv").is_file()


@pytest.mark.parametrize("objective", ["sup", "triplet", "unsup", "mnrl", "align_uniform"])
def test_contrastive_objectives_train_the_encoder(tiny_env, tmp_path, objective):
    rows = run(
        tiny_env,
        tmp_path / "run",
        "--preset",
        "simcse",
        "--simcse_loss",
        objective,
        "--simcse_epochs",
        "2",
        "--simcse_batch_size",
        "8",
    )
    assert [r["stage"] for r in rows] == [f"SimCSE ({objective})"]
    assert math.isfinite(rows[0]["train_loss"]) and "sts" in rows[0]


def test_frozen_encoder_presets_train_only_the_heads(tiny_env, tmp_path, monkeypatch):

    snapshots = []
    real = trainer.train_stage

    def snapshot_after(model, *a, **k):
        loss = real(model, *a, **k)
        snapshots.append({n: v.clone() for n, v in model.state_dict().items()})
        return loss

    monkeypatch.setattr(trainer, "train_stage", snapshot_after)
    rows = run(
        tiny_env,
        tmp_path / "run",
        "--preset",
        "equibert",
        "--simcse_epochs",
        "1",
        "--individual_epochs",
        "1",
        "--simcse_batch_size",
        "8",
    )
    assert [r["stage"] for r in rows] == ["SimCSE (align_uniform)", "SST", "QQP"]
    after_simcse, after_sst, after_qqp = snapshots
    for name, value in after_simcse.items():
        if name.startswith("bert."):  # the encoder never moves after the contrastive stage
            assert torch.equal(value, after_qqp[name]), name
    assert not torch.equal(after_simcse["heads.sst.weight"], after_sst["heads.sst.weight"])
    assert not torch.equal(after_sst["heads.para.weight"], after_qqp["heads.para.weight"])


def test_thesis_smart_preset_runs_with_smart_on(tiny_env, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = sbert.SentenceBERT.forward

    def counting(self, task, batch, embeds=None):  # SMART's passes start from embeddings
        calls["n"] += embeds is not None
        return real(self, task, batch, embeds)

    monkeypatch.setattr(sbert.SentenceBERT, "forward", counting)
    rows = run(tiny_env, tmp_path / "run", "--preset", "thesis-smart", "--smart_batch_size", "8")
    assert len(rows) == 4 and calls["n"] > 0
    assert all(math.isfinite(r["overall"]) for r in rows)


@pytest.mark.parametrize(
    "flags",
    [
        ["--weighting", "equal"],
        ["--weighting", "random", "--examples_per_task", "20"],
        ["--weighting", "pcgrad"],
        ["--mixing", "round_robin", "--order", "random"],
        ["--mixing", "round_robin", "--cross_encode", "para", "sts", "--sts_loss", "l1"],
        ["--para_loss", "contrastive", "--sts_loss", "cosine_mse"],
        ["--para_loss", "mnrl", "--sts_loss", "mnrl"],
    ],
)
def test_multitask_preset_runs(tiny_env, tmp_path, flags):
    rows = run(
        tiny_env, tmp_path / "run", "--preset", "multitask", "--multitask_epochs", "1", *flags
    )
    assert len(rows) == 1 and math.isfinite(rows[0]["train_loss"])


def test_individual_preset_trains_one_model_per_task(tiny_env, tmp_path):
    flags = "--preset individual --individual_epochs 1 --batch_size 16 --max_length 64"
    command.main(tiny_flags(tiny_env, tmp_path / "run", flags))
    for task in MULTITASK:  # a sub-run per task, scored on its own task only
        rows = (tmp_path / "run" / task / "metrics.jsonl").read_text().splitlines()
        last = json.loads(rows[-1])
        assert last["tasks"] == [task] and set(MULTITASK) & set(last) == {task}
        assert (tmp_path / "run" / task / "predictions" / f"{task}-test-output.csv").is_file()
    for use in (export.main, lambda argv: explore.main(["label", *argv])):  # one model each
        with pytest.raises(SystemExit, match="a model per task"):
            use([str(tmp_path / "run")])


@pytest.mark.parametrize(
    ("preset", "names"),
    [
        ("sequential", ["QQP", "STS", "SST"]),
        (
            "thesis-smart-simcse",
            ["SimCSE (sup)", "QQP", "loop 1: STS", "loop 1: SST", "loop 1: QQP 3%"],
        ),
        ("unsup-simcse", ["SimCSE (unsup)", "SST", "QQP"]),
    ],
)
def test_presets_run_their_stages(tiny_env, tmp_path, preset, names):
    rows = run(
        tiny_env,
        tmp_path / "run",
        "--preset",
        preset,
        "--sequential_epochs",
        "1",
        "1",
        "1",
        "--simcse_epochs",
        "1",
        "--individual_epochs",
        "1",
        "--smart_batch_size",
        "16",
    )
    assert [r["stage"] for r in rows] == names


def test_resume_uses_the_runs_own_flags(tiny_env, tmp_path):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    where = f"--resume {tmp_path / 'run'}: the run was made otherwise: "
    with pytest.raises(SystemExit, match=re.escape(where + "--eval_batch_size 4 (the run's: 128)")):
        command.parse_args(["--resume", str(tmp_path / "run"), "--eval_batch_size", "4"])
    with pytest.raises(SystemExit, match=re.escape(where + "--preset demo (the run's: thesis)")):
        command.parse_args(["--resume", str(tmp_path / "run"), "--preset", "demo", "--lr", "1e-3"])
    same = ["--preset", "thesis", "--lr", "1e-3", "--batch_size", "8"]  # as the run was made
    assert command.parse_args(["--resume", str(tmp_path / "run"), *same])[0].optim.lr == 1e-3
    cfg, folders = command.parse_args(["--resume", str(tmp_path / "run")])
    assert cfg.optim.lr == 1e-3 and cfg.optim.batch_size == 8  # from the run's config.json
    assert folders == {
        "resume": str(tmp_path / "run"),
        "predict": None,
        "show": None,
        "score": None,
        "estimate": None,
    }


def test_resuming_a_finished_run_says_so_and_trains_nothing(tiny_env, tmp_path, capsys):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    rows = (tmp_path / "run" / "metrics.jsonl").read_text()
    capsys.readouterr()
    command.main(["--resume", str(tmp_path / "run")])
    assert "after all 1 stages: best rescored" in capsys.readouterr().out
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == rows


def test_the_defended_preset_sets_its_tools_and_keeps_the_forgetting_measures(tiny_env, tmp_path):
    cfg, _ = command.parse_args(["--preset", "defended", "--lr", "1e-5"])
    assert cfg.optim.lr == 1e-5  # a typed flag wins over the preset's 3e-5
    assert (cfg.optim.head_lr_scale, cfg.optim.warmup, cfg.optim.decay) == (50.0, 0.1, "linear")
    assert cfg.optim.distill == 30.0
    assert cfg.multitask.sts_loss == "cosine_sbert" and not cfg.smart.enabled
    run(tiny_env, tmp_path / "run", "--preset", "defended")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    kept = json.loads((tmp_path / "run" / "forgetting.json").read_text())
    assert kept == evaluation.forgetting(rows, MULTITASK)
    assert set(kept) == {"sst", "para", "sts", "overall"}


@pytest.mark.parametrize(
    "flags, scorings",
    [("--loops 1", 1 + 4), ("--preset sequential --sequential_epochs 2 1 2 --patience 5", 1 + 5)],
)
def test_the_kept_models_dev_predictions_come_from_the_scoring_that_kept_it(
    tiny_env, tmp_path, monkeypatch, flags, scorings
):
    """Dev is scored before training and after every stage (or every epoch of a stage of
    several with --patience), and not again for the kept model's dev predictions: they are
    the scoring that kept it, the same files as --predict writes when it scores that model
    again."""
    splits, scored = [], runfolder.evaluate_split

    def counted(model, task_data, split, *rest):
        splits.append(split)
        return scored(model, task_data, split, *rest)

    monkeypatch.setattr(runfolder, "evaluate_split", counted)
    run(tiny_env, tmp_path / "run", *flags.split())
    assert (splits.count("dev"), splits.count("test")) == (scorings, 1)
    folder = tmp_path / "run" / "predictions"
    written = {p.name: p.read_bytes() for p in folder.glob("*-dev-output.csv")}
    command.main(["--predict", str(tmp_path / "run")])
    assert len(written) == 3 and written == {p.name: p.read_bytes() for p in folder.glob("*-dev-*")}


@pytest.mark.parametrize("loss", ["bce", "contrastive", "mnrl"])
def test_qqp_is_scored_by_what_its_loss_trained(tiny_env, tmp_path, monkeypatch, capsys, loss):
    bert_dir, _ = tiny_env
    started = {}
    real_run_plan = runner.run_plan

    def run_plan(plan, model, *args):  # the heads as training finds them
        started.update({k: v.clone() for k, v in model.heads.state_dict().items()})
        return real_run_plan(plan, model, *args)

    monkeypatch.setattr(command, "run_plan", run_plan)
    flags = ["--preset", "sequential", "--sequential_epochs", "1", "1", "1", "--para_loss", loss]
    run(tiny_env, tmp_path / "run", *flags)
    trained = weights(tmp_path / "run" / "state.safetensors")
    if loss == "bce":  # the head that the loss trains is the one that scores
        assert not torch.equal(trained["heads.para.weight"], started["para.weight"])
        return
    # the loss trains the embeddings only: no head, a cosine cut fit on training pairs
    assert "para.weight" not in started and trained["para_threshold"] != 0
    cfg = command.load_run_config(tmp_path / "run")
    model, info = command.best_model(cfg, tmp_path / "run", runtime.make_runtime("cpu", "fp32"))
    tokenizer = BertTokenizer.from_pretrained(str(bert_dir))
    dev = data.load_task_data(cfg.data, tokenizer, ("para",), 0)["para"].dev
    hits = []
    with torch.no_grad():
        for batch in batches.make_loader(dev, 64, shuffle=False):
            z = model.sentences(batch)  # (2B, H)
            u, v = z.view(2, -1, z.size(-1))
            cos = F.cosine_similarity(u, v, dim=-1)  # (B,)
            hits += ((cos > model.para_threshold) == (batch["labels"] > 0.5)).tolist()
    assert info["row"]["para"]["accuracy"] == pytest.approx(sum(hits) / len(hits))
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO("the cat\tthe dog\n"))
    explore.main(["label", str(tmp_path / "run")])  # a cut, not a probability
    line = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(r"paraphrase (yes|no) \(cos - cut [+-]\d\.\d{3}\)\tsimilarity .*", line)


def test_a_held_out_set_is_scored_after_every_stage_and_measured(tiny_env, tmp_path):
    rows = run(tiny_env, tmp_path / "run", "--heldout_size", "12")
    run(tiny_env, tmp_path / "plain")  # scoring more leaves training's random draws alone
    a, b = (
        weights(tmp_path / "run" / "state.safetensors"),
        weights(tmp_path / "plain" / "state.safetensors"),
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(0.0 <= r["heldout"] <= 1.0 for r in rows)
    kept = json.loads((tmp_path / "run" / "forgetting.json").read_text())
    start = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert kept["heldout"]["final_minus_start"] == pytest.approx(
        rows[-1]["heldout"] - start["heldout"]
    )


@pytest.mark.slow
def test_the_demo_trains_and_scores_the_same_sizes_on_the_handouts_real_size(
    tiny_env, tmp_path, capsys
):
    """On a data folder of the 2023 handout's size (141,506 Quora training pairs), the demo
    trains 12,000 and scores 2,000 per task: its length does not grow with the data."""
    from make_handout_standin import build

    bert_dir, small = tiny_env
    handout = tmp_path / "handout"
    assert build(small, handout)["quora-train.csv"] == 141_506
    flags = ["--preset", "demo", "--bert", str(bert_dir), "--data_dir", str(handout)]
    command.main([*flags, "--precision", "fp32", "--estimate"])
    out = capsys.readouterr().out
    assert "QQP: 12000 train, 2000 dev, 2000 test" in out
    assert re.search(r"\nQQP +375 +12000 ", out) and re.search(r"\nloop 1: QQP 3% +12 +360 ", out)


def test_estimate_times_each_kind_of_stage_once_and_makes_no_folder(
    tiny_env, tmp_path, capsys, monkeypatch
):
    timed = []
    real = estimate.time_steps
    monkeypatch.setattr(estimate, "time_steps", lambda *a: timed.append(a[2].tasks) or real(*a))
    flags = "--preset thesis --loops 2 --max_length 64 --estimate"
    command.main(tiny_flags(tiny_env, tmp_path / "r", flags))
    out = capsys.readouterr().out
    assert not (tmp_path / "r").exists()
    stages = ["QQP", "loop 1: STS", "loop 1: SST", "loop 1: QQP 3%", "loop 2: STS"]
    assert all(f"\n{s} " in out for s in stages) and "whole run: about" in out
    assert timed == [("para",), ("sts",), ("sst",)]  # QQP 3% is timed as QQP is
    rows = [line.split() for line in out.splitlines() if line.startswith("loop 1: SST ")]
    assert rows[0][3:5] == ["2", "48"]  # 48 training sentences in batches of 32: 2 steps


def test_score_scores_the_untrained_model_as_a_run_starts_and_makes_no_folder(
    tiny_env, tmp_path, capsys
):
    """--score prints the row a run's forgetting table starts with, the same numbers, and
    which attention ran; it trains nothing and makes no run folder."""
    flags = "--batch_size 8 --lr 1e-3 --seed 0 --loops 0 --max_length 64"
    row = command.main(tiny_flags(tiny_env, tmp_path / "none", flags, "--score"))
    out = capsys.readouterr().out
    assert not (tmp_path / "none").exists()
    assert "attention: bert.py's BertSelfAttention.attention" in out
    assert "start (no training)" in out
    command.main(tiny_flags(tiny_env, tmp_path / "run", flags))
    start = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    for task in ("sst", "para", "sts"):
        assert row[task] == start[task], task


def test_the_estimates_dev_scoring_is_timed_on_samples_and_scaled(monkeypatch):
    """commands.estimate.scoring_seconds scores two samples of each dev set, never the whole
    sets, and splits a fixed part from a per-example part: on a clock where a scoring takes
    3 s plus 0.01 s an example, it gives the whole sets' 3 + 0.01 * N."""
    from types import SimpleNamespace

    from commands import estimate

    clock, seen = [0.0], []

    def score(sample):
        n = sum(len(d.dev) for d in sample.values() if d.dev)
        seen.append(n)
        clock[0] += 3.0 + 0.01 * n

    monkeypatch.setattr(estimate.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(estimate, "head", lambda dev, n: list(range(min(n, len(dev)))))
    sets = {"sst": 1101, "para": 20215, "sts": 863}
    task_data = {t: SimpleNamespace(dev=list(range(n))) for t, n in sets.items()}
    task_data["heldout"] = SimpleNamespace(dev=None)
    monkeypatch.setattr(estimate, "replace", lambda d, dev: SimpleNamespace(dev=dev))
    seconds = estimate.scoring_seconds(task_data, score)
    assert seen == [3 * 128, 3 * 384]
    assert abs(seconds - (3.0 + 0.01 * sum(sets.values()))) < 1e-9
