"""Search a preset's settings with Optuna: every trial a run folder, the study in SQLite.

    python -m lab.sweep SWEEP_DIR --preset demo --trials 8 --search lr=1e-5:1e-4:log distill=3:300:log
    python -m lab.sweep SWEEP_DIR --resume          continue a stopped sweep where it was
    python -m lab.sweep SWEEP_DIR --preset demo ... -- --train_size 3000   flags for every trial

--search takes a run flag (without its dashes) and its range: `low:high` (`:log` for a
log scale; an int flag draws ints) or choices `a,b,c`, each read as the flag reads it (a
switch such as smart takes true,false: given or not). Trial 0 runs the preset's own
settings, the baseline the search has to beat, even where they lie outside the search
(Optuna then records only the settings inside it); --enqueue adds more fixed trials. Each
trial is `multitask_classifier.py` in SWEEP_DIR/trial-NNN: a normal run folder that
resumes. After every stage the trial's value so far (--objective: the overall score, or
the held-out AUC, of the stage the run keeps so far) goes to Optuna; the trial stops
when that value falls below the median of the finished trials' values at that stage. A
finished trial's value is its kept model's score.

The study lives in SWEEP_DIR/study.db: a sweep stopped by Ctrl-C, a kill or a lost
session continues with --resume, its unfinished trial from that trial's last checkpoint,
so no trial runs twice; the sampler is seeded anew (--seed plus the trials so far), so it
does not draw the stopped session's settings again. Before a new sweep, `--estimate` times
the preset to say how long the trials will take. At the end, summary.md (a table of the
trials), history.png and importance.png (Optuna's plots) are written to SWEEP_DIR. Optuna
is optional: `pip install optuna`.
"""

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run as python lab/NAME.py: the course's modules are one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import evaluation
from commands import cli, command, flags
from engine import checkpoint
from engine.checkpoint import METRICS, STATE, atomic_write
from settings import RunConfig

ROOT = Path(__file__).resolve().parent.parent  # the repository
SETTINGS = "sweep.json"  # the sweep's own arguments, for --resume
STUDY = "study.db"
OBJECTIVES = ("overall", "heldout")


