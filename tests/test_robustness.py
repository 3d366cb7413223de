"""A run that meets trouble (docs/robustness.md): a full disk, a GPU out of memory, a broken
or missing checkpoint, SIGTERM, a second process on its folder, a dev set that scores NaN."""

import pytest
import torch

import trainer
from commands import command, outputs
from engine import checkpoint
from helpers import (
    interrupt_stage,
    no_training,
    run,
    tiny_argv,
)


def test_a_full_disk_is_one_line_and_the_run_resumes(tiny_env, tmp_path, monkeypatch):
    import errno
    import os

    from commands.cli import run_cli

    def full(*a, **k):  # the predictions, written after the last stage's checkpoint
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real = outputs.write_predictions
    monkeypatch.setattr(outputs, "write_predictions", full)
    argv = tiny_argv(tiny_env, tmp_path / "run", "--loops", "0")
    with pytest.raises(SystemExit, match=r"^error: the disk is full; free space and run it again"):
        run_cli(command.main, argv)
    with pytest.raises(OSError):  # --debug, or another OSError: the traceback
        run_cli(command.main, [*argv, "--debug", "--run_dir", str(tmp_path / "r2")])
    monkeypatch.setattr(outputs, "write_predictions", real)
    run_cli(command.main, ["--resume", str(tmp_path / "run")])
    assert list((tmp_path / "run" / "predictions").glob("*-dev-output.csv"))


def test_gpu_out_of_memory_is_one_line_and_the_run_resumes_in_smaller_pieces(
    tiny_env, tmp_path, monkeypatch
):
    real, calls = trainer.train_step, []

    def step(*args, **kwargs):  # the 10th step (in loop 1: STS) runs out of GPU memory
        calls.append(1)
        if len(calls) == 10:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "train_step", step)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        command.main(tiny_argv(tiny_env, run_dir))
    assert str(stop.value.code) == (
        f"error: the GPU ran out of memory (Tried to allocate 2.00 GiB); continue from the "
        f"last checkpoint with --resume {run_dir} --accumulate 2 (each batch in 2 pieces, the "
        f"same gradient), or start again with a smaller --batch_size, --max_length or "
        f"--eval_batch_size (scoring)"
    )
    command.main(["--resume", str(run_dir), "--accumulate", "2"])  # a machine setting
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1 + 4 and (run_dir / "predictions").is_dir()  # start, then 4 stages


def test_a_broken_best_checkpoint_is_found_when_resuming(tiny_env, tmp_path, monkeypatch):
    interrupt_stage(monkeypatch, 2)
    with pytest.raises(SystemExit) as stop:  # main turns the interrupt into a clean stop
        command.main(tiny_argv(tiny_env, tmp_path / "run"))
    assert stop.value.code == 130
    best = tmp_path / "run" / "best.safetensors"
    best.write_bytes(best.read_bytes()[:50])
    no_training(monkeypatch)
    with pytest.raises(checkpoint.CheckpointError, match="best.safetensors: not a readable"):
        command.main(["--resume", str(tmp_path / "run")])


def test_a_run_without_its_state_is_not_started_over(tiny_env, tmp_path, monkeypatch):
    interrupt_stage(monkeypatch, 2)
    with pytest.raises(SystemExit):
        command.main(tiny_argv(tiny_env, tmp_path / "run"))
    (tmp_path / "run" / "state.safetensors").unlink()
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    no_training(monkeypatch)
    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"state.safetensors: missing; nothing .*best.safetensors serves --predict\)$",
    ):
        command.main(["--resume", str(tmp_path / "run")])
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == metrics  # nothing wiped


def test_sigterm_stops_after_a_checkpoint_and_says_how_to_resume(
    tiny_env, tmp_path, monkeypatch, capsys
):
    import os
    import signal

    import trainer

    real = trainer.train_stage

    def terminated_after(*a, **k):
        loss = real(*a, **k)
        os.kill(os.getpid(), signal.SIGTERM)  # what Colab's stop button or `kill` sends
        return loss

    monkeypatch.setattr(trainer, "train_stage", terminated_after)
    old = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as stop:
            command.main(tiny_argv(tiny_env, tmp_path / "run"))
    finally:
        signal.signal(signal.SIGTERM, old)
    assert stop.value.code == 130
    assert f"continue it with --resume {tmp_path / 'run'}" in capsys.readouterr().out
    monkeypatch.setattr(trainer, "train_stage", real)
    command.main(["--resume", str(tmp_path / "run")])
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 5  # start + QQP + one loop of three stages


def test_a_second_process_on_the_same_run_folder_is_refused(tiny_env, tmp_path, monkeypatch):
    no_training(monkeypatch)
    with checkpoint.locked(tmp_path / "run"):
        with pytest.raises(checkpoint.CheckpointError, match="in use by another run"):
            command.main(tiny_argv(tiny_env, tmp_path / "run"))


def test_a_dev_set_that_scores_nan_never_makes_a_stage_best(tiny_env, tmp_path, capsys):
    dev = tiny_env[1] / "sts-dev.csv"
    lines = dev.read_text().splitlines()
    dev.write_text("\n".join([lines[0]] + [r.rsplit("\t", 1)[0] + "\t2.0" for r in lines[1:]]))
    run(tiny_env, tmp_path / "run", "--loops", "0")  # STS r of constant labels: nan
    assert "no stage had a numeric score" in capsys.readouterr().out
    assert not (tmp_path / "run" / "best.safetensors").exists()
    assert (tmp_path / "run" / "predictions" / "sts-dev-output.csv").is_file()
