"""The grader's harness: each exercise's check, run part by part, in two processes.

    python grader/sides.py --student NAME ...   runs the student's code (exercises.py check
                                                starts it; reads where to write on stdin)
    python grader/sides.py --judge NAME ...     judges what it handed back (reads a token)

A check (grader/checks.py) is a generator that builds its inputs from seeds, runs one
exercise's piece on them and yields `Part`s: what the piece gave, beside a function that
computes what it should have given. Every call into the student's code is one
`student(fn)`: in the student's process fn runs and what it returns (tensors, numbers,
lists, dicts) is written down; that process holds no reference, no token and no result
file. The judge's process runs the same check again where no student code ever ran: each
`student(fn)` hands back what was written down, fn never runs, and the inputs, the
references and the comparison are the judge's own. Replacing a torch function, walking
the stack or exiting early changes only what the student's code hands back.

The expected side comes from an independent reference: Hugging Face's BERT, torch, scipy,
sklearn, or grader/references.py, the definitions written out, which only the TA's grader
holds. In a student's copy those parts are `Hidden` and the rest is graded.

A part passes when every element of `got` lies within its tolerance of `expected`; NaN or
inf where a finite value was expected is the largest difference there is. A part is the
TA's ("held") when its verdict rests on references.py: in a student's copy it is neither
passed nor failed, only counted. Every part runs, so a part's failure does not hide the
next one's. Results go, one JSON line each with the token read on stdin, to the file named
there: nothing the student's code prints is read.
"""

import contextlib
import json
import math
import resource
import select
import signal
import sys
import sysconfig
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from handed import decode, encode
from libraries import STUDENT_LIBRARIES, libraries_first, libraries_of
from out_of_reach import ANSWERS, out_of_reach
from processes import PROCESSES, SECONDS, bounded, forked, records_of, tasks_now

REFERENCES = ("transformers", "scipy", "sklearn")  # requirements-dev.txt's
CHECKS: dict[str, tuple[Callable, float, tuple[str, ...]]] = {}  # name -> (check, tol, stands in)
CALLS = [0]  # how many times a check has reached into references.py: which parts are the TA's


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
    note: str = ""  # said where the public references miss and the TA's decide
    dtype: torch.dtype | None = None  # the run's: None, its reference's
    per: object = None  # each element's own tolerance (tol then counts in units of it)
    matched: str = field(default="", init=False)


def part(label: str, got, expected, tol: float | None = None, dtype=None) -> Part:
    """A part with one reference: a function that computes it, or a value the check has;
    dtype: the run's, where it is not the reference's."""
    reference = expected if callable(expected) else lambda: expected
    return Part(label, got, {"": reference}, tol, dtype=dtype)


def check(tol: float, stands_in: tuple[str, ...] = (), answers: tuple[str, ...] = ()):
    """Register a check; `stands_in`: the other exercises its piece calls, answered by
    stand-ins while it is graded (`exercises.py list` shows them); `answers`: the library
    functions ("module:function") that compute its answer, out of the student's code's
    reach (`out_of_reach`). Points live in grader/points.py."""

    def register(fn):
        CHECKS[fn.__name__] = (fn, tol, stands_in)
        ANSWERS[fn.__name__] = answers  # out_of_reach's
        return fn

    return register


class Absent:
    """references.py where the TA keeps it: every function raises Hidden."""

    def __getattr__(self, name):
        def hidden(*args, **kwargs):
            raise Hidden(name)

        return hidden


class Traced:
    """references.py, counting each call into it (CALLS): a part that made one is the TA's."""

    def __init__(self, module):
        self.module = module

    def __getattr__(self, name):
        found = getattr(self.module, name)
        if not callable(found):
            CALLS[0] += 1
            return found

        def traced(*args, **kwargs):
            CALLS[0] += 1
            return found(*args, **kwargs)

        return traced


def cached(fn: Callable[[], object]) -> Callable[[], object]:
    """functools.cache for a reference computed once and read by several parts: each
    read counts as a call into references.py when computing it made one."""
    memo = {}

    def read():
        if not memo:
            before = CALLS[0]
            memo["value"] = fn()
            memo["traced"] = CALLS[0] > before
        CALLS[0] += memo["traced"]
        return memo["value"]

    return read


ON_STUDENTS_SIDE = [False]  # the student's process: references.py is never imported


def references():
    """grader/references.py, traced, or a stand-in whose every function is Hidden (in a
    student's copy, and always in the student's process)."""
    if ON_STUDENTS_SIDE[0]:
        return Absent()
    try:
        import references as found
    except ModuleNotFoundError as e:
        if e.name != "references":
            raise
        return Absent()
    return Traced(found)


