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
    (tmp_path / "README.md").write_text("# a short guide: `smart.py`, `trainer.py`\n")
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
    (tmp_path / "smart.py").write_text('"""SMART."""\n\nimport trainer\n')  # a cycle
    (tmp_path / "trainer.py").write_text(
        "import smart\n\n\ndef step(a, b, c, d, e, f, g, h, i):\n    pass\n"
    )
    (tmp_path / "engine").mkdir()  # the engine: its modules count apart from the top level
    (tmp_path / "engine" / "flags.py").write_text('"""Flags."""\n\nfrom lab import bench\n')
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "bench.py").write_text('"""Timings."""\n' + "\n" * 620)
    (tmp_path / "lab" / "plots.py").write_text('"""Pictures."""\n\nfrom lab.bench import x\n')
    (tmp_path / "bert.py").write_text('"""BERT."""\n\nfrom lab import plots\n')  # the lab
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_big.py").write_text('"""Two concerns."""\n' + "\n" * 500)
    (tmp_path / "lab" / "house.py").write_text(  # the one list of modules, one file gone
        '"""The list."""\n\nHOUSE = {"l": ("", [("bert.py", ""), ("gone.py", "")])}\n'
    )
    for i in range(21):  # 25 modules at the top level
        (tmp_path / f"base_{i}.py").write_text('"""A module."""\n')
    code, lines = lint(tmp_path)
    assert code == 1
    top = ["extra.py", "smart.py", "trainer.py", *(f"base_{i}.py" for i in range(21))]
    HOUSELESS = sorted([*top, "engine/flags.py", "lab/bench.py", "lab/plots.py", "lab/house.py"])
    assert lines == [
        "extra.py:4 long: 70 lines, over 50",
        "lab/bench.py: 621 lines, over its 620",
        "trainer.py: no module docstring naming what it holds",
        "trainer.py:4 step: 9 parameters, over 8",
        "tests/test_big.py: 501 lines, over its 500",
        "25 modules at the top level, over 24: move a tool into lab/",
        "bert.py imports lab.plots: the course never reaches into the lab",
        "engine/flags.py imports lab.bench: the course never reaches into the lab",
        "import cycle: smart.py -> trainer.py -> smart.py",
        *(f"{f}: not in lab/house.py's HOUSE; add it where it belongs" for f in HOUSELESS),
        "lab/house.py: gone.py, which is not there",
        *(f"README.md: no `{f}`; add it to the lesson's table" for f in sorted([*top, "bert.py"])),
        "README.md: 12,001 bytes, over 12,000",
    ]


def test_lint_names_a_cycle_through_the_graders_modules(tmp_path):
    """The grader's modules import each other by their bare names (grader/ is on their
    path) and the course's by theirs: a cycle through either is named; none passes."""
    (tmp_path / "README.md").write_text("`exercises.py`\n")
    (tmp_path / "exercises.py").write_text('"""The tool."""\n\nfrom grader import gradescope\n')
    (tmp_path / "grader").mkdir()
    (tmp_path / "grader" / "gradescope.py").write_text('"""Its run."""\n')
    (tmp_path / "grader" / "harness.py").write_text('"""Runs checks."""\n')
    (tmp_path / "grader" / "checks.py").write_text('"""Checks."""\n\nimport harness\n')
    assert lint(tmp_path) == (0, [])
    (tmp_path / "grader" / "harness.py").write_text('"""Runs checks."""\n\nimport checks\n')
    (tmp_path / "grader" / "gradescope.py").write_text('"""Its run."""\n\nimport exercises\n')
    code, lines = lint(tmp_path)
    assert code == 1 and sorted(lines) == [
        "import cycle: exercises.py -> grader/gradescope.py -> exercises.py",
        "import cycle: grader/checks.py -> grader/harness.py -> grader/checks.py",
    ]


def test_lint_keeps_torch_distributed_in_the_engine(tmp_path):
    (tmp_path / "README.md").write_text("`trainer.py`, `smart.py`\n")
    (tmp_path / "trainer.py").write_text('"""The loop."""\n\nimport torch.distributed as dist\n')
    (tmp_path / "smart.py").write_text('"""SMART."""\n\nfrom torch import distributed\n')
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "runtime.py").write_text(
        '"""Processes."""\n\nimport torch.distributed\n'
    )
    code, lines = lint(tmp_path)
    assert code == 1 and lines == [
        f"{f}:3 imports torch.distributed: the engine's (engine/runtime.py)"
        for f in ("smart.py", "trainer.py")
    ]


def test_lint_keeps_one_layer_per_folder(tmp_path):
    """engine/ below the lesson imports neither the lesson nor the commands; no lesson file
    imports a command but from its own `__main__` block (a script calling its command),
    which makes no cycle; commands/ may import the lesson; a lesson file over 500 lines is
    named."""
    (tmp_path / "README.md").write_text("`bert.py`, `multitask_classifier.py`, `trainer.py`\n")
    (tmp_path / "bert.py").write_text('"""BERT."""\n' + "\n" * 500)
    (tmp_path / "multitask_classifier.py").write_text(
        '"""The heads."""\n\nimport bert\n\nif __name__ == "__main__":\n'
        "    from commands.command import main\n"
    )
    (tmp_path / "trainer.py").write_text('"""The step."""\n\nfrom commands import flags\n')
    (tmp_path / "commands").mkdir()
    (tmp_path / "commands" / "command.py").write_text(
        '"""A run."""\n\nimport multitask_classifier\n'
    )
    (tmp_path / "commands" / "flags.py").write_text('"""Flags."""\n')
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "checkpoint.py").write_text('"""Files."""\n\nfrom bert import x\n')
    (tmp_path / "engine" / "runtime.py").write_text(
        '"""Device."""\n\nfrom commands.flags import y\n'
    )
    code, lines = lint(tmp_path)
    below = "engine/ sits below the lesson and the commands; move the piece it needs down, or "
    assert code == 1 and lines == [
        "bert.py: 501 lines, over the lesson's 500: move what the commands or the engine do there",
        f"engine/checkpoint.py imports bert.py: {below}the file up into commands/",
        f"engine/runtime.py imports commands/flags.py: {below}the file up into commands/",
        "trainer.py imports commands/flags.py: no lesson module imports a command (a script "
        'may call its own from `if __name__ == "__main__":`)',
    ]


def test_lint_holds_a_plain_steps_reading_to_its_ceiling(tmp_path):
    """docs/scripts/step_lines.py's strict count, as the repository's script gives it: within
    its ceilings it passes; over either, its lines and its files are each named."""
    (tmp_path / "README.md").write_text("`trainer.py`\n")
    (tmp_path / "trainer.py").write_text('"""The step."""\n')
    script = tmp_path / "docs" / "scripts" / "step_lines.py"
    script.parent.mkdir(parents=True)

    def counted(files: int, lines: int):
        per_file = {f"f{i}.py": [("x", lines // files)] for i in range(files)}
        script.write_text(f'"""Counts."""\n\n\ndef counts(strict):\n    return {per_file!r}\n')
        return lint(tmp_path)

    assert counted(5, 170) == (0, [])
    code, lines = counted(7, 210)
    assert code == 1 and lines == [
        "docs/scripts/step_lines.py: a plain step reads 210 lines, over 185",
        "docs/scripts/step_lines.py: a plain step reads 7 files, over 6",
    ]
