"""colab.ipynb: plain-Python cells that run in order, headless on the CPU, on the tiny BERT.

The cells are run with `exec` in one shared namespace, as a notebook kernel would run
them (tests/notebook_kernel.py), in a folder of links to the repository that stands in for
the notebook's clone (`working_copy`: the notebook's subprocesses run
`sys.executable multitask_classifier.py` and `prepare_submit.py` there, and prepare_submit.py writes its
archive there, not in the repository); MINBERT_NOTEBOOK_TINY switches the notebook to the
tiny model and data of the `tiny_env` fixture and a run folder in tmp_path. A Colab
session on Google Drive is played by a folder that stands in for Drive and a kernel
process that is killed as a VM reset kills it; GitHub, for a private repository, by a
server on 127.0.0.1 that answers git only with the token.
"""

import base64
import functools
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from conftest import write_tiny_data
from engine import checkpoint
from helpers import weights
from notebook_kernel import (
    ARCHIVE,
    NOTEBOOK,
    code_cells,
    drive_charges,
    kernel,
    run_cells,
    working_copy,
)

REPO = NOTEBOOK.parent
CODE = code_cells()
CELLS = json.loads(NOTEBOOK.read_text())["cells"]


def cell(text: str) -> int:
    """The index in CODE of the one code cell that holds `text`."""
    (found,) = [i for i, source in enumerate(CODE) if text in source]
    return found


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


def test_drive_is_mounted_first_before_what_a_reset_runs_again():
    """Drive asks to be allowed, and Run all waits there: right after the parameters, before
    the clone, the packages and the data that a VM reset makes run again."""
    drive = cell('drive.mount("/content/drive")')
    assert drive == 1  # CODE[0]: the parameters
    again = [cell('"clone"'), cell('"-r", "requirements.txt"'), cell('"lab.fetch"')]
    assert drive < min(again) and cell("get_total_norm") < min(again)


def test_an_older_torch_stops_in_one_line(monkeypatch):
    monkeypatch.delenv("MINBERT_NOTEBOOK_TINY", raising=False)
    torch_cell = cell("get_total_norm")
    monkeypatch.setattr(torch, "__version__", "2.5.1+cu124")
    with pytest.raises(SystemExit, match=r"^torch 2\.5\.1\+cu124 is older than 2\.6, .*Runtime"):
        run_cells({"__name__": "__main__"}, CODE[: torch_cell + 1])
    monkeypatch.setattr(torch, "__version__", "2.10.0+cu128")  # 10 > 6, though "1" < "6"
    run_cells({"__name__": "__main__"}, CODE[: torch_cell + 1])


TOKEN = "github_pat_11ASTANDIN0TOKEN0THAT0ONLY0THE0TESTS0KNOW"


class TokenOnly(http.server.SimpleHTTPRequestHandler):
    """A private repository as GitHub serves one, to git's dumb HTTP protocol (static
    files): 401 to a request without x-access-token:TOKEN, as Basic auth."""

    def do_GET(self):
        login = base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
        if self.headers.get("Authorization") == f"Basic {login}":
            return super().do_GET()
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="a private repository"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def private_repo(tmp_path, monkeypatch):
    """The URL of a one-commit repository on 127.0.0.1 that only TOKEN clones, for a git
    whose configuration has a credential helper that would store it in tmp_path/stored."""
    config = tmp_path / "gitconfig"
    config.write_text(f"[credential]\n\thelper = store --file {tmp_path / 'stored'}\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_ASKPASS", "SSH_ASKPASS", "GIT_TERMINAL_PROMPT"):
        monkeypatch.setenv(name, "")  # recorded: restored after the test, as the cell sets one
        monkeypatch.delenv(name)  # unset, as on Colab: the cell must keep git from asking
    bare, work = tmp_path / "served" / "project.git", tmp_path / "work"
    for args in (
        ["init", "-q", "--bare", "-b", "main", bare],
        ["init", "-q", "-b", "main", work],
        ["-C", work, "commit", "-q", "--allow-empty", "-m", "the student's project"],
        ["-C", work, "push", "-q", bare, "main"],
        ["-C", bare, "update-server-info"],  # the dumb protocol's index of refs
    ):
        identity = ["-c", "user.name=A Student", "-c", "user.email=student@example.org"]
        subprocess.run(["git", *identity, *map(str, args)], check=True)
    handler = functools.partial(TokenOnly, directory=str(bare.parent))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        serve = functools.partial(server.serve_forever, poll_interval=0.01)  # quick to stop
        threading.Thread(target=serve, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_port}/project.git"
        server.shutdown()


