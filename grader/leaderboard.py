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
line per problem naming the file, the line and what was expected. Any file is read a line at
a time, one over BIGGEST bytes not at all, a line over LONGEST characters a piece at a time,
and none past its COUNTED-th problem: whatever a student submits, the scorer runs in under
20 MB and writes results.json. If it
fails all the same (a bug, a gold file broken since the build), results.json scores 0 and
tells the student to tell the TA, whose log has the traceback.

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
import traceback
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

SHOWN = 5  # problems listed per file; the rest are counted
COUNTED = 10_000  # problems counted per file: the rest of the file is not read
ECHOED = 80  # characters of a malformed line echoed back
LONGEST = 100_000  # characters in a line, gold or prediction (the handout's: under 2,300)
BIGGEST = 64 * 2**20  # bytes in a prediction file (the handout's largest, QQP's: about 2 MB)
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


def lines_of(path: Path) -> Iterator[str]:
    """The lines of a file, read one at a time (utf-8-sig: an Excel byte-order mark is not
    part of the header); split at line ends only (a sentence may hold a form feed), CRLF and
    a lone CR read as a newline, as prepare_submit.py reads them. A line over LONGEST
    characters comes back cut to LONGEST + 1, its rest read a piece at a time and dropped."""
    with path.open(encoding="utf-8-sig", errors="replace") as f:  # CRLF, CR: read as "\n"
        while line := f.readline(LONGEST + 1):
            rest = line
            while not rest.endswith("\n") and (rest := f.readline(LONGEST)):
                pass  # the rest of a long line
            yield line.removesuffix("\n")


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
    head = next(lines, "")
    header = [c.strip() for c in fields(head)] if head.strip() else []
    if "id" not in header or task.label not in header:
        raise SystemExit(
            f"{path}:1: header {header}; expected the dev file's, with 'id' and {task.label!r}"
        )
    at_id, at_label = header.index("id"), header.index(task.label)
    labels = []
    for n, line in enumerate(lines, start=2):
        if len(line) > LONGEST:
            raise SystemExit(f"{path}:{n}: a line over {LONGEST:,} characters; expected a row")
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
    problem one line naming the file's line and what was expected, the first SHOWN listed
    and the rest counted, up to COUNTED. A file over BIGGEST bytes is not read."""
    if (size := path.stat().st_size) > BIGGEST:
        return [], [
            f"{shown}: {size:,} bytes, over the cap of {BIGGEST:,} bytes, not read; expected "
            f"a line per test row, {len(gold)} lines of 'id , {task.expected(gold=False)}'"
        ]
    lines = lines_of(path)
    header = next(lines, "")
    if [c.strip() for c in header.split("\t")] != ["id", task.column]:
        return [], [f"{shown}:1: header {header[:ECHOED]!r}; expected 'id \\t {task.column} '"]
    preds = {}
    found = problems_in(lines, shown, task, Counter(i for i, _ in gold), preds)
    problems = list(islice(found, SHOWN))
    if (more := sum(1 for _ in islice(found, COUNTED - SHOWN + 1))) > COUNTED - SHOWN:
        problems.append(f"{shown}: over {COUNTED - SHOWN:,} more problems; not read further")
    elif more:
        problems.append(f"{shown}: {more} more problem(s)")
    if problems:
        return [], problems
    return [preds[i].pop(0) for i, _ in gold], problems


def problems_in(
    lines: Iterator[str], shown: str, task: Task, rows: Counter, preds: dict
) -> Iterator[str]:
    """The problems of a prediction file's lines after its header, one at a time, as
    check_predictions says; each test id's values go into preds. Only test ids are kept:
    a file of millions of other lines takes no more memory than the test's."""
    expected, first = task.expected(gold=False), {}
    for n, line in enumerate(lines, start=2):
        if len(line) > LONGEST:
            yield f"{shown}:{n}: a line over {LONGEST:,} characters; expected 'id , {expected}'"
            continue
        if not line.strip():
            continue
        id_, sep, raw = line.partition(",")
        id_, value = id_.strip(), number(raw)
        if not sep or not task.allows(value, gold=False):
            yield f"{shown}:{n}: {line.strip()[:ECHOED]!r}; expected 'id , {expected}'"
        elif id_ not in rows:
            yield f"{shown}:{n}: id {id_[:ECHOED]!r} is not a test id; expected only the test's"
        elif len(preds.get(id_, [])) == rows[id_]:
            times = f"{rows[id_]} time(s), as the test file has it"
            yield f"{shown}:{n}: id {id_!r} again (line {first[id_]}); expected {times}"
        else:
            preds.setdefault(id_, []).append(value)
        if id_ in rows:
            first.setdefault(id_, n)
    if missing := [i for i in rows if len(preds.get(i, [])) < rows[i] and i not in first]:
        yield (
            f"{shown}: no line for {len(missing)} test id(s), the first {missing[0]!r}; "
            "expected one for every row of the test file"
        )
    elif short := [i for i in rows if len(preds.get(i, [])) < rows[i]]:
        yield f"{shown}: id {short[0]!r} has fewer lines than the test file's {rows[short[0]]} rows"


