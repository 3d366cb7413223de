"""prepare_submit.py and the handout's command lines: a tiny run becomes the archive the handout's
prepare_submit.py would make of the same files, every test id in it; a sampled run is
refused, naming the flag, until --predict writes its predictions in full."""

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import datasets as data
from commands import classify, command, submission
from commands.outputs import read_predictions, write_predictions
from evaluation import MULTITASK
from helpers import a_clone, tiny_flags
from presets import PRESETS

REPO = Path(__file__).resolve().parents[1]


def packages() -> list[str]:
    """The code's own packages in the zip, beside the top level the handout's zipper takes."""
    return [f"{d}/{p.name}" for d in submission.PACKAGES for p in sorted((REPO / d).glob("*.py"))]


PREPARE = REPO.parent / "shared" / "reference" / "prepare_submit.py"  # the handout's zipper
TINY = "--batch_size 8 --lr 1e-3 --seed 0 --loops 1 --max_length 64 --preset thesis"


def submit_in(folder, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "prepare_submit.py", *map(str, args)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_run_becomes_the_handouts_archive_with_every_test_id(tiny_env, tmp_path):
    """Full predictions (--dev_size 0), the handout's names and QQP's 1.0 / 0.0; the
    archive lists what the handout's prepare_submit.py lists for the same folder."""
    run_dir = tmp_path / "run"
    command.main(tiny_flags(tiny_env, run_dir, TINY))
    clone = a_clone(tmp_path)
    done = submit_in(clone, run_dir)
    assert done.returncode == 0, done.stderr
    for task in MULTITASK:
        for split in ("dev", "test"):
            ids, preds = read_predictions(clone / "predictions" / f"{task}-{split}-output.csv")
            assert set(ids) == set(submission.file_ids(data.task_file(tiny_env[1], task, split)))
    qqp = (clone / "predictions" / "para-test-output.csv").read_text().splitlines()[1:]
    assert {line.split(",")[1].strip() for line in qqp} <= {"1.0", "0.0"}  # the handout's
    with zipfile.ZipFile(clone / submission.ARCHIVE) as z:
        ours = sorted(z.namelist())
    if not PREPARE.is_file():
        pytest.skip(f"no handout zipper at {PREPARE}")
    (clone / submission.ARCHIVE).unlink()
    subprocess.run([sys.executable, str(PREPARE)], cwd=clone, check=True, capture_output=True)
    with zipfile.ZipFile(clone / submission.ARCHIVE) as z:
        theirs = sorted(z.namelist())  # the top level only: ours adds the code's packages
    assert ours == sorted(theirs + packages()) and "prepare_submit.py" in ours


def test_a_sampled_run_is_refused_until_predict_writes_every_row(tiny_env, tmp_path):
    run_dir = tmp_path / "run"
    command.main(tiny_flags(tiny_env, run_dir, TINY, "--dev_size", "6"))
    clone = a_clone(tmp_path)
    refused = submit_in(clone, run_dir)
    assert refused.returncode == 1 and "--dev_size 6" in refused.stderr
    fix = f"python multitask_classifier.py --predict {run_dir} --dev_size 0"
    assert fix in refused.stderr and refused.stderr.count("\n") == 1
    command.main(["--predict", str(run_dir), "--dev_size", "0", "--data_dir", str(tiny_env[1])])
    assert submit_in(clone, run_dir).returncode == 0


def test_minilm_is_refused_unless_told(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"model": {"bert": "minilm"}}))
    with pytest.raises(SystemExit, match="MiniLM, which was trained on Quora and NLI pairs"):
        submission.main([str(tmp_path / "run")])
    with pytest.raises(SystemExit, match="missing data file"):  # on to the next check
        submission.main([str(tmp_path / "run"), "--allow_outside_pretraining", "--data_dir", "no"])


def test_the_handouts_part1_command_writes_its_file_names(tiny_env, tmp_path):
    """classifier.py as the handout runs it: SST, then CFIMDB, one command; --use_gpu where
    there is none is one line."""
    argv = ["--option", "pretrain", "--epochs", "1", "--lr", "1e-3", "--batch_size", "8"]
    argv += ["--dev_out", "x.csv", "--test_out", "y.csv"]
    results = classify.main(tiny_flags(tiny_env, tmp_path / "p1", "", *argv))
    assert set(results) == {"sst", "cfimdb"}
    written = sorted(p.name for p in (tmp_path / "p1").rglob("predictions/*.csv"))
    assert written == sorted(
        f"pretrain-{task}-{split}-out.csv"
        for task in ("sst", "cfimdb")
        for split in ("dev", "test")
    )
    if not shutil.which("nvidia-smi"):
        with pytest.raises(SystemExit, match="--device cuda: no CUDA device"):
            classify.main(tiny_flags(tiny_env, tmp_path / "p2", "", "--use_gpu", *argv))


