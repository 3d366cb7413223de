"""Teach with it: a handout made from this code, its exercises graded one by one.

    python exercises.py list                          each exercise, its points, what grades it
    python exercises.py make DIR [NAME ...] [--grader TA_DIR]
                                                      a student's copy, exercises open; the
                                                      TA's grader beside it
    python exercises.py check [NAME ...] [--dir DIR] [--grader TA_DIR]
                                                      grade them, print a scorecard
    python exercises.py autograder OUT.zip [--copy DIR] [--grader TA_DIR] [NAME ...]
                                                      Gradescope's autograder of a copy
    python exercises.py leaderboard OUT.zip --gold GOLD_DIR
                                                      Gradescope's leaderboard: test
                                                      predictions against the TA's labels
    python exercises.py gradescope ROOT               what the autograder's run_autograder
                                                      runs, in its handout/ (ROOT: /autograder)

A solution body is marked in the source by two comment lines: above it
`# BEGIN EXERCISE <name>: <hint>`, below it `# END EXERCISE <name>` (an exercise may mark
several bodies; exercises that share their math are one exercise). `make` copies the
repository without what holds answers (the project's tests, the lab's scripts, the grader's
references) and writes each marked body of every exercise, or of those named, as
`raise NotImplementedError("exercise <name>: <hint>")`. The markers stay: the student
writes between them, and `list` and `check` find them again in the copy.

`check` grades in two processes (grader/processes.py), with the grader of TA_DIR (default:
this folder's grader/): the student's code runs in one, in DIR (default: here), holding no
reference, token or result file, and hands back only what it returns; the judge runs in the
other, where no student code runs. In a student's copy the grader has no references.py: the
parts that need it are left to the TA, the rest is graded. Nothing the student's code
prints counts; a check that kills its process fails alone and the others still run. From
a tree that holds the answers (the TA's), `check --dir COPY` grades as Gradescope does:
the copy's files of its exercises over a handout made here, its code as the student's
user (root only; AUTOGRADER_LOCAL=1 for a copy you trust). Archives are written beside
the repository, never in it, and a copy or an archive takes only the files named in
grader/student_copy.py.
"""

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from grader import gradescope, leaderboard, processes
from grader.assignment import HANDOUTS
from grader.markers import enclosing, exercises, in_order
from grader.scorecard import CHECKS, check_docs, score, scorecard_total, shown
from grader.student_copy import (
    ANSWERS,
    ASSIGNED,
    FOR_STUDENTS,
    GRADER,
    TA_GRADER,
    copy_files,
    make,
)

HERE = Path(__file__).resolve().parent


def list_exercises(root: Path) -> None:
    """Each exercise in the order to do them: its points, where its bodies are, what
    grades it, and the exercises it calls (answered by stand-ins while it is graded)."""
    docs, found = check_docs(root), in_order(root, root)
    for k, name in enumerate(found):
        where = ", ".join(f"{r.file}:{r.begin + 1}" for r in found[name])
        c = docs.get(name)
        if c is None:
            print(f"{k + 1:2d}. {name:15s} NO CHECK in {GRADER}  {where}")
            continue
        held = f" ({c.held} the TA's)" if c.held else ""
        print(f"{k + 1:2d}. {name:15s} {c.points} pt{held}  {where}\n{'':19s}{c.doc}")
        if calls := [n for n in c.stands_in if n in found]:
            print(f"{'':19s}calls {', '.join(calls)}; graded alone: stand-ins answer for them")


def run_checks(root: Path, grader: Path, names: list[str], markers: Path | None = None, user=None):
    """{name: result}: the student's code run in root, judged by grader's grader in the
    handout (`markers`, default root) where no student code runs (grader/processes.py);
    `user`: who runs the student's code. Each process is told each exercise's files: one
    that does not compile stops only the exercises written in it."""
    files = {n: sorted({r.file for r in rs}) for n, rs in exercises(markers or root).items()}
    return processes.grade(root, grader / GRADER, names, files, markers, user)


