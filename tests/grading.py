"""What the grader's tests share: a copy's exercise written with a body, a grade of it
with the TA's grader, the autograder archive unpacked and run as Gradescope runs it, and
the student's user where the grader is root."""

import functools
import json
import os
import pwd
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

import exercises
from grader import gradescope, processes

REPO = exercises.HERE


@functools.cache
def ours_regions() -> dict:
    """This checkout's exercises, read once: a test writes copies, never the checkout."""
    return exercises.exercises(REPO)


def write_body(copy: Path, name: str, body: list[str]) -> None:
    """The exercise's last region written with `body`, the others with the solution's."""
    regions = exercises.exercises(copy)[name]
    for i, region in enumerate(regions):
        region = exercises.exercises(copy)[name][i]  # read again: lines moved
        lines = (copy / region.file).read_text().splitlines(keepends=True)
        ours = ours_regions()[name][i]
        solved = (REPO / ours.file).read_text().splitlines(keepends=True)[ours.begin + 1 : ours.end]
        lines[region.begin + 1 : region.end] = body if i == len(regions) - 1 else solved
        (copy / region.file).write_text("".join(lines))


def write_code(copy: Path, name: str, code: str) -> None:
    """write_body with `code`, dedented, indented as the exercise's last region."""
    region = exercises.exercises(copy)[name][-1]
    first = (copy / region.file).read_text().splitlines()[region.begin]
    indent = first[: len(first) - len(first.lstrip())]
    lines = textwrap.dedent(code).strip("\n").splitlines(keepends=False)
    lines = [x + "\n" for x in lines]
    write_body(copy, name, [indent + x if x.strip() else x for x in lines])


def unpacked(archive: Path, root: Path) -> Path:
    """The archive laid out as Gradescope does: its files in root/source, an empty
    submission folder."""
    with zipfile.ZipFile(archive) as z:
        z.extractall(root / "source")
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
    assert modes["run_autograder"] & 0o111 and modes["setup.sh"] & 0o111
    (root / "submission").mkdir()
    return root


def run_autograder(root: Path, python: Path, **env: str) -> dict:
    """run_autograder as Gradescope runs it: as root, where there is the student's user,
    the student's code runs as that user (pytest's folders opened to it), else as this
    user (AUTOGRADER_LOCAL)."""
    for folder in (root.parent, *root.parent.parents):  # pytest's folders: 0700
        os.chmod(folder, folder.stat().st_mode | 0o005)
    base = {"PATH": "/usr/bin:/bin", "HOME": str(root), "AUTOGRADER_ROOT": str(root)}
    base |= {"AUTOGRADER_PYTHON": str(python), gradescope.LOCAL: "1"}
    done = subprocess.run(
        ["bash", str(root / "source" / "run_autograder")],
        env=base | env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((root / "results" / "results.json").read_text())


@functools.cache
def student_user_missing() -> str:
    """Why gradescope.STUDENT cannot run this Python's torch here ('' where it can): it
    needs root, the user (.ci/run makes it) and the folders above the interpreter open.
    Asked once a process: the answer holds for the session."""
    if os.geteuid() != 0:
        return "needs root"
    try:
        pwd.getpwnam(gradescope.STUDENT)
    except KeyError:
        return f"no user {gradescope.STUDENT} (.ci/run makes it)"
    # in the grades' turn: a grade running beside it ends by stopping every process of the user
    with processes.alone(gradescope.STUDENT, time.monotonic() + processes.DEADLINE) as turn:
        if not turn:
            return f"no turn for {gradescope.STUDENT} in {processes.DEADLINE} s"
        try:
            ran = subprocess.run(
                [sys.executable, "-c", "import torch"],
                user=gradescope.STUDENT,
                group=gradescope.STUDENT,
                extra_groups=[],  # as grader/processes.py runs it: none of root's groups
                capture_output=True,
                text=True,
                cwd="/",
            )
        except OSError as e:
            return f"{gradescope.STUDENT} cannot run {sys.executable}: {e}"
    last = (ran.stderr.strip().splitlines() or [""])[-1]
    return f"{gradescope.STUDENT} cannot import torch: {last}" * (ran.returncode != 0)


def as_the_students_user() -> None:
    """Skips where the student's user cannot run this Python; fails instead on CI
    (MINBERT_STUDENT_USER_REQUIRED, .ci/run), where these tests must run."""
    if why := student_user_missing():
        if os.environ.get("MINBERT_STUDENT_USER_REQUIRED"):
            pytest.fail(why)
        pytest.skip(why)


# the TA's folder read and written, the handout's grader written, results.json forged


def leftovers() -> list[Path]:
    """The student's user's processes, read where no grade's student side runs (its lock
    held): a process a grade left."""
    uid = pwd.getpwnam(gradescope.STUDENT).pw_uid
    with processes.alone(gradescope.STUDENT, time.monotonic() + processes.DEADLINE) as turn:
        assert turn, "no grade's student side ended within a grade's deadline"
        return [p for p in Path("/proc").iterdir() if processes.owner(p) == uid]