def test_the_handouts_part2_command_line_runs(tiny_env, tmp_path):
    """multitask_classifier.py with the handout's flags: --option pretrain freezes the
    encoder in every stage, --epochs sets the loops, its output flags are taken."""
    argv = ["--option", "pretrain", "--epochs", "1", "--lr", "1e-3", "--hidden_dropout_prob", "0.3"]
    argv += ["--sst_dev_out", f"{tmp_path}/p2-predictions/sst-dev-output.csv", "--max_length", "64"]
    cfg, _ = command.parse_args(tiny_flags(tiny_env, tmp_path / "p2", "", *argv))
    assert cfg.model.freeze_encoder and cfg.schedule.loops == 1 and cfg.model.dropout == 0.3
    assert all(s.freeze_encoder for s in PRESETS[cfg.preset].plans_of(cfg)[""])
    command.main(tiny_flags(tiny_env, tmp_path / "p2", "", *argv))
    names = sorted(p.name for p in (tmp_path / "p2" / "predictions").iterdir())
    assert names == sorted(f"{t}-{s}-output.csv" for t in MULTITASK for s in ("dev", "test"))
    with pytest.raises(SystemExit, match="--option nonsense: last-linear-layer or pretrain"):
        command.parse_args(["--option", "nonsense"])


def test_what_is_zipped_is_read_first_and_a_gap_names_its_command(tiny_env, tmp_path):
    """A NaN, a label out of range and a wrong header are refused in one line naming the
    file's line; Part 1 needs both tasks per option; files from an earlier call stay out."""
    run_dir, part1 = tmp_path / "run", tmp_path / "part1"
    command.main(tiny_flags(tiny_env, run_dir, TINY))
    argv = ["--task", "sst", "--epochs", "1", "--max_length", "64"]
    classify.main(tiny_flags(tiny_env, part1, "", *argv))
    clone = a_clone(tmp_path)
    (clone / "predictions").mkdir()
    (clone / "predictions" / "old-sst-dev-output.csv").write_text("id \t x \n")  # an earlier call
    done = submit_in(clone, run_dir, "--data_dir", tiny_env[1])
    assert done.returncode == 0, done.stderr
    assert "Part 1 pretrain is missing" in done.stdout and "left out of the zip" in done.stdout
    assert (
        "predictions/old-sst-dev-output.csv"
        not in zipfile.ZipFile(clone / submission.ARCHIVE).namelist()
    )
    refused = submit_in(clone, run_dir, "--part1", part1, "--data_dir", tiny_env[1])
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert (
        "no pretrain-cfimdb-dev-out.csv: python classifier.py --option pretrain --task cfimdb"
        in refused.stderr
    )
    sts = run_dir / "predictions" / "sts-test-output.csv"
    good = sts.read_text()
    for text, why in (
        (good.replace(good.splitlines()[2].split(",")[1], " nan \n", 1), ":3: "),
        (good.replace("Predicted_Similiary", "Predicted_Similarity"), ":1: header"),
    ):
        sts.write_text(text)
        refused = submit_in(clone, run_dir, "--data_dir", tiny_env[1])
        assert refused.returncode == 1 and why in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1
    sts.write_text(good)
    sst = run_dir / "predictions" / "sst-dev-output.csv"
    lines = sst.read_text().splitlines()
    sst.write_text("\n".join([*lines[:2], lines[2].split(",")[0] + ", 7 ", *lines[3:]]) + "\n")
    refused = submit_in(clone, run_dir, "--data_dir", tiny_env[1])
    assert "sst-dev-output.csv:3:" in refused.stderr and "one of [0, 1, 2, 3, 4]" in refused.stderr