def test_a_private_repository_is_cloned_with_the_secret_kept_out_of_outputs_and_files(
    private_repo, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # not in the repository: the cell clones REPO_URL
    monkeypatch.setattr(sys, "path", list(sys.path))  # the cell adds its clone
    for name in ("MINBERT_NOTEBOOK_TINY", "MINBERT_NOTEBOOK_DRIVE"):
        monkeypatch.delenv(name, raising=False)
    cells, url = CODE[: cell('"clone"') + 1], f'REPO_URL = "{private_repo}"'
    monkeypatch.delenv("MINBERT_NOTEBOOK_TOKEN", raising=False)  # no secret
    with pytest.raises(SystemExit, match="^git clone failed: is REPO_URL right. A private"):
        run_cells({"__name__": "__main__"}, cells, url)
    wrong = TOKEN.replace("TESTS", "OTHERS")
    monkeypatch.setenv("MINBERT_NOTEBOOK_TOKEN", wrong)
    with pytest.raises(SystemExit, match="^git clone failed: can the token in the Colab secret"):
        run_cells({"__name__": "__main__"}, cells, url)
    monkeypatch.setenv("MINBERT_NOTEBOOK_TOKEN", TOKEN)
    run_cells({"__name__": "__main__"}, cells, url)

    shown = "".join(capsys.readouterr())
    assert "terminal prompts disabled" in shown  # no secret: git failed, asked nothing
    assert f"clone http://x-access-token:***@{private_repo.removeprefix('http://')}" in shown
    assert TOKEN not in shown and wrong not in shown
    clone = tmp_path / "project"
    assert Path.cwd() == clone and f"working in {clone}" in shown
    for args, answer in (
        (["log", "--format=%s"], "the student's project"),
        (["remote", "get-url", "origin"], private_repo),
    ):
        done = subprocess.run(["git", "-C", str(clone), *args], capture_output=True, text=True)
        assert done.stdout == f"{answer}\n"
    files = [f for f in clone.rglob("*") if f.is_file()]
    assert files and not [f for f in files if TOKEN.encode() in f.read_bytes()]
    assert not (tmp_path / "stored").exists()  # the credential helper stored nothing


def tiny_notebook(monkeypatch, tiny_env, run_dir: Path) -> None:
    """The notebook's environment for a tiny run (MINBERT_NOTEBOOK_TINY) into run_dir."""
    bert_dir, data_dir = tiny_env
    monkeypatch.setenv("MINBERT_DATA", str(data_dir))  # the notebook sets it: restore it after
    # tiny matrices: one thread is faster, and does not crawl when other jobs share the CPU
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MINBERT_NOTEBOOK_TINY", "1")
    monkeypatch.setenv("MINBERT_NOTEBOOK_BERT", str(bert_dir))
    monkeypatch.setenv("MINBERT_NOTEBOOK_DATA", str(data_dir))
    monkeypatch.setenv("MINBERT_NOTEBOOK_RUN_DIR", str(run_dir))


def as_minilm(run_dir: Path, folder: Path) -> Path:
    """folder: run_dir's settings and predictions, as if the run had started from MiniLM."""
    (folder / "predictions").mkdir(parents=True)
    for file in (run_dir / "predictions").iterdir():
        (folder / "predictions" / file.name).write_bytes(file.read_bytes())
    settings = json.loads((run_dir / "config.json").read_text())
    settings["model"]["bert"] = "minilm"
    (folder / "config.json").write_text(json.dumps(settings))
    return folder


def both_parts_submitted(run_dir: Path, clone: Path, out: str) -> None:
    """The Part 1 cell's two runs (pretrain, finetune) on this disk, and the submission
    cell's archive holding their files and the run's six."""
    predictions = sorted(p.name for p in (run_dir / "predictions").iterdir())
    assert len(predictions) == 6  # dev and test for three tasks
    options = ("pretrain", "finetune")
    part1 = [f"runs/{run_dir.name}-part1-{option}" for option in options]
    for folder, option in zip(part1, options, strict=True):
        assert len(list((clone / folder).rglob(f"predictions/{option}-*-out.csv"))) == 4
    submitted = f"$ {sys.executable} prepare_submit.py {run_dir} --part1 {' '.join(part1)}\n"
    assert submitted in out and "is missing" not in out  # not MiniLM: no other flag
    names = [
        f"{o}-{t}-{s}-out.csv" for o in options for t in ("sst", "cfimdb") for s in ("dev", "test")
    ]
    with zipfile.ZipFile(clone / ARCHIVE) as archive:
        zipped = sorted(
            n
            for n in archive.namelist()
            if n.startswith("./predictions/") or n.startswith("predictions/")
        )
    assert [Path(n).name for n in zipped] == sorted(predictions + names)


@pytest.mark.slow
def test_the_notebook_trains_plots_zips_and_resumes(tiny_env, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    clone = working_copy(tmp_path / "clone")  # where prepare_submit.py writes the archive
    monkeypatch.chdir(clone)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the notebook adds its clone
    tiny_notebook(monkeypatch, tiny_env, run_dir)
    namespace = {"__name__": "__main__"}
    run_cells(namespace, CODE)
    out = capsys.readouterr().out

    assert namespace["RUN_DIR"] == str(run_dir) and not namespace["ON_COLAB"]
    # the Drive cell first, then the clone, the packages and the data
    order = ["run folder:", "working in", "tiny test run", "data from"]
    assert [out.index(line) for line in order] == sorted(out.index(line) for line in order)
    assert "--preset thesis" in out and "best stage:" in out  # the run's own output, streamed
    assert "2 exercise(s): 2 pass" in out  # GRADE: exercises.py check pearson auc
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    stages = ["QQP", "loop 1: STS", "loop 1: SST", "loop 1: QQP 3%"]
    assert [row["stage"] for row in rows[1:]] == stages
    assert all(row["stage"] in out for row in rows)  # the forgetting table, printed
    for name in ("config.json", "best.safetensors", "forgetting.png", "loss.png", "report.html"):
        assert (run_dir / name).is_file(), name
    labels = [
        line.split("\t") for line in out.splitlines() if line.startswith(("sentiment", "para"))
    ]
    assert [line[-1] for line in labels] == [s.split("\t")[-1] for s in namespace["SENTENCES"]]
    assert [len(line) for line in labels] == [2, 2, 4]  # the pair: paraphrase, similarity
    both_parts_submitted(run_dir, clone, out)

    training_cell = cell("--resume")
    run_cells(namespace, [CODE[training_cell]])  # running the cell again continues the run
    assert f"--resume {run_dir}" in capsys.readouterr().out
    namespace["FLAGS"] = [*namespace["FLAGS"], "--lr", "5e-4"]  # the run was made with 1e-3
    with pytest.raises(SystemExit, match=r"made otherwise: --lr 0.0005 \(the run's: 0.001\)"):
        run_cells(namespace, [CODE[training_cell]])

    namespace["RUN_DIR"] = str(minilm := as_minilm(run_dir, tmp_path / "minilm"))
    with pytest.raises(RuntimeError, match="exited with status 1"):  # refused, in one line
        run_cells(namespace, [CODE[cell("prepare_submit.py")]])
    assert "MiniLM, which was trained on Quora and NLI pairs" in capsys.readouterr().out
    namespace["ALLOW_OUTSIDE_PRETRAINING"] = True  # the student says so
    run_cells(namespace, [CODE[cell("prepare_submit.py")]])
    assert f"prepare_submit.py {minilm} --part1 " in (out := capsys.readouterr().out)
    assert "--allow_outside_pretraining\n" in out


def test_without_a_gpu_a_model_other_than_minilm_stops_unless_forced(
    tiny_env, tmp_path, monkeypatch
):
    monkeypatch.chdir(REPO)
    tiny_notebook(monkeypatch, tiny_env, tmp_path / "run")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    training_cell = cell("--resume")
    # the tiny run grades pearson and auc first (the whole run's test): 15 s before the refusal
    parameters = 'FORCE_CPU = False\nBERT = "bert-base-uncased"\nGRADE = False'
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
    # a checkpoint every quarter second; grading, TensorBoard and Part 1 are other tests'
    often = "CHECKPOINT_MINUTES = 0.004\nGRADE = False\nTENSORBOARD = False\nPART1 = []"
    assert kernel(tiny_env[0], tmp_path, tmp_path / "drive-a", often).wait() == 0
    broken = tmp_path / "drive-b" / "minbert" / "run"
    stage, step = kill_after_a_checkpoint_inside_a_stage(
        kernel(tiny_env[0], tmp_path, tmp_path / "drive-b", often), broken
    )
    assert saved_position(broken / checkpoint.STATE) == (stage, step)  # Drive kept the state
    assert kernel(tiny_env[0], tmp_path, tmp_path / "drive-b", often).wait() == 0  # all cells
    output = (tmp_path / "drive-b.out").read_text()
    assert f"--resume {broken}" in output and f"resuming {broken} at stage {stage + 1}/4" in output
    again = output[output.rindex("run folder:") :]  # all cells again: Drive first
    assert again.index("working in") < again.index("data from") < again.index("--resume")

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
    assert (broken / "forgetting.png").is_file()
    assert (tmp_path / "drive-b.clone" / ARCHIVE).is_file()  # the submission, made again


@pytest.mark.slow
def test_on_drive_the_thesis_schedule_writes_each_checkpoint_once(tiny_env, tmp_path):
    """The bytes a run leaves in Drive's bin: a thesis schedule (4 stages here) saved after
    every stage replaces its state 3 times; on Drive, saved every CHECKPOINT_MINUTES, the
    state and the best model are written once each and nothing heavy is replaced."""
    write_tiny_data(tmp_path / "data")
    logs = {where: tmp_path / f"{where}.log" for where in ("drive", "disk")}
    ungraded = "GRADE = False\nPART1 = []"  # grading and Part 1 are the in-process test's
    assert kernel(tiny_env[0], tmp_path, tmp_path / "drive", ungraded, logs["drive"]).wait() == 0
    on_disk = f"{ungraded}\nUSE_DRIVE = False"
    on_disk = kernel(tiny_env[0], tmp_path, tmp_path / "disk", on_disk, logs["disk"])
    assert on_disk.wait() == 0

    writes, replaced = drive_charges(logs["drive"])
    state = writes[checkpoint.STATE]
    assert len(state) == len(writes[checkpoint.BEST]) == 1
    assert replaced < state[0] / 10  # text files only (metrics.jsonl, config.json, ...)
    writes, replaced = drive_charges(logs["disk"])
    assert len(writes[checkpoint.STATE]) == 4  # after each stage
    assert replaced >= 3 * min(writes[checkpoint.STATE])
