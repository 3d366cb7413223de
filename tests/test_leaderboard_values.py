"""grader/leaderboard.py on hostile submissions: any value in any file (overflowing,
underflowing, not a number, subnormal), a Pearson r exact where scipy's is not, a file of
any size read a line at a time within Gradescope's 768 MB, and a scorer that fails still
writing a results.json."""

import json
import math
import random
import shutil
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest
from scipy.stats import pearsonr
from sklearn.metrics import accuracy_score

import leaderboard as lb
from test_leaderboard import ROWS, edit, every_value, gold_files, gold_labels, perfect, value_at


@pytest.fixture(scope="module")
def gold(data_dir, tmp_path_factory) -> Path:
    return gold_files(data_dir, tmp_path_factory.mktemp("gold"))


# ---------------------------------------------------------------------------------------
# Any value, any size, any failure: results.json is always written


def results_of(submission: Path, gold: Path, tmp_path: Path) -> dict:
    """The real entry point's results.json, in this process; it must be strict JSON."""
    out = tmp_path / "results" / "results.json"
    argv = ["score", "--submission", str(submission), "--gold", str(gold), "--results", str(out)]
    assert lb.main(argv) == 0
    return json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in results"))


def exact_r(x: list[float], y: list[float]) -> float:
    """Pearson's r in exact rational arithmetic, rounded once, at the end (0: a side constant)."""
    fx, fy = [Fraction(a) for a in x], [Fraction(b) for b in y]
    mx, my = sum(fx) / len(fx), sum(fy) / len(fy)
    sxy = sum((a - mx) * (b - my) for a, b in zip(fx, fy, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in fx), sum((b - my) ** 2 for b in fy)
    if not sxx or not syy:
        return 0.0
    return math.sqrt(sxy * sxy / (sxx * syy)) * (1 if sxy > 0 else -1)


# the values a float() reads that overflow, underflow or are not numbers; subnormals included
HOSTILE = "inf -inf nan 1e400 1e308 -1.7e308 1e200 1e-200 -0.0 5e-324 2.5e-310".split()


@pytest.mark.parametrize("among", ["labels", "zeros"])
@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("key", ["sst", "para", "sts"])
def test_any_value_in_any_file_is_scored_in_a_results_json(key, value, among, gold, tmp_path):
    """One prediction set to the value, among the gold labels or among zeros: a non-number
    or a value out of range scores the task 0, an STS number its exact Pearson r."""
    submission = perfect(tmp_path, gold)
    path = submission / "predictions" / f"{key}-test-output.csv"
    if among == "zeros":
        edit(path, every_value(0))
    edit(path, value_at(3, value))
    results = results_of(submission, gold, tmp_path)
    at = [t.key for t in lb.TASKS].index(key)
    graded, task = results["tests"][at], lb.TASKS[at]
    assert 0 <= results["score"] <= 1 and math.isfinite(results["score"])
    y = list(gold_labels(gold, task).values())
    p = [0.0] * len(y) if among == "zeros" else list(y)
    p[1] = float(value)  # line 3
    if not math.isfinite(p[1]) or (task.classes and p[1] != 0):
        assert graded["status"] == "failed" and graded["score"] == 0
        line = path.read_text().splitlines()[2]
        assert f"predictions/{key}-test-output.csv:3: '{line}'; expected" in graded["output"]
    elif task.classes:
        assert graded["status"] == "passed"
        assert graded["score"] == pytest.approx(accuracy_score(y, p), abs=1e-12)
    else:
        r = exact_r(p, y)
        assert graded["status"] == "passed"
        assert graded["score"] == pytest.approx((r + 1) / 2, abs=1e-15)
        assert results["leaderboard"][3]["value"] == pytest.approx(r, abs=5e-5)
        assert (len(set(p)) == 1) == ("Pearson r is undefined" in graded["output"])


def hostile_predictions(rng: random.Random, n: int) -> dict[str, list[float]]:
    """Finite predictions that overflow, underflow or cancel in a textbook Pearson r."""
    return {
        "huge": [rng.uniform(-1, 1) * 1e300 for _ in range(n)],
        "the largest": [
            rng.choice([1.7976931348623157e308, -1.7976931348623157e308, 0.0]) for _ in range(n)
        ],
        "tiny": [rng.uniform(0, 1) * 1e-300 for _ in range(n)],
        "subnormal": [rng.randint(0, 9) * 5e-324 for _ in range(n)],
        "mixed magnitudes": [rng.choice([-1, 1]) * 10 ** rng.uniform(-300, 300) for _ in range(n)],
        "one 1e200 among scores": [1e200] + [rng.uniform(0, 5) for _ in range(n - 1)],
        "one 1e-200 among zeros": [0.0] * (n - 1) + [1e-200],
        "one subnormal among zeros": [5e-324] + [0.0] * (n - 1),
        "differing in the last bit": [1 + rng.randint(0, 3) * 2**-52 for _ in range(n)],
        "a large offset": [1e15 + rng.uniform(0, 5) for _ in range(n)],
    }


# where scipy 1.17's pearsonr is right, within 1e-15 of the exact r (elsewhere it is NaN near
# 1.8e308, off by 0.03 to 0.1 on subnormals, by 0.01 on values a bit apart, by 2e-3 at 1e15)
SCIPY_RIGHT = [
    "huge",
    "tiny",
    "mixed magnitudes",
    "one 1e200 among scores",
    "one 1e-200 among zeros",
]


def test_pearson_r_matches_scipy_and_exact_arithmetic_on_hostile_finite_values():
    """Within 1e-15 of the exactly rounded r, and of scipy's within 1e-12 where scipy's is
    right; never an overflow or a division by zero; a constant side, however large or small
    its value, gives 0."""
    rng = random.Random(0)
    for n in (2, 3, 50, 1000):
        y = [rng.uniform(0, 5) for _ in range(n)]
        for name, x in hostile_predictions(rng, n).items():
            exact = exact_r(x, y)
            for a, b in ((x, y), (y, x)):
                r = lb.pearson(a, b)
                assert -1 <= r <= 1 and r == pytest.approx(exact, abs=1e-15), (name, n)
            if name in SCIPY_RIGHT:
                assert lb.pearson(x, y) == pytest.approx(pearsonr(x, y).statistic, abs=1e-12), name
    for value in (0.0, -0.0, 0.1, 1e308, -1e308, 1e-200, 5e-324):
        assert lb.pearson([value] * 7, [0, 1, 2, 3, 4, 5, 1.5]) == 0.0
        assert lb.pearson([0, 1, 2, 3, 4, 5, 1.5], [value] * 7) == 0.0


def test_a_scorer_failure_still_writes_results_json_telling_the_student(
    gold, tmp_path, monkeypatch, capsys
):
    """Fail closed: a bug, or a gold file broken since the build, scores 0 with a line to tell
    the TA; the details go to the autograder's log, not to the student."""
    submission = perfect(tmp_path, gold)

    def broken(*args):
        raise RuntimeError("a bug in the scorer")

    monkeypatch.setattr(lb, "grade", broken)
    results = results_of(submission, gold, tmp_path)
    assert results["score"] == 0 and "tell the TA" in results["output"]
    assert "a bug in the scorer" not in results["output"]
    assert "RuntimeError: a bug in the scorer" in capsys.readouterr().out  # the traceback
    assert [e["value"] for e in results["leaderboard"]] == [0.0, 0.0, 0.0, -1.0]
    monkeypatch.undo()
    folder = shutil.copytree(gold, tmp_path / "gold")
    (folder / "sts-test.csv").unlink()
    results = results_of(submission, folder, tmp_path)
    assert results["score"] == 0 and "tell the TA" in results["output"]


MEMORY = 768 * 2**20  # bytes of address space the scorer runs in (the reviewer's cgroup)
MB = 2**20


def write_big(path: Path, head: str, size: int, line: str | None) -> None:
    """A prediction file of `size` bytes: its head, then `line` repeated (a block at a time),
    or with line None a single line of x's with no line end."""
    block = (line * (MB // len(line))) if line else "x" * MB
    with path.open("w") as f:
        f.write(head)
        while f.tell() + len(block) <= size:
            f.write(block)
        f.write(block[: size - f.tell()])


# run by a small Python: a child forked from pytest would count pytest's memory in its peak
MEASURED = """import resource, subprocess, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]),) * 2)
status = subprocess.run(sys.argv[2:]).returncode
print(status, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"""


def scored_in_a_subprocess(submission: Path, gold: Path, results: Path) -> tuple[int, float, float]:
    """`python grader/leaderboard.py score ...` as run_autograder runs it, its address space
    capped at MEMORY: (exit status, peak resident memory in MB, seconds)."""
    argv = [sys.executable, lb.__file__, "score", "--submission", str(submission)]
    argv += ["--gold", str(gold), "--results", str(results)]
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", MEASURED, str(MEMORY), *argv], capture_output=True, text=True
    )
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-2000:]
    status, peak = done.stdout.split("\n")[-2].split()
    return int(status), int(peak) / 1024, seconds


ROW = "0123456789abcdef0123456789abcdef , 2.5\n"  # not a test id
# case: (the STS file's size in MB, the line repeated after its rows (None: one, no line end))
BIG = {
    "100 MB of rows": (100, ROW),
    "100 MB on one line": (100, None),
    "63 MB of rows": (63, ROW),
    "63 MB on one line": (63, None),
    "63 MB of blank lines": (63, " " * 1023 + "\n"),
}


@pytest.mark.parametrize("case", list(BIG))
def test_a_huge_prediction_file_is_scored_in_768_mb(case, gold, tmp_path):
    """Over the size cap, the file is refused unread; under it, it is read a line at a time
    (blank lines to its end, other lines to its COUNTED-th problem), a long line a piece at
    a time: results.json, in a 768 MB address space, in a few MB."""
    megabytes, line = BIG[case]
    submission = perfect(tmp_path, gold)
    path = submission / "predictions" / "sts-test-output.csv"
    write_big(path, path.read_text(), megabytes * MB, line)
    results = tmp_path / "results.json"
    status, peak, seconds = scored_in_a_subprocess(submission, gold, results)
    print(f"{case}: exit {status}, peak RSS {peak:.0f} MB, {seconds:.1f} s")
    assert status == 0 and results.is_file()
    scored = json.loads(results.read_text())
    sts, shown, size = scored["tests"][2], "predictions/sts-test-output.csv", path.stat().st_size
    assert [t["score"] for t in scored["tests"][:2]] == [1, 1]
    if size > lb.BIGGEST:
        said = f"{shown}: {size:,} bytes, over the cap of {lb.BIGGEST:,} bytes, not read"
        assert sts["output"].splitlines()[1].startswith(said)
    elif line is None:
        said = f"{shown}:{ROWS + 2}: a line over {lb.LONGEST:,} characters; expected 'id , a "
        assert sts["output"].splitlines()[1:] == [said + "finite number'"]
    elif line.strip():
        said = f"{shown}: over {lb.COUNTED - lb.SHOWN:,} more problems; not read further"
        assert sts["output"].splitlines()[-1] == said
    else:
        assert sts["status"] == "passed" and sts["score"] == 1  # read to its end
    assert sts["status"] == "passed" or sts["score"] == 0
    assert peak < 64, f"{case}: peak RSS {peak:.0f} MB"