# ---------------------------------------------------------------- the two processes


class StudentError(Exception):
    """What the student's half of a check raised, as the judge hears of it."""

    def __init__(self, result: str, detail: str):
        super().__init__(detail)
        self.result, self.detail = result, detail


SIDE: list = [None]  # the process's side: a Recorder (the student's) or a Replay (the judge's)


def judging() -> bool:
    """Whether this is the judge's process (a check's references are computed there only)."""
    return isinstance(SIDE[0], Replay)


def student(fn: Callable, *args, **kwargs):
    """The student's half of a check: every call into the student's code goes through here.
    In the student's process fn(*args) runs and what it returns is written down; in the
    judge's, fn never runs and what was written down comes back."""
    return SIDE[0](fn, args, kwargs)


class Recorder:
    """The student's process: runs each half, the functions that compute its exercise's
    answer out of reach (`out_of_reach`), and writes down what it returns (or raises)."""

    def __init__(self, name: str):
        self.name, self.records = name, []

    def __call__(self, fn, args, kwargs):
        refused = []  # a refusal the student's code caught still counts
        try:
            with out_of_reach(self.name, refused):
                value = fn(*args, **kwargs)
            if refused:
                raise refused[0]
            self.records.append({"value": encode(value)})
        except BaseException as e:
            self.records.append({"raised": raised(refused[0] if refused else e, self.name, True)})
            raise
        return value


class Replay:
    """The judge's process: hands back the student's values in the order they were
    written down; fn never runs."""

    def __init__(self, records: list[dict]):
        self.records, self.handed = iter(records), 0

    def __call__(self, fn, args, kwargs):
        stopped = {"raised": {"result": "error", "detail": "your code handed back nothing more"}}
        record = next(self.records, stopped)
        if not isinstance(record, dict) or "raised" in record:
            raise StudentError(*charged(record))
        self.handed += 1
        try:
            return decode(record["value"])
        except Exception as e:  # noqa: BLE001  (what the student's process wrote is data)
            raise StudentError("error", f"handed back what the grader cannot read: {e}") from e


def charged(record) -> tuple[str, str]:
    """(result, detail) of a record that is not a value: open or error as written, anything
    else (a `pass`, a `grader`, what is not a record) an error of its exercise's."""
    said = record.get("raised") if isinstance(record, dict) else None
    said = said if isinstance(said, dict) else {}
    result, detail = said.get("result"), str(said.get("detail", ""))[:300]
    if result in ("open", "error"):
        return result, detail
    if result == "grader":  # the grader's own code raised in the student's process
        return "error", f"charged to this exercise: {detail}"
    return "error", f"a record that is neither a value, open nor an error: {str(result)[:40]!r}"


def raised(e: BaseException, name: str, half: bool = False) -> dict:
    """{result, detail} of an exception in the student's process: open (the exercise's own
    NotImplementedError); error (the student's code raised, or inside a student half, the
    grader's code on what the student's code returned: a tensor of the wrong shape); grader
    (the grader's code elsewhere, no frame of the student's)."""
    hint = str(e).removeprefix(f"exercise {name}: ")
    if isinstance(e, NotImplementedError) and hint != str(e):
        return {"result": "open", "detail": hint}
    if graders(e) and half:
        return {"result": "error", "detail": f"{failure(e)}, on what your code returned"}
    if graders(e):
        return {"result": "grader", "detail": f"the grader failed, not your code: {failure(e)}"}
    return {"result": "error", "detail": failure(e)}


def array(x) -> np.ndarray:
    """A part's value as a float64 array."""
    if torch.is_tensor(x):
        x = x.detach().cpu().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def difference(got, expected, per=None) -> tuple[float, str]:
    """(largest |got - expected|, where); NaN or inf where expected is finite: inf.
    Where both are NaN (a nan the exercise asks for) they agree. per: each element's
    tolerance, the difference then counted in units of it."""
    try:
        a = array(got)
    except (TypeError, ValueError, RuntimeError, NotImplementedError):
        return math.inf, f": {type(got).__name__} is not numbers"
    b = array(expected)
    if a.shape != b.shape:
        return math.inf, f" in shape: {list(a.shape)}, expected {list(b.shape)}"
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b)
        d = np.where(
            (a == b) | (np.isnan(a) & np.isnan(b)), 0.0, d
        )  # equal infinities, asked-for nans
        d = np.where(np.isnan(d), math.inf, d)  # any other NaN
        d = d if per is None else d / np.broadcast_to(array(per), d.shape)
    if d.size == 0:
        return 0.0, ""
    i = int(np.argmax(d))
    where = [int(k) for k in np.unravel_index(i, d.shape)]
    n = digits(float(a.flat[i]), float(b.flat[i]))
    values = f"got {a.flat[i]:.{n}g}, expected {b.flat[i]:.{n}g}"
    return float(d.flat[i]), f" at {where} ({values})" if where else f" ({values})"


