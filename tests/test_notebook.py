"""colab.ipynb: plain-Python cells that run in order, headless on the CPU, on the tiny BERT.

The cells are run with `exec` in one shared namespace, as a notebook kernel would run
them (tests/notebook_kernel.py), from the repository root (the notebook's subprocesses run
`sys.executable multitask_classifier.py` and `lab/plots.py` there); MINBERT_NOTEBOOK_TINY
switches the notebook to the tiny model and data of the `tiny_env` fixture and a run
folder in tmp_path. A Colab session on Google Drive is played by a folder that stands in
for Drive and a kernel process that is killed as a VM reset kills it.
"""

import json
import os
import signal
import time
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import write_tiny_data
from notebook_kernel import NOTEBOOK, code_cells, drive_charges, kernel, run_cells
from safetensors import safe_open

import checkpoint
from helpers import weights

REPO = NOTEBOOK.parent
CODE = code_cells()
CELLS = json.loads(NOTEBOOK.read_text())["cells"]


def test_every_code_cell_is_plain_python_explained_by_the_cell_before_it():
    assert json.loads(NOTEBOOK.read_text())["nbformat"] == 4
    cells = CELLS
    for before, cell in zip(cells, cells[1:], strict=False):
        if cell["cell_type"] == "code":
            assert before["cell_type"] == "markdown", "".join(cell["source"])[:60]
            assert cell["outputs"] == [] and cell["execution_count"] is None
    for i, source in enumerate(CODE):
        compile(source, f"colab.ipynb code cell {i}", "exec")  # no ! or % magics
        installs = [line for line in source.splitlines() if "pip" in line]
        assert not any("torch" in line for line in installs), "keep Colab's CUDA torch"


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
    assert "2/2 exercises pass" in out  # GRADE: exercises.py check pearson auc
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["stage"] for row in rows[1:]] == [
        "QQP",
        "loop 1: STS",
        "loop 1: SST",
        "loop 1: QQP 3%",
    ]
    assert all(row["stage"] in out for row in rows)  # the forgetting table, printed
    for name in ("config.json", "best.safetensors", "forgetting.png", "loss.png", "report.html"):
        assert (run_dir / name).is_file(), name
    labels = [
        line.split("\t") for line in out.splitlines() if line.startswith(("sentiment", "para"))
    ]
    assert [line[-1] for line in labels] == [s.split("\t")[-1] for s in namespace["SENTENCES"]]
    assert [len(line) for line in labels] == [2, 2, 4]  # the pair: paraphrase, similarity
    predictions = sorted(p.name for p in (run_dir / "predictions").iterdir())
    assert len(predictions) == 6  # dev and test for three tasks
    with zipfile.ZipFile(run_dir / "predictions.zip") as archive:
        assert sorted(archive.namelist()) == predictions

    training_cell = next(i for i, source in enumerate(CODE) if "--resume" in source)
    run_cells(namespace, [CODE[training_cell]])  # running the cell again continues the run
    assert f"--resume {run_dir}" in capsys.readouterr().out
    namespace["FLAGS"] = [*namespace["FLAGS"], "--lr", "5e-4"]  # the run was made with 1e-3
    with pytest.raises(SystemExit, match=r"made otherwise: --lr 0.0005 \(the run's: 0.001\)"):
        run_cells(namespace, [CODE[training_cell]])


