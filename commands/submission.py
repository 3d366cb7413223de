"""The submission's checks (prepare_submit.py): which prediction files a run or the
handout's commands wrote, each file read against the data (the handout's header, a number
in range on every row, the data file's ids, every test id and every usable dev id), a
MiniLM run refused without --allow_outside_pretraining, a gap named with the command that
fills it; then the zip, as the handout's zipper writes it."""

import argparse
import functools
import json
import math
import shutil
import warnings
import zipfile
from collections import Counter
from functools import partial
from pathlib import Path

import datasets as data
import prepare_submit
from commands.outputs import prediction_path
from commands.runfolder import SOURCES
from engine.tsv import require
from evaluation import MULTITASK, TASKS

SPLITS = ("dev", "test")
PACKAGES = ("engine", "commands")  # the code's own, zipped beside the top level
PART1_TASKS = ("sst", "cfimdb")
# classifier.py's options by the 2023 handout's names (--option) and the 2024 handout's
# (--fine-tune-mode): its files are named by the one typed
OPTIONS = {"pretrain": "last-linear-layer", "finetune": "full-model"}
NAMES = (*OPTIONS, *OPTIONS.values())
FIX = "python multitask_classifier.py --predict {run} --dev_size 0"


def part1_name(option: str, task: str, split: str) -> str:
    """classifier.py's file names, the handout's: pretrain-sst-dev-out.csv (2024's:
    last-linear-layer-sst-dev-out.csv)."""
    return f"{option}-{task}-{split}-out.csv"


def part1_fix(option: str, task: str) -> str:
    """The command that writes an option's files, by the flag of the handout that names it."""
    flag = "--option" if option in OPTIONS else "--fine-tune-mode"
    return f"python classifier.py {flag} {option} --task {task}"


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


@functools.cache
def demanded(folder: Path, task: str, split: str) -> tuple[frozenset, Counter]:
    """(the ids that need a prediction, every id of the file with its count): every test
    row; the dev rows the reader keeps (one line, once, says how many it skips and why: the
    handout's reader skips a row without a label)."""
    known = Counter(file_ids(data.task_file(folder, task, split)))
    if split == "test":
        return frozenset(known), known
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = frozenset(e.id for e in data.read_task(folder, task, split))
    for w in caught:
        print(f"{task} dev: not demanded: {w.message}")
    return kept, known


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
    lines = path.read_text(encoding="utf-8-sig").splitlines()  # -sig: Excel's byte-order mark
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


def check_ids(path: Path, task: str, split: str, folder: Path, gap_line) -> None:
    """Each id of the file once per row of the data file that has it, and every demanded id."""
    wanted, known = demanded(folder, task, split)
    have = Counter(check_values(path, task))
    for id_, n in have.items():
        if n > known[id_]:
            where = data.task_file(folder, task, split)
            held = f"has it {known[id_]} time(s)" if known[id_] else "does not have it"
            raise SystemExit(f"{path}: id {id_!r} has {n} prediction(s); {where} {held}")
    if missing := len(wanted - set(have)):
        raise SystemExit(gap_line(missing))


def run_files(run_dir: Path, settings: dict) -> dict[str, tuple[Path, dict, str]]:
    """The Part 2 files of a multitask_classifier.py run (the individual preset: in its
    sub-runs), by name; a missing one names the command that writes it."""
    out = {}
    for task in MULTITASK:
        for split in SPLITS:
            name = prediction_path("predictions", task, split).as_posix()
            found = sorted(run_dir.rglob(name))
            if not found:  # an unfinished run, or one with --no_test_predictions
                raise SystemExit(f"{run_dir}: no {name}: {FIX.format(run=run_dir)}")
            out[found[0].name] = (found[0], settings, str(run_dir))
    return out


def part1_files(run_dir: Path, allow: bool) -> dict[str, tuple[Path, dict, str]]:
    """A classifier.py run's files by the handout's names, each with its run's settings."""
    out = {}
    for config in sorted(run_dir.rglob("config.json")):
        settings = json.loads(config.read_text())
        refuse_outside(config.parent, settings, allow)
        for f in sorted(config.parent.glob("predictions/*-*-*-out.csv")):
            out[f.name] = (f, settings, str(config.parent))
    if not out:
        raise SystemExit(f"--part1 {run_dir}: no predictions/*-out.csv; a classifier.py run?")
    return out


def check_part1(files: dict, folder: Path, joined: bool) -> None:
    """Four files per option present, by either name; every id in each; else the command
    that fills it. An option without a file by either name is one line (joined: files
    come from --part1 runs)."""
    options = [o for o in NAMES if any(n.startswith(f"{o}-") for n in files)]
    for option, renamed in OPTIONS.items():
        if option not in options and renamed not in options:
            how = "add --part1 ITS_RUN_DIR, from" if joined else "it writes ./predictions/:"
            print(
                f"Part 1 {option} is missing: no {option}-*-out.csv (nor {renamed}-*-out.csv, "
                f"the 2024 name); {how} python classifier.py --option {option}"
            )
    if options:
        require([data.task_file(folder, t, s) for t in PART1_TASKS for s in SPLITS])
    for option in options:
        for task in PART1_TASKS:
            fix = part1_fix(option, task)
            for split in SPLITS:
                name = part1_name(option, task, split)
                if name not in files:
                    raise SystemExit(f"Part 1 {option}: no {name}: {fix}")
                path, settings, _ = files[name]
                where = f"{path}: {task} {split}"
                check_ids(path, task, split, folder, partial(gap, where, settings, split, fix=fix))


