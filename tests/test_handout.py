"""The handout's command lines give the handout's runs, on the handout's kinds of data: its
Part 1 and Part 2 commands, run in a copy of the code as a student runs them, write the
handout's files where it writes them; the handout's own zipper and prepare_submit.py then
zip the same files. A run on data holding the real files' bad rows is submitted end to end."""

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from commands import classify, command, submission
from commands.handout import MULTITASK_HANDOUT, handout_argv, handout_help
from commands.outputs import read_predictions
from conftest import add_real_bad_rows
from datasets import DataError
from helpers import a_clone, tiny_flags
from presets import PRESETS

REPO = Path(__file__).resolve().parents[1]
PREPARE = REPO.parent / "shared" / "reference" / "prepare_submit.py"  # the handout's zipper
ARCHIVE = "cs224n_default_final_project_submission.zip"


def script_run(folder, script, *args) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, script, *map(str, args)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def zipped(folder) -> list[str]:
    with zipfile.ZipFile(folder / ARCHIVE) as z:
        return sorted(z.namelist())


def handout_commands(clone: Path, tiny_env, tmp_path) -> str:
    """classifier.py twice (pretrain, finetune), then multitask_classifier.py with the
    handout's flags, its data paths among them, run in `clone`; the last one's output."""
    bert, data = tiny_env
    small = ["--bert", bert, "--max_length", "64", "--precision", "fp32", "--train_size", "16"]
    for option in ("pretrain", "finetune"):
        part1 = ["--option", option, "--epochs", "1", "--run_dir", tmp_path / option]
        out = script_run(clone, "classifier.py", *part1, "--data_dir", data, *small).stdout
        lr = 1e-3 if option == "pretrain" else 1e-5
        expected = f"Part 1: 1 epochs, lr {lr:g}, batch 8, dropout 0.3, 64 tokens, "
        assert expected in out
    stems = {"sst": "ids-sst", "para": "quora", "sts": "sts"}
    splits = {"train": "train", "dev": "dev", "test": "test-student"}
    paths = [
        x
        for t, stem in stems.items()
        for s, name in splits.items()
        for x in (f"--{t}_{s}", data / f"{stem}-{name}.csv")
    ]
    part2 = ["--option", "finetune", "--epochs", "1", "--hidden_dropout_prob", "0.2", *paths]
    return script_run(
        clone, "multitask_classifier.py", *part2, "--run_dir", tmp_path / "p2", *small
    )


def test_the_handouts_commands_write_its_files_and_both_zippers_agree(tiny_env, tmp_path):
    """The handout's three commands write its files in ./predictions/; prepare_submit.py
    with no argument, as the handout runs it, and the handout's own zipper zip the same
    predictions, every one checked."""
    clone = a_clone(tmp_path)
    first = handout_commands(clone, tiny_env, tmp_path).stdout.splitlines()[:2]
    assert first[0].startswith(
        "this project's completion of the handout's starter (--preset handout"
    )
    assert (
        "--preset handout-starter is the starter: SST alone" in first[0] and "float32" in first[0]
    )
    assert (
        "the handout trains in float32, this run in --precision: its device line says which): --option finetune"
        in first[0]
    )
    assert first[1].startswith(
        "this project's preset handout: this project's completion of the handout's starter"
    )
    written = sorted(p.name for p in (clone / "predictions").iterdir())
    assert len(written) == 14  # 4 + 4 of Part 1, 6 of Part 2, in ./predictions/
    done = script_run(clone, "prepare_submit.py", "--data_dir", tiny_env[1])
    assert "is missing" not in done.stdout and "no record" not in done.stdout
    ours = zipped(clone)
    predictions = [n for n in ours if n.startswith("predictions/")]
    assert predictions == [f"predictions/{n}" for n in written]
    if not PREPARE.is_file():
        pytest.skip(f"no handout zipper at {PREPARE}")
    (clone / ARCHIVE).unlink()
    script_run(clone, PREPARE)
    packages = [f"{d}/{p.name}" for d in submission.PACKAGES for p in (REPO / d).glob("*.py")]
    assert ours == sorted(zipped(clone) + packages)


