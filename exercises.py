"""Teach with it: a handout made from this code, its exercises graded one by one.

    python exercises.py list                      each exercise, where it is, what grades it
    python exercises.py make DIR [NAME ...]       a copy of the repository, exercises open
    python exercises.py check [NAME ...] [--dir DIR]   grade them, print a scorecard

A solution body is marked in the source by two comment lines: above it
`# BEGIN EXERCISE <name>: <hint>`, below it `# END EXERCISE <name>` (an exercise may mark
several bodies). `make` copies the repository (its git files, or everything but .git,
.venv, runs and the data) and writes each marked body of every exercise, or of those
named, as `raise NotImplementedError("exercise <name>: <hint>")`. The markers stay: the
student writes between them, and `list` and `check` find them again in the handout.
Everything else is untouched and runs (the tokenizer's CLI while attention is open).

`check` runs tests/exercise_checks.py in one process of its own in DIR (default: this
folder): each exercise's check compares its piece with the project's references
(Hugging Face's BERT and tokenizer, torch's AdamW, sklearn, scipy, naive loops) and
prints pass, fail with the largest difference, or open. An open or broken exercise fails
alone: the others are still graded.
"""

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKS = Path("tests") / "exercise_checks.py"
BEGIN = re.compile(r"^(\s*)# BEGIN EXERCISE (\w+): (.+)$")
END = re.compile(r"^\s*# END EXERCISE (\w+)\s*$")
NOT_COPIED = {".git", ".venv", "runs", "__pycache__", ".pytest_cache", ".ruff_cache"}
SECONDS = 60  # one check's time limit (tests/exercise_checks.py stops a longer one)


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


def check_docs(root: Path) -> dict[str, str]:
    """{exercise: the first line of its check's docstring}, read without importing."""
    tree = ast.parse((root / CHECKS).read_text())
    return {
        f.name: " ".join((ast.get_docstring(f) or "").split("\n\n")[0].split())
        for f in tree.body
        if isinstance(f, ast.FunctionDef) and any(is_check(d) for d in f.decorator_list)
    }


def is_check(decorator: ast.expr) -> bool:
    """Whether a decorator is exercise_checks' @check(tolerance)."""
    return isinstance(decorator, ast.Call) and getattr(decorator.func, "id", "") == "check"


def in_order(root: Path) -> dict[str, list[Region]]:
    """exercises(root) in the checks' order: the handout's BERT first."""
    found, docs = exercises(root), list(check_docs(root))
    return {
        n: found[n]
        for n in sorted(found, key=lambda n: (n not in docs, docs.index(n) if n in docs else 0))
    }


def list_exercises(root: Path) -> None:
    """Each exercise: where its bodies are, and what grades it."""
    docs, found = check_docs(root), in_order(root)
    for name in found:
        where = ", ".join(f"{r.file}:{r.begin + 1}" for r in found[name])
        print(f"{name:17s} {where}\n{'':17s} {docs.get(name, 'NO CHECK in ' + str(CHECKS))}")


def copy_repository(src: Path, dst: Path) -> None:
    """The repository's files (git's list when it is a clone) into the new folder dst."""
    if (src / ".git").exists():
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=src,
            capture_output=True,
            check=True,
        ).stdout.decode()
        files = [src / f for f in listed.split("\0") if f]
    else:
        files = [
            p
            for p in src.rglob("*")
            if p.is_file()
            and not NOT_COPIED & set(p.relative_to(src).parts)
            and not (p.parts[len(src.parts)] == "data" and p.name != "README.md")
        ]
    for f in files:
        if f.is_file():  # a file git lists may have been deleted since
            (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst / f.relative_to(src))


def open_exercises(root: Path, regions: list[Region]) -> None:
    """Replace each region's body in root by a NotImplementedError that names it."""
    for file in sorted({r.file for r in regions}):
        lines = (root / file).read_text().splitlines(keepends=True)
        for r in sorted((r for r in regions if r.file == file), key=lambda r: -r.begin):
            message = json.dumps(f"exercise {r.name}: {r.hint}", ensure_ascii=False)
            lines[r.begin + 1 : r.end] = [f"{r.indent}raise NotImplementedError({message})\n"]
        (root / file).write_text("".join(lines))


def make(out: Path, names: list[str]) -> None:
    found = exercises(HERE)
    unknown = sorted(set(names) - set(found))
    if unknown:
        raise SystemExit(f"no exercise {', '.join(unknown)}; `python exercises.py list` names them")
    out = out.resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SystemExit(f"{out}: not empty; make writes a new folder")
    if out == HERE or HERE in out.parents:
        raise SystemExit(f"{out}: inside this repository; make the handout beside it")
    copy_repository(HERE, out)
    chosen = names or list(found)
    open_exercises(out, [r for name in chosen for r in found[name]])
    print(f"{out}: a handout with {len(chosen)} exercise(s) open: {', '.join(chosen)}")
    print(f"grade it: cd {out} && python exercises.py check")


def check(root: Path, names: list[str]) -> int:
    """Grade the exercises in root; print the scorecard; return how many did not pass."""
    if not (root / CHECKS).is_file():
        raise SystemExit(f"{root}: no {CHECKS}; is it this repository or a handout of it?")
    found = in_order(root)
    unknown = sorted(set(names) - set(found))
    if unknown:
        raise SystemExit(f"no exercise {', '.join(unknown)} in {root}")
    names = names or list(found)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(root), str(root / "tests")])}
    try:
        done = subprocess.run(
            [sys.executable, str(root / CHECKS), *names],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=SECONDS * len(names) + 60,
        )
        out, err = done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:  # each check has its own alarm; this is the net
        out, err = (x.decode() if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr))
    rows = {r["name"]: r for r in map(result, out.splitlines()) if r}
    if set(names) - set(rows) and err.strip():  # the checks' process itself broke
        print(f"the checks stopped: {err.strip().splitlines()[-1]}")
    print(f"{'exercise':17s} {'file':24s} {'result':6s} {'max diff':>9s} {'tolerance':>9s}")
    for name in names:
        r = rows.get(name, {"result": "error", "detail": "its check never reported"})
        diff = "" if r.get("diff") is None else f"{r['diff']:.2e}"
        tol = "" if r.get("tol") is None else f"{r['tol']:.0e}"
        file = found[name][0].file
        print(f"{name:17s} {file:24s} {r['result']:6s} {diff:>9s} {tol:>9s}  {r.get('detail', '')}")
    passed = sum(rows.get(n, {}).get("result") == "pass" for n in names)
    print(f"\n{passed}/{len(names)} exercises pass")
    return len(names) - passed


def result(line: str) -> dict | None:
    """A check's JSON line; None for anything else (a student's own print)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) and "name" in row and "result" in row else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="each exercise: name, where, what checks it")
    handout = commands.add_parser("make", help="write a handout: a copy with exercises open")
    handout.add_argument("dir", type=Path, help="a new folder, outside this repository")
    handout.add_argument("names", nargs="*", help="the exercises to open (default: all)")
    grade = commands.add_parser("check", help="grade the exercises, print a scorecard")
    grade.add_argument("names", nargs="*", help="the exercises to grade (default: all)")
    grade.add_argument("--dir", type=Path, default=HERE, help="the handout (default: here)")
    args = parser.parse_args(argv)
    if args.command == "list":
        return list_exercises(HERE)
    if args.command == "make":
        return make(args.dir, args.names)
    return check(args.dir.resolve(), args.names)


if __name__ == "__main__":  # no project module is imported: a broken exercise stops no command
    try:
        sys.exit(1 if main() else 0)
    except BrokenPipeError:  # the reader stopped early (| head): quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
