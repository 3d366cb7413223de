"""The two processes a grade runs in (exercises.py check starts them; grader/sides.py is
their entry, grader/harness.py what runs inside):

- the student's: in the copy (the submission), with the grader's checks but not the TA's
  references; each exercise's check runs in a fork of it (`forked`), which runs the
  student's code on the checks' inputs and hands back what that code returns, its address
  space and what it hands back bounded (FORK_MB, RECORDS_MB); the process writes it down,
  to a file it was handed open. It holds no reference, no token and no result file. Where the
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
import fcntl
import json
import os
import re
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

# one check's time limit: grader/harness.py stops a longer one (a TA may set it)
SECONDS = int(os.environ.get("MINBERT_CHECK_SECONDS", "60"))
# the memory a grade may take, in MB, where a TA sets it (lab/grade_bench.py sets
# Gradescope's 768): below BOTH_MB the judge's process starts once the student's has ended,
# as it does wherever the student's code runs as another user (Gradescope)
GRADE_MB = float(os.environ.get("MINBERT_GRADE_MB", "inf"))
BOTH_MB = 1536  # the two processes at once: 830 MB at their peak, 960 flooded (grade_bench)
DEADLINE = 540  # a whole grade, in seconds: below Gradescope's default of 10 minutes
JUDGING = 120  # of DEADLINE, kept for the judge's side: the student's stops at 420 s
RECORDS_MB = 24  # what one exercise's code may hand back, as JSON (the layer's: 12 MB)
FILE_MB = 64  # the largest file one exercise's fork may write (its stderr's included)
PROCESSES = 256  # processes and threads the student's process may add to its user's
FORK_MB = 256  # address space one exercise's fork may add to the student's process (the
# layer's: 96 MB, with LEAN's settings)
LATE = "timed out: the grade's deadline passed before this exercise ran"
# The grader's modules the student's side and a student's copy hold: named, never "all but
# the answers", so a file not named here (a backup, a new module of references) stays with
# the TA; grader/references.py and mtdnn_smart.py are the TA's answers.
STUDENT_SIDE = tuple(
    f"{m}.py"
    for m in "ascent assignment checks definitions extensions gradescope handed harness "
    "leaderboard libraries markers multitask_checks out_of_reach points processes scorecard "
    "setups sides student_copy tiny_bert".split()
)
SIDES = "sides.py"  # the entry of both processes
# the student's process: no address space reserved for threads it does not need (FORK_MB),
# no user site (a usercustomize.py left by an earlier grade's code)
LEAN = {"MALLOC_ARENA_MAX": "2", "TOKENIZERS_PARALLELISM": "false", "PYTHONNOUSERSITE": "1"}
LOCK = Path(tempfile.gettempdir()) / "minbert-grader.lock"  # alone()'s
RAISED = re.compile(r"^[\w.]*(Error|Exception|Interrupt|Exit)\b")


def grade(root: Path, grader: Path, names: list[str], files: dict, handout=None, user=None):
    """{name: row}: the student's process in root, and the judge's in `handout` (default
    root), with the grader of the folder `grader`; `user`: who runs the student's process
    (None: this process's user). files: {exercise: the files it is written in}. It ends
    within DEADLINE, a row for every exercise."""
    end = time.monotonic() + DEADLINE
    with (
        tempfile.TemporaryDirectory() as held,  # each exercise's records, a file each
        judge_side(handout or root, grader, names, Path(held), end, at_once(user)) as verdicts,
    ):
        student_side(root, grader, names, files, user, Path(held), end - JUDGING)
        return verdicts()


def student_side(root: Path, grader: Path, names, files: dict, user, out: Path, end: float):
    """Each exercise's records from the student's process (grader/sides.py --student) run
    in root, again for the exercises left when one stops it, in out/NAME.json; those not
    reached by `end` (time.monotonic()) are charged."""
    left = list(names)
    with tempfile.TemporaryDirectory() as tmp, alone(user, end) as turn:
        code = Path(tmp) / "grader"  # the checks without the TA's references
        code.mkdir()
        for name in STUDENT_SIDE:
            if (grader / name).is_file():
                shutil.copy2(grader / name, code / name)
        os.chmod(tmp, 0o755)  # readable by the unprivileged user
        while turn and left and time.monotonic() < end:
            written = Path(tmp) / "records.jsonl"
            with open(written, "w+") as out_file:
                why = run_student(root, code, left, files, out_file.fileno(), user, end)
            with open(written) as lines:
                done = read_records(lines, left, out, why)
            left = [n for n in left if n not in done]
    for name in left:  # past the deadline: charged, and results.json is still written
        save(out, name, [{"raised": {"result": "error", "detail": LATE}}])


@contextlib.contextmanager
def alone(user: str | None, end: float):
    """Where the student's code runs as `user`, one grade's student side at a time on this
    machine, as each ends by stopping every process of that user (stop_leftovers): whether
    this grade's turn came before `end`."""
    if user is None:
        yield True
        return
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o600)  # not the student's to open
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > end:
                    yield False
                    return
                time.sleep(0.1)
        yield True
    finally:
        os.close(fd)


