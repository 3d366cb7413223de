"""Your submission: the predictions in the handout's files, checked, zipped with the code.

    python prepare_submit.py RUN_DIR [--part1 RUN_DIR ...]   (make submit RUN=RUN_DIR)
    python prepare_submit.py                                  (the handout's way)

1. With RUN_DIR: the run's six Part 2 files ({sst,para,sts}-{dev,test}-output.csv) and
   each --part1 run's (classifier.py) {pretrain,finetune}-{sst,cfimdb}-{dev,test}-out.csv
   are copied into ./predictions/; only these are zipped. Without it: the files of those
   names already in ./predictions/, where the handout's commands write them.
2. Part 1 needs its four files for each option it has; without any, one line says Part 1
   is missing (the zip still has Part 2).
3. Every file is read: the handout's header; a number in range on every row (no NaN);
   every test id, and every dev id the data reader keeps (a dev row without a usable label
   is not scored, by the handout's reader either: one line gives their count). A gap names
   the command that fills it.
4. A run that started from MiniLM is refused: it was trained on Quora and NLI pairs, and
   the handout allows no outside pre-trained model. --allow_outside_pretraining says you
   know (the offline demo).
5. cs224n_default_final_project_submission.zip holds every top-level .py, engine/*.py (the
   code imports it) and the checked prediction files, as the handout's zipper writes them.
"""

import argparse
import json
import math
import shutil
import sys
import warnings
import zipfile
from functools import partial
from pathlib import Path

import datasets as data
from engine.runtime import run_cli
from evaluation import MULTITASK, TASKS, prediction_path

ARCHIVE = "cs224n_default_final_project_submission.zip"  # the handout's name
SPLITS = ("dev", "test")
PART1_TASKS = ("sst", "cfimdb")
OPTIONS = ("pretrain", "finetune")
FIX = "python multitask_classifier.py --predict {run} --dev_size 0"
PART1_FIX = "python classifier.py --option {option} --task {task}"


def part1_name(option: str, task: str, split: str) -> str:
    """classifier.py's file names, the handout's: pretrain-sst-dev-out.csv."""
    return f"{option}-{task}-{split}-out.csv"


def run_config(run_dir: Path) -> dict:
    """The settings a run folder keeps (config.json), as JSON."""
    path = run_dir / "config.json"
    if not path.is_file():
        raise SystemExit(f"{run_dir}: no config.json; is it a run folder?")
    return json.loads(path.read_text())


def refuse_outside(run_dir: Path, settings: dict, allow: bool) -> None:
    bert = str(settings.get("model", {}).get("bert", ""))
    if "minilm" in bert.lower() and not allow:
        raise SystemExit(
            f"{run_dir}: trained from {bert}, MiniLM, which was trained on Quora and NLI "
            "pairs; the handout allows no outside pre-trained model. Train bert-base-uncased, "
            "or add --allow_outside_pretraining to submit it anyway (the offline demo)"
        )


def file_ids(path: Path) -> list[str]:
    """The id column of one of the handout's tab-separated files, every row."""
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    at = lines[0].split("\t").index("id")
    return [line.split("\t")[at].strip() for line in lines[1:] if line.strip()]


