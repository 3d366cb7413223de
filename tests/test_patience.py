"""--patience: early stopping across stages and inside a stage of several epochs (its best
epoch kept), and the stopped run finished; a run killed inside such a stage and resumed is
test_trainer.py's."""

import json

import torch

from commands import command, runfolder
from engine import checkpoint
from helpers import (
    run,
    tiny_flags,
    weights,
)


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
    command.main(["--resume", str(tmp_path / "run")])
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
    scored, score = [], runfolder.Run.scored
    monkeypatch.setattr(runfolder.Run, "scored", lambda *a, **k: scored.append(1) or score(*a, **k))
    flags = "--preset individual --batch_size 8 --lr 1e-3 --max_length 64 --individual_epochs"
    command.main(tiny_flags(tiny_env, tmp_path / "patient", flags, "3", "--patience", "1"))
    assert len(scored) == 3 * 3  # per task: the start and two epochs; the kept one not again
    command.main(tiny_flags(tiny_env, tmp_path / "one", flags, "1"))
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
