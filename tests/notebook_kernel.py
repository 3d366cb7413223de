"""Run colab.ipynb's code cells in order in one namespace, as a notebook kernel does.

    python tests/notebook_kernel.py [PARAMETERS]     (from the repository root)

PARAMETERS: Python run right after the parameters cell, as papermill injects a cell of
parameters (e.g. 'CHECKPOINT_MINUTES = 0.01'). `kernel` starts it as a process of its own,
on the tiny BERT, with a folder standing in for Google Drive, so that a test can kill it as
a Colab VM reset would and count what the run wrote to that Drive (tests/drive_audit), and
another standing in for the clone the notebook works in (`working_copy`).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parent.parent / "colab.ipynb"
ARCHIVE = "cs224n_default_final_project_submission.zip"  # prepare_submit.py's, the handout's name


def code_cells() -> list[str]:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def run_cells(namespace: dict, cells: list[str], parameters: str = "") -> None:
    """exec each cell in `namespace`; `parameters` right after the first (the parameters)."""
    for i, source in enumerate(cells):
        exec(compile(source, f"colab.ipynb code cell {i}", "exec"), namespace)
        if i == 0 and parameters:
            exec(compile(parameters, "injected parameters", "exec"), namespace)


def working_copy(folder: Path) -> Path:
    """`folder` made to stand in for the notebook's clone of the repository: a link to each of
    its files and folders. What the notebook writes where it works (prepare_submit.py's predictions/
    and archive) lands in `folder`, not in the repository."""
    kept_out = (".git", "data", "runs", "predictions", ARCHIVE)  # a student's own: untouched
    folder.mkdir(parents=True, exist_ok=True)
    for entry in NOTEBOOK.parent.iterdir():
        link = folder / entry.name
        if entry.name not in kept_out and not link.is_symlink():
            link.symlink_to(entry)
    return folder


def kernel(bert: Path, folder: Path, drive: Path, parameters="", log=None) -> subprocess.Popen:
    """The notebook in a kernel process of its own process group (as a Colab VM's), on the
    tiny BERT in `bert` and the data in folder/data, its output in folder/DRIVE.out, its
    Drive played by `drive`, its clone by folder/DRIVE.clone; with `log`, each file
    operation under `folder` is logged there."""
    env = os.environ | {
        "MINBERT_NOTEBOOK_TINY": "1",
        "MINBERT_NOTEBOOK_BERT": str(bert),
        "MINBERT_NOTEBOOK_DATA": str(folder / "data"),
        "MINBERT_NOTEBOOK_RUN_DIR": str(folder / "run"),
        "MINBERT_NOTEBOOK_DRIVE": str(drive),
        "OMP_NUM_THREADS": "1",  # tiny matrices: one thread is faster
    }
    if log:
        audit = str(Path(__file__).parent / "drive_audit")
        env |= {"MINBERT_AUDIT_ROOT": str(folder), "MINBERT_AUDIT_LOG": str(log)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [audit, env.get("PYTHONPATH")]))
    with open(folder / f"{drive.name}.out", "a") as out:
        return subprocess.Popen(
            [sys.executable, __file__, parameters],
            cwd=working_copy(folder / f"{drive.name}.clone"),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def drive_charges(log: Path) -> tuple[dict, int]:
    """({file name: [bytes of each write that replaced it into place]}, bytes replaced or
    removed in all) from a log of tests/drive_audit."""
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    writes = {}
    for e in entries:
        if e["op"] == "replace":
            writes.setdefault(Path(e["path"]).name, []).append(e["bytes"])
    return writes, sum(e["replaced"] for e in entries)


if __name__ == "__main__":
    run_cells({"__name__": "__main__"}, code_cells(), sys.argv[1] if len(sys.argv) > 1 else "")