def test_without_a_gpu_a_model_other_than_minilm_stops_unless_forced(
    tiny_env, tmp_path, monkeypatch
):
    bert_dir, data_dir = tiny_env
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("MINBERT_DATA", str(data_dir))
    monkeypatch.setenv("MINBERT_NOTEBOOK_TINY", "1")
    monkeypatch.setenv("MINBERT_NOTEBOOK_BERT", str(bert_dir))
    monkeypatch.setenv("MINBERT_NOTEBOOK_DATA", str(data_dir))
    monkeypatch.setenv("MINBERT_NOTEBOOK_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    training_cell = next(i for i, source in enumerate(CODE) if "--resume" in source)
    parameters = 'FORCE_CPU = False\nBERT = "bert-base-uncased"'
    with pytest.raises(SystemExit, match="^no GPU: bert-base-uncased would train for many hours"):
        run_cells({"__name__": "__main__"}, CODE[: training_cell + 1], parameters)
    assert not (tmp_path / "run").exists()  # stopped before anything ran


def saved_position(state: Path):
    """(stage, step) of a checkpoint inside a stage, else None."""
    try:
        with safe_open(str(state), "pt") as f:
            info = json.loads(f.metadata()["info"])
    except (FileNotFoundError, OSError):
        return None
    return (info["next_stage"], info["within"]["step"]) if "within" in info else None


def kill_after_a_checkpoint_inside_a_stage(proc, run_dir: Path):
    """SIGKILL the kernel's process group (the VM reset: nothing is saved) once steps were
    trained past a checkpoint inside a stage; returns that checkpoint's (stage, step)."""
    while proc.poll() is None:
        os.killpg(proc.pid, signal.SIGSTOP)  # held still: no checkpoint between look and kill
        position = saved_position(run_dir / checkpoint.STATE)
        if position and (run_dir / checkpoint.STEPS).exists():
            steps = [
                json.loads(x) for x in (run_dir / checkpoint.STEPS).read_text().split("\n")[:-1]
            ]
            if any((s["stage"], 0) == (position[0], 0) and s["step"] > position[1] for s in steps):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return position
        os.killpg(proc.pid, signal.SIGCONT)
        time.sleep(0.01)
    pytest.fail("the run ended before a checkpoint inside a stage")


@pytest.mark.slow
def test_a_vm_reset_mid_stage_then_all_cells_again_ends_as_the_unbroken_run(tiny_env, tmp_path):
    write_tiny_data(tmp_path / "data", n_train=2400)  # 300 steps a stage: a second or two
    often = "CHECKPOINT_MINUTES = 0.004"  # a checkpoint every quarter second
    assert kernel(tiny_env[0], tmp_path, tmp_path / "drive-a", often).wait() == 0
    broken = tmp_path / "drive-b" / "minbert" / "run"
    stage, step = kill_after_a_checkpoint_inside_a_stage(
        kernel(tiny_env[0], tmp_path, tmp_path / "drive-b", often), broken
    )
    assert saved_position(broken / checkpoint.STATE) == (stage, step)  # Drive kept the state
    assert kernel(tiny_env[0], tmp_path, tmp_path / "drive-b", often).wait() == 0  # all cells
    output = (tmp_path / "drive-b.out").read_text()
    assert f"--resume {broken}" in output and f"resuming {broken} at stage {stage + 1}/4" in output

    unbroken = tmp_path / "drive-a" / "minbert" / "run"
    rows = [
        [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in lines]
        for lines in ((d / checkpoint.METRICS).read_text().splitlines() for d in (unbroken, broken))
    ]
    assert rows[0] == rows[1] and len(rows[0]) == 5
    a, b = weights(unbroken / checkpoint.BEST), weights(broken / checkpoint.BEST)
    assert all(torch.equal(a[k], b[k]) for k in a)
    for file in sorted((unbroken / "predictions").iterdir()):
        assert file.read_text() == (broken / "predictions" / file.name).read_text()
    assert (broken / "predictions.zip").is_file() and (broken / "forgetting.png").is_file()


@pytest.mark.slow
def test_on_drive_the_thesis_schedule_writes_each_checkpoint_once(tiny_env, tmp_path):
    """The bytes a run leaves in Drive's bin: a thesis schedule (4 stages here) saved after
    every stage replaces its state 3 times; on Drive, saved every CHECKPOINT_MINUTES, the
    state and the best model are written once each and nothing heavy is replaced."""
    write_tiny_data(tmp_path / "data")
    logs = {where: tmp_path / f"{where}.log" for where in ("drive", "disk")}
    assert kernel(tiny_env[0], tmp_path, tmp_path / "drive", log=logs["drive"]).wait() == 0
    on_disk = kernel(tiny_env[0], tmp_path, tmp_path / "disk", "USE_DRIVE = False", logs["disk"])
    assert on_disk.wait() == 0

    writes, replaced = drive_charges(logs["drive"])
    state = writes[checkpoint.STATE]
    assert len(state) == len(writes[checkpoint.BEST]) == 1
    assert replaced < state[0] / 10  # text files only (metrics.jsonl, config.json, ...)
    writes, replaced = drive_charges(logs["disk"])
    assert len(writes[checkpoint.STATE]) == 4  # after each stage
    assert replaced >= 3 * min(writes[checkpoint.STATE])
