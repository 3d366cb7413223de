"""colab.ipynb: plain-Python cells that run in order, headless on the CPU, on the tiny BERT.

The cells are run with `exec` in one shared namespace, as a notebook kernel would run
them, from the repository root (the notebook's subprocesses run `sys.executable
multitask_classifier.py` and `plots.py` there); MINBERT_NOTEBOOK_TINY switches the
notebook to the tiny model and data of the `tiny_env` fixture and a run folder in tmp_path.
"""

import json
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = json.loads((REPO / "colab.ipynb").read_text())
CODE = ["".join(c["source"]) for c in NOTEBOOK["cells"] if c["cell_type"] == "code"]


def test_every_code_cell_is_plain_python_explained_by_the_cell_before_it():
    assert NOTEBOOK["nbformat"] == 4
    cells = NOTEBOOK["cells"]
    for before, cell in zip(cells, cells[1:], strict=False):
        if cell["cell_type"] == "code":
            assert before["cell_type"] == "markdown", "".join(cell["source"])[:60]
            assert cell["outputs"] == [] and cell["execution_count"] is None
    for i, source in enumerate(CODE):
        compile(source, f"colab.ipynb code cell {i}", "exec")  # no ! or % magics
        installs = [line for line in source.splitlines() if "pip" in line]
        assert not any("torch" in line for line in installs), "keep Colab's CUDA torch"


def run_cells(namespace: dict, cells: list[str]):
    for i, source in enumerate(cells):
        exec(compile(source, f"colab.ipynb code cell {i}", "exec"), namespace)


@pytest.mark.slow
def test_the_notebook_trains_plots_zips_and_resumes(tiny_env, tmp_path, monkeypatch, capsys):
    bert_dir, data_dir = tiny_env
    run_dir = tmp_path / "run"
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("MINBERT_DATA", str(data_dir))  # the notebook sets it: restore it after
    # tiny matrices: one thread is faster, and does not crawl when other jobs share the CPU
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MINBERT_NOTEBOOK_TINY", "1")
    monkeypatch.setenv("MINBERT_NOTEBOOK_BERT", str(bert_dir))
    monkeypatch.setenv("MINBERT_NOTEBOOK_DATA", str(data_dir))
    monkeypatch.setenv("MINBERT_NOTEBOOK_RUN_DIR", str(run_dir))
    namespace = {"__name__": "__main__"}
    run_cells(namespace, CODE)
    out = capsys.readouterr().out

    assert namespace["RUN_DIR"] == str(run_dir) and not namespace["ON_COLAB"]
    assert "--preset thesis" in out and "best stage:" in out  # the run's own output, streamed
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["stage"] for row in rows[1:]] == [
        "QQP",
        "loop 1: STS",
        "loop 1: SST",
        "loop 1: QQP 3%",
    ]
    assert all(row["stage"] in out for row in rows)  # the forgetting table, printed
    for name in ("config.json", "best.safetensors", "forgetting.png", "loss.png"):
        assert (run_dir / name).is_file(), name
    predictions = sorted(p.name for p in (run_dir / "predictions").iterdir())
    assert len(predictions) == 6  # dev and test for three tasks
    with zipfile.ZipFile(run_dir / "predictions.zip") as archive:
        assert sorted(archive.namelist()) == predictions

    training_cell = next(i for i, source in enumerate(CODE) if "--resume" in source)
    run_cells(namespace, [CODE[training_cell]])  # running the cell again continues the run
    assert f"--resume {run_dir}" in capsys.readouterr().out
    namespace["FLAGS"] = [*namespace["FLAGS"], "--lr", "5e-4"]  # the run was made with 1e-3
    with pytest.raises(RuntimeError, match="exited with status 1"):
        run_cells(namespace, [CODE[training_cell]])
    assert "the run was made otherwise: --lr 0.0005 (the run's: 0.001)" in capsys.readouterr().out
