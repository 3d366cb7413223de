"""`make lint`'s script (.ci/lint.py) on a small tree built here: it names what breaks the
house's budgets, and passes what keeps them. The repository's own sizes are not tested."""

import subprocess
import sys
from pathlib import Path

LINT = Path(__file__).resolve().parent.parent / ".ci" / "lint.py"


def lint(root: Path) -> tuple[int, list[str]]:
    done = subprocess.run([sys.executable, LINT, root], capture_output=True, text=True)
    return done.returncode, done.stdout.splitlines()


def test_lint_passes_a_tree_within_its_budgets(tmp_path):
    (tmp_path / "README.md").write_text("# a short guide\n")
    (tmp_path / "smart.py").write_text('"""SMART."""\n\n\ndef f(a, b):\n    return a + b\n')
    (tmp_path / "trainer.py").write_text('"""The loop."""\n\nimport smart\n')
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "__init__.py").write_text('"""The lab."""\n')
    (tmp_path / "lab" / "plots.py").write_text('"""Pictures."""\n\nimport trainer\n')
    (tmp_path / "lab" / "explore.py").write_text('"""A page."""\n\nfrom lab import plots\n')
    assert lint(tmp_path) == (0, [])


def test_lint_names_each_file_function_and_import_over_the_limits(tmp_path):
    (tmp_path / "README.md").write_text("x" * 12_001)
    body = "".join(f"    x{i} = {i}\n" for i in range(69))
    (tmp_path / "extra.py").write_text(f'"""A student\'s module."""\n\n\ndef long():\n{body}')
    (tmp_path / "smart.py").write_text('"""SMART."""\n\nimport trainer\n')  # reaches up
    (tmp_path / "trainer.py").write_text("def step(a, b, c, d, e, f, g, h, i):\n    pass\n")
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "bench.py").write_text('"""Timings."""\n' + "\n" * 540)
    (tmp_path / "lab" / "plots.py").write_text('"""Pictures."""\n\nfrom lab.bench import x\n')
    (tmp_path / "bert.py").write_text('"""BERT."""\n\nfrom lab import plots\n')  # the lab
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_big.py").write_text('"""Two concerns."""\n' + "\n" * 500)
    for i in range(19):  # 23 modules at the top level
        (tmp_path / f"base_{i}.py").write_text('"""A module."""\n')
    code, lines = lint(tmp_path)
    assert code == 1
    assert lines == [
        "extra.py:4 long: 70 lines, over 50",
        "lab/bench.py: 541 lines, over its 540",
        "trainer.py: no module docstring naming what it holds",
        "trainer.py:1 step: 9 parameters, over 8",
        "tests/test_big.py: 501 lines, over its 500",
        "23 modules at the top level, over 22: move a tool into lab/",
        *(f"base_{i}.py: in no layer; place it in LAYERS" for i in sorted(range(19), key=str)),
        "extra.py: in no layer; place it in LAYERS",
        "bert.py imports lab.plots, which is not in a layer below it",
        "lab/plots.py imports lab.bench, which is not in a layer below it",
        "smart.py imports trainer, which is not in a layer below it",
        "README.md: 12,001 bytes, over 12,000",
    ]
