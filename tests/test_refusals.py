"""What multitask_classifier.py refuses before a run folder is made or a step is trained: bad
flags and values, unusable data files, a folder that holds another run, a changed experiment."""

import json

import pytest

import datasets as data
from base_bert import ModelError
from commands import command
from helpers import (
    no_training,
    run,
    tiny_argv,
    tiny_flags,
)
from presets import PRESETS
from tokenizer import BertTokenizer


def test_an_existing_run_folder_is_not_overwritten(tiny_env, tmp_path, monkeypatch):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    saved = (tmp_path / "run" / "config.json").read_text()
    monkeypatch.setattr(command, "seeded_data", None)  # refused before the data is read
    with pytest.raises(SystemExit, match="already holds a run: continue it with --resume"):
        run(tiny_env, tmp_path / "run", "--loops", "0", "--lr", "0.5")
    assert (tmp_path / "run" / "config.json").read_text() == saved  # the refusal wrote nothing


def test_bad_flag_values_stop_with_the_allowed_values(capsys):
    with pytest.raises(SystemExit):
        command.parse_args(["--pooling", "max"])
    err = capsys.readouterr().err
    assert "invalid choice: 'max'" in err and "mean" in err and "cls" in err
    with pytest.raises(SystemExit, match="--batch_size must be at least 1, got 0"):
        command.parse_args(["--batch_size", "0"])


def test_a_max_length_beyond_the_position_table_stops_before_training(tiny_env, tmp_path):
    with pytest.raises(SystemExit, match="--max_length 65 is longer than the 64 positions"):
        command.main(tiny_argv(tiny_env, tmp_path / "run", "--max_length", "65"))