def need_optuna():
    try:
        import optuna
    except ImportError:
        raise SystemExit(
            "lab/sweep.py needs Optuna, an optional package: pip install optuna"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def searchable() -> dict[str, tuple]:
    """{flag without its dashes: (config field, default)}: what --search may name."""
    return {flags.flag_of(f)[2:]: (f, value) for _, f, value in flags.leaves(RunConfig())}


def typed(name: str, text: str) -> bool | int | float | str:
    """A value as the flag reads it (its config field's type); a switch's true or false."""
    f, default = searchable()[name]
    if isinstance(default, bool):
        if text.lower() not in ("true", "false"):
            raise ValueError(f"{text!r} is neither true nor false")
        return text.lower() == "true"
    return f.metadata.get("type", str if default is None else type(default))(text)


def flag_values(cfg) -> dict:
    """{flag without its dashes: value} of a config; a switch's value is whether it is given
    (--smart: SMART on; --no_amp: amp off)."""
    return {
        flags.flag_of(f)[2:]: value != f.default if isinstance(value, bool) else value
        for _, f, value in flags.leaves(cfg)
    }


def parse_search(specs: list[str]) -> dict[str, dict]:
    """{flag: {'kind': float | int | choice, ...}} from 'lr=1e-5:1e-4:log' and 'x=a,b'."""
    known = searchable()
    out = {}
    for spec in specs:
        name, _, rng = spec.partition("=")
        if name not in known or not rng:
            raise SystemExit(f"--search {spec}: expected FLAG=LOW:HIGH[:log] or FLAG=A,B,..")
        default = known[name][1]
        if isinstance(default, list | tuple):
            raise SystemExit(f"--search {spec}: a flag of several values cannot be searched")
        if "," in rng or not isinstance(default, int | float) or isinstance(default, bool):
            try:  # choices of the flag's own type: Optuna matches trial 0's value against them
                out[name] = {"kind": "choice", "choices": [typed(name, c) for c in rng.split(",")]}
            except ValueError as e:
                raise SystemExit(f"--search {spec}: {e}") from None
            continue
        low, high, *log = rng.split(":")
        kind = type(default).__name__
        try:
            bounds = typed(name, low), typed(name, high)
        except ValueError:
            raise SystemExit(f"--search {spec}: {low} and {high} must be {kind}s") from None
        if not bounds[0] < bounds[1] or log not in ([], ["log"]) or (log and bounds[0] <= 0):
            raise SystemExit(f"--search {spec}: expected LOW < HIGH (both > 0 with :log)")
        out[name] = {"kind": kind, "low": bounds[0], "high": bounds[1], "log": bool(log)}
    return out


def in_search(s: dict, value) -> bool:
    return value in s["choices"] if s["kind"] == "choice" else s["low"] <= value <= s["high"]


def suggest(trial, search: dict) -> dict:
    """The trial's value of every searched flag (stored ones when it runs again)."""
    values = {}
    for name, s in search.items():
        if s["kind"] == "choice":
            values[name] = trial.suggest_categorical(name, s["choices"])
        elif s["kind"] == "int":
            values[name] = trial.suggest_int(name, s["low"], s["high"], log=s["log"])
        else:
            values[name] = trial.suggest_float(name, s["low"], s["high"], log=s["log"])
    return values


def trial_values(trial, search: dict) -> dict:
    """The settings a trial runs. Trial 0 runs the preset's (its user attribute 'preset');
    Optuna records those that lie in the search as its params, and knows nothing of the
    others. Every other trial runs what the sampler draws."""
    preset = trial.user_attrs.get("preset")
    if preset is None:
        return suggest(trial, search)
    suggest(trial, {name: s for name, s in search.items() if in_search(s, preset[name])})
    return preset


def trial_flags(settings: dict, values: dict) -> list[str]:
    argv = ["--preset", settings["preset"], *settings["flags"]]
    for name, value in values.items():
        if isinstance(value, bool):  # a switch: given or not
            argv += [f"--{name}"] if value else []
        elif value is not None:  # None: unset, as the preset leaves it (no flag gives None)
            argv += [f"--{name}", str(value)]
    return argv


def objective_of(row: dict, objective: str) -> float:
    return row["heldout"] if objective == "heldout" else row["overall"]


def running_value(rows: list[dict], objective: str) -> float | None:
    """The value the trial would have if it ended after the last of `rows`: the objective
    at the stage kept so far (chosen by the overall score, whatever the objective)."""
    kept = evaluation.kept_row(rows)
    return None if kept is None else objective_of(kept, objective)


def below_median(optuna, study, step: int, value: float) -> bool:
    """Optuna's median rule on the trial's value now: below the median of the finished
    trials' values at the same stage, once two have finished. (Optuna's MedianPruner would
    compare the trial's best value so far: under --objective heldout a later kept stage
    can lower the value the trial returns.)"""
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    at_step = [t.intermediate_values.get(step, math.nan) for t in done]
    at_step = [v for v in at_step if not math.isnan(v)]
    return len(done) >= 2 and bool(at_step) and value < statistics.median(at_step)


def trial_rows(folder: Path) -> list[dict]:
    """The trial's forgetting table so far: none before the run has scored its start (the
    file is written whole each time, and empty until then)."""
    path = folder / METRICS
    return checkpoint.read_rows(folder) if path.is_file() and path.stat().st_size else []


def follow(optuna, study, trial, proc, folder: Path, objective: str) -> int | None:
    """Report each new stage's running value while the run trains (and once more after it
    ends); stop the run at a stage whose value falls below the median and return that
    stage's index. None: the run ended by itself."""
    reported = set(study.trials[trial.number].intermediate_values)  # before a restart
    while True:
        running = proc.poll() is None
        rows = trial_rows(folder)
        for end, row in enumerate(rows[1:], 2):  # after the start row: one per stage
            value = running_value(rows[:end], objective)
            if row["index"] in reported or value is None:
                continue
            trial.report(value, row["index"])
            reported.add(row["index"])
            if running and below_median(optuna, study, row["index"], value):
                proc.terminate()  # the run saves and stops between two steps
                proc.wait()
                return row["index"]
        if not running:
            return None
        time.sleep(0.25)


def run_trial(optuna, study, trial, sweep_dir: Path, settings: dict) -> None:
    """Train one trial (or continue it from its folder), reporting each stage's value to
    Optuna; tell the study how it ended."""
    folder = sweep_dir / f"trial-{trial.number:03d}"
    values = trial_values(trial, settings["search"])
    given = trial_flags(settings, values)
    again = (folder / STATE).is_file()
    argv = ["--resume", str(folder), *given] if again else [*given, "--run_dir", str(folder)]
    what = " (the preset)" if "preset" in trial.user_attrs else ""
    print(f"trial {trial.number}{what}: {' '.join(f'{k}={v}' for k, v in values.items())}")
    with open(sweep_dir / f"trial-{trial.number:03d}.log", "a") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "multitask_classifier.py"), *argv], stdout=log, stderr=log
        )
        pruned = follow(optuna, study, trial, proc, folder, settings["objective"])
    if pruned is not None:  # Optuna keeps the last reported value: the value at that stage
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return print(f"trial {trial.number}: pruned after stage {pruned + 1}")
    kept = evaluation.kept_row(trial_rows(folder))
    if proc.returncode or kept is None:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return print(f"trial {trial.number}: failed (exit {proc.returncode}); see {log.name}")
    value = objective_of(kept, settings["objective"])
    study.tell(trial, value)
    print(f"trial {trial.number}: {settings['objective']} {value:.4f} ({kept['stage']})")


