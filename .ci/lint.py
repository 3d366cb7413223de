"""The house's budgets, checked by `make lint` on the source itself (ast), not by `make test`:
file and function sizes (tests' too: a test file at most 500 lines), parameters, module
docstrings, formatter escapes, the README's size, the number of modules at the top level
(the lesson; engine/, commands/ and the lab's tools are packages), imports (no cycle, the
grader's and the lab's included; the course never reaches into the lab; torch.distributed
only in the engine; one layer per folder: engine/ below the lesson imports no lesson module
and no command, and no lesson module imports a command but from its script block),
lab/house.py's list of every module and the README's of the lesson's, and how much a
student reads of one plain step (docs/scripts/step_lines.py's strict count). A student's new
module or long function keeps `make test` green; the developers keep this green.

    python .ci/lint.py          # the repository this file sits in
    python .ci/lint.py PATH     # another checkout
"""

import ast
import importlib.util
import sys
from pathlib import Path

# presets.py is the one table of every preset and its settings, lab/bench.py the one bench
# (a section per measurement): each grows a row or a section at a time, within these
LINES = {"presets.py": 640, "lab/bench.py": 620}
LINES_DEFAULT = 650
LESSON_LINES, LESSON_TOTAL = 500, 6_600  # a top-level module, and all of them: the lesson
FUNCTION_LINES, PARAMETERS, FMT_SKIPS, README_BYTES = 50, 8, 10, 12_000
TEST_LINES = 500  # a test file holds one concern, named after what it tests
TOP_LEVEL = 24  # modules at the top level: the lesson; the other layers are packages
# below the lesson; above it (the commands a script runs); the lab's tools
PACKAGES = ("engine", "commands", "lab")
HOUSE = "lab/house.py"  # its HOUSE names every module once: the one list of them
# What a student reads of one plain step, counted strictly by this script (with the fields
# of the dataclasses it reads): at most these many lines, in at most these many files
STEP, STEP_LINES, STEP_FILES = "docs/scripts/step_lines.py", 185, 6


def functions(tree: ast.AST) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def parameters(f: ast.FunctionDef) -> list[str]:
    a = f.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [x.arg for x in (a.vararg, a.kwarg) if x]
    return [n for n in names if n not in ("self", "cls")]


def script_block(node: ast.AST) -> bool:
    """`if __name__ == "__main__":`, whose imports are the script's (a module `__main__` of
    its own), not the module's: `python multitask_classifier.py` imports commands.command,
    which imports multitask_classifier, and no module imports itself."""
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and getattr(test.left, "id", "") == "__name__"
        and getattr(test.comparators[0], "value", "") == "__main__"
    )


