"""lab/house.py: the committed docs/house.svg is what it draws (that HOUSE names every module
once is `make lint`'s rule, so that a student's new module keeps `make test` green), and
every lab tool runs as a module and as a script."""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from lab import house

REPO = Path(__file__).resolve().parent.parent


def test_the_committed_picture_is_current(tmp_path):
    house.main(["--out", str(tmp_path / "house.svg")])
    drawn = (tmp_path / "house.svg").read_text()
    assert drawn == (REPO / "docs" / "house.svg").read_text(), "run: python -m lab.house"
    texts = "".join(ET.fromstring(drawn).itertext())  # well-formed, and says what it shows
    assert all(part in texts for part in house.HOUSE) and "multitask_classifier.py" in texts


# One process per way of running the tools (torch imported once, not once a tool): before
# each tool, sys.path is the way's own and the project's modules are forgotten, so that each
# tool finds the course's modules by itself, as it does in a process of its own.
HELP_DRIVER = """
import contextlib, io, json, runpy, sys
from pathlib import Path
repo, way, tools = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
path, answers = list(sys.path), {}
for tool in tools:
    for name, module in list(sys.modules.items()):
        if Path(getattr(module, "__file__", None) or "/").resolve().parent in (repo, repo / "lab"):
            del sys.modules[name]
    sys.path[:] = [str(repo / "lab"), *path[1:]] if way == "script" else path
    sys.argv, out, code = [tool, "--help"], io.StringIO(), None
    with contextlib.redirect_stdout(out):
        try:
            if way == "script":  # python lab/NAME.py: its folder first on sys.path
                runpy.run_path(str(repo / "lab" / f"{tool}.py"), run_name="__main__")
            else:  # python -m lab.NAME from the repository's root
                runpy.run_module(f"lab.{tool}", run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            code = stop.code
        except Exception as error:  # e.g. the course's modules not found: named per tool
            code = repr(error)
    answers[tool] = [code, out.getvalue()]
print(json.dumps(answers))
"""


def test_every_lab_tool_runs_as_a_module_and_as_a_script():
    """`python -m lab.NAME` and `python lab/NAME.py`, from anywhere: --help answers both."""
    tools = sorted(p.stem for p in (REPO / "lab").glob("*.py") if "__main__" in p.read_text())
    assert len(tools) >= 10
    ways = {"module": REPO, "script": REPO / "tests"}  # the script from another folder
    running = {
        way: subprocess.Popen(
            [sys.executable, "-c", HELP_DRIVER, str(REPO), way, *tools],
            cwd=where,
            stdout=subprocess.PIPE,
            text=True,
        )
        for way, where in ways.items()
    }
    for way, proc in running.items():
        out, _ = proc.communicate()
        assert proc.returncode == 0, way
        answers = json.loads(out)
        for tool in tools:
            name = f"python -m lab.{tool}" if way == "module" else f"{tool}.py"
            code, shown = answers[tool]
            assert code in (0, None) and shown.startswith(f"usage: {name} "), (way, tool, shown)
