"""The grader's harness: each exercise's check, run part by part, in a process of its own.

    python grader/harness.py NAME ...      (exercises.py check runs it; reads a token on stdin)

A check (grader/checks.py) is a generator that runs one exercise's piece and yields
`Part`s: what the piece gave, beside a function that computes what it should have given.
The expected side comes from an independent reference: Hugging Face's BERT, torch, scipy,
sklearn, or grader/references.py, the definitions written out, which only the TA's grader
holds. In a student's copy those parts are `Hidden` and the rest is graded.

A part passes when every element of `got` lies within its tolerance of `expected`; NaN or
inf where a finite value was expected is the largest difference there is. An exercise
passes when every part it ran passes. Results go, one JSON line each with the token read
on stdin, to the file named there: nothing the student's code prints is read.
"""

import json
import math
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

SECONDS = 60  # one check's time limit: a loop that never ends fails alone
REFERENCES = ("transformers", "scipy", "sklearn")  # requirements-dev.txt's
CHECKS: dict[str, tuple[Callable, float, int]] = {}  # name -> (check, tolerance, points)


class Hidden(Exception):
    """A part whose reference only the TA's grader holds."""


@dataclass
class Part:
    """got: the student's tensor (or number); expected: {reference's name: a function that
    returns the tensor it should equal}; the part passes when any reference matches."""

    label: str
    got: object
    expected: dict[str, Callable[[], object]]
    tol: float | None = None  # None: the check's own
    matched: str = field(default="", init=False)


def part(label: str, got, expected, tol: float | None = None) -> Part:
    """A part with one reference: a function that computes it, or a value the check has."""
    return Part(label, got, {"": expected if callable(expected) else lambda: expected}, tol)


def check(tol: float, points: int):
    def register(fn):
        CHECKS[fn.__name__] = (fn, tol, points)
        return fn

    return register


def references():
    """grader/references.py, or a stand-in whose every function is Hidden."""
    try:
        import references as found
    except ModuleNotFoundError as e:
        if e.name != "references":
            raise

        class Absent:
            def __getattr__(self, name):
                def hidden(*args, **kwargs):
                    raise Hidden(name)

                return hidden

        return Absent()
    return found


def difference(got, expected) -> tuple[float, str]:
    """(largest |got - expected|, where); NaN or inf where expected is finite: inf.
    Where both are NaN (a nan the exercise asks for) they agree."""
    a, b = (
        x.detach().cpu().double() if torch.is_tensor(x) else torch.tensor(x, dtype=torch.float64)
        for x in (got, expected)
    )
    if a.shape != b.shape:
        return math.inf, f" in shape: {list(a.shape)}, expected {list(b.shape)}"
    d = (a - b).abs()
    d = torch.where((a == b) | (a.isnan() & b.isnan()), 0.0, d)  # equal infinities, asked-for nans
    d = torch.where(d.isnan(), math.inf, d)  # any other NaN
    if d.numel() == 0:
        return 0.0, ""
    i = int(d.flatten().argmax())
    where = [int(x) for x in torch.unravel_index(torch.tensor(i), d.shape)]
    return float(d.flatten()[i]), f" at {where}" if where else ""


def judge(p: Part, tol: float, difference=difference) -> tuple[bool | None, float, str]:
    """(passed, the difference, a one-line account) of one part; passed is None when
    every reference of the part is Hidden."""
    tol = p.tol if p.tol is not None else tol
    best, hidden = None, 0
    for name, expected in p.expected.items():
        try:
            diff, where = difference(p.got, expected())
        except Hidden:
            hidden += 1
            continue
        if best is None or diff < best[0] or math.isnan(best[0]):
            best = (diff, where, name)
    if best is None:
        return None, 0.0, ""
    diff, at, name = best
    against = f" against {name}" if name else ""
    if diff <= tol:
        p.matched = name
        return True, diff, ""
    return (
        False,
        diff,
        f"{p.label}: largest difference {diff:.2e}{at}{against} (tolerance {tol:.0e})",
    )


def grade(name: str, judge=judge) -> dict:
    """{'name', 'result', 'diff', 'tol', 'points', 'detail'}; the result is pass, fail,
    open, error, or hidden: every part needs the references only the TA's grader holds."""
    if name not in CHECKS:
        return {"name": name, "result": "error", "detail": f"no check named {name} here"}
    fn, tol, points = CHECKS[name]
    row = {"name": name, "tol": tol, "points": points}
    signal.alarm(SECONDS)
    try:
        worst, hidden, ran, matched = 0.0, 0, 0, set()
        for p in fn():
            ok, diff, account = judge(p, tol)
            if ok is False:
                return row | {"result": "fail", "diff": diff, "detail": account}
            hidden, matched = hidden + (ok is None), matched | ({p.matched} - {""})
            ran += 1
            worst = max(worst, diff)
    except NotImplementedError as e:
        hint = str(e).removeprefix(f"exercise {name}: ")
        return row | {"result": "open" if hint != str(e) else "error", "detail": hint}
    except Exception as e:  # the student's code: any failure is this exercise's
        return row | {"result": "error", "detail": failure(e)}
    finally:
        signal.alarm(0)
    if hidden and hidden == ran:
        return row | {"result": "hidden", "detail": "every part is the TA's grader's to grade"}
    notes = [f"matched {', '.join(sorted(matched))}"] * bool(matched)
    notes += [f"{hidden} part(s) left to the TA's grader"] * bool(hidden)
    return row | {"result": "pass", "diff": worst, "detail": "; ".join(notes)}


def failure(e: Exception) -> str:
    """One line: the exception and where in the student's code it was raised."""
    where = traceback.extract_tb(e.__traceback__)[-1]
    if isinstance(e, ModuleNotFoundError) and e.name in REFERENCES:
        return f"no {e.name}: the checks need pip install -r requirements-dev.txt"
    return f"{type(e).__name__}: {e} ({Path(where.filename).name}:{where.lineno})"


def on_alarm(signum, frame):
    raise TimeoutError(f"took over {SECONDS} s")


def main(names: list[str], grade=grade, dumps=json.dumps) -> None:
    """Read `TOKEN PATH` on stdin, then grade each name and append its line to PATH. The
    functions that judge are bound before any exercise's module is imported: a module that
    replaces harness.grade, judge or difference changes nothing here."""
    token, path = sys.stdin.readline().split(maxsplit=1)
    sys.stdin.close()
    import checks  # noqa: F401  (they register; neither imports an exercise's module)
    import extensions  # noqa: F401

    torch.set_num_threads(1)  # tiny tensors: one thread is faster
    signal.signal(signal.SIGALRM, on_alarm)
    with open(path.strip(), "a", buffering=1) as out:
        for name in names:
            out.write(dumps({"token": token, "start": name}) + "\n")
            out.write(dumps({"token": token} | grade(name)) + "\n")


if __name__ == "__main__":  # as the module checks.py registers with, not a second copy
    import harness

    harness.main(sys.argv[1:])