def test_ids_are_the_data_files_each_as_often_and_the_handouts_way_checks_the_model(
    tiny_env, tmp_path
):
    """An id the data lacks, or one predicted twice where the data has it once, stops in one
    line; Excel's byte-order mark does not. With no argument, the run that wrote each file
    (.predictions.json) is checked: a MiniLM run is refused there too."""
    run_dir = tmp_path / "run"
    command.main(tiny_flags(tiny_env, run_dir, TINY))
    clone = a_clone(tmp_path)
    sst = run_dir / "predictions" / "sst-dev-output.csv"
    good = sst.read_text()
    first = good.splitlines()[1]
    for text, why in (
        (good + "bogus1 , 2 \n", "id 'bogus1' has 1 prediction(s); "),
        (good + first + "\n", "has 2 prediction(s); "),
    ):
        sst.write_text(text)
        refused = submit_in(clone, run_dir, "--data_dir", tiny_env[1])
        assert refused.returncode == 1 and why in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1
    sst.write_text("\ufeff" + good)  # a byte-order mark, as Excel saves UTF-8
    assert submit_in(clone, run_dir, "--data_dir", tiny_env[1]).returncode == 0
    handout = tmp_path / f"{run_dir.name}-predictions"  # where tiny_flags copies them
    (clone / "predictions").mkdir(exist_ok=True)
    for f in handout.iterdir():
        shutil.copy2(f, clone / "predictions" / f.name)
    sources = json.loads((tmp_path / ".predictions.json").read_text())
    assert sources["sts-test-output.csv"] == str(run_dir.resolve())
    shutil.copy2(tmp_path / ".predictions.json", clone / ".predictions.json")
    settings = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps(settings | {"model": {"bert": "minilm"}}))
    refused = submit_in(clone, "--data_dir", tiny_env[1])
    assert refused.returncode == 1 and "MiniLM" in refused.stderr
    (clone / ".predictions.json").unlink()
    done = submit_in(clone, "--data_dir", tiny_env[1])
    assert done.returncode == 0 and "no record of the run that wrote" in done.stdout


def part1_by_2024_names(folder, data_dir, modes, tasks=("sst", "cfimdb")):
    """Part 1's files as the 2024 handout's classifier.py names them
    (predictions/{fine_tune_mode}-{task}-{split}-out.csv), every id of the data predicted."""
    for mode in modes:
        for task in tasks:
            for split in ("dev", "test"):
                ids = submission.file_ids(data.task_file(data_dir, task, split))
                path = folder / f"{mode}-{task}-{split}-out.csv"
                write_predictions(path, task, ids, [0] * len(ids))


def test_the_2024_handouts_part1_names_are_checked_and_zipped(tiny_env, tmp_path):
    """last-linear-layer-* and full-model-*-out.csv stand for pretrain-* and finetune-*: in
    ./predictions/ the archive holds what the handout's zipper holds; from --part1 they are
    checked, a gap naming the 2024 command, and an option by neither name is one line."""
    run_dir, part1 = tmp_path / "run", tmp_path / "part1"
    command.main(tiny_flags(tiny_env, run_dir, TINY))
    clone = a_clone(tmp_path)
    shutil.copytree(run_dir / "predictions", clone / "predictions")
    part1_by_2024_names(clone / "predictions", tiny_env[1], ("last-linear-layer", "full-model"))
    done = submit_in(clone, "--data_dir", tiny_env[1])
    assert done.returncode == 0, done.stderr
    assert "is missing" not in done.stdout and "left out of the zip" not in done.stdout
    with zipfile.ZipFile(clone / submission.ARCHIVE) as z:
        ours = sorted(z.namelist())
    assert sum(n.startswith("predictions/") for n in ours) == 6 + 8
    if PREPARE.is_file():  # the 2024 handout's prepare_submit.py zips as the 2023 one
        (clone / submission.ARCHIVE).unlink()
        subprocess.run([sys.executable, str(PREPARE)], cwd=clone, check=True, capture_output=True)
        with zipfile.ZipFile(clone / submission.ARCHIVE) as z:
            theirs = sorted(z.namelist())
        assert ours == sorted(theirs + packages())
    (part1 / "predictions").mkdir(parents=True)
    (part1 / "config.json").write_text("{}")
    part1_by_2024_names(part1 / "predictions", tiny_env[1], ("last-linear-layer",), ("sst",))
    refused = submit_in(clone, run_dir, "--part1", part1, "--data_dir", tiny_env[1])
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    fix = "python classifier.py --fine-tune-mode last-linear-layer --task cfimdb"
    assert f"no last-linear-layer-cfimdb-dev-out.csv: {fix}" in refused.stderr
    part1_by_2024_names(part1 / "predictions", tiny_env[1], ("last-linear-layer",), ("cfimdb",))
    done = submit_in(clone, run_dir, "--part1", part1, "--data_dir", tiny_env[1])
    assert done.returncode == 0, done.stderr
    assert "Part 1 pretrain is missing" not in done.stdout
    assert "Part 1 finetune is missing: no finetune-*-out.csv (nor full-model-*" in done.stdout
    zipped = zipfile.ZipFile(clone / submission.ARCHIVE).namelist()
    assert sum(n.startswith("predictions/last-linear-layer-") for n in zipped) == 4
