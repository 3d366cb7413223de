"""The course's leaderboard: a Gradescope autograder that scores a student's test predictions
against the TA's gold labels, by CS224n's overall score.

    python grader/leaderboard.py build leaderboard.zip --gold GOLD_DIR
    python grader/leaderboard.py score --submission DIR --gold GOLD_DIR --results results.json

GOLD_DIR holds the handout's test sets with their labels, each laid out as its dev file
(tab-separated: an index column, id, the sentences, the label): ids-sst-test.csv,
quora-test.csv and sts-test.csv. `build` checks them (a problem stops it, naming the file,
the line and what was expected) and writes the archive of a Gradescope programming
assignment with a leaderboard: setup.sh, run_autograder, this file and the gold files.

`score` is what run_autograder runs on each submission (Gradescope unpacks the student's zip
in /autograder/submission). It finds {sst,para,sts}-test-output.csv anywhere in it
(prepare_submit.py zips them in predictions/), checks each as prepare_submit.py does, and
writes results.json: SST and QQP accuracy, STS Pearson r, and the overall score
(sst_acc + para_acc + (sts_r + 1) / 2) / 3, on the leaderboard. A missing or malformed file
scores its task 0 (STS: its term (r + 1) / 2 is 0, so the leaderboard shows r = -1), with one
line per problem naming the file, the line and what was expected.

Only Python's standard library: the scorer runs in Gradescope's image with nothing installed,
and imports nothing from the project. Gradescope's format: gradescope-autograders.readthedocs.io
(specs/, leaderboards/).
"""

import argparse
import csv
import json
import math
import re
import sys
import time
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

SHOWN = 5  # problems listed per file; the rest are counted
HEADER_SHOWN = 80  # characters of a malformed header echoed back
ID = re.compile(r"[^\s,]+")  # an id goes into "id , value" rows: no space, no comma


@dataclass(frozen=True)
class Task:
    key: str  # the handout's: sst, para, sts
    name: str  # in the output and on the leaderboard
    files: str  # the handout's file stem: {files}-dev.csv, {files}-test-student.csv
    column: str  # the prediction file's header after `id`, as the handout writes it
    label: str  # the gold file's label column, the dev file's
    classes: int  # labels 0..classes-1, scored by accuracy; 0: a 0-5 score, by Pearson r

    @property
    def output(self) -> str:
        """The student's file, by the handout's name."""
        return f"{self.key}-test-output.csv"

    @property
    def gold(self) -> str:
        """The TA's file: the handout's test set with its labels, laid out as the dev file."""
        return f"{self.files}-test.csv"

    @property
    def board(self) -> str:
        """Its column on the leaderboard."""
        return f"{self.name} {'accuracy' if self.classes else 'Pearson'}"

    def expected(self, gold: bool) -> str:
        """What a value must be, in words."""
        if self.classes:
            return f"one of {list(range(self.classes))}"
        return "a number from 0 to 5" if gold else "a finite number"

    def allows(self, value: float, gold: bool) -> bool:
        """A class in range (1.0 is 1: QQP's files write floats), or a finite score."""
        if self.classes:
            return value in range(self.classes)
        return math.isfinite(value) and (not gold or 0 <= value <= 5)


TASKS = (
    Task("sst", "SST", "ids-sst", "Predicted_Sentiment", "sentiment", 5),
    Task("para", "QQP", "quora", "Predicted_Is_Paraphrase", "is_duplicate", 2),
    # "Similiary" is the handout's spelling: its files are read as it writes them
    Task("sts", "STS", "sts", "Predicted_Similiary", "similarity", 0),
)

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, when it builds the image (its base: Ubuntu 22.04 with python3).
# The scorer needs only Python's standard library.
echo "leaderboard.py: standard library only, nothing to install"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission: the student's zip is unpacked in $ROOT/submission
# and the score goes to $ROOT/results/results.json.
set -euo pipefail
ROOT=${AUTOGRADER_ROOT:-/autograder}
mkdir -p "$ROOT/results"
python3 "$ROOT/source/leaderboard.py" score --submission "$ROOT/submission" \\
  --gold "$ROOT/source/gold" --results "$ROOT/results/results.json"