def estimate_trials(settings: dict) -> None:
    """The preset timed by the driver's --estimate (command.main, here in this
    process), times the trials."""
    minutes = command.main([*trial_flags(settings, {}), "--estimate"]) * settings["trials"]
    torch.cuda.empty_cache()  # the trials, each a process of its own, need the GPU's memory
    print(f"{settings['trials']} trials: about {minutes:.1f} minutes without pruning")


def summary_cells(t, row: dict, names: list[str]) -> list[str]:
    """One trial's row: its kept model's dev overall and held-out AUC (`row`, both, whichever
    is the objective; a pruned trial's kept stage so far), its settings (trial 0's are the
    preset's, searched or not), where and how long."""
    scores = [f"{row[k]:.4f}" if row.get(k) is not None else "" for k in ("overall", "heldout")]
    took = (
        (t.datetime_complete - t.datetime_start).total_seconds() / 60 if t.datetime_complete else 0
    )
    values = t.params | t.user_attrs.get("preset", {})
    settings = [f"{v:.4g}" if isinstance(v := values.get(n, ""), float) else str(v) for n in names]
    return [
        f"{t.number} (preset)" if "preset" in t.user_attrs else str(t.number),
        t.state.name.lower(),
        *scores,
        *settings,
        row.get("stage", ""),
        f"{took:.1f}",
    ]


