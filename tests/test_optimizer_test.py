"""`python optimizer_test.py`, the handout's AdamW check, run as a student runs it: against the
handout's optimizer_test.npy where it lies, against torch.optim.AdamW in a clone without it,
and failing in one line on a perturbed reference or an open exercise. The clone's runs are
processes of their own (its optimizer.py is not this checkout's); the others run main()
here, in the folder a student would run it in."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import optimizer_test
from optimizer import AdamW

REPO = Path(__file__).resolve().parents[1]
HANDOUT = Path(__file__).parents[2] / "shared" / "reference" / "optimizer_test.npy"


def run(script: Path, cwd: Path, *flags: str) -> subprocess.CompletedProcess:
    """The script in a process of its own: a clone's optimizer.py, not this checkout's."""
    return subprocess.run(
        [sys.executable, str(script), *flags], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def run_here(cwd: Path, monkeypatch, capsys, *flags: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of this checkout's optimizer_test.main(flags) run in
    cwd, as `python optimizer_test.py` there ends: SystemExit's message on stderr."""
    monkeypatch.chdir(cwd)
    try:
        optimizer_test.main(list(flags))
        code = 0
    except SystemExit as stop:
        code = 1 if isinstance(stop.code, str) else stop.code or 0
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    out = capsys.readouterr()
    return code, out.out, out.err


def clone(tmp_path: Path) -> Path:
    """A student's fresh clone, as far as the check reads it: no ../shared beside it."""
    folder = tmp_path / "clone"
    folder.mkdir()
    for name in ("optimizer_test.py", "optimizer.py"):
        shutil.copy(REPO / name, folder / name)
    return folder


def open_adamw(path: Path) -> None:
    """Replace each body marked as exercise adamw by the error a student's copy raises there."""
    lines = path.read_text().splitlines(keepends=True)
    marks = [i for i, line in enumerate(lines) if "EXERCISE adamw" in line]  # BEGIN, END, ...
    for begin, end in reversed(list(zip(marks[::2], marks[1::2], strict=True))):
        indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
        lines[begin + 1 : end] = [f'{indent}raise NotImplementedError("exercise adamw: do it")\n']
    path.write_text("".join(lines))


@pytest.mark.parametrize("flags", [(), ("--foreach",)])
def test_passes_against_the_handouts_file_in_the_working_folder(
    tmp_path, flags, monkeypatch, capsys
):
    if not HANDOUT.is_file():
        pytest.skip(f"no handout reference at {HANDOUT}")
    shutil.copy(HANDOUT, tmp_path / "optimizer_test.npy")
    code, out, err = run_here(tmp_path, monkeypatch, capsys, *flags)
    assert code == 0, out + err
    line = f"foreach={bool(flags)}), 1000 steps"
    assert out.startswith("Optimizer test passed: AdamW(") and line in out
    assert out.strip().endswith(f"against {(tmp_path / 'optimizer_test.npy').resolve()}")
    assert out.count("\n") == 1


def test_without_the_file_it_compares_with_torchs_adamw_and_says_so(tmp_path):
    folder = clone(tmp_path)
    done = run(folder / "optimizer_test.py", folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Optimizer test passed: AdamW(foreach=False)")
    said = "against torch.optim.AdamW on the same recipe; the handout's optimizer_test.npy"
    assert done.stdout.strip().endswith(f"{said} was not found (put it in this folder)")


def test_a_perturbed_reference_fails_in_one_line_naming_the_entry(tmp_path, monkeypatch, capsys):
    w = optimizer_test.fit(AdamW, correct_bias=True).numpy().copy()
    w[1, 2] += 1e-3  # one entry off by far more than atol + rtol * |w|
    np.save(tmp_path / "optimizer_test.npy", w)
    code, out, err = run_here(tmp_path, monkeypatch, capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(
        "Optimizer test failed: AdamW(foreach=False), 1000 steps, atol 1e-06, rtol 1e-04: "
    )
    assert "largest difference 1.0e-03 at weight[1, 2]" in err
    assert f"against {(tmp_path / 'optimizer_test.npy').resolve()}" in err


def test_a_nan_reference_fails_naming_the_nan(tmp_path, monkeypatch, capsys):
    w = np.zeros((2, 3), dtype=np.float32)
    w[0, 1] = np.nan  # all entries fail; the nan is named
    np.save(tmp_path / "optimizer_test.npy", w)
    code, _, err = run_here(tmp_path, monkeypatch, capsys)
    assert code == 1 and "at weight[0, 1]" in err


@pytest.mark.parametrize("flags", [(), ("--foreach",)])
def test_an_open_exercise_is_one_line(tmp_path, flags):
    folder = clone(tmp_path)
    open_adamw(folder / "optimizer.py")
    done = run(folder / "optimizer_test.py", folder, *flags)
    assert done.returncode == 1 and done.stdout == "", done.stderr
    assert done.stderr == (
        "Optimizer test not run: exercise adamw: do it (python exercises.py check adamw)\n"
    )