def where_is(root: Path, name: str) -> str:
    """An exercise's places by the handout's names: `bert.py: BertModel.embed`."""
    regions = exercises(root).get(name, [])
    places = dict.fromkeys(f"{r.file}: {enclosing(root / r.file, r.begin)}" for r in regions)
    return ", ".join(places)


def assigned(root: Path, found: dict) -> list[str]:
    """The exercises `make` opened in a student's copy (its ASSIGNED file), in the grader's
    order; every exercise where there is no such file (this repository)."""
    if not (root / ASSIGNED).is_file():
        return list(found)
    chosen = set((root / ASSIGNED).read_text().split())
    names = [name for name in found if name in chosen]
    print(f"the assigned exercises ({ASSIGNED}): {', '.join(names)}")
    return names


def check(
    root: Path,
    names: list[str],
    ta: Path | None = None,
    results: tuple[Path, str] | None = None,
    markers: Path | None = None,
    user: str | None = None,
    verbose: bool = False,
):
    """Grade the exercises in root with ta's grader (default: root's); print the scorecard
    (verbose: every failing part that needs no TA's reference) and the exercise to write next;
    return how many did not pass (provisional ones pass here). results: (where to write
    Gradescope's results.json too, which files were graded: the top of its output).
    markers: the handout, where the exercises' markers are read (a submission may have
    broken its own) and the judge runs; user: who runs the student's code."""
    if importlib.util.find_spec("torch") is None:
        raise SystemExit(
            f"torch is not importable here ({sys.executable}): run `. .venv/bin/activate` "
            "(make venv makes it) or `make check`"
        )
    ta = (ta or root).resolve()
    if not (ta / CHECKS[0]).is_file():
        raise SystemExit(
            f"{ta}: no {CHECKS[0]}; is it this repository, a handout or a TA's grader?"
        )
    found = in_order(markers or root, ta)
    if unknown := sorted(set(names) - set(found)):
        raise SystemExit(f"no exercise {', '.join(unknown)} in {root}")
    names = names or assigned(root, found)
    started, docs = time.monotonic(), check_docs(ta)
    rows = run_checks(root, ta, names, markers, user)
    scores = {n: score(rows[n], docs[n]) for n in names}
    print_scorecard(rows, scores, names, markers or root, verbose, not (ta / ANSWERS[0]).is_file())
    if results:
        path, graded = results
        each = [(n, rows[n], scores[n]) for n in names]
        gradescope.write_results(path, each, graded, time.monotonic() - started)
    return sum(rows[n]["result"] not in ("pass", "provisional", "hidden") for n in names)


def print_scorecard(rows, scores, names, root: Path, verbose: bool, copy: bool) -> None:
    """The scorecard: a row per exercise (verbose: each failing part that needs no TA's
    reference under it), the total, and the exercise to write next with where it is."""
    if copy:
        print(
            "(a student's copy: `+N?` points are the parts only the TA's grader judges: provisional)"
        )
    print(f"{'exercise':16s} {'points':>11s}  {'result':11s}  detail")
    for name in names:
        r = rows[name]
        print(f"{name:16s} {shown(scores[name]):>11s}  {r['result']:11s}  {r.get('detail', '')}")
        for account in r.get("public_failures", [])[1:] if verbose else []:
            print(f"{'':42s}{account}")
    print(scorecard_total(rows, scores, names))
    if todo := [n for n in names if rows[n]["result"] not in ("pass", "provisional", "hidden")]:
        print(
            f"next: {todo[0]} ({where_is(root, todo[0])}); python exercises.py check -v {todo[0]}"
        )


