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
prints counts; a check that kills its process fails alone and the others still run.
"""

import argparse
import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from grader import gradescope, leaderboard, processes
from grader.assignment import COURSE, HANDOUTS, assignment_page
from grader.scorecard import CHECKS, check_docs, score, scorecard_total, shown

HERE = Path(__file__).resolve().parent
GRADER = Path("grader")
ANSWERS = (GRADER / "references.py", GRADER / "mtdnn_smart.py")  # the TA's: definitions
ASSIGNED = "exercises-assigned.txt"  # in a student's copy: the exercises make opened
BEGIN = re.compile(r"^(\s*)# BEGIN EXERCISE (\w+): (.+)$")
END = re.compile(r"^\s*# END EXERCISE (\w+)\s*$")
NOT_COPIED = {".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".ruff_cache"}
TA_ONLY = ("tests", "docs/scripts", "docs/archive", "docs/teaching.md", ".ci", *map(str, ANSWERS))
# in tests/, what a student's copy keeps: sanity_check.py's expected outputs, its own tests
STUDENTS_TESTS = ("tests/reference/", "tests/test_assignment.py")


@dataclass(frozen=True)
class Region:
    """One marked body: lines begin + 1 .. end - 1 of `file` (0-based line numbers)."""

    name: str
    hint: str
    file: str
    begin: int
    end: int
    indent: str


def regions_of(path: Path, root: Path) -> list[Region]:
    """The marked bodies of one file; a marker without its pair stops with file:line."""
    found, open_ = [], None
    for i, line in enumerate(path.read_text(errors="replace").splitlines()):
        where = f"{path.relative_to(root)}:{i + 1}"
        if m := BEGIN.match(line):
            if open_:
                raise SystemExit(f"{where}: BEGIN EXERCISE {m[2]} inside exercise {open_[1]}")
            open_ = (i, m[2], m[3].strip(), m[1])
        elif m := END.match(line):
            if not open_ or m[1] != open_[1]:
                raise SystemExit(f"{where}: END EXERCISE {m[1]} without its BEGIN")
            begin, name, hint, indent = open_
            found.append(Region(name, hint, str(path.relative_to(root)), begin, i, indent))
            open_ = None
    if open_:
        raise SystemExit(f"{path.relative_to(root)}:{open_[0] + 1}: exercise {open_[1]} never ends")
    return found


def exercises(root: Path) -> dict[str, list[Region]]:
    """{name: its marked bodies} over the repository's modules, in file order."""
    out = {}
    for path in sorted(root.glob("*.py")):
        if path.name != Path(__file__).name:  # this docstring shows the markers
            for region in regions_of(path, root):
                out.setdefault(region.name, []).append(region)
    return out


def in_order(root: Path, grader: Path) -> dict[str, list[Region]]:
    """exercises(root) in the checks' order: the handout's BERT first."""
    found, docs = exercises(root), list(check_docs(grader))
    key = lambda n: (n not in docs, docs.index(n) if n in docs else 0)  # noqa: E731
    return {n: found[n] for n in sorted(found, key=key)}


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


def repository_files(src: Path) -> list[Path]:
    """The repository's files: git's list when it is a clone, else all but the ignored."""
    if (src / ".git").exists():
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=src,
            capture_output=True,
            check=True,
        ).stdout.decode()
        return [src / f for f in listed.split("\0") if f and (src / f).is_file()]
    return [
        p
        for p in src.rglob("*")
        if p.is_file()
        and not NOT_COPIED & set(p.relative_to(src).parts)
        and not (p.parts[len(src.parts)] == "data" and p.name != "README.md")
    ]


def copy_files(src: Path, dst: Path, keep) -> None:
    """The repository's files whose relative path `keep` accepts, into dst."""
    for f in repository_files(src):
        rel = f.relative_to(src)
        if keep(rel.as_posix()):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst / rel)


def for_students(rel: str) -> bool:
    """Whether a file goes into a student's copy: not the TA's (tests, scripts, answers,
    the TA's page), but sanity_check.py's expected outputs and the copy's own tests."""
    if rel.startswith(STUDENTS_TESTS):
        return True
    return not any(rel == t or rel.startswith(t + "/") for t in TA_ONLY)


def open_exercises(root: Path, regions: list[Region]) -> None:
    """Replace each region's body in root by a NotImplementedError that names it."""
    for file in sorted({r.file for r in regions}):
        lines = (root / file).read_text().splitlines(keepends=True)
        for r in sorted((r for r in regions if r.file == file), key=lambda r: -r.begin):
            message = json.dumps(f"exercise {r.name}: {r.hint}", ensure_ascii=False)
            lines[r.begin + 1 : r.end] = [f"{r.indent}raise NotImplementedError({message})\n"]
        (root / file).write_text("".join(lines))