def demanded_ids(folder: Path, task: str, split: str) -> set[str]:
    """The ids that need a prediction: every test row; the dev rows the reader keeps (one
    line says how many it skips and why: the handout's reader skips a row without a label)."""
    if split == "test":
        return set(file_ids(data.task_file(folder, task, split)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = {e.id for e in data.read_task(folder, task, split)}
    for w in caught:
        print(f"{task} dev: not demanded: {w.message}")
    return kept


def gap(source: str, settings: dict, split: str, missing: int, fix: str) -> str:
    """One line: which predictions are missing, and the flag and command that fill them."""
    where = f"{source}: {missing} ids without a prediction"
    sampled = settings.get("data", {}).get("dev_size", 0)
    if sampled:
        return f"{where}; the run scored --dev_size {sampled}: {fix}"
    if split == "test" and not settings.get("data", {}).get("test_predictions", True):
        return f"{where}; the run had --no_test_predictions: {fix}"
    return f"{where}; run it again: {fix}"


def check_values(path: Path, task: str) -> list[str]:
    """The ids of a prediction file whose header and every value are the handout's; else
    one line naming the file's line and what was expected."""
    spec = TASKS[task]
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or [c.strip() for c in lines[0].split("\t")] != ["id", spec.column]:
        head = lines[0] if lines else ""
        raise SystemExit(f"{path}:1: header {head!r}; expected 'id \\t {spec.column} '")
    labels = range(spec.num_labels) if spec.kind == "classification" else range(2)
    expected = "a finite number" if spec.kind == "regression" else f"one of {list(labels)}"
    ids = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        id_, sep, raw = line.partition(",")
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (spec.kind == "regression" or value in labels)
        if not sep or not ok:
            raise SystemExit(f"{path}:{n}: {line.strip()!r}; expected 'id , {expected}'")
        ids.append(id_.strip())
    return ids


def check_ids(path: Path, task: str, wanted: set[str], gap_line) -> None:
    if missing := len(wanted - set(check_values(path, task))):
        raise SystemExit(gap_line(missing))


def run_files(run_dir: Path, settings: dict) -> dict[str, Path]:
    """The Part 2 files of a multitask_classifier.py run (the individual preset: in its
    sub-runs), by name; a missing one names the command that writes it."""
    out = {}
    for task in MULTITASK:
        for split in SPLITS:
            name = prediction_path("predictions", task, split).as_posix()
            found = sorted(run_dir.rglob(name))
            if not found:  # an unfinished run, or one with --no_test_predictions
                raise SystemExit(f"{run_dir}: no {name}: {FIX.format(run=run_dir)}")
            out[found[0].name] = found[0]
    return out


def part1_files(run_dir: Path, allow: bool) -> dict[str, tuple[Path, dict]]:
    """A classifier.py run's files by the handout's names, each with its run's settings."""
    out = {}
    for config in sorted(run_dir.rglob("config.json")):
        settings = json.loads(config.read_text())
        refuse_outside(config.parent, settings, allow)
        for f in sorted(config.parent.glob("predictions/*-*-*-out.csv")):
            out[f.name] = (f, settings)
    if not out:
        raise SystemExit(f"--part1 {run_dir}: no predictions/*-out.csv; a classifier.py run?")
    return out


def check_part1(files: dict, folder: Path) -> None:
    """Four files per option present; every id in each; else the command that fills it."""
    options = [o for o in OPTIONS if any(n.startswith(f"{o}-") for n in files)]
    if not options:
        print(
            "Part 1 is missing: no {pretrain,finetune}-{sst,cfimdb}-*-out.csv; add --part1 "
            "CLASSIFIER_RUN (python classifier.py --option pretrain, then finetune)"
        )
    for option in options:
        for task in PART1_TASKS:
            fix = PART1_FIX.format(option=option, task=task)
            for split in SPLITS:
                name = part1_name(option, task, split)
                if name not in files:
                    raise SystemExit(f"Part 1 {option}: no {name}: {fix}")
                path, settings = files[name]
                where = f"{path}: {task} {split}"
                wanted = demanded_ids(folder, task, split)
                check_ids(path, task, wanted, partial(gap, where, settings, split, fix=fix))


def check_part2(files: dict, settings: dict, folder: Path, run: str) -> None:
    for task in MULTITASK:
        for split in SPLITS:
            path = files[prediction_path("", task, split).name]
            fix = FIX.format(run=run)
            where = f"{path}: {task} {split}"
            wanted = demanded_ids(folder, task, split)
            check_ids(path, task, wanted, partial(gap, where, settings, split, fix=fix))


def in_predictions(out: Path) -> tuple[dict, dict]:
    """The handout's way: (Part 2, Part 1) files already in ./predictions/, by name."""
    part2 = {prediction_path("", t, s).name for t in MULTITASK for s in SPLITS}
    if missing := sorted(n for n in part2 if not (out / n).is_file()):
        raise SystemExit(
            f"{out}: no {missing[0]} ({len(missing)} of Part 2's 6 files missing): train with "
            "python multitask_classifier.py, or name its run: python prepare_submit.py RUN_DIR"
        )
    names = {part1_name(o, t, s) for o in OPTIONS for t in PART1_TASKS for s in SPLITS}
    part1 = {n: (out / n, {}) for n in sorted(names) if (out / n).is_file()}
    return {n: out / n for n in part2}, part1


def write_archive(out: Path, root: Path, predictions: list[str]) -> list[str]:
    """Every top-level .py, the engine package the code imports (engine/*.py) and the named
    prediction files, written as the handout writes them."""
    names = sorted(p.name for p in root.glob("*.py"))
    names += sorted(f"engine/{p.name}" for p in (root / "engine").glob("*.py"))
    names += sorted(f"predictions/{name}" for name in predictions)
    with zipfile.ZipFile(out, "w") as z:
        for name in names:
            z.write(root / name, f"./{name}")
    return names


def gather(args, out: Path) -> tuple[dict, dict, str]:
    """(Part 2 files, Part 1 files, where they come from), checked against the data."""
    settings = {} if args.run_dir is None else run_config(args.run_dir)
    if args.run_dir is not None:
        refuse_outside(args.run_dir, settings, args.allow_outside_pretraining)
    folder = data.data_dir(args.data_dir or settings.get("data", {}).get("data_dir"))
    data.require([data.task_file(folder, t, s) for t in (*MULTITASK, "cfimdb") for s in SPLITS])
    if args.run_dir is None:
        part2, part1 = in_predictions(out)
        source, run = f"{out}/", "RUN_DIR"
    else:
        part2 = run_files(args.run_dir, settings)
        part1 = {}
        for run_dir in args.part1:
            part1 |= part1_files(run_dir, args.allow_outside_pretraining)
        source, run = f"{args.run_dir}", str(args.run_dir)
    check_part2(part2, settings, folder, run)
    check_part1(part1, folder)
    return part2, part1, source


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "run_dir", type=Path, nargs="?", help="a multitask_classifier.py run folder"
    )
    parser.add_argument("--part1", type=Path, nargs="*", default=[], help="classifier.py runs")
    parser.add_argument(
        "--allow_outside_pretraining",
        action="store_true",
        help="submit a model trained from MiniLM anyway (against the handout's rules)",
    )
    parser.add_argument("--data_dir", help="the handout's data (default $MINBERT_DATA, else data/)")
    args = parser.parse_args(argv)
    if args.part1 and args.run_dir is None:
        parser.error("--part1 joins a RUN_DIR's files; name the multitask run too")
    out = Path.cwd() / "predictions"
    part2, part1, source = gather(args, out)
    files = part2 | {name: path for name, (path, _) in part1.items()}
    out.mkdir(exist_ok=True)
    for name, path in files.items():
        if path.resolve() != (out / name).resolve():
            shutil.copy2(path, out / name)
    names = write_archive(Path.cwd() / ARCHIVE, Path.cwd(), sorted(files))
    if left := sorted(p.name for p in out.iterdir() if p.is_file() and p.name not in files):
        print(f"left out of the zip, not named: predictions/{', predictions/'.join(left)}")
    print(f"{ARCHIVE}: {len(names)} files, the predictions of {source}")
    return Path.cwd() / ARCHIVE


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
