"""The two processes a grade runs in (exercises.py check starts them; grader/harness.py is
what runs inside):

- the student's: in the copy (the submission), with the grader's checks but not the TA's
  references; each exercise's check runs in a fork of it, which runs the student's code on
  the checks' inputs and hands back what that code returns; the process writes it down, to
  a file it was handed open. It holds no reference, no token and no result file. Where the
  grader runs as root (Gradescope), it runs as an unprivileged user, and every process of
  that user is stopped once it ends.
- the judge's: in the handout (the given code, no submitted file), with the TA's grader;
  it runs the checks again where no student code ever ran, on what the student's process
  wrote down, and writes each exercise's row, with a token only it knows, to a file only
  it knows.

A check that kills the student's process is charged to its exercise, and the rest run in
a new one.
"""

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SECONDS = 60  # one check's time limit: grader/harness.py stops a longer one
DEADLINE = 420  # the student's side of a whole grade, in seconds: below Gradescope's 10 min
LATE = "timed out: the grade's deadline passed before this exercise ran"
ANSWERS = ("references.py", "mtdnn_smart.py")  # the TA's: never where the student's code runs
HARNESS = "harness.py"
RAISED = re.compile(r"^[\w.]*(Error|Exception|Interrupt|Exit)\b")


def grade(root: Path, grader: Path, names: list[str], files: dict, handout=None, user=None):
    """{name: row}: the student's process in root, then the judge's in `handout` (default
    root), with the grader of the folder `grader`; `user`: who runs the student's process
    (None: this process's user). files: {exercise: the files it is written in}."""
    records = student_side(root, grader, names, files, user)
    return judge_side(handout or root, grader, names, records)


def student_side(root: Path, grader: Path, names, files: dict, user: str | None) -> dict:
    """{name: its records} from the student's process (grader/harness.py --student) run in
    root, again for the exercises left when one stops it."""
    records, left, end = {}, list(names), time.monotonic() + DEADLINE
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / "grader"  # the checks without the TA's references
        shutil.copytree(grader, code, ignore=shutil.ignore_patterns(*ANSWERS, "__pycache__"))
        os.chmod(tmp, 0o755)  # readable by the unprivileged user
        while left and time.monotonic() < end:
            written = Path(tmp) / "records.jsonl"
            with open(written, "w+") as out:
                why = run_student(root, code, left, files, out.fileno(), user, end)
            done = read_records(written.read_text(), left, records, why)
            left = [n for n in left if n not in done]
    for name in left:  # past the deadline: charged, and results.json is still written
        records[name] = [{"raised": {"result": "error", "detail": LATE}}]
    return records


def run_student(root: Path, code: Path, names, files: dict, fd: int, user, end: float) -> str:
    """One student's process over `names`, its records written to fd, waited on until `end`
    (time.monotonic()) at most; then every process it left (its group; where `user` is
    given, every process of that user) is stopped. Its stderr goes to a file, so a process
    it left holding that file keeps nothing waiting. Returns why it ended, in a few words."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(code), str(root)])}
    env |= {"HOME": tempfile.gettempdir()} if user else {}  # the grader's home is not its
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, str(code / HARNESS), "--student", *names],
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,  # nothing it prints counts
            stderr=err,
            text=True,
            pass_fds=(fd,),
            start_new_session=True,  # its group: what it starts is stopped with it
            user=user,
            group=user,
            extra_groups=[] if user else None,
        )
        limit = max(1.0, min(SECONDS * len(names) + 60, end - time.monotonic()))
        try:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(f"{fd}\n{json.dumps(files)}\n")
                proc.stdin.close()
            proc.wait(limit)
            err.seek(max(0, os.fstat(err.fileno()).st_size - 4000))  # a flood's tail only
            last = (err.read().strip().splitlines() or [""])[-1]  # a traceback's last line
            why = last if RAISED.match(last) else f"exit code {proc.returncode}"
        except subprocess.TimeoutExpired:
            why = "timed out"
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            stop_leftovers(user)
            proc.kill()
            proc.wait()
    return why


def stop_leftovers(user: str | None) -> None:
    """Stop every process of `user`, one that left the student's process's group too
    (without a user, only that group is known: on a student's own machine, where the
    grade is the student's own)."""
    if user is None:
        return
    import pwd

    uid = pwd.getpwnam(user).pw_uid
    for _ in range(20):  # a process may fork while the others are stopped
        found = [p for p in Path("/proc").iterdir() if p.name.isdigit() and owner(p) == uid]
        for p in found:
            try:
                os.kill(int(p.name), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not found:
            return


def owner(proc: Path) -> int | None:
    """The real uid of /proc/PID, or None once it is gone."""
    try:
        return int(proc.joinpath("status").read_text().split("\nUid:")[1].split()[0])
    except (OSError, IndexError):
        return None


def read_records(text: str, names: list[str], records: dict, why: str) -> set[str]:
    """The exercises of `names` the student's process finished, their records added to
    `records`; the one it was in when it stopped is charged with `why`. A line it did not
    write as JSON for one of these exercises is skipped; an exercise whose records were
    begun twice (another exercise's code wrote into them) is an error."""
    done, current, begun = set(), None, set()
    for line in text.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if not isinstance(r, dict) or r.get("name") not in names:
            continue
        name = r.pop("name")
        if r.get("start") is True:
            records[name], current = [], name
            if name in begun:
                records[name] = [{"raised": {"result": "error", "detail": TWICE}}]
                current = None  # what follows is not its own
            begun.add(name)
        elif r.get("end") is True:
            done.add(name)
            current = None if current == name else current
        elif set(r) in ({"value"}, {"raised"}) and name == current:
            records[name].append(r)
    if current is None:  # it stopped before its first check, or between two
        current = next((n for n in names if n not in done), None)
    if current is not None and current not in done:
        stopped = {"result": "error", "detail": f"stopped: {why}"}
        records.setdefault(current, []).append({"raised": stopped})
        done.add(current)
    return done


TWICE = "its records were begun twice: code of another exercise wrote into them"


def judge_side(handout: Path, grader: Path, names, records: dict) -> dict:
    """{name: row} from the judge's process (grader/harness.py --judge) run in the handout,
    on the student's records."""
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        token, results = secrets.token_hex(16), Path(tmp) / "results.jsonl"
        handed = Path(tmp) / "records.json"
        handed.write_text(json.dumps(records))
        env = os.environ | {"PYTHONPATH": os.pathsep.join([str(grader), str(handout)])}
        try:
            done = subprocess.run(
                [sys.executable, str(grader / HARNESS), "--judge", *names],
                cwd=handout,
                env=env,
                input=f"{token} {results}\n{handed}\n",
                capture_output=True,
                text=True,
                timeout=SECONDS * len(names) + 60,
            )
            why = (done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"])[0]
        except subprocess.TimeoutExpired:
            why = "timed out"
        lines = results.read_text().splitlines() if results.exists() else []
    for row in map(json.loads, lines):
        if row.pop("token", None) == token:
            rows[row["name"]] = row
    for name in names:
        rows.setdefault(name, {"name": name, "result": "grader", "detail": f"judge: {why}"})
    return rows