def enclosing(path: Path, line: int) -> str:
    """The handout's name of the code holding a 0-based line: Class.method or function;
    a private method by the public one that calls it (`AdamW.step` for _loop_update)."""
    tree = ast.parse(path.read_text())
    inner = sorted(
        (
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.ClassDef)
            and n.lineno <= line + 1 <= n.end_lineno
        ),
        key=lambda n: n.lineno,
    )
    if len(inner) >= 2 and isinstance(inner[-2], ast.ClassDef) and inner[-1].name.startswith("_"):
        callers = [
            m.name
            for m in inner[-2].body
            if isinstance(m, ast.FunctionDef)
            and not m.name.startswith("_")
            and any(getattr(c, "attr", "") == inner[-1].name for c in ast.walk(m))
        ]
        if callers:
            return f"{inner[-2].name}.{callers[0]} ({inner[-1].name})"
    return ".".join(n.name for n in inner) or path.stem


def assignment_rows(chosen: list[str]) -> tuple[list[str], list[str], int, int]:
    """ASSIGNMENT.md's table rows of the open exercises in the grader's order, the course's
    and the project's apart, with their points; each names its place by the handout's names."""
    docs, found = check_docs(HERE), in_order(HERE, HERE)
    course, project, points = [], [], {True: 0, False: 0}
    for name in (n for n in found if n in chosen):
        regions = found[name]
        files = {r.file: [] for r in regions}
        for r in regions:
            files[r.file].append(f"`{enclosing(HERE / r.file, r.begin)}`")
        where = "; ".join(f"{f}: {', '.join(dict.fromkeys(fs))}" for f, fs in files.items())
        hints = "; ".join(dict.fromkeys(r.hint for r in regions))
        rows = course if name in COURSE else project
        rows.append(f"| {len(rows) + 1} | `{name}` | {docs[name].points} | {where} | {hints} |")
        points[name in COURSE] += docs[name].points
    return course, project, points[True], points[False]


def assignment(chosen: list[str], year: str) -> str:
    """ASSIGNMENT.md of a student's copy (grader/assignment.py writes it): its rows, and the
    files the open exercises are written in."""
    files = sorted({r.file for n in chosen for r in exercises(HERE)[n]})
    return assignment_page(*assignment_rows(chosen), year, files)


HONOR = "**If you take CS224n"  # the README's paragraph for readers of the solution


TA_SECTION = "## Teach with it"  # the README's section for TAs: not in a student's copy
TEST_LINE = "make test   # set-up, then the whole test suite, as CI runs it"  # the repository's


def point_readme(readme: Path, n: int) -> None:
    """The copy's README says first that it is the assignment, in place of the paragraph
    that sends a reader of the solution to a copy; its section for TAs is left out."""
    text = readme.read_text()
    if (at := text.find(TA_SECTION)) >= 0:
        after = text.find("\n## ", at + len(TA_SECTION))
        text = text[:at] + (text[after + 1 :] if after >= 0 else "")
    text = text.replace(
        TEST_LINE, "make test   # this copy's tests: each assigned exercise, skipped while open"
    )
    start = text.find(HONOR)
    end = text.find("\n\n", start) if start >= 0 else -1
    ours = f"**This copy is your assignment: {n} exercise(s) open. Start with [ASSIGNMENT.md](ASSIGNMENT.md).**"
    if start < 0 or end < 0:
        raise SystemExit(f"{readme}: no paragraph starting {HONOR!r} to replace")
    readme.write_text(text[:start] + ours + text[end:])


LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")  # a Markdown link: [text](target)


def unlink_removed(root: Path) -> None:
    """In the copy's Markdown pages, a link into what the copy leaves out (docs/archive/,
    the tests, the TA's page) keeps its text and loses its target, and a table's row that
    lists such a page goes: no page points at a missing file."""

    def kept(page: Path, m: re.Match) -> str:
        target = m[2].split("#")[0]
        if not target or "://" in target or (page.parent / target).exists():
            return m[0]
        return m[1]

    def row(page: Path, line: str) -> bool:  # a table's row about a page the copy lacks
        first = LINK.match(line.removeprefix("| "))
        return not (line.startswith("| [") and first and kept(page, first) != first[0])

    for page in root.rglob("*.md"):
        text = page.read_text()
        lines = [line for line in text.split("\n") if row(page, line)]
        fixed = LINK.sub(lambda m, page=page: kept(page, m), "\n".join(lines))
        if fixed != text:
            page.write_text(fixed)


def new_folder(out: Path) -> Path:
    out = out.resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SystemExit(f"{out}: not empty; make writes a new folder")
    if out == HERE or HERE in out.parents:
        raise SystemExit(f"{out}: inside this repository; make it beside the repository")
    return out