def digits(a: float, b: float) -> int:
    """Significant digits that show a and b apart (4 at least, 17 at most)."""
    gap, scale = abs(a - b), max(abs(a), abs(b))
    if not (math.isfinite(gap) and gap > 0 and scale > 0):
        return 4
    return min(17, max(4, math.ceil(math.log10(scale / gap)) + 2))


def judge(p: Part, tol: float) -> tuple[bool | None, float, str, bool]:
    """(passed, the difference, a one-line account, held) of one part. held: its verdict
    rests on references.py, the TA's: it passed only against them, or failed with one of
    them among its references. passed is None where they are absent and nothing else
    matched. The dtype is part of the check: a floating output must have its run's dtype
    (the part's, else its reference's), and the tolerance is the run's, never the one the
    output's dtype would give."""
    best, hidden, ta_only, run, real = None, 0, False, p.dtype, p.dtype is not None
    for name, expected in p.expected.items():
        before = CALLS[0]
        try:
            value = expected()
        except Hidden:
            hidden += 1
            continue
        run, real = run or floating(value), real or kind(value) == "floating"
        diff, where = difference(p.got, value, p.per)
        held = CALLS[0] > before
        ta_only |= held
        if best is None or diff < best[0] or math.isnan(best[0]):
            best = (diff, where, name, held)
    got, k = floating(p.got), kind(p.got)
    run = run or (got if got in (torch.float32, torch.float64) else torch.float64)
    wrong = k == "complex" or (k == "integer" and real)  # where real numbers are asked for
    if wrong or (got is not None and got != run):
        what = getattr(p.got, "dtype", None) or f"{k} {type(p.got).__name__}"
        said = f"{p.label}: a {what} output, where this run computes in {run}"
        return False, math.inf, said, ta_only
    tol = rounding(p.got, p.tol if p.tol is not None else tol, run)
    if best is not None and best[0] <= tol:
        p.matched = best[2]
        return True, best[0], "", best[3]
    if hidden:  # what the student's side has does not match; the TA's references may
        said = (
            f"{p.label}: {best[0]:.1e} from {best[2]}; the TA's reference decides" if best else ""
        ) + (f" ({p.note})" if p.note and best else "")
        return None, 0.0, said, True
    diff, at, name, _ = best
    against = f" against {name}" if name else ""
    account = f"{p.label}: largest difference {diff:.2e}{at}{against} (tolerance {tol:.0e})"
    if p.per is not None:
        account = f"{p.label}: {diff:.3g} times an element's tolerance{at}{against}"
    return False, diff, account, ta_only


def floating(x) -> torch.dtype | None:
    """x's dtype where x is a floating tensor; None for anything else."""
    return x.dtype if torch.is_tensor(x) and x.is_floating_point() else None


def kind(x) -> str:
    """What numbers x holds: complex, integer (booleans too), floating, or "" (not numbers);
    of a tensor, an array, a number, or the worst of a list's."""
    if torch.is_tensor(x):
        return "complex" if x.is_complex() else "floating" if x.is_floating_point() else "integer"
    if isinstance(x, np.ndarray | np.generic):
        return {
            "c": "complex",
            "f": "floating",
            "i": "integer",
            "u": "integer",
            "b": "integer",
        }.get(x.dtype.kind, "")
    if isinstance(x, list | tuple):
        kinds = {kind(v) for v in x}
        return next((k for k in ("complex", "floating", "integer") if k in kinds), "")
    return {bool: "integer", int: "integer", float: "floating", complex: "complex"}.get(type(x), "")


def rounding(got, tol: float, run: torch.dtype) -> float:
    """The tolerance a part's arithmetic allows: its own, or where its run computes in a
    lower precision than float64 (a float32 run), 64 of that precision's epsilons times
    the output's scale: any correct float32 solution passes. The run's dtype decides, not
    the dtype the student's code handed back."""
    if run == torch.float64 or not torch.is_tensor(got):
        return tol
    values = np.abs(array(got)) if got.device.type != "meta" else np.ones(1)
    scale = float(values.max()) if values.size else 1.0
    scale = scale if math.isfinite(scale) else 1.0
    return max(tol, 64 * torch.finfo(run).eps * max(1.0, scale))


