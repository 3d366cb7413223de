"""The house's budgets, checked by `make lint` on the source itself (ast), not by `make test`:
file and function sizes (tests' too: a test file at most 500 lines), parameters, module
docstrings, formatter escapes, the README's size, the number of modules at the top level
(the course; the lab's tools live in lab/), and imports that only go down the layers. A
student's new module or long function keeps `make test` green; the developers keep this
green.

    python .ci/lint.py          # the repository this file sits in
    python .ci/lint.py PATH     # another checkout
"""

import ast
import sys
from pathlib import Path

LINES = {"multitask_classifier.py": 495, "datasets.py": 810, "lab/bench.py": 540}  # else 585
FUNCTION_LINES, PARAMETERS, FMT_SKIPS, README_BYTES = 50, 8, 10, 12_000
TEST_LINES = 500  # a test file holds one concern, named after what it tests
TOP_LEVEL = 22  # modules at the top level: the course; experiments' tools live in lab/

# Each module imports only from the layers below its own: no cycles, the ground floor
# (the model, the tokenizer, the optimizer, the objectives) never reaches up to training,
# and the course never reaches into the lab.
LAYERS = [
    {"base_bert", "checkpoint", "evaluation", "optimizer", "simcse", "smart"},
    {"optimizer_test"},  # the handout's AdamW test: numpy, torch and the optimizer only
    {"tokenizer", "datasets"},
    {"runtime"},
    {"bert", "losses"},
    {"config", "runfolder"},
    {"plans"},
    {"presets", "trainer"},
    {"multitask_classifier", "sanity_check", "exercises", "submit"},  # the course's commands
    {"classifier", "lab", "lab.fetch", "lab.plots", "lab.export", "lab.house", "lab.timing"},
    {"lab.bench", "lab.ensemble", "lab.gpu_check", "lab.explore", "lab.reports"},
    {"lab.sweep"},
]


def functions(tree: ast.AST) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def parameters(f: ast.FunctionDef) -> list[str]:
    a = f.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [x.arg for x in (a.vararg, a.kwarg) if x]
    return [n for n in names if n not in ("self", "cls")]


def project_imports(tree: ast.AST, known: set[str]) -> set[str]:
    """The project's modules a module imports: `bert`, or `lab.plots` for `from lab import
    plots`, `from lab.plots import x` and `import lab.plots`."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names} | {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module, node.module.split(".")[0]}
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return (found - {"lab"}) & known  # the package's __init__ imports nothing


def module_problems(path: Path, name: str, tree: ast.AST, limit: int = 0) -> list[str]:
    """Size, docstring and every function's length and parameters of one module (limit: its
    lines, else LINES' or 585)."""
    out, limit = [], limit or LINES.get(name, 585)
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


def layer_problems(trees: dict[str, ast.AST]) -> list[str]:
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    out = [f"{path(name)}: in no layer; place it in LAYERS" for name in trees if name not in layer]
    for name, tree in trees.items():
        for dep in sorted(project_imports(tree, set(layer)) - {name}):
            if name in layer and layer[dep] >= layer[name]:
                out.append(f"{path(name)} imports {dep}, which is not in a layer below it")
    return out


def path(module: str) -> str:
    """lab.plots -> lab/plots.py; the package itself, lab -> lab/__init__.py."""
    return "lab/__init__.py" if module == "lab" else module.replace(".", "/") + ".py"


def problems(root: Path) -> list[str]:
    top = sorted(root.glob("*.py"))
    modules = {p.stem: p for p in top}
    modules |= {
        f"lab.{p.stem}" if p.stem != "__init__" else "lab": p for p in (root / "lab").glob("*.py")
    }
    trees = {name: ast.parse(p.read_text(), str(p)) for name, p in sorted(modules.items())}
    out = [
        line
        for name, p in sorted(modules.items())
        for line in module_problems(p, path(name), trees[name])
    ]
    for p in sorted((root / "grader").glob("*.py")):  # the TA's grader: sizes, not layers
        out += module_problems(p, f"grader/{p.name}", ast.parse(p.read_text(), str(p)))
    for p in sorted((root / "tests").glob("*.py")):  # the tests: the same budgets, 500 lines
        tree = ast.parse(p.read_text(), str(p))
        out += module_problems(p, f"tests/{p.name}", tree, TEST_LINES)
    if len(top) > TOP_LEVEL:
        out.append(f"{len(top)} modules at the top level, over {TOP_LEVEL}: move a tool into lab/")
    out += layer_problems(trees)
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