def module_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of a module but those of its script block."""
    top = [n for n in getattr(tree, "body", []) if not script_block(n)]
    return [node for n in top for node in ast.walk(n)]


def project_imports(tree: ast.AST, known: set[str]) -> set[str]:
    """The project's modules a module imports: `bert`, or `lab.plots` for `from lab import
    plots`, `from lab.plots import x` and `import lab.plots`."""
    found = set()
    for node in module_nodes(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names} | {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, node.module.split(".")[0]}
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return (found - set(PACKAGES)) & known  # a package's __init__ imports nothing


def module_problems(path: Path, name: str, tree: ast.AST, limit: int = 0) -> list[str]:
    """Size, docstring and every function's length and parameters of one module (limit: its
    lines, else LINES' or LINES_DEFAULT)."""
    out, limit = [], limit or LINES.get(name, LINES_DEFAULT)
    if (n := len(path.read_text().splitlines())) > limit:
        out.append(f"{name}: {n} lines, over its {limit}")
    if not ast.get_docstring(tree):
        out.append(f"{name}: no module docstring naming what it holds")
    for f in functions(tree):
        where = f"{name}:{f.lineno} {f.name}"
        if (n := f.end_lineno - f.lineno + 1) > FUNCTION_LINES:
            out.append(f"{where}: {n} lines, over {FUNCTION_LINES}")
        if (n := len(parameters(f))) > PARAMETERS:
            out.append(f"{where}: {n} parameters, over {PARAMETERS}")
    return out


def direction_problems(trees: dict[str, ast.AST]) -> list[str]:
    """One layer per folder: engine/ sits below the lesson (device, precision, checkpoints,
    the file reader: it imports no lesson module and no command), commands/ above it (no
    lesson module imports a command, but a script calling its own from its `__main__` block,
    which module_nodes leaves out)."""
    lesson = {name for name in trees if "." not in name and name not in PACKAGES}
    commands = {name for name in trees if name.startswith("commands.")}
    out = []
    for name, tree in sorted(trees.items()):
        deps = project_imports(tree, set(trees))
        if name.startswith("engine."):
            out += [
                f"{path(name)} imports {path(dep)}: engine/ sits below the lesson and the "
                "commands; move the piece it needs down, or the file up into commands/"
                for dep in sorted(deps & (lesson | commands))
            ]
        elif name in lesson:
            out += [
                f"{path(name)} imports {path(dep)}: no lesson module imports a command (a "
                'script may call its own from `if __name__ == "__main__":`)'
                for dep in sorted(deps & commands)
            ]
    return out


def distributed_problems(trees: dict[str, ast.AST]) -> list[str]:
    """No module of the lesson (the top level) speaks to other processes itself: the
    engine's runtime does (torch.distributed)."""
    out = []
    for name, tree in sorted(trees.items()):
        if "." in name or name in PACKAGES:
            continue
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if any(n == "torch.distributed" or n.startswith("torch.distributed.") for n in names):
                out.append(
                    f"{path(name)}:{node.lineno} imports torch.distributed: the engine's (engine/runtime.py)"
                )
    return out


def import_problems(trees: dict[str, ast.AST], grader: dict[str, ast.AST]) -> list[str]:
    """The lesson and the engine never import the lab; no module imports itself through
    others (a cycle, named once from its first module), the TA's grader's included (its
    modules import each other by their bare names: grader/ is on their path)."""
    deps = {
        name: project_imports(tree, set(trees) | set(grader)) - {name}
        for name, tree in trees.items()
    }
    stems = {name.removeprefix("grader."): name for name in grader}
    for name, tree in grader.items():  # by bare names (the judge's path) or as grader.X
        found = project_imports(tree, set(trees) | set(stems) | set(grader))
        deps[name] = {stems.get(d, d) for d in found} - {name}
    out = [
        f"{path(name)} imports {dep}: the course never reaches into the lab"
        for name in sorted(deps)
        if not name.startswith("lab")
        for dep in sorted(deps[name])
        if dep.startswith("lab")
    ]
    seen = set()
    for start in sorted(deps):
        cycle = find_cycle(start, deps)
        if cycle and frozenset(cycle) not in seen:
            seen.add(frozenset(cycle))
            out.append("import cycle: " + " -> ".join(path(n) for n in [*cycle, cycle[0]]))
    return out


def find_cycle(start: str, deps: dict[str, set[str]]) -> list[str]:
    """A path of imports from `start` back to itself, or []."""
    stack, seen = [(start, [start])], set()
    while stack:
        name, trail = stack.pop()
        for dep in sorted(deps.get(name, ())):
            if dep == start:
                return trail
            if dep not in seen:
                seen.add(dep)
                stack.append((dep, [*trail, dep]))
    return []


def house_problems(root: Path, names: list[str]) -> list[str]:
    """lab/house.py's HOUSE against the files: each module named once, none that is gone."""
    if not (root / HOUSE).is_file():
        return []
    tree = ast.parse((root / HOUSE).read_text())
    value = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "HOUSE"
    )
    named = [f for _, files in ast.literal_eval(value).values() for f, _ in files]
    files = [path(n) for n in names if n not in PACKAGES]
    out = [f"{f}: not in {HOUSE}'s HOUSE; add it where it belongs" for f in files if f not in named]
    out += [
        f"{HOUSE}: {f} is named {named.count(f)} times" for f in set(named) if named.count(f) > 1
    ]
    return out + [f"{HOUSE}: {f}, which is not there" for f in named if f not in files]


def readme_problems(root: Path, top: list[str]) -> list[str]:
    """The README's tables name every module at the top level (the lesson a student reads)."""
    readme = (root / "README.md").read_text() if (root / "README.md").is_file() else ""
    return [
        f"README.md: no `{name}`; add it to the lesson's table"
        for name in top
        if f"`{name}`" not in readme
    ]


def path(module: str) -> str:
    """lab.plots -> lab/plots.py; a package itself, lab -> lab/__init__.py."""
    return f"{module}/__init__.py" if module in PACKAGES else module.replace(".", "/") + ".py"


def lesson_size_problems(top: list[Path]) -> list[str]:
    """The lesson a student reads stays short: each top-level module at most LESSON_LINES
    (presets.py's table has its own), all of them at most LESSON_TOTAL."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in top}
    out = [
        f"{name}: {n} lines, over the lesson's {LESSON_LINES}: move what the commands or the engine do there"
        for name, n in sorted(sizes.items())
        if n > LINES.get(name, LESSON_LINES)
    ]
    if (total := sum(sizes.values())) > LESSON_TOTAL:
        out.append(f"the top level: {total:,} lines, over {LESSON_TOTAL:,}")
    return out


def step_problems(root: Path) -> list[str]:
    """STEP's strict count of a plain step's reading against its ceilings."""
    if not (root / STEP).is_file():
        return []
    spec = importlib.util.spec_from_file_location("step_lines", root / STEP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    per_file = module.counts(strict=True)
    lines = sum(n for read in per_file.values() for _, n in read)
    out = [f"{STEP}: a plain step reads {lines} lines, over {STEP_LINES}"] * (lines > STEP_LINES)
    many = len(per_file) > STEP_FILES
    return out + [f"{STEP}: a plain step reads {len(per_file)} files, over {STEP_FILES}"] * many


def problems(root: Path) -> list[str]:
    top = sorted(root.glob("*.py"))
    modules = {p.stem: p for p in top}
    for package in PACKAGES:
        modules |= {
            f"{package}.{p.stem}" if p.stem != "__init__" else package: p
            for p in (root / package).glob("*.py")
        }
    trees = {name: ast.parse(p.read_text(), str(p)) for name, p in sorted(modules.items())}
    out = [
        line
        for name, p in sorted(modules.items())
        for line in module_problems(p, path(name), trees[name])
    ]
    grader = {
        f"grader.{p.stem}": ast.parse(p.read_text(), str(p))
        for p in sorted((root / "grader").glob("*.py"))
    }
    for name, tree in grader.items():  # the TA's grader: sizes and cycles, not layers
        out += module_problems(root / path(name), path(name), tree)
    for p in sorted((root / "tests").glob("*.py")):  # the tests: the same budgets, 500 lines
        tree = ast.parse(p.read_text(), str(p))
        out += module_problems(p, f"tests/{p.name}", tree, TEST_LINES)
    out += lesson_size_problems(top)
    if len(top) > TOP_LEVEL:
        out.append(f"{len(top)} modules at the top level, over {TOP_LEVEL}: move a tool into lab/")
    out += import_problems(trees, grader) + distributed_problems(trees) + direction_problems(trees)
    out += house_problems(root, sorted(modules)) + step_problems(root)
    out += readme_problems(root, [p.name for p in top])
    sources = [*modules.values(), *sorted((root / "tests").glob("*.py"))]
    if (n := sum(p.read_text().count("# fmt: skip") for p in sources)) > FMT_SKIPS:
        out.append(f"{n} '# fmt: skip' escapes, over {FMT_SKIPS}")
    if (n := len((root / "README.md").read_bytes())) > README_BYTES:
        out.append(f"README.md: {n:,} bytes, over {README_BYTES:,}")
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent
    found = problems(root)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
