"""lab/house.py: the README's picture names every module of the repository once, and the
committed docs/house.svg is what it draws."""

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from lab import house

REPO = Path(__file__).resolve().parent.parent


def test_the_house_names_every_module_once():
    named = [name for _, files in house.HOUSE.values() for name, _ in files]
    modules = [p.name for p in REPO.glob("*.py")]
    modules += [f"lab/{p.name}" for p in (REPO / "lab").glob("*.py") if p.stem != "__init__"]
    assert sorted(named) == sorted(modules)


def test_the_committed_picture_is_current(tmp_path):
    house.main(["--out", str(tmp_path / "house.svg")])
    drawn = (tmp_path / "house.svg").read_text()
    assert drawn == (REPO / "docs" / "house.svg").read_text(), "run: python -m lab.house"
    texts = "".join(ET.fromstring(drawn).itertext())  # well-formed, and says what it shows
    assert all(part in texts for part in house.HOUSE) and "multitask_classifier.py" in texts


def test_every_lab_tool_runs_as_a_module_and_as_a_script():
    """`python -m lab.NAME` and `python lab/NAME.py`, from anywhere: --help answers both."""
    tools = [p for p in (REPO / "lab").glob("*.py") if "__main__" in p.read_text()]
    assert len(tools) >= 10
    ways = [(["-m", f"lab.{t.stem}"], REPO, f"python -m lab.{t.stem}") for t in tools]
    ways += [([str(t)], REPO / "tests", t.name) for t in tools]  # another folder
    running = [
        subprocess.Popen(
            [sys.executable, *argv, "--help"], cwd=where, stdout=subprocess.PIPE, text=True
        )
        for argv, where, _ in ways
    ]
    for (argv, _, name), proc in zip(ways, running, strict=True):
        out, _ = proc.communicate()
        assert proc.returncode == 0 and out.startswith(f"usage: {name} "), argv