def autograder(out: Path, names: list[str], ta: Path | None, copy: Path | None) -> None:
    """Gradescope's archive (grader/gradescope.py) of a student's copy (`copy`, or one made
    here with `names` open) and the TA's grader (`ta`, or this repository's): it grades the
    copy's assigned exercises, checked against `names` and the grader's checks."""
    outside(out, ".zip", "an autograder")
    if ta and not (ta / ANSWERS[0]).is_file():
        raise SystemExit(f"{ta}: no {ANSWERS[0]}; --grader is the TA's folder from make --grader")
    with tempfile.TemporaryDirectory() as tmp:
        chosen, files = autograder_source(Path(tmp) / "source", names, ta, copy)
        gradescope.archive(out, Path(tmp) / "source")
    print(
        f"{out}: Gradescope's autograder for {', '.join(chosen)}; students submit {', '.join(files)}"
    )
    print(
        f"its settings: base image {gradescope.BASE_IMAGE}; setup.sh installs Python {gradescope.PYTHON}"
    )


def outside(out: Path, suffix: str, what: str) -> None:
    """An archive is written beside the repository, never in it: a TA's commit or a copy
    would carry what it holds."""
    if out.suffix != suffix:
        raise SystemExit(f"{out}: {what} is a {suffix} file")
    if HERE in out.resolve().parents:
        raise SystemExit(f"{out}: inside this repository; write {what} beside it (../{out.name})")


def autograder_source(source: Path, names: list[str], ta: Path | None, copy: Path | None):
    """(the exercises graded, the files students submit): the archive's source/ folder,
    the handout (the copy's allowed files, or a copy made here) and the TA's grader."""
    if copy:
        if not (copy / ASSIGNED).is_file():
            raise SystemExit(f"{copy}: no {ASSIGNED}; --copy is a folder exercises.py make wrote")
        copy_files(copy, source / "handout", (*FOR_STUDENTS, ASSIGNED))
    else:
        make(source / "handout", names, quiet=True)
    chosen = (source / "handout" / ASSIGNED).read_text().split()
    if names and names != chosen:
        raise SystemExit(f"{copy}: its exercises are {' '.join(chosen)}, not {' '.join(names)}")
    if missing := [n for n in chosen if n not in check_docs(ta or HERE)]:
        raise SystemExit(f"{ta or HERE}: no check for {', '.join(missing)}")
    copy_files(ta or HERE, source / "ta", TA_GRADER)
    found = exercises(source / "handout")
    files = sorted({r.file for name in chosen for r in found[name]})
    (source / "files.txt").write_text("".join(f + "\n" for f in files))
    (source / "names.txt").write_text(" ".join(chosen) + "\n")
    return chosen, files