def make(
    out: Path,
    names: list[str],
    ta: Path | None = None,
    quiet: bool = False,
    year: str = "2023",
    every: bool = False,
) -> list[str]:
    """A student's copy in out of the `year` handout, with `names` open (default: the
    course's, COURSE; every: all of them), and the TA's grader in ta; returns the exercises
    opened; quiet: say nothing (a copy in a temporary folder)."""
    if year not in HANDOUTS:
        raise SystemExit(
            f"--handout {year}: the handouts this project follows are {', '.join(HANDOUTS)}"
        )
    found = exercises(HERE)
    unknown = sorted(set(names) - set(found))
    if unknown:
        raise SystemExit(f"no exercise {', '.join(unknown)}; `python exercises.py list` names them")
    if names and every:
        raise SystemExit("--all opens every exercise; name exercises or give --all, not both")
    out, ta = new_folder(out), ta and new_folder(ta)
    if ta == out:
        raise SystemExit(f"{ta}: the TA's grader goes in a folder of its own, not the copy")
    copy_files(HERE, out, for_students)
    ordered = in_order(HERE, HERE)
    chosen = names or [n for n in ordered if every or n in COURSE]
    open_exercises(out, [r for name in chosen for r in found[name]])
    (out / ASSIGNED).write_text("".join(f"{name}\n" for name in chosen))  # what check grades
    (out / "ASSIGNMENT.md").write_text(assignment(chosen, year))
    point_readme(out / "README.md", len(chosen))
    unlink_removed(out)
    if ta:
        copy_files(HERE, ta, lambda rel: rel.startswith(f"{GRADER}/"))
    if quiet:
        return chosen
    print(f"{out}: a student's copy with {len(chosen)} exercise(s) open: {', '.join(chosen)}")
    if ta:
        print(f"{ta}: the TA's grader (keep it): python exercises.py check --grader {ta}")
    print(f"grade it: cd {out} && python exercises.py check")
    return chosen


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
    results: Path | None = None,
    graded: str = "",
    markers: Path | None = None,
    user: str | None = None,
    verbose: bool = False,
):
    """Grade the exercises in root with ta's grader (default: root's); print the scorecard
    (verbose: every failing part that needs no TA's reference) and the exercise to write next;
    return how many did not pass (provisional ones pass here). results: also write
    Gradescope's results.json there, `graded` (which files) at the top of its output.
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
        gradescope.write_results(
            results, [(n, rows[n], scores[n]) for n in names], graded, time.monotonic() - started
        )
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
    if out.suffix != ".zip":
        raise SystemExit(f"{out}: an autograder is a .zip file")
    if ta and not (ta / ANSWERS[0]).is_file():
        raise SystemExit(f"{ta}: no {ANSWERS[0]}; --grader is the TA's folder from make --grader")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"
        if copy:
            if not (copy / ASSIGNED).is_file():
                raise SystemExit(
                    f"{copy}: no {ASSIGNED}; --copy is a folder exercises.py make wrote"
                )
            shutil.copytree(copy, source / "handout", ignore=shutil.ignore_patterns(*NOT_COPIED))
        else:
            make(source / "handout", names, quiet=True)
        chosen = (source / "handout" / ASSIGNED).read_text().split()
        if names and names != chosen:
            raise SystemExit(f"{copy}: its exercises are {' '.join(chosen)}, not {' '.join(names)}")
        if missing := [n for n in chosen if n not in check_docs(ta or HERE)]:
            raise SystemExit(f"{ta or HERE}: no check for {', '.join(missing)}")
        copy_files(ta or HERE, source / "ta", lambda rel: rel.startswith(f"{GRADER}/"))
        found = exercises(source / "handout")
        files = sorted({r.file for name in chosen for r in found[name]})
        (source / "files.txt").write_text("".join(f + "\n" for f in files))
        (source / "names.txt").write_text(" ".join(chosen) + "\n")
        gradescope.archive(out, source)
    print(
        f"{out}: Gradescope's autograder for {', '.join(chosen)}; students submit {', '.join(files)}"
    )
    print(
        f"its settings: base image {gradescope.BASE_IMAGE}; setup.sh installs Python {gradescope.PYTHON}"
    )


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
    grade.add_argument("--grader", type=Path, help="the TA's grader folder (default: the copy's)")
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
        return leaderboard.build(args.out, args.gold)
    if args.command == "gradescope":
        gradescope.run(args.root, check)
        return 0
    return check(args.dir.resolve(), args.names, args.grader, args.results, verbose=args.verbose)


if __name__ == "__main__":  # no project module is imported: a broken exercise stops no command
    try:
        sys.exit(1 if main() else 0)
    except BrokenPipeError:  # the reader stopped early (| head): quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
