"""lab/ensemble.py: averaging the best models of run folders, against each member alone."""

import math

import pytest
import torch

import evaluation
from commands import command, outputs
from engine import runtime
from helpers import run
from lab import ensemble


def test_an_ensemble_of_one_run_is_that_run(tiny_env, tmp_path, capsys):
    run(tiny_env, tmp_path / "a", "--loops", "0")
    command.main(["--predict", str(tmp_path / "a")])
    ensemble.main([str(tmp_path / "a"), "--out", str(tmp_path / "e")])
    table = capsys.readouterr().out.splitlines()
    member, alone = (
        line.split("|", 1)[1] for line in table if line.startswith(("member 1 ", "ensemble "))
    )
    assert member == alone
    for task in evaluation.MULTITASK:
        for split in ("dev", "test"):
            ours = outputs.read_predictions(
                outputs.prediction_path(tmp_path / "e" / "predictions", task, split)
            )
            run_s = outputs.read_predictions(
                outputs.prediction_path(tmp_path / "a" / "predictions", task, split)
            )
            assert ours[0] == run_s[0]
            if task == "sts":
                assert ours[1] == pytest.approx(run_s[1], abs=1e-5)
            else:
                assert ours[1] == run_s[1], (task, split)


def test_members_with_other_heads_average_what_their_heads_mean(tiny_env, tmp_path):
    """A siamese member and a cross-encoded one (QQP and STS as one sequence) each predict
    with their own batches; the ensemble's QQP probability is the mean of theirs."""
    run(tiny_env, tmp_path / "siamese", "--loops", "0")
    run(
        tiny_env, tmp_path / "cross", "--loops", "0", "--cross_encode", "para", "sts", "--seed", "3"
    )
    rt = runtime.make_runtime("cpu", "fp32")
    members = {
        str(p): ensemble.member_outputs(tmp_path / p, rt, ("dev",)) for p in ("siamese", "cross")
    }
    mean = ensemble.average(members)
    (ids_a, a, _), (ids_b, b, _) = (m["para", "dev"] for m in members.values())
    assert ((a >= 0) & (a <= 1)).all() and sorted(ids_a) == sorted(ids_b) and ids_a != ids_b
    b = torch.tensor([b[ids_b.index(i)].item() for i in ids_a])  # cross-encoded: other order
    torch.testing.assert_close(mean["para", "dev"][1], (a + b) / 2)
    sst = mean["sst", "dev"][1]
    torch.testing.assert_close(sst.sum(-1), torch.ones(len(sst)))  # probabilities, averaged
    results = ensemble.scored(mean)
    assert set(results) == set(evaluation.MULTITASK)
    assert not math.isnan(results["sts"].metrics["pearson"])  # averaged scores, scored


def test_members_that_cannot_be_averaged_are_refused(tiny_env, tmp_path):
    run(tiny_env, tmp_path / "a", "--loops", "0")
    run(tiny_env, tmp_path / "cos", "--loops", "0", "--para_loss", "cosine_mse")
    with pytest.raises(SystemExit, match="cos: QQP is read out by a cosine cut .cosine_mse."):
        ensemble.main([str(tmp_path / "a"), str(tmp_path / "cos"), "--out", str(tmp_path / "e")])
    run(tiny_env, tmp_path / "small", "--loops", "0", "--dev_size", "8")
    with pytest.raises(SystemExit, match="predicted other SST dev examples than"):
        ensemble.main([str(tmp_path / "a"), str(tmp_path / "small"), "--out", str(tmp_path / "e")])
    assert not (tmp_path / "e").exists()


def test_a_member_with_its_data_moved_or_best_model_gone_is_one_line(tiny_env, tmp_path):
    from commands.cli import run_cli

    run(tiny_env, tmp_path / "a", "--loops", "0")
    moved = tiny_env[1].rename(tmp_path / "moved")
    argv = [str(tmp_path / "a"), "--out", str(tmp_path / "e"), "--no_test_predictions"]
    with pytest.raises(SystemExit, match=r"^error: data file .*/data/.* not found"):
        run_cli(ensemble.main, argv)
    argv += ["--data_dir", str(moved)]
    assert run_cli(ensemble.main, argv) == 0  # the data found where it moved
    (tmp_path / "a" / "best.safetensors").unlink()
    with pytest.raises(SystemExit, match=r"^error: .*a/best.safetensors"):
        run_cli(ensemble.main, argv)
