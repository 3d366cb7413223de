"""The exercises in the source. A solution body is marked by two comment lines: above it
`# BEGIN EXERCISE <name>: <hint>`, below it `# END EXERCISE <name>` (an exercise may mark
several bodies). `exercises` finds them in the top-level modules, `in_order` puts them in
the checks' order, `enclosing` names a body's place by the handout's names."""

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from grader.scorecard import check_docs

BEGIN = re.compile(r"^(\s*)# BEGIN EXERCISE (\w+): (.+)$")
END = re.compile(r"^\s*# END EXERCISE (\w+)\s*$")


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
        if "# BEGIN EXERCISE" not in line and "# END EXERCISE" not in line:
            continue  # most lines: no regex, no file:line
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
        if path.name != "exercises.py":  # its docstring shows the markers
            for region in regions_of(path, root):
                out.setdefault(region.name, []).append(region)
    return out


def in_order(root: Path, grader: Path) -> dict[str, list[Region]]:
    """exercises(root) in the checks' order: the handout's BERT first."""
    found, docs = exercises(root), list(check_docs(grader))
    key = lambda n: (n not in docs, docs.index(n) if n in docs else 0)  # noqa: E731
    return {n: found[n] for n in sorted(found, key=key)}


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