def check_part2(files: dict, folder: Path) -> None:
    for task in MULTITASK:
        for split in SPLITS:
            path, settings, run = files[prediction_path("", task, split).name]
            fix = FIX.format(run=run)
            where = f"{path}: {task} {split}"
            check_ids(path, task, split, folder, partial(gap, where, settings, split, fix=fix))


def source_of(name: str, sources: dict, allow: bool) -> tuple[dict, str]:
    """(settings, run folder) of the run that wrote ./predictions/NAME, as .predictions.json
    records it (its model checked: refuse_outside); ({}, 'RUN_DIR') when unrecorded."""
    recorded = sources.get(name)
    for folder in [Path(recorded), *Path(recorded).parents] if recorded else []:
        if (folder / "config.json").is_file():
            settings = run_config(folder)
            refuse_outside(folder, settings, allow)
            return settings, str(folder)
    return {}, "RUN_DIR"


def in_predictions(out: Path, allow: bool) -> tuple[dict, dict]:
    """The handout's way: (Part 2, Part 1) files already in ./predictions/, by name, each
    with the settings and folder of the run that wrote it, where recorded."""
    part2 = {prediction_path("", t, s).name for t in MULTITASK for s in SPLITS}
    if missing := sorted(n for n in part2 if not (out / n).is_file()):
        raise SystemExit(
            f"{out}: no {missing[0]} ({len(missing)} of Part 2's 6 files missing): train with "
            "python multitask_classifier.py, or name its run: python prepare_submit.py RUN_DIR"
        )
    names = {part1_name(o, t, s) for o in NAMES for t in PART1_TASKS for s in SPLITS}
    found = sorted(part2) + sorted(n for n in names if (out / n).is_file())
    record = out.parent / SOURCES
    sources = json.loads(record.read_text()) if record.is_file() else {}
    files = {n: (out / n, *source_of(n, sources, allow)) for n in found}
    if unknown := [n for n in found if files[n][2] == "RUN_DIR"]:
        print(
            f"no record of the run that wrote {', '.join(unknown)} ({record}): its model is "
            "not checked (prepare_submit.py RUN_DIR checks it)"
        )
    return {n: files[n] for n in part2}, {n: f for n, f in files.items() if n not in part2}


def write_archive(out: Path, root: Path, predictions: list[str]) -> list[str]:
    """Every top-level .py, the packages the code imports (engine/*.py, commands/*.py) and
    the named prediction files, written as the handout writes them."""
    names = sorted(p.name for p in root.glob("*.py"))
    for package in PACKAGES:
        names += sorted(f"{package}/{p.name}" for p in (root / package).glob("*.py"))
    names += sorted(f"predictions/{name}" for name in predictions)
    with zipfile.ZipFile(out, "w") as z:
        for name in names:
            z.write(root / name, f"./{name}")
    return names


def gather(args, out: Path) -> tuple[dict, dict, str]:
    """(Part 2 files, Part 1 files, where they come from), checked against the data."""
    allow = args.allow_outside_pretraining
    settings = {} if args.run_dir is None else run_config(args.run_dir)
    if args.run_dir is not None:
        refuse_outside(args.run_dir, settings, allow)
    folder = data.data_dir(args.data_dir or settings.get("data", {}).get("data_dir"))
    require([data.task_file(folder, t, s) for t in MULTITASK for s in SPLITS])
    if args.run_dir is None:
        part2, part1 = in_predictions(out, allow)
        source = f"{out}/"
    else:
        part2, part1 = run_files(args.run_dir, settings), {}
        for run_dir in args.part1:
            part1 |= part1_files(run_dir, allow)
        source = str(args.run_dir)
    check_part2(part2, folder)
    check_part1(part1, folder, joined=args.run_dir is not None)
    return part2, part1, source


ARCHIVE = "cs224n_default_final_project_submission.zip"  # the handout's name


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(
        description=prepare_submit.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
    files = {name: path for name, (path, *_) in (part2 | part1).items()}
    out.mkdir(exist_ok=True)
    for name, path in files.items():
        if path.resolve() != (out / name).resolve():
            shutil.copy2(path, out / name)
    names = write_archive(Path.cwd() / ARCHIVE, Path.cwd(), sorted(files))
    if left := sorted(p.name for p in out.iterdir() if p.is_file() and p.name not in files):
        print(f"left out of the zip, not named: predictions/{', predictions/'.join(left)}")
    print(f"{ARCHIVE}: {len(names)} files, the predictions of {source}")
    return Path.cwd() / ARCHIVE