def summary(optuna, study, sweep_dir: Path, objective: str) -> str:
    """summary.md: one row per trial, the best by the objective (the score the row shows)
    first; and Optuna's plots."""
    shown = {
        t.number: evaluation.kept_row(trial_rows(sweep_dir / f"trial-{t.number:03d}")) or {}
        for t in study.trials
    }

    def score(t) -> float:
        value = shown[t.number].get(objective)
        return -math.inf if value is None or math.isnan(value) else value

    trials = sorted(study.trials, key=score, reverse=True)  # stable: unscored ones in order
    names = sorted({k for t in trials for k in t.params | t.user_attrs.get("preset", {})})
    head = ["trial", "state", "dev overall", "held-out AUC", *names, "kept stage", "minutes"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(summary_cells(t, shown[t.number], names)) + " |" for t in trials]
    table = "\n".join(lines)
    text = f"# Sweep: {sweep_dir.name}\n\nThe best by {objective} first.\n\n{table}\n"
    atomic_write(text, sweep_dir / "summary.md")
    optuna_plots(optuna, study, sweep_dir)
    return table


def optuna_plots(optuna, study, sweep_dir: Path) -> None:
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    from optuna.visualization import matplotlib as draw

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

    for name, plot in (
        ("history", draw.plot_optimization_history),
        ("importance", draw.plot_param_importances),
    ):
        try:
            plot(study).figure.savefig(sweep_dir / f"{name}.png", dpi=110, bbox_inches="tight")
        except (ValueError, RuntimeError) as e:  # e.g. importance needs two finished trials
            print(f"no {name}.png: {e}")


def load_settings(args, parser) -> dict:
    """The sweep's settings: typed (a new sweep) or saved in SWEEP_DIR (--resume)."""
    saved = args.sweep_dir / SETTINGS
    if args.resume:
        if not saved.is_file():
            parser.error(f"{args.sweep_dir}: no {SETTINGS}; is it a sweep folder?")
        return json.loads(saved.read_text())
    if saved.is_file():
        parser.error(f"{args.sweep_dir} already holds a sweep: --resume it, or give another folder")
    if not args.search:
        parser.error("--search: name at least one flag to search")
    if args.trials < 1:
        parser.error(f"--trials must be at least 1, got {args.trials}")
    settings = {"preset": args.preset, "trials": args.trials, "objective": args.objective}
    settings |= {"search": parse_search(args.search), "flags": args.flags, "enqueue": args.enqueue}
    settings["seed"] = args.seed
    for values in (baseline(settings), *enqueued(settings), *search_ends(settings)):
        cfg, _ = command.parse_args(trial_flags(settings, values))  # bad flags stop here
        command.one_model(cfg, "lab/sweep.py")  # a trial is scored by its one kept model
        if settings["objective"] == "heldout" and not cfg.data.heldout_size:
            parser.error("--objective heldout needs held-out pairs: give --heldout_size after --")
        given = flag_values(cfg)
        for name, value in values.items():
            if given[name] != value:  # a switch the preset gives already cannot be undone
                parser.error(
                    f"--search {name}: {value} cannot be run; the preset's flags give {given[name]}"
                )
    return settings


def search_ends(settings: dict) -> list[dict]:
    """Each choice and each range's ends, alone: the values every trial's flags must give."""
    ends = []
    for name, s in settings["search"].items():
        values = s["choices"] if s["kind"] == "choice" else (s["low"], s["high"])
        ends += [{name: v} for v in values]
    return ends


def baseline(settings: dict) -> dict:
    """The searched flags' values in the preset itself (with the typed flags): trial 0."""
    cfg, _ = command.parse_args(trial_flags(settings, {}))
    values = flag_values(cfg)
    return {name: values[name] for name in settings["search"]}


def enqueued(settings: dict) -> list[dict]:
    """--enqueue 'lr=1e-5,distill=1': more fixed trials, typed as their flags, in the search."""
    out = []
    for spec in settings["enqueue"]:
        values = dict(item.partition("=")[::2] for item in spec.split(","))
        unknown = sorted(set(values) - set(settings["search"]))
        if unknown:
            raise SystemExit(f"--enqueue {spec}: {', '.join(unknown)} not searched")
        try:
            values = {k: typed(k, v) for k, v in values.items()}
        except ValueError:
            raise SystemExit(
                f"--enqueue {spec}: expected FLAG=VALUE,... of its searches' types"
            ) from None
        outside = [k for k, v in values.items() if not in_search(settings["search"][k], v)]
        if outside:
            raise SystemExit(f"--enqueue {spec}: {', '.join(outside)} outside its search")
        out.append(values)
    return out


