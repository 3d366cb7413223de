"""Your submission: a trained run's predictions in the handout's files, zipped with the code.

    python prepare_submit.py RUN_DIR [--part1 RUN_DIR ...]        (make submit RUN=RUN_DIR)

1. Every id of each task's dev and test-student file must have a prediction in
   RUN_DIR/predictions/. A gap names the flag behind it: a run scored on a sample
   (--dev_size; `python multitask_classifier.py --predict RUN_DIR --dev_size 0` writes
   them all), a run with --no_test_predictions, or rows the data reader skipped.
2. A run that started from MiniLM is refused: it was trained on Quora and NLI pairs, and
   the handout allows no outside pre-trained model. --allow_outside_pretraining says you
   know (the offline demo).
3. ./predictions/ gets the handout's files: {sst,para,sts}-{dev,test}-output.csv, and
   from each --part1 run (classifier.py) its {pretrain,finetune}-{sst,cfimdb}-*-out.csv.
4. cs224n_default_final_project_submission.zip holds every top-level .py and the files of
   predictions/, as the handout's prepare_submit.py writes it, and engine/*.py.
"""

import argparse
import json
import shutil
import sys
import zipfile
from pathlib import Path

import datasets as data
from engine.runtime import run_cli
from evaluation import MULTITASK, prediction_path, read_predictions

ARCHIVE = "cs224n_default_final_project_submission.zip"  # the handout's name
HERE = Path(__file__).resolve().parent
FIX = "python multitask_classifier.py --predict {run} --dev_size 0"


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
    lines = path.read_text(encoding="utf-8").splitlines()
    at = lines[0].split("\t").index("id")
    return [line.split("\t")[at].strip() for line in lines[1:] if line.strip()]


def gap(run_dir: Path, settings: dict, task: str, split: str, missing: int) -> str:
    """One line: which predictions are missing, and the flag that left them out."""
    where = f"{run_dir}: {task} {split}: {missing} ids without a prediction"
    sampled = settings.get("data", {}).get("dev_size", 0)
    if sampled:
        return f"{where}; the run scored --dev_size {sampled}: {FIX.format(run=run_dir)}"
    if split == "test" and not settings.get("data", {}).get("test_predictions", True):
        return f"{where}; the run had --no_test_predictions: {FIX.format(run=run_dir)}"
    return f"{where}; the data reader skipped those rows (see the run's log; --strict names them)"


def prediction_file(run_dir: Path, task: str, split: str) -> Path | None:
    """The run's prediction file of a task, in its folder or (the individual preset, a model
    per task) in the sub-run's."""
    name = prediction_path("predictions", task, split).as_posix()
    return next(iter(sorted(run_dir.rglob(name))), None)


def check_predictions(run_dir: Path, settings: dict, folder: Path) -> None:
    """Every id of every dev and test file has a prediction in run_dir/predictions/."""
    data.require([data.task_file(folder, t, s) for t in MULTITASK for s in ("dev", "test")])
    for task in MULTITASK:
        for split in ("dev", "test"):
            wanted = file_ids(data.task_file(folder, task, split))
            path = prediction_file(run_dir, task, split)
            have = set(read_predictions(path)[0]) if path else set()
            if missing := len(set(wanted) - have):
                raise SystemExit(gap(run_dir, settings, task, split, missing))


def part1_files(run_dir: Path, allow: bool) -> list[Path]:
    """A classifier.py run's prediction files, by the handout's names."""
    found = sorted(run_dir.rglob("predictions/*-*-*-out.csv"))
    if not found:
        raise SystemExit(f"--part1 {run_dir}: no predictions/*-out.csv; a classifier.py run?")
    for config in sorted(run_dir.rglob("config.json")):
        refuse_outside(config.parent, json.loads(config.read_text()), allow)
    return found


def write_archive(out: Path, root: Path) -> list[str]:
    """Every top-level .py and predictions/'s files, written as the handout writes them, and
    the engine package the code imports (engine/*.py), so the archive's code runs."""
    names = sorted(p.name for p in root.glob("*.py"))
    names += sorted(f"engine/{p.name}" for p in (root / "engine").glob("*.py"))
    names += sorted(
        f"predictions/{p.name}" for p in (root / "predictions").iterdir() if p.is_file()
    )
    with zipfile.ZipFile(out, "w") as z:
        for name in names:
            z.write(root / name, f"./{name}")
    return names


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path, help="a multitask_classifier.py run folder")
    parser.add_argument("--part1", type=Path, nargs="*", default=[], help="classifier.py runs")
    parser.add_argument(
        "--allow_outside_pretraining",
        action="store_true",
        help="submit a model trained from MiniLM anyway (against the handout's rules)",
    )
    parser.add_argument("--data_dir", help="the handout's data (default $MINBERT_DATA, else data/)")
    args = parser.parse_args(argv)
    settings = run_config(args.run_dir)
    refuse_outside(args.run_dir, settings, args.allow_outside_pretraining)
    folder = data.data_dir(args.data_dir or settings.get("data", {}).get("data_dir"))
    check_predictions(args.run_dir, settings, folder)
    part1 = [f for run in args.part1 for f in part1_files(run, args.allow_outside_pretraining)]
    out = Path.cwd() / "predictions"
    out.mkdir(exist_ok=True)
    ours = [prediction_file(args.run_dir, t, split) for t in MULTITASK for split in ("dev", "test")]
    for f in [*ours, *part1]:
        shutil.copy2(f, out / f.name)
    names = write_archive(Path.cwd() / ARCHIVE, Path.cwd())
    print(f"{ARCHIVE}: {len(names)} files, the predictions of {args.run_dir}")
    return Path.cwd() / ARCHIVE


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