def run_student(name: str) -> list[dict]:
    """The student's side of one exercise: its check run with every `student(fn)` running
    fn; what each returned (or raised), in order. It runs in a fork of its own (`forked`):
    what the student's code changes dies with it."""
    fn = CHECKS[name][0]
    recorder = SIDE[0] = Recorder(name)
    signal.alarm(SECONDS)
    try:
        for _ in fn():
            pass
    except BaseException as e:  # noqa: BLE001  (an exit, a timeout: the judge hears of it)
        if not recorder.records or "raised" not in recorder.records[-1]:
            recorder.records.append({"raised": raised(e, name)})
    finally:
        signal.alarm(0)
        SIDE[0] = None
    return recorder.records


def judged(name: str, records: list[dict]) -> dict:
    """{'name', 'result', 'detail', ...} of one exercise, its check run on the student's
    values handed back (`records`), with how many parts ran, were held (the TA's), failed,
    held_failed, and were unknown (held, references.py absent). result: pass; fail (a part
    failed); provisional (the parts here pass, the TA's are unknown); hidden (every part is
    the TA's); open; error (the student's code raised, or handed back what the grader
    cannot read); grader (the grader's own code raised). held_detail: the first held
    part's failure."""
    if name not in CHECKS:
        return {"name": name, "result": "error", "detail": f"no check named {name} here"}
    fn, tol, _ = CHECKS[name]
    row = {"name": name, "tol": tol}
    n = dict.fromkeys(("parts", "held", "failed", "held_failed", "unknown"), 0)
    accounts, waiting, matched, worst = {False: [], True: []}, [], set(), 0.0
    replay = SIDE[0] = Replay(records)
    signal.alarm(SECONDS)
    try:
        for p in fn():
            ok, diff, account, held = judge(p, tol)
            n["parts"], n["held"], n["unknown"] = n["parts"] + 1, n["held"] + held, n["unknown"] + (ok is None)  # fmt: skip
            n["held_failed" if held else "failed"] += ok is False
            accounts[held] += [account] * (ok is False)
            waiting += [account] * (ok is None and bool(account))
            matched |= {p.matched} - {""}
            worst = max(worst, diff)
    except StudentError as e:
        return row | {"result": e.result, "detail": e.detail}
    except Exception as e:  # noqa: BLE001  (the judge's code: no student code runs here)
        if replay.handed:
            why = f"the grader could not judge what your code handed back: {failure(e)}"
            return row | {"result": "error", "detail": why}
        why = f"the grader failed, not your code (tell the TA): {failure(e)}"
        return row | {"result": "grader", "detail": why}
    finally:
        signal.alarm(0)
        SIDE[0] = None
    row |= n | {"diff": worst, "held_detail": (accounts[True] or [""])[0]}
    row |= {"public_failures": accounts[False]}  # check -v lists them
    if failed := accounts[False] + accounts[True]:
        more = f" (and {len(failed) - 1} more part(s))" * (len(failed) > 1)
        return row | {"result": "fail", "detail": failed[0] + more}
    if n["unknown"] == n["parts"]:
        return row | {"result": "hidden", "detail": "every part is the TA's grader's to grade"}
    notes = [f"matched {', '.join(sorted(matched))}"] * bool(matched)
    notes += [f"{n['unknown']} part(s) left to the TA's grader"] * bool(n["unknown"])
    notes += waiting[:1]  # a public reference it does not match: the student should know
    return row | {"result": "provisional" if n["unknown"] else "pass", "detail": "; ".join(notes)}


def failure(e: BaseException) -> str:
    """One line: the exception and the deepest line of the student's files it passed
    through (not torch's, not the grader's)."""
    if isinstance(e, ModuleNotFoundError) and e.name in REFERENCES:
        return f"no {e.name}: the checks need pip install -r requirements-dev.txt"
    if isinstance(e, SyntaxError) and e.filename:
        return f"SyntaxError: {e.msg} ({Path(e.filename).name}:{e.lineno})"
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if students(f.filename)] or frames[-1:]
    where = f" ({relative(ours[-1].filename)}:{ours[-1].lineno})" if ours else ""
    return f"{type(e).__name__}: {e}{where}"