def storage(optuna, sweep_dir: Path):
    return optuna.storages.RDBStorage(f"sqlite:///{(sweep_dir / STUDY).resolve()}")


def stopped_trials(optuna, study, sweep_dir: Path) -> list:
    """The trials a stopped sweep left running, as Trials to continue (their run folders
    resume from their checkpoints)."""
    db = storage(optuna, sweep_dir)
    study_id = db.get_study_id_from_name(study.study_name)
    running = study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    ids = [db.get_trial_id_from_study_id_trial_number(study_id, t.number) for t in running]
    return [optuna.trial.Trial(study, trial_id) for trial_id in ids]


def open_study(optuna, sweep_dir: Path, settings: dict):
    """The sweep's study in SWEEP_DIR/study.db; a new one gets trial 0 (the preset's own
    settings) and the --enqueue'd trials first."""
    study = optuna.create_study(
        storage=storage(optuna, sweep_dir),
        study_name="sweep",
        direction="maximize",
        load_if_exists=True,
        pruner=optuna.pruners.NopPruner(),  # follow() prunes, by below_median
    )
    # Random draws for the first third of the trials (trial 0 included), then TPE. The seed
    # moves on with the trials so far: a resumed sweep seeded as the first session was
    # would draw that session's settings again.
    seed = settings["seed"] + len(study.trials)
    study.sampler = optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=max(2, settings["trials"] // 3)
    )
    if study.trials:
        print(f"{len(study.trials)} trials so far; the sampler's seed: {seed}")
        return study
    preset = baseline(settings)
    outside = [n for n, s in settings["search"].items() if not in_search(s, preset[n])]
    if outside:
        print(
            f"trial 0 runs the preset's {', '.join(f'{n}={preset[n]}' for n in outside)}, "
            "outside the search: Optuna records only its other settings"
        )
    inside = {n: v for n, v in preset.items() if n not in outside}
    study.enqueue_trial(inside, user_attrs={"preset": preset})
    for values in enqueued(settings):
        study.enqueue_trial(values)
    return study


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog=cli.prog(),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sweep_dir", type=Path, help="the sweep's folder (a new one, or --resume)")
    parser.add_argument("--preset", default="demo", help="the preset every trial runs")
    parser.add_argument("--trials", type=int, default=8, help="trials in all, trial 0 included")
    parser.add_argument(
        "--search", nargs="+", default=[], metavar="FLAG=RANGE", help="what to search"
    )
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="overall",
        help="the kept model's score to maximise",
    )
    parser.add_argument(
        "--enqueue", action="append", default=[], metavar="FLAG=VALUE,...", help="a fixed trial"
    )
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    parser.add_argument(
        "--no_estimate", action="store_true", help="start without timing the preset"
    )
    parser.add_argument("--resume", action="store_true", help="continue the sweep in SWEEP_DIR")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.flags = argv[cut + 1 :]
    optuna = need_optuna()
    settings = load_settings(args, parser)
    if not args.resume and not args.no_estimate:
        estimate_trials(settings)
    args.sweep_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(json.dumps(settings, indent=1), args.sweep_dir / SETTINGS)
    study = open_study(optuna, args.sweep_dir, settings)
    for trial in stopped_trials(optuna, study, args.sweep_dir):
        run_trial(optuna, study, trial, args.sweep_dir, settings)
    while sum(t.state.is_finished() for t in study.trials) < settings["trials"]:
        run_trial(optuna, study, study.ask(), args.sweep_dir, settings)
    print(summary(optuna, study, args.sweep_dir, settings["objective"]))


if __name__ == "__main__":
    cli.run_cli(main)