def ta_grade(copy: Path, names: list[str], ta: Path | None, results: Path | None) -> int:
    """The TA's grade of a student's copy, as Gradescope's: a handout made here with the
    same exercises open, the copy's files of them put over it, its code run as
    gradescope.STUDENT and the judge in the handout, the TA's grader closed to that user;
    returns how many exercises did not pass."""
    if (why := gradescope.unsafe()) and os.environ.get(gradescope.LOCAL) != "1":
        raise SystemExit(
            f"{copy}: a TA's grade runs the copy's code as {gradescope.STUDENT}, and this "
            f"runs {why}: run it as root with that user (setup.sh's useradd line), as "
            f"docs/teaching.md's local run of the archive does, or set {gradescope.LOCAL}=1 "
            "for a copy you trust"
        )
    if not names and (copy / ASSIGNED).is_file():
        names = (copy / ASSIGNED).read_text().split()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _, files = autograder_source(root / "source", names, ta, None)
        for name in (f for f in files if (copy / f).is_file()):
            (root / "submission" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(copy / name, root / "submission" / name)
        user = "its own user: a copy you trust" if why else gradescope.STUDENT
        print(f"graded as Gradescope grades it: {', '.join(files)} of {copy} run as {user}")
        failed = gradescope.run(root, check)
        if results:
            shutil.copyfile(root / "results" / "results.json", results)
    return failed


def parser() -> argparse.ArgumentParser:
    """The commands and their flags (the module's docstring is --help's head)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="each exercise: name, points, where, what checks it")
    handout = commands.add_parser("make", help="write a student's copy with exercises open")
    handout.add_argument("dir", type=Path, help="a new folder, outside this repository")
    handout.add_argument(
        "names", nargs="*", help="the exercises to open (default: the handout's TODOs)"
    )
    handout.add_argument("--grader", type=Path, help="a new folder for the TA's grader")
    handout.add_argument(
        "--handout",
        default="2023",
        help=f"the CS224n handout the copy follows: {' or '.join(HANDOUTS)} (default 2023)",
    )
    handout.add_argument("--all", action="store_true", help="open every exercise, the project's")
    grade = commands.add_parser("check", help="grade the exercises, print a scorecard")
    grade.add_argument(
        "names",
        nargs="*",
        help="the exercises to grade (default: those make opened in a student's copy, else all)",
    )
    grade.add_argument("--dir", type=Path, default=HERE, help="the copy (default: here)")
    grade.add_argument(
        "--grader",
        type=Path,
        help="the TA's grader folder (default: this tree's where it holds the answers, else "
        "the copy's)",
    )
    grade.add_argument("--results", type=Path, help="also write Gradescope's results.json here")
    grade.add_argument(
        "-v", "--verbose", action="store_true", help="every failing part, not the first only"
    )
    gradescope_commands(commands)
    return parser


def gradescope_commands(commands) -> None:
    """autograder, gradescope and leaderboard: Gradescope's archives and run."""
    zipped = commands.add_parser("autograder", help="write a Gradescope autograder .zip")
    zipped.add_argument("out", type=Path, help="the .zip to write")
    zipped.add_argument(
        "names", nargs="*", help="the exercises it grades (default: the copy's, else all)"
    )
    zipped.add_argument("--copy", type=Path, help="the student's copy it grades (from make)")
    zipped.add_argument("--grader", type=Path, help="the TA's grader folder (from make --grader)")
    run = commands.add_parser(
        "gradescope", help="grade a submission as the autograder's run_autograder does"
    )
    run.add_argument("root", type=Path, help="the autograder's folder (/autograder)")
    board = commands.add_parser(
        "leaderboard", help="write a Gradescope leaderboard .zip (grader/leaderboard.py)"
    )
    board.add_argument("out", type=Path, help="the .zip to write")
    board.add_argument(
        "--gold",
        type=Path,
        required=True,
        help="the TA's labeled test sets: ids-sst-test.csv, quora-test.csv, sts-test.csv",
    )


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.command == "list":
        return list_exercises(HERE)
    if args.command == "make":
        make(args.dir, args.names, args.grader, year=args.handout, every=args.all)
        return 0
    if args.command == "autograder":
        return autograder(args.out, args.names, args.grader, args.copy)
    if args.command == "leaderboard":
        outside(args.out, ".zip", "a leaderboard")
        return leaderboard.build(args.out, args.gold)
    if args.command == "gradescope":
        gradescope.run(args.root.resolve(), check)
        return 0
    root = args.dir.resolve()
    if is_copy_of_ta(root):
        return ta_grade(root, args.names, args.grader, args.results)
    results = (args.results, "") if args.results else None
    return check(root, args.names, args.grader, results, verbose=args.verbose)


def is_copy_of_ta(root: Path) -> bool:
    """Whether a check grades another folder from a tree that holds the answers (the TA's):
    then ta_grade runs it as Gradescope does, never the copy's code as this user."""
    if not (root / "exercises.py").is_file():
        raise SystemExit(
            f"{root}: no exercises.py; is it this repository, a handout or a TA's grader?"
        )
    return root != HERE and (HERE / ANSWERS[0]).is_file()


if __name__ == "__main__":  # no project module is imported: a broken exercise stops no command
    try:
        sys.exit(1 if main() else 0)
    except BrokenPipeError:  # the reader stopped early (| head): quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