def graders(e: BaseException) -> bool:
    """Whether an exception is the grader's own: raised in the grader's files with no frame
    of the student's code on the way (a student's code that raises is the student's)."""
    frames = traceback.extract_tb(e.__traceback__)
    grader = Path(__file__).resolve().parent
    mine = any(Path(f.filename).resolve().is_relative_to(grader) for f in frames)
    return mine and not any(students(f.filename) for f in frames)


def relative(filename: str) -> str:
    path = Path(filename).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else path.name


LIBRARIES = {Path(p).resolve() for k, p in sysconfig.get_paths().items() if "lib" in k}


def students(filename: str) -> bool:
    """Whether a traceback's file is the student's copy's: not the grader's, not Python's
    or an installed library's (torch's container.py)."""
    if filename.startswith("<"):
        return False
    path, grader = Path(filename).resolve(), Path(__file__).resolve().parent
    return not path.is_relative_to(grader) and not any(path.is_relative_to(p) for p in LIBRARIES)


def broken_modules() -> dict[str, str]:
    """{module: its syntax error, one line} of the copy's modules that do not compile."""
    out = {}
    for path in sorted(Path.cwd().glob("*.py")):
        try:
            compile(path.read_bytes(), str(path), "exec")
        except SyntaxError as e:
            out[path.stem] = failure(e)
    return out


def stand_in_module(name: str, why: str) -> types.ModuleType:
    """A module that does not compile, imported as one whose every name raises on use: an
    exercise that never calls into it is graded as if it were whole."""
    module = types.ModuleType(name)

    def missing(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def broken(*args, **kwargs):
            raise ImportError(f"{name}.py does not compile: {why}")

        return broken

    module.__getattr__ = missing
    return module


def on_alarm(signum, frame):
    raise TimeoutError(f"took over {SECONDS} s")


def student_main(names: list[str]) -> None:
    """The student's process: read the number of a file descriptor open for writing and
    then {exercise: its files} (JSON) on stdin; run each name's check in a fork of its own
    (`forked`) and write its records to that descriptor, one JSON line each. It holds no
    references.py, no token and no result file, and runs no student code itself: what one
    exercise's code changes dies with its fork. A module that does not compile stops only
    the exercises written in it."""
    fd = int(sys.stdin.readline())
    files = json.loads(sys.stdin.readline() or "{}")
    sys.stdin.close()
    ON_STUDENTS_SIDE[0] = True
    with contextlib.suppress(OSError):  # where memory runs out, the student's process goes first
        Path("/proc/self/oom_score_adj").write_text("1000")
    if (now := tasks_now()) is not None:  # root is not bound
        bounded(resource.RLIMIT_NPROC, now + PROCESSES)
    broken = broken_modules()
    sys.modules.update({m: stand_in_module(m, why) for m, why in broken.items()})
    torch.set_num_threads(1)  # tiny tensors: one thread is faster
    signal.signal(signal.SIGALRM, on_alarm)
    libraries_first(STUDENT_LIBRARIES)  # imported once, not in every fork
    with open(fd, "w", buffering=1, closefd=True) as out:
        for name in names:
            out.write(json.dumps({"name": name, "start": True}) + "\n")
            own = [broken[Path(f).stem] for f in files.get(name, ()) if Path(f).stem in broken]
            if own:
                records = [{"raised": {"result": "error", "detail": own[0]}}]
            else:
                records = forked(name, fd, run_student)
            for record in records:
                out.write(json.dumps({"name": name} | record) + "\n")
            out.write(json.dumps({"name": name, "end": True}) + "\n")


def judge_main(names: list[str]) -> None:
    """The judge's process: while the student's side runs, import the references'
    libraries; then read `TOKEN PATH` and the student's records' file on stdin; judge each
    name on its records and append its line, with the token, to PATH. Started once the
    student's side has ended (stdin already written), it imports an exercise's libraries
    only where its code handed back a value to judge. No student code runs here: what it
    imports is the handout's."""
    if not select.select([sys.stdin], [], [], 0)[0]:  # the student's side still runs
        libraries_first(libraries_of(names))
    token, path = sys.stdin.readline().split(maxsplit=1)
    held = Path(sys.stdin.readline().strip())
    sys.stdin.close()
    torch.set_num_threads(1)
    signal.signal(signal.SIGALRM, on_alarm)
    with open(path.strip(), "a", buffering=1) as out:
        for name in names:
            records = records_of(held, name)  # one exercise's records at a time
            if any(isinstance(r, dict) and "value" in r for r in records):  # not in its time
                libraries_first(libraries_of([name]))
            out.write(json.dumps({"token": token} | judged(name, records)) + "\n")
