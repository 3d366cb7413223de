"""The lines a student reads to understand one plain training step, file by file, for the
table in docs/extending.md.

The step: the thesis preset's first stage (QQP, `para:bce`), one process, float32, no
SMART, no PCGrad, no L2-SP or distillation, no --accumulate. Read from trainer.train_step
down: every function the step calls whose result the reader needs, from its `def` to its
end, or to the line where this step leaves it (a `return 0.0` where the stage has no such
term). Not counted: the model's forward (`model.embed`, `sentences`, `readout`: the model
is its own lesson, bert.py and multitask_classifier.py), torch's own calls, and a callee
whose answer for this step the call site's comment or the callee's docstring already
gives (SMART's float32 rule: under float32 `Runtime.autocast` ignores it).

The strict count adds the dataclasses the step reads a field of: each such class's line,
and the lines of the fields and properties it reads (FIELDS). `make lint` holds it to its
ceiling (.ci/lint.py's STEP_LINES and STEP_FILES).

Run from the repository root:

    python docs/scripts/step_lines.py            # the path, then the strict count
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (file, function or Class.method, the line this step leaves it at: None for its end)
PATH = [
    ("trainer.py", "StepContext", None),
    ("trainer.py", "train_step", None),
    ("trainer.py", "set_lr", None),
    ("trainer.py", "task_weights", "return {tasks[0]: 1.0}"),
    ("trainer.py", "AddedTerms", None),
    ("trainer.py", "Clean", None),
    ("trainer.py", "l2sp_pull", "return 0.0"),
    ("trainer.py", "step_loss", None),
    ("losses.py", "default_loss", None),
    ("losses.py", "loss_of", None),
    ("losses.py", "bce", None),
    ("engine/runtime.py", "Runtime.autocast", None),
    ("engine/runtime.py", "shares", "return [(task, to_device"),
    ("engine/runtime.py", "to_device", None),
    ("engine/runtime.py", "sum_gradients", "return"),
    ("engine/runtime.py", "sum_over_processes", None),
]


# (file, dataclass, the fields and properties of it the step reads)
FIELDS = [
    ("presets.py", "Stage", ("lr", "losses", "freeze_encoder", "weighting")),
    ("settings.py", "OptimConfig", ("accumulate", "max_grad_norm", "l2sp")),
    ("engine/runtime.py", "Runtime", ("device", "scaler", "main")),
]


def definitions(tree: ast.AST, prefix: str = "") -> dict[str, ast.AST]:
    """{name or Class.method: its node} of a module's functions and classes."""
    out = {}
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            out[prefix + node.name] = node
            if isinstance(node, ast.ClassDef):
                out |= definitions(node, f"{node.name}.")
    return out


def lines_read(file: str, name: str, until: str | None) -> int:
    """The lines of `name` in `file` from its def (decorators included) to its end, or to
    the first line holding `until`."""
    source = (ROOT / file).read_text().splitlines()
    node = definitions(ast.parse("\n".join(source)))[name]
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    last = node.end_lineno
    if until is not None:
        last = next(i for i in range(node.lineno, last + 1) if until in source[i - 1])
    return last - first + 1


def fields_read(file: str, cls: str, names: tuple) -> int:
    """The class line of dataclass `cls` in `file` and the lines of the fields and
    properties `names` (decorators included)."""
    node = definitions(ast.parse((ROOT / file).read_text()))[cls]
    total = 1
    for item in node.body:
        target = getattr(item, "target", None)
        name = getattr(target, "id", None) or getattr(item, "name", None)
        if name in names:
            first = min([item.lineno, *(d.lineno for d in getattr(item, "decorator_list", []))])
            total += item.end_lineno - first + 1
    return total


def counts(strict: bool) -> dict[str, list[tuple[str, int]]]:
    """{file: [(what is read there, its lines)]}: the path, with the dataclasses' fields
    where strict."""
    per_file: dict[str, list[tuple[str, int]]] = {}
    for file, name, until in PATH:
        per_file.setdefault(file, []).append((name, lines_read(file, name, until)))
    for file, cls, names in FIELDS if strict else []:
        shown = f"{cls}: {', '.join(names)}"
        per_file.setdefault(file, []).append((shown, fields_read(file, cls, names)))
    return per_file


def table(per_file: dict) -> str:
    out = ["| file | what the step reads there | lines |", "| --- | --- | ---: |"]
    for file, read in per_file.items():
        names = ", ".join(f"`{n}`" for n, _ in read)
        out.append(f"| `{file}` | {names} | {sum(n for _, n in read)} |")
    total = sum(n for read in per_file.values() for _, n in read)
    return "\n".join([*out, f"| {len(per_file)} files | | {total} |"])


def main() -> None:
    print(table(counts(strict=False)))
    print("\nstrict, with the dataclasses' fields the step reads:\n")
    print(table(counts(strict=True)))


if __name__ == "__main__":
    main()