# ---------------------------------------------------------------------------------------
# Scoring


def integers(values: list[float]) -> list[int]:
    """The values exactly, as integers over one power of two (r does not see the scale)."""
    ratios = [v.as_integer_ratio() for v in values]
    scale = max(d for _, d in ratios)  # each d a power of two
    return [n * (scale // d) for n, d in ratios]


def pearson(x: list[float], y: list[float]) -> float:
    """Pearson's r of finite values, computed exactly (in integers: no overflow, underflow or
    cancellation, whatever the values, 1e308 or 5e-324) and rounded once; 0 when either side
    is constant (r is 0/0 there)."""
    n, ix, iy = len(x), integers(x), integers(y)
    sx, sy = sum(ix), sum(iy)
    sxy = n * sum(a * b for a, b in zip(ix, iy, strict=True)) - sx * sy
    sxx, syy = n * sum(a * a for a in ix) - sx * sx, n * sum(b * b for b in iy) - sy * sy
    if not sxx or not syy:
        return 0.0
    sign = -1.0 if sxy < 0 else 1.0
    return sign * math.sqrt(sxy * sxy / (sxx * syy))  # int / int: rounded once, at most 1


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
        return Graded(task, failed, 0.0, lines + problems, False)
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
            "output": plain("\n".join(g.lines)),
        }
        for g in graded
    ]
    board = [("Overall", overall)] + [(g.task.board, g.value) for g in graded]
    return {
        "score": overall,
        "execution_time": int(time.monotonic() - start),
        "output": plain("\n".join([line for g in graded for line in g.lines] + [formula])),
        **TEXT,
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
        "leaderboard": [{"name": name, "value": round(value, 4)} for name, value in board],
    }


# Gradescope shows every output as text: a submitted folder's name in HTML stays text
TEXT = dict.fromkeys(("output_format", "test_output_format", "test_name_format"), "text")


def plain(text: str) -> str:
    """Valid Unicode: a file name's undecodable bytes written as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def crashed(error: BaseException) -> dict:
    """results.json when the scorer itself fails: score 0, and a line telling the student to
    tell the TA (the details, which could show gold labels, are in the log only)."""
    line = (
        f"The scorer failed on this submission ({type(error).__name__}): scored 0 for now; "
        "tell the TA, whose autograder log has the details"
    )
    board = [("Overall", 0.0)] + [(t.board, 0.0 if t.classes else -1.0) for t in TASKS]
    return {
        "score": 0.0,
        "output": line,
        **TEXT,
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "leaderboard": [{"name": name, "value": value} for name, value in board],
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
    try:  # written whatever the files, even if the scorer fails: Gradescope shows it
        results = score(args.submission, args.gold)
        text = json.dumps(results, indent=2, allow_nan=False)  # Gradescope's JSON has no NaN
    except (Exception, SystemExit) as error:  # SystemExit: a gold file broken since the build
        traceback.print_exc(file=sys.stdout)  # in the autograder's log, which students don't see
        results = crashed(error)
        text = json.dumps(results, indent=2)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(text + "\n")
    print(results["output"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
