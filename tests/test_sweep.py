"""lab/sweep.py: a search over a preset's settings with Optuna, killed mid-trial and resumed."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commands import command
from lab import sweep

optuna = pytest.importorskip("optuna")  # an optional package
REPO = sweep.ROOT


def run_flags(tiny_env) -> list[str]:
    """Every trial's flags: the tiny BERT and data, lr 1e-3, one loop of the thesis schedule."""
    bert_dir, data_dir = tiny_env
    flags = f"--bert {bert_dir} --data_dir {data_dir} --precision fp32 --batch_size 8 "
    return (flags + "--lr 1e-3 --seed 0 --loops 1 --max_length 64").split()


def argv(tiny_env, sweep_dir) -> list[str]:
    """Three trials over --lr and --distill on the tiny BERT: trial 0 the typed settings
    (lr 1e-3, no distillation), trial 1 a higher lr with distillation, trial 2 an lr that
    cannot learn, whose first stage falls below the median of the first two."""
    return [
        str(sweep_dir),
        *("--preset thesis --trials 3 --search lr=1e-7:1e-2:log distill=0:1".split()),
        *("--enqueue lr=2e-3,distill=0.5 --enqueue lr=1e-7,distill=0".split()),
        "--",
        *run_flags(tiny_env),
    ]


def kill_during_trial_1(proc, sweep_dir):
    """SIGKILL the sweep's process group (the sweep and its trial, as a lost session
    would) once trial 1 has finished a stage and saved its state (the row comes first:
    killed between the two, the trial would start again rather than continue)."""
    metrics = sweep_dir / "trial-001" / "metrics.jsonl"
    state = sweep_dir / "trial-001" / "state.safetensors"
    while proc.poll() is None:
        if state.is_file() and len(metrics.read_text().splitlines()) >= 2:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()
        time.sleep(0.2)
    pytest.fail("the sweep ended before trial 1 trained a stage")


