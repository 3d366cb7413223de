"""A stand-in data folder of the CS224n 2023 handout's real size, built from whatever data
is present: times and sizes promised for a student's clone are measured on it.

The handout's Quora files hold 141,506 training, 20,214 dev and about 40,000 test pairs;
a smaller copy (the offline mirror's 16,182 / 2,017 / 2,015) is repeated, each repeat under
new ids, until a file has the handout's row count. The other files are copied as they are.

    python tests/make_handout_standin.py /tmp/handout               # from $MINBERT_DATA
    MINBERT_DATA=/tmp/handout python multitask_classifier.py --preset demo --estimate
"""

import argparse
import csv
import itertools
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

import datasets as data  # noqa: E402

HANDOUT_2023 = {
    "quora-train.csv": 141_506,
    "quora-dev.csv": 20_214,
    "quora-test-student.csv": 40_000,
}


def grow(source: Path, target: Path, rows: int) -> int:
    """target: source's header, then its rows cycled until `rows`, repeat k's ids suffixed
    with -k (repeat 0 keeps the originals). Returns the rows written."""
    with open(source, newline="") as f:
        header, *body = list(csv.reader(f, delimiter="\t"))
    if not body:
        raise SystemExit(f"{source}: no rows to repeat")
    id_col = header.index("id")
    with open(target, "w", newline="") as f:
        out = csv.writer(f, delimiter="\t")
        out.writerow(header)
        for n, row in enumerate(itertools.islice(itertools.cycle(body), rows)):
            k, row = n // len(body), list(row)
            row[0] = str(n)  # the unnamed index column
            row[id_col] = row[id_col] + (f"-{k}" if k else "")
            out.writerow(row)
    return rows


def build(source: Path, target: Path, sizes: dict[str, int] = HANDOUT_2023) -> dict[str, int]:
    """Every file of `source` into `target`, those in `sizes` grown to their row counts."""
    target.mkdir(parents=True, exist_ok=True)
    written = {}
    for path in sorted(source.glob("*.csv")):
        if path.name in sizes:
            written[path.name] = grow(path, target / path.name, sizes[path.name])
        else:
            shutil.copyfile(path, target / path.name)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("out", help="the folder to write")
    p.add_argument("--data_dir", help="the data to grow (default: $MINBERT_DATA, else data/)")
    args = p.parse_args(argv)
    source = data.data_dir(args.data_dir)
    for name, rows in build(source, Path(args.out)).items():
        print(f"{args.out}/{name}: {rows:,} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
