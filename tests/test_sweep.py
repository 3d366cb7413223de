"""lab/sweep.py: a search over a preset's settings with Optuna, killed mid-trial and resumed."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from lab import sweep

optuna = pytest.importorskip("optuna")  # an optional package
REPO = sweep.ROOT


def argv(tiny_env, sweep_dir) -> list[str]:
    """Three trials over --lr and --distill on the tiny BERT: trial 0 the typed settings
    (lr 1e-3, no distillation), trial 1 a higher lr with distillation, trial 2 an lr that
    cannot learn, whose first stage falls below the median of the first two."""
    bert_dir, data_dir = tiny_env
    run_flags = f"--bert {bert_dir} --data_dir {data_dir} --precision fp32 --batch_size 8 "
    run_flags += "--lr 1e-3 --seed 0 --loops 1 --max_length 64"
    return [
        str(sweep_dir),
        *("--preset thesis --trials 3 --search lr=1e-7:1e-2:log distill=0:1".split()),
        *("--enqueue lr=2e-3,distill=0.5 --enqueue lr=1e-7,distill=0".split()),
        "--",
        *run_flags.split(),
    ]


def kill_during_trial_1(proc, sweep_dir):
    """SIGKILL the sweep's process group (the sweep and its trial, as a lost session
    would) once trial 1 has finished a stage."""
    metrics = sweep_dir / "trial-001" / "metrics.jsonl"
    while proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 2:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()
        time.sleep(0.2)
    pytest.fail("the sweep ended before trial 1 trained a stage")


@pytest.mark.slow
def test_a_sweep_killed_mid_trial_resumes_without_running_a_trial_twice(tiny_env, tmp_path):
    sweep_dir = tmp_path / "sweep"
    out = open(tmp_path / "sweep.out", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab.sweep", *argv(tiny_env, sweep_dir)],
        cwd=REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )
    kill_during_trial_1(proc, sweep_dir)
    assert "3 trials: about" in (tmp_path / "sweep.out").read_text()  # --estimate, first

    done = subprocess.run(
        [sys.executable, "-m", "lab.sweep", str(sweep_dir), "--resume"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{sweep_dir / 'study.db'}")
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert [t.params["lr"] for t in study.trials] == [1e-3, 2e-3, 1e-7]
    assert sorted(p.name for p in sweep_dir.glob("trial-???")) == [
        "trial-000",
        "trial-001",
        "trial-002",
    ]
    resumed = sweep_dir / "trial-001"
    assert "resuming" in (sweep_dir / "trial-001.log").read_text()  # continued, not rerun
    rows = [json.loads(x) for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == [-1, 0, 1, 2, 3]  # one start row, each stage once
    steps = [json.loads(x) for x in (resumed / "steps.jsonl").read_text().splitlines()]
    assert len({(s["stage"], s["epoch"], s["step"]) for s in steps}) == len(steps)
    kept = max(rows[1:], key=lambda r: r["overall"])["overall"]
    assert study.trials[1].value == pytest.approx(kept)
    assert len(study.trials[2].intermediate_values) < 4  # stopped before its last stage
    table = (sweep_dir / "summary.md").read_text()
    assert table.count("| complete |") == 2 and table.count("| pruned |") == 1
    assert f"| 1 | complete | {kept:.4f} |" in table  # the kept model's dev overall
    assert (sweep_dir / "history.png").is_file()


def test_what_a_sweep_refuses(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # as if it were not installed
    with pytest.raises(SystemExit, match="^lab/sweep.py needs Optuna, an optional package"):
        sweep.need_optuna()
    monkeypatch.undo()
    with pytest.raises(SystemExit, match="expected LOW < HIGH"):
        sweep.parse_search(["lr=1e-3:1e-5"])
    with pytest.raises(SystemExit, match="expected FLAG=LOW:HIGH"):
        sweep.parse_search(["nonsense=1:2"])
    assert sweep.parse_search(["loops=1:3", "sts_loss=mse,cosine_sbert"]) == {
        "loops": {"kind": "int", "low": 1, "high": 3, "log": False},
        "sts_loss": {"kind": "choice", "choices": ["mse", "cosine_sbert"]},
    }
    with pytest.raises(SystemExit):
        sweep.main([str(tmp_path / "nothing"), "--resume"])
    assert "no sweep.json" in capsys.readouterr().err
    new = [str(tmp_path / "new"), "--no_estimate", "--preset"]
    for flags, message in [
        (["thesis", "--search", "lr=1e-7:1e-6"], "the preset's own value 1e-05 (trial 0) lies"),
        (["thesis", "--search", "lr=1e-6:1e-4", "--objective", "heldout"], "--heldout_size"),
        (["individual", "--search", "lr=1e-6:1e-4"], "keeps a model per task"),
        (["thesis", "--search", "lr=1e-6:1e-4", "--trials", "0"], "--trials must be at least 1"),
        (["thesis", "--search", "lr=1e-6:1e-4", "--enqueue", "lr=fast"], "--enqueue lr=fast:"),
    ]:
        with pytest.raises(SystemExit) as stop:
            sweep.main(new + flags)
        assert message in capsys.readouterr().err + str(stop.value.code)  # parser's, or ours
    assert not (tmp_path / "new").exists()  # refused before anything was made


def test_a_trial_that_has_not_scored_its_start_has_no_rows_yet(tmp_path):
    assert sweep.trial_rows(tmp_path) == []  # no file yet
    (tmp_path / "metrics.jsonl").write_text("")  # a new run writes its table empty first
    assert sweep.trial_rows(tmp_path) == []
    (tmp_path / "metrics.jsonl").write_text('{"stage": "start (no training)", "index": -1}\n')
    assert sweep.trial_rows(tmp_path) == [{"stage": "start (no training)", "index": -1}]


def test_a_summary_row_gives_settings_to_four_digits(tmp_path):
    from types import SimpleNamespace

    waiting = SimpleNamespace(
        number=3, state=SimpleNamespace(name="RUNNING"), datetime_complete=None
    )
    waiting.params = {"lr": 8.716828556481287e-05, "distill": 30.0, "loops": 2, "pooling": "cls"}
    cells = sweep.summary_cells(waiting, ["distill", "loops", "lr", "pooling"], tmp_path)
    assert cells == ["3", "running", "", "", "30", "2", "8.717e-05", "cls", "", "0.0"]
