"""Your submission: the predictions in the handout's files, checked, zipped with the code.

    python prepare_submit.py RUN_DIR [--part1 RUN_DIR ...]   (make submit RUN=RUN_DIR)
    python prepare_submit.py                                  (the handout's way)

1. With RUN_DIR: the run's six Part 2 files ({sst,para,sts}-{dev,test}-output.csv) and
   each --part1 run's (classifier.py) {pretrain,finetune}-{sst,cfimdb}-{dev,test}-out.csv
   (the 2024 handout's names: last-linear-layer-..., full-model-...) are copied into
   ./predictions/; only these are zipped. Without it: the files of those names already in
   ./predictions/, where the handout's commands write them (the runs that wrote them are
   in ./.predictions.json).
2. Part 1 needs its four files for each option it has, by either name; an option with
   none is one line (the zip still has the rest).
3. Every file is read: the handout's header; a number in range on every row (no NaN);
   only the data file's ids, each as often as the file has it; every test id, and every
   dev id the data reader keeps (a dev row without a usable label is not scored, by the
   handout's reader either: one line gives their count). A gap names the command that
   fills it.
4. A run that started from MiniLM is refused: it was trained on Quora and NLI pairs, and
   the handout allows no outside pre-trained model. --allow_outside_pretraining says you
   know (the offline demo).
5. cs224n_default_final_project_submission.zip holds every top-level .py, engine/*.py (the
   code imports it) and the checked prediction files, as the handout's zipper writes them.
"""

import argparse
import shutil
import sys
from pathlib import Path

from engine.cli import run_cli
from engine.submission import gather, write_archive

ARCHIVE = "cs224n_default_final_project_submission.zip"  # the handout's name


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


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