def save(out: Path, name: str, records: list) -> None:
    out.joinpath(f"{name}.json").write_text(json.dumps(records))


def records_of(out: Path, name: str) -> list:
    """What student_side wrote down for one exercise ([]: nothing)."""
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else []


def run_student(root: Path, code: Path, names, files: dict, fd: int, user, end: float) -> str:
    """One student's process over `names`, its records written to fd, waited on until `end`
    (time.monotonic()) at most; then every process it left (its group; where `user` is
    given, every process of that user) is stopped. Its stderr goes to a file, so a process
    it left holding that file keeps nothing waiting. Returns why it ended, in a few words."""
    env = os.environ | LEAN | {"PYTHONPATH": os.pathsep.join([str(code), str(root)])}
    env |= {"HOME": str(code.parent)}  # a home of its own per grade, not its to write
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, str(code / SIDES), "--student", *names],
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
            why = waited(proc, limit)
        finally:  # everything it left stopped before anything it wrote is read
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            stop_leftovers(user)
            proc.kill()
            proc.wait()
        err.seek(max(0, os.fstat(err.fileno()).st_size - 4000))  # a flood's tail only
        last = (err.read().strip().splitlines() or [""])[-1]  # a traceback's last line
    return last if why.startswith("exit") and RAISED.match(last) else why


def waited(proc: subprocess.Popen, seconds: float) -> str:
    """Why the student's process ended, waited on for `seconds` at most: its exit code,
    stopped (by a signal: it would only wait out the limit) or timed out."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        pid, status = os.waitpid(proc.pid, os.WNOHANG | os.WUNTRACED)
        if pid and os.WIFSTOPPED(status):
            return "stopped by a signal"
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return f"exit code {proc.returncode}"
        time.sleep(0.05)
    return "timed out"


def stop_leftovers(user: str | None) -> None:
    """Stop every process of `user`, one that left the student's process's group too
    (without a user, only that group is known: on a student's own machine, where the
    grade is the student's own)."""
    if user is None:
        return
    import pwd

    uid, until = pwd.getpwnam(user).pw_uid, time.monotonic() + 10
    while time.monotonic() < until:  # a process may fork while the others are stopped
        found = [p for p in Path("/proc").iterdir() if p.name.isdigit() and owner(p) == uid]
        if not found:
            break
        for p in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(p.name), signal.SIGKILL)
        time.sleep(0.02)  # a killed process takes a moment to go
    remove_files_of(uid)


SHARED = ("/dev/shm", tempfile.gettempdir(), "/var/tmp")  # folders any user may write in