def sweep_then_resume(command: list[str], sweep_dir: Path, out: Path):
    """Run `python -m lab.sweep COMMAND`, kill it during trial 1, resume it to its end:
    the resumed sweep's output."""
    with open(out, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lab.sweep", *command],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=os.environ | {"OMP_NUM_THREADS": "1"},
        )
        kill_during_trial_1(proc, sweep_dir)
    done = subprocess.run(
        [sys.executable, "-m", "lab.sweep", str(sweep_dir), "--resume"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_a_sweep_killed_mid_trial_resumes_without_running_a_trial_twice(tiny_env, tmp_path):
    sweep_dir = tmp_path / "sweep"
    sweep_then_resume(argv(tiny_env, sweep_dir), sweep_dir, tmp_path / "sweep.out")
    assert "3 trials: about" in (tmp_path / "sweep.out").read_text()  # --estimate, first
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{sweep_dir / 'study.db'}")
    states = [t.state.name for t in study.trials]
    # trial 2 (lr 1e-7) is pruned when a check finds it still running below the median;
    # a tiny run may end between two checks (test_the_pruner_sees_... decides the rule)
    assert states[:2] == ["COMPLETE", "COMPLETE"] and states[2] in ("PRUNED", "COMPLETE")
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
    if states[2] == "PRUNED":
        assert len(study.trials[2].intermediate_values) < 4  # stopped before its last stage
    table = (sweep_dir / "summary.md").read_text()
    assert table.count("| complete |") == 2 and table.count("| pruned |") == 1
    assert f"| 1 | complete | {kept:.4f} |" in table  # the kept model's dev overall
    assert (sweep_dir / "history.png").is_file()


@pytest.mark.slow
def test_a_sweep_over_choices_killed_while_drawing_at_random_resumes_with_new_settings(
    tiny_env, tmp_path
):
    """--search lr=1e-5,3e-5 smart=true,false: trial 0 the typed settings (lr 1e-3, outside
    the choices; no SMART), trial 1 drawn at random and killed after a stage; resumed,
    trial 1 continues and trial 2 is drawn by a sampler seeded anew (0 + 2 trials). No
    setting runs twice, and each run was given its trial's settings."""
    sweep_dir = tmp_path / "sweep"
    search = "--preset thesis --trials 3 --no_estimate --search lr=1e-5,3e-5 smart=true,false"
    argv = [str(sweep_dir), *search.split(), "--", *run_flags(tiny_env)]
    resumed = sweep_then_resume(argv, sweep_dir, tmp_path / "sweep.out")
    assert "2 trials so far; the sampler's seed: 2" in resumed
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{sweep_dir / 'study.db'}")
    assert [t.state.name for t in study.trials[:2]] == ["COMPLETE", "COMPLETE"]
    assert study.trials[2].state.name in ("COMPLETE", "PRUNED")
    assert study.trials[0].params == {"smart": False}  # lr 1e-3: run, not recorded
    settings = [t.params | t.user_attrs.get("preset", {}) for t in study.trials]
    assert settings[0] == {"lr": 1e-3, "smart": False}
    assert len({(s["lr"], s["smart"]) for s in settings}) == 3
    for number, values in enumerate(settings):
        cfg = command.load_run_config(sweep_dir / f"trial-{number:03d}")
        assert (cfg.optim.lr, cfg.smart.enabled) == (values["lr"], values["smart"])
    assert "resuming" in (sweep_dir / "trial-001.log").read_text()  # continued, not rerun
    assert "| 0 (preset) | complete |" in (sweep_dir / "summary.md").read_text()


def test_what_a_sweep_refuses(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # as if it were not installed
    with pytest.raises(SystemExit, match="^lab/sweep.py needs Optuna, an optional package"):
        sweep.need_optuna()
    monkeypatch.undo()
    with pytest.raises(SystemExit, match="expected LOW < HIGH"):
        sweep.parse_search(["lr=1e-3:1e-5"])
    with pytest.raises(SystemExit, match="expected FLAG=LOW:HIGH"):
        sweep.parse_search(["nonsense=1:2"])
    with pytest.raises(SystemExit, match="'yes' is neither true nor false"):
        sweep.parse_search(["smart=true,yes"])
    with pytest.raises(SystemExit, match="could not convert string to float: 'fast'"):
        sweep.parse_search(["lr=1e-5,fast"])
    with pytest.raises(SystemExit, match="a flag of several values"):
        sweep.parse_search(["cross_encode=para,sts"])
    assert sweep.parse_search(["loops=1:3", "sts_loss=mse,cosine_sbert"]) == {
        "loops": {"kind": "int", "low": 1, "high": 3, "log": False},
        "sts_loss": {"kind": "choice", "choices": ["mse", "cosine_sbert"]},
    }
    with pytest.raises(SystemExit):
        sweep.main([str(tmp_path / "nothing"), "--resume"])
    assert "no sweep.json" in capsys.readouterr().err
    new = [str(tmp_path / "new"), "--no_estimate", "--preset"]
    for flags, message in [
        (["thesis-smart", "--search", "smart=true,false"], "smart: False cannot be run"),
        (["thesis", "--search", "sts_loss=mse,no_such_loss"], "invalid choice: 'no_such_loss'"),
        (["thesis", "--search", "lr=1e-5,3e-5", "--enqueue", "lr=2e-5"], "lr outside its search"),
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
        number=3, state=SimpleNamespace(name="RUNNING"), datetime_complete=None, user_attrs={}
    )
    waiting.params = {"lr": 8.716828556481287e-05, "distill": 30.0, "loops": 2, "pooling": "cls"}
    cells = sweep.summary_cells(waiting, {}, ["distill", "loops", "lr", "pooling"])
    assert cells == ["3", "running", "", "", "30", "2", "8.717e-05", "cls", "", "0.0"]


class FakeRun:
    """Stands in for subprocess.Popen of a trial's multitask_classifier.py: it writes the
    run's forgetting table whole, as the run does after each stage, and exits on the poll
    after the first."""

    def __init__(self, rows: list[dict]):
        self.rows, self.argvs = rows, []

    def __call__(self, cmd, stdout, stderr):
        self.argvs.append(cmd[2:])  # after python and multitask_classifier.py
        folder = Path(cmd[cmd.index("--run_dir" if "--run_dir" in cmd else "--resume") + 1])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        self.returncode, self.polls = None, 0
        return self

    def poll(self):
        self.polls += 1
        self.returncode = 0 if self.polls > 1 else None
        return self.returncode

    def terminate(self):
        self.returncode = -15

    def wait(self):
        return self.returncode


def stages(*scores) -> list[dict]:
    """A forgetting table: the start row, then a stage per (dev overall, held-out AUC)."""
    rows = [{"stage": "start (no training)", "index": -1, "overall": 0.3, "heldout": 0.95}]
    return rows + [
        {"stage": f"stage {i}", "index": i, "overall": o, "heldout": h}
        for i, (o, h) in enumerate(scores)
    ]


def settings_for(search: list[str], objective="overall", trials=3, flags=()) -> dict:
    return {
        "preset": "thesis",
        "trials": trials,
        "objective": objective,
        "search": sweep.parse_search(search),
        "flags": list(flags),
        "enqueue": [],
        "seed": 0,
    }


def test_choices_keep_their_flags_types_and_trial_0_runs_the_preset_outside_them(
    tmp_path, monkeypatch
):
    """lr=1e-5,3e-5 smart=true,false with the preset's lr (1e-3) among neither: trial 0 runs
    it, records smart (in the search) and not lr, and a --resume of it runs the same."""
    settings = settings_for(["lr=1e-5,3e-5", "smart=true,false"], flags=["--lr", "1e-3"])
    assert settings["search"] == {
        "lr": {"kind": "choice", "choices": [1e-5, 3e-5]},
        "smart": {"kind": "choice", "choices": [True, False]},
    }
    run = FakeRun(stages((0.6, 0.9)))
    monkeypatch.setattr(sweep.subprocess, "Popen", run)
    monkeypatch.setattr(sweep.time, "sleep", lambda s: None)
    monkeypatch.setattr(sweep, "optuna_plots", lambda *a: None)
    study = sweep.open_study(optuna, tmp_path, settings)
    study.ask()  # trial 0, stopped before it ran (a kill): --resume continues it
    again = sweep.open_study(optuna, tmp_path, settings)
    for trial in sweep.stopped_trials(optuna, again, tmp_path):
        sweep.run_trial(optuna, again, trial, tmp_path, settings)
    sweep.run_trial(optuna, again, again.ask(), tmp_path, settings)  # trial 1: drawn

    first, drawn = again.trials
    assert [first.state.name, drawn.state.name] == ["COMPLETE", "COMPLETE"]
    assert first.params == {"smart": False}  # lr 1e-3 lies outside the choices
    assert first.user_attrs["preset"] == {"lr": 1e-3, "smart": False}
    assert drawn.params["lr"] in (1e-5, 3e-5) and drawn.params["smart"] in (True, False)
    for argv, values in zip(run.argvs, (first.user_attrs["preset"], drawn.params), strict=True):
        cfg, _ = command.parse_args(argv)  # what each run was given
        assert (cfg.optim.lr, cfg.smart.enabled) == (values["lr"], values["smart"])
    table = sweep.summary(optuna, again, tmp_path, "overall")
    assert "| 0 (preset) | complete | 0.6000 | 0.9000 | 0.001 | False |" in table


def test_a_resumed_sweep_draws_new_settings(tmp_path):
    """Killed while trial 1 runs (drawn at random), then resumed: trial 2, still drawn at
    random (the first 9 // 3 trials are), must not draw trial 1's lr again."""
    settings = settings_for(["lr=1e-6:1e-4:log"], trials=9)
    study = sweep.open_study(optuna, tmp_path, settings)
    study.tell(study.ask(), 0.5)  # trial 0: the preset
    first = sweep.suggest(study.ask(), settings["search"])  # trial 1, then the kill

    again = sweep.open_study(optuna, tmp_path, settings)  # --resume
    (stopped,) = sweep.stopped_trials(optuna, again, tmp_path)
    assert sweep.suggest(stopped, settings["search"]) == first  # its own, stored
    again.tell(stopped, 0.4)
    assert sweep.suggest(again.ask(), settings["search"]) != first


def test_the_pruner_sees_the_value_the_trial_would_return(tmp_path, monkeypatch):
    """--objective heldout: the value is the held-out AUC of the stage kept by overall. Stage
    1 (overall 0.4) is not kept, so its AUC (0.95) is not the trial's; stage 2 is kept and its
    AUC (0.80) falls below the finished trials' median there (0.855): pruned, with 0.80."""
    settings = settings_for(["lr=1e-6:1e-4:log"], objective="heldout")
    study = sweep.open_study(optuna, tmp_path, settings)
    lr = optuna.distributions.FloatDistribution(1e-6, 1e-4, log=True)
    for values in ([0.88, 0.88, 0.85], [0.89, 0.89, 0.86]):
        finished = optuna.trial.create_trial(
            value=values[-1],
            params={"lr": 2e-5},
            distributions={"lr": lr},
            intermediate_values=dict(enumerate(values)),
        )
        study.add_trial(finished)
    monkeypatch.setattr(
        sweep.subprocess, "Popen", FakeRun(stages((0.5, 0.9), (0.4, 0.95), (0.6, 0.8)))
    )
    monkeypatch.setattr(sweep.time, "sleep", lambda s: None)
    trial = study.ask()
    sweep.run_trial(optuna, study, trial, tmp_path, settings)
    ran = study.trials[trial.number]
    assert ran.intermediate_values == {0: 0.9, 1: 0.9, 2: 0.8}
    assert (ran.state.name, ran.value) == ("PRUNED", 0.8)


def test_the_summary_sorts_by_the_score_it_shows(tmp_path, monkeypatch):
    """A pruned trial's Optuna value may be a stage's own score (0.60, its last); the table
    shows its kept stage (0.75) and ranks it by that, above a finished 0.70."""
    monkeypatch.setattr(sweep, "optuna_plots", lambda *a: None)
    study = optuna.create_study(direction="maximize")
    for state, value, scores in (
        ("COMPLETE", 0.70, [(0.65, 0.9), (0.70, 0.9)]),
        ("PRUNED", 0.60, [(0.75, 0.9), (0.60, 0.9)]),
    ):
        study.add_trial(
            optuna.trial.create_trial(state=optuna.trial.TrialState[state], value=value)
        )
        folder = tmp_path / f"trial-{len(study.trials) - 1:03d}"
        folder.mkdir()
        text = "".join(json.dumps(r) + "\n" for r in stages(*scores))
        (folder / "metrics.jsonl").write_text(text)
    table = sweep.summary(optuna, study, tmp_path, "overall")
    assert table.index("| 1 | pruned | 0.7500 |") < table.index("| 0 | complete | 0.7000 |")