def test_a_run_on_the_real_files_bad_rows_is_submitted(tiny_env, tmp_path):
    """An empty label in Quora dev is not demanded; an empty sentence and a repeated id in
    the test files are predicted, as the handout predicts them; each said in one line."""
    bert, data = tiny_env
    add_real_bad_rows(data)
    run_dir = tmp_path / "run"
    command.main(
        tiny_flags(tiny_env, run_dir, "--preset thesis --loops 1 --max_length 64 --seed 0")
    )
    ids, _ = read_predictions(run_dir / "predictions" / "para-test-output.csv")
    assert "quoratest-empty" in ids and ids.count("quoratest-student0") == 2
    assert (
        "ids-ssttest-empty" in read_predictions(run_dir / "predictions" / "sst-test-output.csv")[0]
    )
    assert (
        "quoradev-nolabel"
        not in read_predictions(run_dir / "predictions" / "para-dev-output.csv")[0]
    )
    clone = a_clone(tmp_path)
    done = script_run(clone, "prepare_submit.py", run_dir, "--data_dir", data)
    lines = done.stdout.splitlines()
    skipped = [line for line in lines if line.startswith("para dev: not demanded:")]
    assert (
        len(skipped) == 1 and "skipped 1 bad row(s)" in skipped[0] and "empty label" in skipped[0]
    )
    assert sum(line.startswith("Part 1 ") and "is missing" in line for line in lines) == 2
    assert "predictions/para-test-output.csv" in zipped(clone)


def test_a_test_row_that_cannot_be_read_stops_the_run_before_its_folder(tiny_env, tmp_path):
    with (tiny_env[1] / "sts-test-student.csv").open("a") as f:
        f.write("90\tststest-short\tonly one sentence\n")
    with pytest.raises(
        DataError,
        match=r"sts-test-student.csv:\d+: 3 columns; expected 4 .*"
        "a test row is never skipped",
    ):
        command.main(tiny_flags(tiny_env, tmp_path / "run", "--preset thesis --max_length 64"))
    assert not (tmp_path / "run").exists()


def test_the_handout_preset_has_the_handouts_settings_and_head_lr_works(tiny_env):
    """No --preset and a handout flag: the handout's defaults (pretrain, 10 epochs over SST,
    QQP, STS, batch 8, dropout 0.3, 512 tokens) on the handout's MultitaskBERT, with heads
    at --head_lr, or at a typed --lr; a typed --preset keeps the project's defaults."""
    cfg, _ = command.parse_args(["--use_gpu", "--device", "cpu"])
    stages = PRESETS[cfg.preset].plans_of(cfg)[""]
    assert (
        cfg.preset == "handout"
        and cfg.model.freeze_encoder
        and cfg.predictions_dir == "predictions"
    )
    assert (cfg.optim.batch_size, cfg.model.dropout, cfg.data.max_length) == (8, 0.3, 512)
    assert PRESETS[cfg.preset].handout_model and len(stages) == 30
    assert [s.tasks[0] for s in stages[:3]] == ["sst", "para", "sts"]
    assert {s.lr for s in stages} == {1e-3} and all(s.freeze_encoder for s in stages)
    typed, _ = command.parse_args(["--option", "pretrain", "--lr", "2e-3"])
    assert {s.lr for s in PRESETS[typed.preset].plans_of(typed)[""]} == {2e-3}
    head, _ = command.parse_args(
        ["--preset", "thesis", "--freeze_encoder", "--pair_head", "concat", "--head_lr", "5e-4"]
    )
    assert {s.lr for s in PRESETS["thesis"].plans_of(head)[""]} == {5e-4}
    ours, _ = command.parse_args(["--preset", "thesis", "--option", "finetune"])
    assert ours.preset == "thesis" and ours.optim.batch_size != 8 and ours.predictions_dir is None
    with pytest.raises(SystemExit, match="the handout's file name is quora-dev.csv"):
        command.parse_args(["--para_dev", "data/qqp.csv"])