def remove_files_of(uid: int) -> None:
    """What the student's user left where any user may write (memory-backed /dev/shm
    among them): removed, so nothing of a grade outlives it."""
    for folder in map(Path, dict.fromkeys(SHARED)):
        entries = []
        with contextlib.suppress(OSError):  # a folder this machine lacks (macOS: /dev/shm)
            entries = list(folder.iterdir())
        for entry in entries:
            with contextlib.suppress(OSError):  # one gone meanwhile: the rest still go
                if entry.lstat().st_uid != uid:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)


def owner(proc: Path) -> int | None:
    """The real uid of /proc/PID, or None once it is gone (a zombie runs nothing)."""
    try:
        status = proc.joinpath("status").read_text()
        return None if "\nState:\tZ" in status else int(status.split("\nUid:")[1].split()[0])
    except (OSError, IndexError):
        return None


def read_records(lines: IO[str], names: list[str], out: Path, why: str) -> set[str]:
    """The exercises of `names` the student's process finished, their records written to
    out (`save`); the one it was in when it stopped is charged with `why`. A line it did not
    write as JSON for one of these exercises is skipped; an exercise whose records were
    begun twice (another exercise's code wrote into them), or run past RECORDS_MB, is an
    error. At most one exercise's records are held at a time."""
    done, current, begun, kept, size = set(), None, set(), [], 0
    while line := lines.readline(LINE):
        if not line.endswith("\n") and len(line) == LINE:  # past any record's size
            while (rest := lines.readline(LINE)) and not rest.endswith("\n"):
                pass
            size += LINE  # charged to the exercise it is in
            continue
        try:
            r = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(r, dict) or r.get("name") not in names:
            continue
        name, size = r.pop("name"), size + len(line)
        if r.get("start") is True:
            current, kept, size = name, [], 0
            if name in begun:
                save(out, name, [{"raised": {"result": "error", "detail": TWICE}}])
                current = None  # what follows is not its own
            begun.add(name)
        elif r.get("end") is True and name == current:
            save(out, name, kept if size <= LINE else [OVER])
            done.add(name)
            current = None
        elif set(r) in ({"value"}, {"raised"}) and name == current:
            kept += [r] * (size <= LINE)
    if current is None:  # it stopped before its first check, or between two
        current, kept = next((n for n in names if n not in done), None), []
    if current is not None and current not in done:
        save(out, current, [*kept, {"raised": {"result": "error", "detail": f"stopped: {why}"}}])
        done.add(current)
    return done


TWICE = "its records were begun twice: code of another exercise wrote into them"
OVER = {"raised": {"result": "error", "detail": f"handed back over {RECORDS_MB} MB"}}
LINE = (RECORDS_MB + 1) << 20  # the longest line read: one exercise's records, framed


def forked(name: str, fd: int, run_student) -> list[dict]:
    """run_student(name) in a fork of this process, its records back through a pipe; the
    fork holds neither `fd` nor anything of the exercises before it, and may add FORK_MB to
    its address space. A fork that exits, is killed, runs past 1.5 SECONDS or hands back
    over RECORDS_MB is charged to the exercise."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the fork: the student's code runs here, and dies with it
        os.close(read), os.close(fd)
        try:
            bounded(resource.RLIMIT_FSIZE, FILE_MB << 20)
            if (now := address_space()) is not None:  # past it, an allocation fails
                bounded(resource.RLIMIT_AS, (now + FORK_MB) << 20)
            with open(write, "w") as pipe:
                pipe.write(json.dumps(run_student(name)))
        finally:
            os._exit(0)
    os.close(write)
    try:
        text, why = drained(read, pid, time.monotonic() + SECONDS * 1.5)  # after its alarm
    finally:
        os.close(read)
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # what the fork's code wrote itself, or nothing
        return [{"raised": {"result": "error", "detail": f"stopped: {why}"}}]


def address_space() -> int | None:
    """This process's address space (VmSize), MB; None where the system does not say
    (no /proc: macOS), where the fork's address space is left unbounded."""
    try:
        return int(Path("/proc/self/status").read_text().split("VmSize:")[1].split()[0]) >> 10
    except (OSError, IndexError):
        return None


