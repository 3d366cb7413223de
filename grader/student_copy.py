"""A student's copy made from this repository (`python exercises.py make`): its files but
what holds answers (the project's tests, the lab's scripts, the grader's references), every
marked body of the exercises it assigns written as `raise NotImplementedError("exercise
<name>: <hint>")` (the markers stay: the student writes between them), its ASSIGNMENT.md,
its README pointing at it first, no link to a page it lacks; the TA's grader beside it."""

import fnmatch
import json
import re
import shutil
import subprocess
from pathlib import Path

from grader.assignment import COURSE, HANDOUTS, assignment_page
from grader.markers import Region, enclosing, exercises, in_order
from grader.processes import STUDENT_SIDE
from grader.scorecard import check_docs

HERE = Path(__file__).resolve().parents[1]  # the repository a copy is made from
GRADER = Path("grader")
ANSWERS = (GRADER / "references.py", GRADER / "mtdnn_smart.py")  # the TA's: definitions
ASSIGNED = "exercises-assigned.txt"  # in a student's copy: the exercises make opened
# What a student's copy holds, and nothing else: a file is copied only where one of these
# patterns matches its whole path ('*' within one folder), so an archive, an editor's
# backup or any file not named here never reaches a copy, whatever lies in the tree.
FOR_STUDENTS = (
    *("*.py", "*.md", "*.ipynb", "Makefile", ".gitignore", "pyproject.toml", "requirements*.txt"),
    *(
        "engine/*.py",
        "commands/*.py",
        "lab/*.py",
        "docs/*.md",
        "docs/*.png",
        "docs/*.svg",
        "data/README.md",
    ),
    *("tests/reference/*", "tests/test_assignment.py"),  # sanity_check.py's outputs, its tests
    *(f"{GRADER}/{name}" for name in STUDENT_SIDE),
)
TA_PAGES = ("docs/teaching.md",)  # matched above, the TA's page: not in a copy
TA_GRADER = (f"{GRADER}/*.py",)  # the TA's grader folder: the checks and the answers


def matches(rel: str, patterns) -> bool:
    """Whether a relative path matches one of the patterns whole, folder by folder."""
    parts = rel.split("/")
    return any(
        len(p.split("/")) == len(parts) and all(map(fnmatch.fnmatchcase, parts, p.split("/")))
        for p in patterns
    )


def git_files(src: Path, *which: str) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", *which, "-z"], cwd=src, capture_output=True, check=True
    ).stdout.decode()
    return [f for f in listed.split("\0") if f and (src / f).is_file()]


def repository_files(src: Path) -> list[Path]:
    """The files of a folder: git's tracked files where it is a clone (nothing a TA left
    untracked, such as an archive), else every file under it."""
    if (src / ".git").exists():
        return [src / f for f in git_files(src, "--cached")]
    return [p for p in src.rglob("*") if p.is_file() and not p.is_symlink()]


def copy_files(src: Path, dst: Path, patterns) -> None:
    """The files of src whose relative path matches one of `patterns`, into dst; in a
    clone, one line names each such file left out because git does not track it."""
    if (src / ".git").exists():
        others = git_files(src, "--others", "--exclude-standard")
        if untracked := [f for f in others if matches(f, patterns)]:
            print(f"not copied, not tracked by git (git add it): {', '.join(untracked)}")
    for f in repository_files(src):
        rel = f.relative_to(src)
        if matches(rel.as_posix(), patterns) and rel.as_posix() not in TA_PAGES:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst / rel)


def open_exercises(root: Path, regions: list[Region]) -> None:
    """Replace each region's body in root by a NotImplementedError that names it."""
    for file in sorted({r.file for r in regions}):
        lines = (root / file).read_text().splitlines(keepends=True)
        for r in sorted((r for r in regions if r.file == file), key=lambda r: -r.begin):
            message = json.dumps(f"exercise {r.name}: {r.hint}", ensure_ascii=False)
            lines[r.begin + 1 : r.end] = [f"{r.indent}raise NotImplementedError({message})\n"]
        (root / file).write_text("".join(lines))


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
    copy_files(HERE, out, FOR_STUDENTS)
    ordered = in_order(HERE, HERE)
    chosen = names or [n for n in ordered if every or n in COURSE]
    open_exercises(out, [r for name in chosen for r in found[name]])
    (out / ASSIGNED).write_text("".join(f"{name}\n" for name in chosen))  # what check grades
    (out / "ASSIGNMENT.md").write_text(assignment(chosen, year))
    point_readme(out / "README.md", len(chosen))
    unlink_removed(out)
    if ta:
        copy_files(HERE, ta, TA_GRADER)
    if quiet:
        return chosen
    print(f"{out}: a student's copy with {len(chosen)} exercise(s) open: {', '.join(chosen)}")
    if ta:
        print(f"{ta}: the TA's grader (keep it): python exercises.py check --grader {ta}")
    print(f"grade it: cd {out} && python exercises.py check")
    return chosen