@pytest.mark.parametrize(
    ("file", "edit", "message"),
    [
        ("sts-train.csv", lambda t: t.split("\n")[0] + "\n", r"sts-train.csv: no usable rows"),
        (
            "ids-sst-train.csv",
            lambda t: "\n".join(r.rsplit("\t", 1)[0] for r in t.splitlines()),
            r"ids-sst-train.csv: no label column; a train file needs its labels",
        ),
        (
            "quora-dev.csv",
            lambda t: "\n".join(r.rsplit("\t", 1)[0] for r in t.splitlines()),
            r"quora-dev.csv: no label column; a dev file needs its labels",
        ),
    ],
)
def test_unusable_data_files_stop_before_training(
    tiny_env, tmp_path, monkeypatch, file, edit, message
):
    path = tiny_env[1] / file
    path.write_text(edit(path.read_text()))
    no_training(monkeypatch)
    with pytest.raises(data.DataError, match=message):
        command.main(tiny_argv(tiny_env, tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # read and checked before a run folder is made


def test_an_unlabeled_heldout_file_stops_before_training(tiny_env, tmp_path, monkeypatch):
    path = tiny_env[1] / "snli-dev.csv"
    path.write_text("\n".join(r.rsplit("\t", 1)[0] for r in path.read_text().splitlines()))
    no_training(monkeypatch)
    with pytest.raises(data.DataError, match=r"snli-dev.csv: no label column; a dev file"):
        command.main(tiny_argv(tiny_env, tmp_path / "run", "--heldout_size", "10"))
    assert not (tmp_path / "run").exists()


def test_user_errors_are_one_line_and_debug_shows_the_traceback(tiny_env, tmp_path):
    from commands.cli import run_cli

    config_json = tiny_env[0] / "config.json"
    config_json.write_text(config_json.read_text()[:-3])
    argv = tiny_argv(tiny_env, tmp_path / "run")
    with pytest.raises(SystemExit, match=r"^error: .*tiny-bert/config.json: not valid JSON"):
        run_cli(command.main, argv)
    with pytest.raises(ModelError):
        run_cli(command.main, [*argv, "--debug"])


def test_a_resumed_config_with_a_wrong_type_names_the_field(tiny_env, tmp_path):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    saved = tmp_path / "run" / "config.json"
    saved.write_text(saved.read_text().replace('"lr": 0.001', '"lr": "fast"'))
    with pytest.raises(SystemExit, match=r"config.json: optim.lr is 'fast'; expected a float"):
        command.parse_args(["--resume", str(tmp_path / "run")])
    saved.write_text("[]")
    with pytest.raises(ModelError, match=r"config.json: expected a JSON object, got list"):
        command.parse_args(["--resume", str(tmp_path / "run")])


def test_a_device_that_does_not_exist_stops_before_a_run_folder_is_made(tmp_path):
    with pytest.raises(SystemExit, match="--device gpu: expected auto, cpu, cuda or cuda:N"):
        command.main(["--device", "gpu", "--run_dir", str(tmp_path / "run"), "--bert", "minilm"])
    assert not (tmp_path / "run").exists()


def test_a_folder_holding_another_presets_run_is_refused(tiny_env, tmp_path, monkeypatch):
    (tmp_path / "run" / "sst").mkdir(parents=True)
    (tmp_path / "run" / "sst" / "state.safetensors").write_bytes(b"individual preset's")
    no_training(monkeypatch)
    with pytest.raises(SystemExit, match="already holds a run"):
        command.main(tiny_argv(tiny_env, tmp_path / "run"))


def test_a_resumed_run_may_change_the_machine_but_not_the_experiment(tiny_env, tmp_path):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    cfg, _ = command.parse_args(["--resume", str(tmp_path / "run"), "--device", "cpu", "--no_amp"])
    assert cfg.device.device == "cpu" and not cfg.device.amp and cfg.optim.lr == 1e-3
    assert json.loads((tmp_path / "run" / "config.json").read_text())["run_dir"] == str(
        tmp_path / "run"
    )
    saved = tmp_path / "run" / "config.json"
    saved.write_text(saved.read_text().replace('"pooling": "mean"', '"pooling": "max"'))
    with pytest.raises(SystemExit, match=r"--pooling 'max' is not one of \['mean', 'cls'\]"):
        command.parse_args(["--resume", str(tmp_path / "run")])


@pytest.mark.parametrize(
    "flags",
    [
        "--preset thesis",
        "--preset thesis --heldout_size 10 --no_test_predictions",
        "--preset simcse",
        "--preset simcse --simcse_data para --simcse_loss mnrl",
        "--preset sicurello-unif",
        "--preset individual",
    ],
)
def test_the_files_a_run_needs_are_the_files_it_reads(tiny_env, tmp_path, monkeypatch, flags):
    """command.plan_files, checked before the run folder is made, against the loaders themselves."""
    cfg, _ = command.parse_args(tiny_flags(tiny_env, tmp_path / "r", flags))
    stages = PRESETS[cfg.preset].plans_of(cfg).stages()
    read = []
    real_task, real_snli = data.read_task, data.read_snli

    def read_task(folder, task, split, *args, **kwargs):
        read.append(data.task_file(folder, task, split))
        return real_task(folder, task, split, *args, **kwargs)

    def read_snli(path, *args, **kwargs):
        read.append(path)
        return real_snli(path, *args, **kwargs)

    monkeypatch.setattr(data, "read_task", read_task)
    monkeypatch.setattr(data, "read_snli", read_snli)
    command.plan_data(cfg, stages, BertTokenizer.from_pretrained(cfg.model.bert))
    assert sorted(set(read)) == sorted(command.plan_files(cfg, stages))


def test_a_missing_data_file_stops_the_run_before_its_folder(tiny_env, tmp_path):
    bert_dir, data_dir = tiny_env
    (data_dir / "snli-dev.csv").unlink()
    command.main(tiny_flags(tiny_env, tmp_path / "ok", "--preset thesis --loops 1 --max_length 64"))
    with pytest.raises(SystemExit, match=r"missing data file\(s\) in .*: snli-dev.csv; fetch them"):
        command.main(tiny_flags(tiny_env, tmp_path / "r", "--heldout_size 10 --max_length 64"))
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("frozen", ["--freeze_encoder --pair_head concat", "--option pretrain"])
def test_pcgrad_on_a_frozen_encoder_stops_before_its_folder(tiny_env, tmp_path, frozen):
    """PCGrad projects the encoder's gradients; a frozen encoder has none (it was a
    traceback from flatten_grads, after the run folder was made)."""
    argv = tiny_argv(tiny_env, tmp_path / "run", "--preset", "multitask", "--weighting", "pcgrad")
    with pytest.raises(SystemExit, match="--weighting pcgrad projects the encoder's gradients"):
        command.main([*argv, *frozen.split()])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ("--pooling cls", "--pooling"),
        ("--smart", "--smart"),
        ("--para_loss mnrl", "--para_loss or --sts_loss"),
        ("--cross_encode para", "--cross_encode"),
        ("--simcse_weight 0.1", "--simcse_weight"),
        ("--option finetune --pair_head concat", "--pair_head"),
        ("--heldout_size 8", "--heldout_size"),
        ("--head_lr_scale 10", "--head_lr_scale"),
    ],
)
def test_a_sentence_bert_flag_on_the_handouts_model_stops_before_its_folder(
    tiny_env, tmp_path, flags, named
):
    """The handout preset trains multitask_classifier.py's MultitaskBERT through its
    predict_*: a flag of sbert.py's SentenceBERT is refused in one line naming it."""
    argv = tiny_argv(tiny_env, tmp_path / "run", "--preset", "handout", *flags.split())
    with pytest.raises(SystemExit, match=f"^{named}: preset handout trains multitask_classifier"):
        command.main(argv)
    assert not (tmp_path / "run").exists()


def test_a_tool_that_reads_sentence_bert_refuses_a_run_of_the_handouts_model():
    """lab.export and lab.explore read SentenceBERT's sentence embeddings and heads: a run of
    the handout's MultitaskBERT is refused in one line, and a project preset's is not."""
    handout, _ = command.parse_args(["--preset", "handout"])
    with pytest.raises(SystemExit, match="^runs/x: --preset handout trains the handout's"):
        command.sentence_bert(handout, "runs/x")
    command.sentence_bert(command.parse_args(["--preset", "demo"])[0], "runs/x")
