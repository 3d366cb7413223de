"""A small copy of the data: each file's header and first N rows, byte for byte (a bad
row among them stays), in another folder.

    python -m lab.sample OUT_DIR [--rows N] [--data_dir DIR]

`make submit-demo` trains, predicts and zips on such a copy: every id of its dev and test
files is predicted and checked, as in a real submission, at a size that does not grow
with the handout's files (its Quora test set alone is 40,431 pairs).
"""

import argparse
import csv
import sys
from collections.abc import Iterator
from pathlib import Path

if not __package__:  # run as python lab/NAME.py: the course's modules are one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from commands.cli import prog, run_cli
from datasets import data_dir, expected_files
from engine.checkpoint import atomic_write


def records(path: Path) -> Iterator[str]:
    """The file's rows as they are on disk, a quoted field over several lines kept in its
    row: the csv reader the handout reads with decides where a row ends."""
    with path.open(newline="", encoding="utf-8") as f:
        raw: list[str] = []

        def lines():
            for line in f:
                raw.append(line)
                yield line

        for _ in csv.reader(lines(), delimiter="\t"):
            yield "".join(raw)
            raw.clear()


def head(path: Path, rows: int) -> str:
    """The header and the first `rows` rows of a data file."""
    kept = []
    for record in records(path):
        kept.append(record)
        if len(kept) > rows:
            break
    return "".join(kept)


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(prog=prog(), description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="the copy's folder (made, files replaced)")
    parser.add_argument("--rows", type=int, default=100, help="rows kept of each file")
    parser.add_argument("--data_dir", help="the data copied (default $MINBERT_DATA, else data/)")
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error(f"--rows must be at least 1, got {args.rows}")
    source = data_dir(args.data_dir)
    if source.resolve() == args.out_dir.resolve():
        parser.error(f"out_dir {args.out_dir} is the data folder itself; name another")
    names = [n for n in expected_files() if (source / n).is_file()]
    if not names:
        raise FileNotFoundError(f"no data file in {source} (python -m lab.fetch fetches them)")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in expected_files():
        if name in names:
            atomic_write(head(source / name, args.rows), args.out_dir / name)
        else:  # an earlier copy's file the source no longer has
            (args.out_dir / name).unlink(missing_ok=True)
    print(f"{args.out_dir}: the first {args.rows} rows of {len(names)} files of {source}")
    return args.out_dir


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