"""


# ---------------------------------------------------------------------------------------
# Reading


def lines_of(path: Path) -> list[str]:
    """The lines of a file (utf-8-sig: an Excel byte-order mark is not part of the header);
    split at line ends only (a sentence may hold a form feed), CRLF and a lone CR read as
    a newline, as prepare_submit.py reads them."""
    text = path.read_bytes().decode("utf-8-sig", errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # lone CRs too


def fields(line: str) -> list[str]:
    """One line's tab-separated fields, quotes read as the handout's csv reader reads them."""
    return next(csv.reader([line], delimiter="\t"))


def number(raw: str) -> float:
    """The number a field holds; NaN when it holds none."""
    try:
        return float(raw)
    except ValueError:
        return math.nan


def read_gold(folder: Path, task: Task) -> list[tuple[str, float]]:
    """A gold file's rows, (id, label) in its order, a repeated id a row each (the handout's
    test files repeat a few; prepare_submit.py writes a prediction per row); any problem
    stops with one line naming the file, the line and what was expected."""
    path = folder / task.gold
    if not path.is_file():
        raise SystemExit(
            f"{path}: no such file; expected the {task.name} test set with its {task.label!r} "
            f"labels, laid out as {task.files}-dev.csv"
        )
    lines = lines_of(path)
    header = [c.strip() for c in fields(lines[0])] if lines[0].strip() else []
    if "id" not in header or task.label not in header:
        raise SystemExit(
            f"{path}:1: header {header}; expected the dev file's, with 'id' and {task.label!r}"
        )
    at_id, at_label = header.index("id"), header.index(task.label)
    labels = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        row = fields(line)
        if len(row) != len(header):
            raise SystemExit(
                f"{path}:{n}: {len(row)} columns; expected {len(header)}, as the header"
            )
        id_, value = row[at_id].strip(), number(row[at_label])
        if not ID.fullmatch(id_):
            raise SystemExit(f"{path}:{n}: id {id_!r}; expected one word, no space or comma")
        if not task.allows(value, gold=True):
            raise SystemExit(
                f"{path}:{n}: {task.label} {row[at_label]!r}; expected {task.expected(gold=True)}"
            )
        labels.append((id_, value))
    if not labels:
        raise SystemExit(f"{path}: no rows after the header; expected the test set's")
    return labels


def find(submission: Path, name: str) -> list[str]:
    """Where a file of this name is in the submission (relative, with forward slashes): the
    shortest path (fewest folders) first, then alphabetically. A link out of the submission
    is not one: its lines would be shown in the output (the gold file's, say)."""
    inside = submission.resolve()
    found = [
        p.relative_to(submission).as_posix()
        for p in submission.rglob(name)
        if p.is_file() and p.resolve().is_relative_to(inside)
    ]
    return sorted(found, key=lambda p: (p.count("/"), p))


def check_predictions(path: Path, shown: str, task: Task, gold: list) -> tuple[list, list[str]]:
    """(the prediction of each gold row, in its order; problems): prepare_submit.py's checks,
    the handout's header, 'id , value' on every line with the value in range, each gold id
    as many times as the gold has it (its k-th line is its k-th row's) and no other id; each
    problem one line naming the file's line and what was expected."""
    lines = lines_of(path)
    if [c.strip() for c in lines[0].split("\t")] != ["id", task.column]:
        head = lines[0][:HEADER_SHOWN]
        return [], [f"{shown}:1: header {head!r}; expected 'id \\t {task.column} '"]
    rows = Counter(i for i, _ in gold)
    preds, first, problems = {}, {}, []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        id_, sep, raw = line.partition(",")
        id_, value = id_.strip(), number(raw)
        if not sep or not task.allows(value, gold=False):
            expected = task.expected(gold=False)
            problems.append(f"{shown}:{n}: {line.strip()!r}; expected 'id , {expected}'")
        elif id_ not in rows:
            problems.append(f"{shown}:{n}: id {id_!r} is not a test id; expected only the test's")
        elif len(preds.get(id_, [])) == rows[id_]:
            times = f"{rows[id_]} time(s), as the test file has it"
            problems.append(f"{shown}:{n}: id {id_!r} again (line {first[id_]}); expected {times}")
        else:
            preds.setdefault(id_, []).append(value)
        first.setdefault(id_, n)
    if missing := [i for i in rows if len(preds.get(i, [])) < rows[i] and i not in first]:
        problems.append(
            f"{shown}: no line for {len(missing)} test id(s), the first {missing[0]!r}; "
            "expected one for every row of the test file"
        )
    elif short := [i for i in rows if len(preds.get(i, [])) < rows[i]]:
        problems.append(
            f"{shown}: id {short[0]!r} has fewer lines than the test file's {rows[short[0]]} rows"
        )
    if problems:
        return [], problems
    return [preds[i].pop(0) for i, _ in gold], problems


# ---------------------------------------------------------------------------------------
# Scoring


def pearson(x: list[float], y: list[float]) -> float:
    """Pearson's r, by hand; 0 when either side is constant (r is 0/0 there)."""
    if min(x) == max(x) or min(y) == max(y):
        return 0.0
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    sxy = math.fsum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx, syy = math.fsum((a - mx) ** 2 for a in x), math.fsum((b - my) ** 2 for b in y)
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


@dataclass
class Graded:
    task: Task
    value: float  # the accuracy or Pearson r; a file not graded: 0 (STS: -1, its term is 0)
    term: float  # its share of the overall score: the accuracy, or (r + 1) / 2
    lines: list[str]  # for the output: the file graded, then what to know about it
    passed: bool  # the file was there and well formed


def grade(task: Task, submission: Path, gold: list[tuple[str, float]]) -> Graded:
    """One task's file, found, checked and scored; a missing or malformed one scores 0."""
    failed = -1.0 if not task.classes else 0.0
    found = find(submission, task.output)
    if not found:
        where = f"{task.name}: no {task.output} in the submission"
        line = f"{where}; expected one, e.g. predictions/{task.output} as prepare_submit.py zips it"
        return Graded(task, failed, 0.0, [line], False)
    shown, *others = found
    lines = [f"{task.name}: {shown}"]
    if others:
        also = ", ".join(others)
        lines.append(
            f"{task.output} is there {len(found)} times: graded {shown}, the shortest path, not {also}"
        )
    preds, problems = check_predictions(submission / shown, shown, task, gold)
    if problems:
        more = len(problems) - SHOWN
        lines += problems[:SHOWN] + ([f"{shown}: {more} more problem(s)"] if more > 0 else [])
        return Graded(task, failed, 0.0, lines, False)
    y, p = [label for _, label in gold], preds
    if task.classes:
        value = math.fsum(a == b for a, b in zip(y, p, strict=True)) / len(y)
        lines[0] += f", accuracy {value:.4f} on {len(y)} ids"
        return Graded(task, value, value, lines, True)
    value = pearson(p, y)
    lines[0] += f", Pearson r {value:.4f} on {len(y)} ids"
    if min(p) == max(p):
        lines.append(f"{shown}: every prediction is {p[0]}; Pearson r is undefined, counted as 0")
    return Graded(task, value, (value + 1) / 2, lines, True)


def score(submission: Path, gold: Path) -> dict:
    """Gradescope's results.json for one submission: a test per task, the overall score and
    the leaderboard's four numbers."""
    start = time.monotonic()
    graded = [grade(t, submission, read_gold(gold, t)) for t in TASKS]
    overall = math.fsum(g.term for g in graded) / len(graded)
    sst, qqp, sts = (g.value for g in graded)
    formula = (
        f"Overall {overall:.4f} = (SST {sst:.4f} + QQP {qqp:.4f} + (STS r {sts:.4f} + 1) / 2) / 3"
    )
    tests = [
        {
            "name": f"{g.task.name}: {g.task.output}",
            "score": g.term,
            "max_score": 1,
            "status": "passed" if g.passed else "failed",
            "output": "\n".join(g.lines),
        }
        for g in graded
    ]
    board = [("Overall", overall)] + [(g.task.board, g.value) for g in graded]
    return {
        "score": overall,
        "execution_time": int(time.monotonic() - start),
        "output": "\n".join([line for g in graded for line in g.lines] + [formula]),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
        "leaderboard": [{"name": name, "value": round(value, 4)} for name, value in board],
    }


# ---------------------------------------------------------------------------------------
# The archive


def build(out: Path, gold: Path) -> None:
    """Gradescope's autograder .zip: setup.sh and run_autograder (executable), this file and
    the gold files, checked first, in gold/."""
    if out.suffix != ".zip":
        raise SystemExit(f"{out}: a Gradescope autograder is a .zip file; expected OUT.zip")
    counts = [f"{len(read_gold(gold, t))} {t.name}" for t in TASKS]
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in (("setup.sh", SETUP), ("run_autograder", RUN_AUTOGRADER)):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16  # executable, as Gradescope runs them
            z.writestr(info, text)
        z.write(Path(__file__), "leaderboard.py")  # Gradescope unpacks the zip in source/
        for t in TASKS:
            z.write(gold / t.gold, f"gold/{t.gold}")
    print(f"{out}: Gradescope's leaderboard, gold ids: {', '.join(counts)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    gold_help = "the folder of ids-sst-test.csv, quora-test.csv, sts-test.csv (with labels)"
    archive = commands.add_parser("build", help="check the gold files, write the autograder")
    archive.add_argument("out", type=Path, help="the .zip to write, uploaded to Gradescope")
    archive.add_argument("--gold", type=Path, required=True, help=gold_help)
    scoring = commands.add_parser("score", help="score one submission, write results.json")
    scoring.add_argument(
        "--submission",
        type=Path,
        required=True,
        help="the student's unpacked zip (Gradescope: /autograder/submission)",
    )
    scoring.add_argument("--gold", type=Path, required=True, help=gold_help)
    scoring.add_argument("--results", type=Path, required=True, help="the results.json to write")
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.out, args.gold)
        return 0
    results = score(args.submission, args.gold)  # written whatever the files: Gradescope shows it
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print(results["output"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
