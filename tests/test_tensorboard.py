"""--tensorboard: every step logged once, also across a kill and a resume, read back with
TensorBoard's own reader; without its package, one line that says how to install it."""

import json
import sys

import pytest

import trainer
from commands import command
from helpers import (
    run,
    sigterm_on_call,
)


def test_tensorboard_holds_every_step_once_also_after_a_resume(tiny_env, tmp_path, monkeypatch):
    """Read back with tensorboard's own reader: 19 steps (6 + 6 + 6 + 1), each once, though
    the run was killed at its 8th step and resumed; dev scores at the start and after each
    stage, at the step that ended it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sigterm_on_call(monkeypatch, trainer, "train_step", 8)
    with pytest.raises(SystemExit):
        run(tiny_env, tmp_path / "run", "--tensorboard")
    monkeypatch.undo()
    command.main(["--resume", str(tmp_path / "run")])
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