def tasks_now() -> int | None:
    """The processes and threads this process's user runs now (RLIMIT_NPROC counts them
    all: a student's desktop holds hundreds); None without /proc."""
    uid, n = os.getuid(), 0
    try:
        for status in Path("/proc").glob("[0-9]*/status"):
            with contextlib.suppress(OSError, IndexError):
                text = status.read_text()
                if int(text.split("\nUid:")[1].split()[0]) == uid:
                    n += int(text.split("\nThreads:")[1].split()[0])
    except OSError:
        return None
    return n or None


def bounded(limit: int, value: int) -> None:
    """A resource limit lowered to `value` for good (soft and hard), where the system allows
    it; left as it is where it does not."""
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(limit, (value, value))


def drained(read: int, pid: int, deadline: float) -> tuple[bytes, str]:
    """(what the fork wrote to the pipe, why it ended: its exit code, or killed at the
    deadline or past RECORDS_MB). It ends when the fork does: a process the fork left
    holding the pipe is not waited on."""
    chunks, size, why = [], 0, "timed out"
    while time.monotonic() < deadline:
        if select.select([read], [], [], 0.05)[0] and (chunk := os.read(read, 1 << 20)):
            chunks.append(chunk)
            size += len(chunk)
            if size > RECORDS_MB << 20:
                chunks, why = [], f"handed back over {RECORDS_MB} MB"
                break
            continue
        ended, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        if ended and os.WIFSTOPPED(status):  # a stopped fork would only wait out the deadline
            break
        if ended:
            while select.select([read], [], [], 0)[0] and (chunk := os.read(read, 1 << 20)):
                chunks.append(chunk)  # the fork is gone: at most a pipe's buffer more
            return b"".join(chunks), f"exit code {os.waitstatus_to_exitcode(status)}"
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return b"".join(chunks), why


def at_once(user: str | None) -> bool:
    """Whether the judge's process starts with the student's (judge_side's `early`)."""
    return user is None and GRADE_MB >= BOTH_MB


@contextlib.contextmanager
def judge_side(handout: Path, grader: Path, names, held: Path, end: float, early: bool):
    """The judge's process (grader/sides.py --judge) run in the handout. Yields verdicts():
    {name: row} judged on the records in `held` once the student's side has written them,
    until `end` at most. early: the process starts now and imports its libraries while the
    student's side runs (a grade 10 s shorter on two cores), where memory allows both
    (at_once). The process is stopped on the way out."""
    with tempfile.TemporaryDirectory() as tmp:
        token, results = secrets.token_hex(16), Path(tmp) / "results.jsonl"
        env = os.environ | {"PYTHONPATH": os.pathsep.join([str(grader), str(handout)])}
        argv = [sys.executable, str(grader / SIDES), "--judge", *names]
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        started = []

        def judge():  # the process, started at the first call
            if not started:
                started.append(subprocess.Popen(argv, cwd=handout, env=env, text=True, **pipes))
            return started[0]

        if early:
            judge()

        def verdicts() -> dict:
            proc = judge()
            try:
                _, err = proc.communicate(
                    f"{token} {results}\n{held}\n", timeout=max(1.0, end - time.monotonic())
                )
                why = (err.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"])[0]
            except subprocess.TimeoutExpired:
                why = "timed out"
            lines = results.read_text().splitlines() if results.exists() else []
            return rows_of(lines, token, names, why)

        try:
            yield verdicts
        finally:
            for proc in started:
                if proc.poll() is None:
                    proc.kill()
                proc.communicate()


def rows_of(lines: list[str], token: str, names, why: str) -> dict:
    """{name: row} of the judge's lines that carry its token; a grader row saying `why`
    for each name it left."""
    rows = {}
    for row in map(json.loads, lines):
        if row.pop("token", None) == token:
            rows[row["name"]] = row
    for name in names:
        rows.setdefault(name, {"name": name, "result": "grader", "detail": f"judge: {why}"})
    return rows