def test_the_handouts_run_keeps_a_model_only_at_an_epochs_end(tiny_env, tmp_path, capsys):
    """As the handout's loop, the kept model is an epoch's (the STS stage's), never one whose
    STS head has not trained yet; --preset handout typed is the same run; a run made with
    the defaults resumes with --epochs 10 typed."""
    run_dir = tmp_path / "run"
    flags = ["--option", "finetune", "--epochs", "2", "--max_length", "64", "--lr", "1e-3"]
    command.main(tiny_flags(tiny_env, run_dir, "", *flags))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in rows[1:4]] == ["epoch 1: SST", "epoch 1: QQP", "epoch 1: STS"]
    kept = re.search(r"best stage: (.*) \(score", capsys.readouterr().out)
    assert kept and re.fullmatch(r"(epoch \d: STS|start \(no training\))", kept[1])
    stages = PRESETS["handout"].plans_of(command.parse_args(flags)[0])[""]
    assert [s.candidate for s in stages] == [False, False, True] * 2
    typed, _ = command.parse_args(["--preset", "handout"])
    assert typed.model.freeze_encoder and typed.predictions_dir == "predictions"
    assert not command.parse_args(["--preset", "handout", "--option", "finetune"])[
        0
    ].model.freeze_encoder
    default, _ = command.parse_args(["--option", "pretrain"])
    assert (default.schedule.loops, default.schedule.individual_epochs) == (10, 10)
    resumed, _ = command.parse_args(
        ["--resume", str(run_dir), "--option", "finetune", "--epochs", "2"]
    )
    assert resumed.multitask.multitask_epochs == 2


@pytest.mark.parametrize(
    ("mode", "option"), [("last-linear-layer", "pretrain"), ("full-model", "finetune")]
)
def test_the_2024_handouts_fine_tune_mode_is_the_2023_option(mode, option):
    """The 2024 handout's command lines (`python classifier.py --fine-tune-mode
    last-linear-layer --lr 1e-3 --use_gpu`, `python multitask_classifier.py
    --fine-tune-mode full-model --lr 1e-5 --use_gpu`): classifier.py is given --option
    MODE (it names its files by the word typed, as the 2024 handout does);
    multitask_classifier.py runs the handout's run as it does with --option."""
    typed = ["--lr", "1e-5", "--use_gpu"]
    rewritten = ["--option", mode, "--lr", "1e-5", "--device", "cuda"]
    assert handout_argv(["--fine-tune-mode", mode, *typed], classify.HANDOUT) == rewritten
    assert handout_argv([f"--fine-tune-mode={mode}"], classify.HANDOUT) == ["--option", mode]
    here = ["--device", "cpu"]  # after --use_gpu: this machine may have no GPU
    ours, _ = command.parse_args(["--option", option, *typed, *here])
    assert ours.preset == "handout" and ours.model.freeze_encoder == (option == "pretrain")
    for argv in (["--fine-tune-mode", mode], [f"--fine-tune-mode={mode}"], ["--option", mode]):
        assert command.parse_args([*argv, *typed, *here])[0] == ours
    thesis, _ = command.parse_args(["--preset", "thesis", "--fine-tune-mode", mode])
    assert thesis.preset == "thesis" and thesis.model.freeze_encoder == (option == "pretrain")


def test_the_2024_flag_takes_the_four_words_and_not_the_2023_flag_beside_it():
    """A word outside the four, or --option and --fine-tune-mode on one command line: one
    line on either command, before anything is read; --help lists the flag."""
    for parse in (classify.main, command.parse_args):
        with pytest.raises(
            SystemExit,
            match=r"^--fine-tune-mode pretrained: last-linear-layer or pretrain \(BERT "
            r"frozen\), full-model or finetune$",
        ):
            parse(["--fine-tune-mode", "pretrained"])
        with pytest.raises(
            SystemExit,
            match="^--fine-tune-mode and --option: one flag by its 2024 and 2023 names; give "
            "one of them$",
        ):
            parse(["--option", "pretrain", "--fine-tune-mode=full-model"])
    with pytest.raises(SystemExit, match=r"^--option all: last-linear-layer or pretrain"):
        command.parse_args(["--option", "all"])
    for table in (classify.HANDOUT, MULTITASK_HANDOUT):
        lines = [line.split(None, 1) for line in handout_help(table).splitlines()[1:]]
        assert dict(lines)["--fine-tune-mode"] == (
            "--option (2024's name): last-linear-layer is pretrain, full-model is finetune"
        )
