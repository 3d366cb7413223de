"""Multitask SBERT heads and the presets, end to end on a tiny random BERT."""

import io
import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

import checkpoint
import datasets as data
import evaluation
import losses
import multitask_classifier as mt
import plans
import runtime
import trainer
from base_bert import BertConfig, ModelError
from bert import BertModel, mean_pool
from config import ModelConfig
from helpers import (
    embeddings,
    interrupt_stage,
    pair_batch,
    run,
    sentence_batch,
    tiny_flags,
    weights,
)
from lab import explore, export
from plans import Stage, concat_tasks, cosine_tasks
from smart import SmartConfig
from tokenizer import BertTokenizer
from trainer import StepContext


def tiny_model(tiny_config, dropout=0.0):
    torch.manual_seed(0)
    return mt.MultitaskBERT(BertModel(tiny_config), dropout=dropout).eval()


def swapped(batch):
    return {k: v.flip(0) for k, v in batch.items()}


def test_head_shapes(tiny_config):
    model = tiny_model(tiny_config)
    assert model("sst", sentence_batch()).shape == (3, 5)
    assert model("para", pair_batch()).shape == (3,)
    score = model("sts", pair_batch())
    assert score.shape == (3,) and (score >= 0).all() and (score <= 5).all()


def test_pair_outputs_are_symmetric(tiny_config):
    model = tiny_model(tiny_config)
    with torch.no_grad():
        for task in ("para", "sts"):
            batch = pair_batch()
            assert torch.allclose(model(task, batch), model(task, swapped(batch)), atol=1e-6)


def test_similarity_of_a_sentence_with_itself_is_five(tiny_config):
    model = tiny_model(tiny_config)
    a = sentence_batch()
    batch = {k: torch.stack([v, v]) for k, v in a.items()}
    assert torch.allclose(model("sts", batch), torch.full((3,), 5.0), atol=1e-5)


def test_siamese_pair_equals_two_separate_forwards(tiny_config):
    model = tiny_model(tiny_config)
    batch = pair_batch()
    with torch.no_grad():
        u, v = (
            model.dropout(
                mean_pool(
                    model.bert(batch["input_ids"][i], batch["attention_mask"][i])[
                        "last_hidden_state"
                    ],
                    batch["attention_mask"][i],
                )
            )
            for i in (0, 1)
        )
        ref = F.cosine_similarity(u, v, dim=-1) * 2.5 + 2.5
        assert torch.allclose(model("sts", batch), ref, atol=1e-6)
        w = model.heads["para"]
        d = (u - v).abs()
        logit = (w(torch.cat([u, v, d], -1)) + w(torch.cat([v, u, d], -1))).squeeze(-1) / 2
        assert torch.allclose(model("para", batch), logit, atol=1e-6)


def test_cross_encoded_pairs_carry_token_types_and_use_a_linear_head(tiny_config):
    tok = FakePairTok()
    examples = [data.PairExample("1", "a", "b", 1.0)]
    batch = data.PairDataset(examples, tok, 16, cross_encode=True).collate([0])
    assert batch["input_ids"].tolist() == [[2, 10, 3, 20, 21, 3]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 1, 1, 1]]
    torch.manual_seed(0)
    model = mt.MultitaskBERT(BertModel(tiny_config), dropout=0.0, cross=("para", "sts")).eval()
    with torch.no_grad():
        pooled = mean_pool(
            model.bert(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])[
                "last_hidden_state"
            ],
            batch["attention_mask"],
        )
        for task in ("para", "sts"):
            ref = model.heads[f"{task}_cross"](pooled).squeeze(-1)  # the head adds no order effect
            assert torch.allclose(model(task, batch), ref, atol=1e-6)


class FakePairTok:
    pad_token_id = 0

    def __call__(self, texts, text_pair=None, **kw):
        ids = [[2, 10, 3, 20, 21, 3] for _ in texts]
        return {"input_ids": ids, "token_type_ids": [[0, 0, 0, 1, 1, 1] for _ in texts]}


# ---------------------------------------------------------------- presets, end to end


def test_plan_runner_writes_table_checkpoint_and_predictions(tiny_env, tmp_path, capsys):
    rows = run(tiny_env, tmp_path / "run", "--loops", "2")
    names = [r["stage"] for r in rows]
    assert names == ["QQP", "loop 1: STS", "loop 1: SST", "loop 1: QQP 3%"] + [
        "loop 2: STS",
        "loop 2: SST",
        "loop 2: QQP 3%",
    ]
    for r in rows:
        overall = (r["sst"]["accuracy"] + r["para"]["accuracy"] + (r["sts"]["pearson"] + 1) / 2) / 3
        assert r["overall"] == pytest.approx(overall)
    out = capsys.readouterr().out
    assert "SST acc" in out and "best stage:" in out
    _, best = checkpoint.read_tensors(tmp_path / "run" / "best.safetensors")
    assert best["row"]["overall"] == max(r["overall"] for r in rows)
    for task in ("sst", "para", "sts"):
        for split in ("dev", "test"):
            assert (tmp_path / "run" / "predictions" / f"{task}-{split}-output.csv").is_file()


@pytest.mark.parametrize("objective", ["sup", "triplet", "unsup", "mnrl", "align_uniform"])
def test_contrastive_objectives_train_the_encoder(tiny_env, tmp_path, objective):
    rows = run(
        tiny_env,
        tmp_path / "run",
        "--preset",
        "simcse",
        "--simcse_loss",
        objective,
        "--simcse_epochs",
        "2",
        "--simcse_batch_size",
        "8",
    )
    assert [r["stage"] for r in rows] == [f"SimCSE ({objective})"]
    assert math.isfinite(rows[0]["train_loss"]) and "sts" in rows[0]


def test_frozen_encoder_presets_train_only_the_heads(tiny_env, tmp_path, monkeypatch):
    import trainer

    snapshots = []
    real = trainer.train_stage

    def snapshot_after(model, *a, **k):
        loss = real(model, *a, **k)
        snapshots.append({n: v.clone() for n, v in model.state_dict().items()})
        return loss

    monkeypatch.setattr(trainer, "train_stage", snapshot_after)
    rows = run(
        tiny_env,
        tmp_path / "run",
        "--preset",
        "equibert",
        "--simcse_epochs",
        "1",
        "--individual_epochs",
        "1",
        "--simcse_batch_size",
        "8",
    )
    assert [r["stage"] for r in rows] == ["SimCSE (align_uniform)", "SST", "QQP"]
    after_simcse, after_sst, after_qqp = snapshots
    for name, value in after_simcse.items():
        if name.startswith("bert."):  # the encoder never moves after the contrastive stage
            assert torch.equal(value, after_qqp[name]), name
    assert not torch.equal(after_simcse["heads.sst.weight"], after_sst["heads.sst.weight"])
    assert not torch.equal(after_sst["heads.para.weight"], after_qqp["heads.para.weight"])


def test_thesis_smart_preset_runs_with_smart_on(tiny_env, tmp_path, monkeypatch):

    calls = {"n": 0}
    real = losses.smart_term

    def counting(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(losses, "smart_term", counting)
    rows = run(tiny_env, tmp_path / "run", "--preset", "thesis-smart", "--smart_batch_size", "8")
    assert len(rows) == 4 and calls["n"] > 0
    assert all(math.isfinite(r["overall"]) for r in rows)


@pytest.mark.parametrize(
    "flags",
    [
        ["--weighting", "equal"],
        ["--weighting", "random", "--examples_per_task", "20"],
        ["--weighting", "pcgrad"],
        ["--mixing", "round_robin", "--order", "random"],
        ["--mixing", "round_robin", "--cross_encode", "para", "sts", "--sts_loss", "l1"],
        ["--para_loss", "contrastive", "--sts_loss", "cosine_mse"],
        ["--para_loss", "mnrl", "--sts_loss", "mnrl"],
    ],
)
def test_multitask_preset_runs(tiny_env, tmp_path, flags):
    rows = run(
        tiny_env, tmp_path / "run", "--preset", "multitask", "--multitask_epochs", "1", *flags
    )
    assert len(rows) == 1 and math.isfinite(rows[0]["train_loss"])


def test_individual_preset_trains_one_model_per_task(tiny_env, tmp_path):
    flags = "--preset individual --individual_epochs 1 --batch_size 16 --max_length 64"
    mt.main(tiny_flags(tiny_env, tmp_path / "run", flags))
    for task in mt.MULTITASK:  # a sub-run per task, scored on its own task only
        rows = (tmp_path / "run" / task / "metrics.jsonl").read_text().splitlines()
        last = json.loads(rows[-1])
        assert last["tasks"] == [task] and set(mt.MULTITASK) & set(last) == {task}
        assert (tmp_path / "run" / task / "predictions" / f"{task}-test-output.csv").is_file()
    for use in (export.main, lambda argv: explore.main(["label", *argv])):  # one model each
        with pytest.raises(SystemExit, match="a model per task"):
            use([str(tmp_path / "run")])


@pytest.mark.parametrize(
    ("preset", "names"),
    [
        ("sequential", ["QQP", "STS", "SST"]),
        (
            "thesis-smart-simcse",
            ["SimCSE (sup)", "QQP", "loop 1: STS", "loop 1: SST", "loop 1: QQP 3%"],
        ),
        ("unsup-simcse", ["SimCSE (unsup)", "SST", "QQP"]),
    ],
)
def test_presets_run_their_stages(tiny_env, tmp_path, preset, names):
    rows = run(
        tiny_env,
        tmp_path / "run",
        "--preset",
        preset,
        "--sequential_epochs",
        "1",
        "1",
        "1",
        "--simcse_epochs",
        "1",
        "--individual_epochs",
        "1",
        "--smart_batch_size",
        "16",
    )
    assert [r["stage"] for r in rows] == names


def test_an_existing_run_folder_is_not_overwritten(tiny_env, tmp_path, monkeypatch):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    saved = (tmp_path / "run" / "config.json").read_text()
    monkeypatch.setattr(mt, "seeded_data", None)  # refused before the data is read
    with pytest.raises(SystemExit, match="already holds a run: continue it with --resume"):
        run(tiny_env, tmp_path / "run", "--loops", "0", "--lr", "0.5")
    assert (tmp_path / "run" / "config.json").read_text() == saved  # the refusal wrote nothing


def test_resume_uses_the_runs_own_flags(tiny_env, tmp_path):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    where = f"--resume {tmp_path / 'run'}: the run was made otherwise: "
    with pytest.raises(SystemExit, match=re.escape(where + "--eval_batch_size 4 (the run's: 128)")):
        mt.parse_args(["--resume", str(tmp_path / "run"), "--eval_batch_size", "4"])
    with pytest.raises(SystemExit, match=re.escape(where + "--preset demo (the run's: thesis)")):
        mt.parse_args(["--resume", str(tmp_path / "run"), "--preset", "demo", "--lr", "1e-3"])
    same = ["--preset", "thesis", "--lr", "1e-3", "--batch_size", "8"]  # as the run was made
    assert mt.parse_args(["--resume", str(tmp_path / "run"), *same])[0].optim.lr == 1e-3
    cfg, folders = mt.parse_args(["--resume", str(tmp_path / "run")])
    assert cfg.optim.lr == 1e-3 and cfg.optim.batch_size == 8  # from the run's config.json
    assert folders == {
        "resume": str(tmp_path / "run"),
        "predict": None,
        "show": None,
        "estimate": None,
    }


def test_resuming_a_finished_run_says_so_and_trains_nothing(tiny_env, tmp_path, capsys):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    rows = (tmp_path / "run" / "metrics.jsonl").read_text()
    capsys.readouterr()
    mt.main(["--resume", str(tmp_path / "run")])
    assert "after all 1 stages: best rescored" in capsys.readouterr().out
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == rows


def test_bad_flag_values_stop_with_the_allowed_values(capsys):
    with pytest.raises(SystemExit):
        mt.parse_args(["--pooling", "max"])
    err = capsys.readouterr().err
    assert "invalid choice: 'max'" in err and "mean" in err and "cls" in err
    with pytest.raises(SystemExit, match="--batch_size must be at least 1, got 0"):
        mt.parse_args(["--batch_size", "0"])


# ---------------------------------------------------------------- bad input, refused early


def tiny_argv(tiny_env, run_dir, *extra):
    return tiny_flags(tiny_env, run_dir, "--max_length 64 --loops 1 --batch_size 8", *extra)


def no_training(monkeypatch):
    """Make any training step fail the test: the checks must come before it."""
    import trainer

    def fail(*a, **k):
        raise AssertionError("training started before the input was checked")

    monkeypatch.setattr(trainer, "train_stage", fail)


def test_a_max_length_beyond_the_position_table_stops_before_training(tiny_env, tmp_path):
    with pytest.raises(SystemExit, match="--max_length 65 is longer than the 64 positions"):
        mt.main(tiny_argv(tiny_env, tmp_path / "run", "--max_length", "65"))


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
        mt.main(tiny_argv(tiny_env, tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # read and checked before a run folder is made


def test_an_unlabeled_heldout_file_stops_before_training(tiny_env, tmp_path, monkeypatch):
    path = tiny_env[1] / "snli-dev.csv"
    path.write_text("\n".join(r.rsplit("\t", 1)[0] for r in path.read_text().splitlines()))
    no_training(monkeypatch)
    with pytest.raises(data.DataError, match=r"snli-dev.csv: no label column; a dev file"):
        mt.main(tiny_argv(tiny_env, tmp_path / "run", "--heldout_size", "10"))
    assert not (tmp_path / "run").exists()


def test_user_errors_are_one_line_and_debug_shows_the_traceback(tiny_env, tmp_path):
    from runtime import run_cli

    config_json = tiny_env[0] / "config.json"
    config_json.write_text(config_json.read_text()[:-3])
    argv = tiny_argv(tiny_env, tmp_path / "run")
    with pytest.raises(SystemExit, match=r"^error: .*tiny-bert/config.json: not valid JSON"):
        run_cli(mt.main, argv)
    with pytest.raises(ModelError):
        run_cli(mt.main, [*argv, "--debug"])


def test_a_full_disk_is_one_line_and_the_run_resumes(tiny_env, tmp_path, monkeypatch):
    import errno
    import os

    import evaluation
    from runtime import run_cli

    def full(*a, **k):  # the predictions, written after the last stage's checkpoint
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real = evaluation.write_predictions
    monkeypatch.setattr(evaluation, "write_predictions", full)
    argv = tiny_argv(tiny_env, tmp_path / "run", "--loops", "0")
    with pytest.raises(SystemExit, match=r"^error: the disk is full; free space and run it again"):
        run_cli(mt.main, argv)
    with pytest.raises(OSError):  # --debug, or another OSError: the traceback
        run_cli(mt.main, [*argv, "--debug", "--run_dir", str(tmp_path / "r2")])
    monkeypatch.setattr(evaluation, "write_predictions", real)
    run_cli(mt.main, ["--resume", str(tmp_path / "run")])
    assert list((tmp_path / "run" / "predictions").glob("*-dev-output.csv"))


def test_gpu_out_of_memory_is_one_line_and_the_run_resumes_in_smaller_pieces(
    tiny_env, tmp_path, monkeypatch
):
    real, calls = trainer.train_step, []

    def step(*args, **kwargs):  # the 10th step (in loop 1: STS) runs out of GPU memory
        calls.append(1)
        if len(calls) == 10:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "train_step", step)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        mt.main(tiny_argv(tiny_env, run_dir))
    assert str(stop.value.code) == (
        f"error: the GPU ran out of memory (Tried to allocate 2.00 GiB); continue from the "
        f"last checkpoint with --resume {run_dir} --accumulate 2 (each batch in 2 pieces, the "
        f"same gradient), or start again with a smaller --batch_size, --max_length or "
        f"--eval_batch_size (scoring)"
    )
    mt.main(["--resume", str(run_dir), "--accumulate", "2"])  # a machine setting
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1 + 4 and (run_dir / "predictions").is_dir()  # start, then 4 stages


def test_a_broken_best_checkpoint_is_found_when_resuming(tiny_env, tmp_path, monkeypatch):
    interrupt_stage(monkeypatch, 2)
    with pytest.raises(SystemExit) as stop:  # main turns the interrupt into a clean stop
        mt.main(tiny_argv(tiny_env, tmp_path / "run"))
    assert stop.value.code == 130
    best = tmp_path / "run" / "best.safetensors"
    best.write_bytes(best.read_bytes()[:50])
    no_training(monkeypatch)
    with pytest.raises(checkpoint.CheckpointError, match="best.safetensors: not a readable"):
        mt.main(["--resume", str(tmp_path / "run")])


def test_a_run_without_its_state_is_not_started_over(tiny_env, tmp_path, monkeypatch):
    interrupt_stage(monkeypatch, 2)
    with pytest.raises(SystemExit):
        mt.main(tiny_argv(tiny_env, tmp_path / "run"))
    (tmp_path / "run" / "state.safetensors").unlink()
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    no_training(monkeypatch)
    with pytest.raises(
        checkpoint.CheckpointError,
        match=r"state.safetensors: missing; nothing .*best.safetensors serves --predict\)$",
    ):
        mt.main(["--resume", str(tmp_path / "run")])
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == metrics  # nothing wiped


def test_sigterm_stops_after_a_checkpoint_and_says_how_to_resume(
    tiny_env, tmp_path, monkeypatch, capsys
):
    import os
    import signal

    import trainer

    real = trainer.train_stage

    def terminated_after(*a, **k):
        loss = real(*a, **k)
        os.kill(os.getpid(), signal.SIGTERM)  # what Colab's stop button or `kill` sends
        return loss

    monkeypatch.setattr(trainer, "train_stage", terminated_after)
    old = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as stop:
            mt.main(tiny_argv(tiny_env, tmp_path / "run"))
    finally:
        signal.signal(signal.SIGTERM, old)
    assert stop.value.code == 130
    assert f"continue it with --resume {tmp_path / 'run'}" in capsys.readouterr().out
    monkeypatch.setattr(trainer, "train_stage", real)
    mt.main(["--resume", str(tmp_path / "run")])
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 5  # start + QQP + one loop of three stages


def test_a_second_process_on_the_same_run_folder_is_refused(tiny_env, tmp_path, monkeypatch):
    no_training(monkeypatch)
    with checkpoint.locked(tmp_path / "run"):
        with pytest.raises(checkpoint.CheckpointError, match="in use by another run"):
            mt.main(tiny_argv(tiny_env, tmp_path / "run"))


def test_a_dev_set_that_scores_nan_never_makes_a_stage_best(tiny_env, tmp_path, capsys):
    dev = tiny_env[1] / "sts-dev.csv"
    lines = dev.read_text().splitlines()
    dev.write_text("\n".join([lines[0]] + [r.rsplit("\t", 1)[0] + "\t2.0" for r in lines[1:]]))
    run(tiny_env, tmp_path / "run", "--loops", "0")  # STS r of constant labels: nan
    assert "no stage had a numeric score" in capsys.readouterr().out
    assert not (tmp_path / "run" / "best.safetensors").exists()
    assert (tmp_path / "run" / "predictions" / "sts-dev-output.csv").is_file()


def test_a_resumed_config_with_a_wrong_type_names_the_field(tiny_env, tmp_path):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    saved = tmp_path / "run" / "config.json"
    saved.write_text(saved.read_text().replace('"lr": 0.001', '"lr": "fast"'))
    with pytest.raises(SystemExit, match=r"config.json: optim.lr is 'fast'; expected a float"):
        mt.parse_args(["--resume", str(tmp_path / "run")])
    saved.write_text("[]")
    with pytest.raises(ModelError, match=r"config.json: expected a JSON object, got list"):
        mt.parse_args(["--resume", str(tmp_path / "run")])


# ---------------------------------------------------------------- a trained model, used


def test_export_writes_a_folder_that_both_loaders_read(tiny_env, tmp_path, capsys):
    import transformers

    run(tiny_env, tmp_path / "run", "--loops", "0")
    export.main([str(tmp_path / "run")])
    out = tmp_path / "run" / "export"
    assert {p.name for p in out.iterdir()} >= {"config.json", "vocab.txt", "model.safetensors"}
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: sentence-transformers\n")
    assert "Kept stage: QQP" in card and "SentenceTransformer(" in card and '"preset"' in card
    ours = BertModel.from_pretrained(str(out)).eval()  # also: --bert RUN/export
    best = weights(tmp_path / "run" / "best.safetensors")
    for name, value in ours.state_dict().items():
        assert torch.equal(value, best[f"bert.{name}"]), name
    hf = transformers.BertModel.from_pretrained(str(out)).eval()
    batch = sentence_batch(vocab=ours.config.vocab_size)
    with torch.no_grad():
        a = ours(batch["input_ids"], batch["attention_mask"])["last_hidden_state"]
        b = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    assert torch.allclose(a, b.last_hidden_state, atol=1e-5)
    heads, _ = checkpoint.read_tensors(out / "heads.safetensors")
    assert torch.equal(heads["sst.weight"], best["heads.sst.weight"])


def test_label_gives_a_sentiment_or_a_pair_score_per_line(tiny_env, tmp_path, monkeypatch, capsys):
    import io

    run(tiny_env, tmp_path / "run", "--loops", "0")
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO("good movie\nthe cat\tthe dog\n\n"))
    explore.main(["label", str(tmp_path / "run")])  # prints each line's labels as it goes
    lines = capsys.readouterr().out.splitlines()[-2:]
    assert re.fullmatch(r"sentiment [0-4] \(p 0\.\d\d\)\tgood movie", lines[0])
    assert re.fullmatch(r"paraphrase 0\.\d{3}\tsimilarity [0-5]\.\d\d\tthe cat\tthe dog", lines[1])
    for text, message in [
        ("ok\nid\tsentence\tsentiment\n", "3 tab-separated fields"),  # a csv's header row
        ("ok\n\tthe dog\n", "an empty side of the tab"),
        ("ok\nthe cat\t \n", "an empty side of the tab"),
    ]:
        monkeypatch.setattr("sys.stdin", io.StringIO(text))
        with pytest.raises(data.DataError, match=rf"^input line 2: {message}; expected a sent"):
            explore.main(["label", str(tmp_path / "run")])


def test_label_input_that_is_not_utf8_or_a_reader_that_stops_is_quiet(
    tiny_env, tmp_path, monkeypatch
):
    import io
    import os

    from runtime import run_cli

    run(tiny_env, tmp_path / "run", "--loops", "0")
    strict = io.TextIOWrapper(io.BytesIO(b"caf\xe9\n"), encoding="utf-8")  # Latin-1 bytes
    monkeypatch.setattr("sys.stdin", strict)
    with pytest.raises(SystemExit, match=r"^error: input after 0 good line\(s\): not UTF-8 text"):
        run_cli(explore.main, ["label", str(tmp_path / "run")])
    read, write = os.pipe()
    os.close(read)  # `| head` that has read enough
    monkeypatch.setattr("sys.stdin", io.StringIO("good movie\n"))
    monkeypatch.setattr("sys.stdout", io.TextIOWrapper(os.fdopen(write, "wb"), line_buffering=True))
    with pytest.raises(SystemExit) as stop:
        run_cli(explore.main, ["label", str(tmp_path / "run")])
    assert stop.value.code == 1


def test_a_device_that_does_not_exist_stops_before_a_run_folder_is_made(tmp_path):
    with pytest.raises(SystemExit, match="--device gpu: expected auto, cpu, cuda or cuda:N"):
        mt.main(["--device", "gpu", "--run_dir", str(tmp_path / "run"), "--bert", "minilm"])
    assert not (tmp_path / "run").exists()


def test_a_folder_holding_another_presets_run_is_refused(tiny_env, tmp_path, monkeypatch):
    (tmp_path / "run" / "sst").mkdir(parents=True)
    (tmp_path / "run" / "sst" / "state.safetensors").write_bytes(b"individual preset's")
    no_training(monkeypatch)
    with pytest.raises(SystemExit, match="already holds a run"):
        mt.main(tiny_argv(tiny_env, tmp_path / "run"))


def test_a_resumed_run_may_change_the_machine_but_not_the_experiment(tiny_env, tmp_path):
    run(tiny_env, tmp_path / "run", "--loops", "0")
    cfg, _ = mt.parse_args(["--resume", str(tmp_path / "run"), "--device", "cpu", "--no_amp"])
    assert cfg.device.device == "cpu" and not cfg.device.amp and cfg.optim.lr == 1e-3
    assert json.loads((tmp_path / "run" / "config.json").read_text())["run_dir"] == str(
        tmp_path / "run"
    )
    saved = tmp_path / "run" / "config.json"
    saved.write_text(saved.read_text().replace('"pooling": "mean"', '"pooling": "max"'))
    with pytest.raises(SystemExit, match=r"--pooling 'max' is not one of \['mean', 'cls'\]"):
        mt.parse_args(["--resume", str(tmp_path / "run")])


def test_the_defended_preset_sets_its_tools_and_keeps_the_forgetting_measures(tiny_env, tmp_path):
    cfg, _ = mt.parse_args(["--preset", "defended", "--lr", "1e-5"])
    assert cfg.optim.lr == 1e-5  # a typed flag wins over the preset's 3e-5
    assert (cfg.optim.head_lr_scale, cfg.optim.warmup, cfg.optim.decay) == (50.0, 0.1, "linear")
    assert cfg.optim.distill == 30.0
    assert cfg.multitask.sts_loss == "cosine_sbert" and not cfg.smart.enabled
    run(tiny_env, tmp_path / "run", "--preset", "defended")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    kept = json.loads((tmp_path / "run" / "forgetting.json").read_text())
    assert kept == evaluation.forgetting(rows, mt.MULTITASK)
    assert set(kept) == {"sst", "para", "sts", "overall"}


@pytest.mark.parametrize("loss", ["bce", "contrastive", "mnrl"])
def test_qqp_is_scored_by_what_its_loss_trained(tiny_env, tmp_path, monkeypatch, capsys, loss):
    bert_dir, _ = tiny_env
    started = {}
    real_run_plan = trainer.run_plan

    def run_plan(plan, model, *args):  # the heads as training finds them
        started.update({k: v.clone() for k, v in model.heads.state_dict().items()})
        return real_run_plan(plan, model, *args)

    monkeypatch.setattr(mt, "run_plan", run_plan)
    flags = ["--preset", "sequential", "--sequential_epochs", "1", "1", "1", "--para_loss", loss]
    run(tiny_env, tmp_path / "run", *flags)
    trained = weights(tmp_path / "run" / "state.safetensors")
    if loss == "bce":  # the head that the loss trains is the one that scores
        assert not torch.equal(trained["heads.para.weight"], started["para.weight"])
        return
    # the loss trains the embeddings only: no head, a cosine cut fit on training pairs
    assert "para.weight" not in started and trained["para_threshold"] != 0
    cfg = mt.load_run_config(tmp_path / "run")
    model, info = mt.best_model(cfg, tmp_path / "run", runtime.make_runtime("cpu", "fp32"))
    tokenizer = BertTokenizer.from_pretrained(str(bert_dir))
    dev = data.load_task_data(cfg.data, tokenizer, ("para",), 0)["para"].dev
    hits = []
    with torch.no_grad():
        for batch in data.make_loader(dev, 64, shuffle=False):
            z = model.sentences(batch)  # (2B, H)
            u, v = z.view(2, -1, z.size(-1))
            cos = F.cosine_similarity(u, v, dim=-1)  # (B,)
            hits += ((cos > model.para_threshold) == (batch["labels"] > 0.5)).tolist()
    assert info["row"]["para"]["accuracy"] == pytest.approx(sum(hits) / len(hits))
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO("the cat\tthe dog\n"))
    explore.main(["label", str(tmp_path / "run")])  # a cut, not a probability
    line = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(r"paraphrase (yes|no) \(cos - cut [+-]\d\.\d{3}\)\tsimilarity .*", line)


def test_a_held_out_set_is_scored_after_every_stage_and_measured(tiny_env, tmp_path):
    rows = run(tiny_env, tmp_path / "run", "--heldout_size", "12")
    run(tiny_env, tmp_path / "plain")  # scoring more leaves training's random draws alone
    a, b = (
        weights(tmp_path / "run" / "state.safetensors"),
        weights(tmp_path / "plain" / "state.safetensors"),
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(0.0 <= r["heldout"] <= 1.0 for r in rows)
    kept = json.loads((tmp_path / "run" / "forgetting.json").read_text())
    start = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert kept["heldout"]["final_minus_start"] == pytest.approx(
        rows[-1]["heldout"] - start["heldout"]
    )


def test_concatenation_heads_are_a_linear_on_u_and_v(tiny_config):
    torch.manual_seed(0)
    model = mt.MultitaskBERT(BertModel(tiny_config), dropout=0.0, concat=("para", "sts")).eval()
    H = tiny_config.hidden_size
    assert model.heads["para"].in_features == model.heads["sts"].in_features == 2 * H
    batch = pair_batch()
    with torch.no_grad():
        u, v = embeddings(model, batch)
        for task in ("para", "sts"):
            head = model.heads[task]
            expected = torch.cat([u, v], -1) @ head.weight.T + head.bias  # (B, 1)
            assert torch.allclose(model(task, batch), expected.squeeze(-1), atol=1e-6)


def test_euclidean_siamese_outputs_the_distance_and_cuts_on_it(tiny_config):
    torch.manual_seed(0)
    bert = BertModel(tiny_config)
    model = mt.MultitaskBERT(bert, dropout=0.0, cosine=("para",), siamese="euclidean").eval()
    model.para_threshold.fill_(0.7)
    batch = pair_batch()
    with torch.no_grad():
        u, v = embeddings(model, batch)
        d = torch.tensor([math.dist(a, b) for a, b in zip(u.tolist(), v.tolist(), strict=True)])
        assert torch.allclose(model("sts", batch), d, atol=1e-5)
        assert torch.allclose(model("para", batch), d - 0.7, atol=1e-5)  # d > 0.7: paraphrase
    assert model.config()["siamese"] == "euclidean"


def test_the_euclidean_output_is_the_distance_of_the_embeddings_not_of_dropped_ones(
    tiny_config,
):
    torch.manual_seed(0)
    quiet = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    bert = BertModel(BertConfig(**tiny_config.to_dict() | quiet))
    model = mt.MultitaskBERT(bert, dropout=0.5, siamese="euclidean").train()  # head dropout on
    batch = pair_batch()
    u, v = embeddings(model, batch)
    assert torch.allclose(model("sts", batch), (u - v).norm(dim=-1), atol=1e-5)


@pytest.mark.parametrize(
    ("preset", "cosine", "concat", "cross"),
    [
        ("broadhurst-2", (), ("para", "sts"), ()),
        ("broadhurst-3", ("para",), (), ()),
        ("broadhurst-5", (), ("para",), ()),
        ("auslin-siamese", ("para",), (), ()),
        ("auslin-segments-gs-l1", (), (), ("para", "sts")),
        ("auslin-siamese-cosine-mse", ("para",), (), ()),
    ],
)
def test_each_task_is_read_out_by_what_its_loss_trains(preset, cosine, concat, cross):
    cfg, _ = mt.parse_args(["--preset", preset])
    assert cosine_tasks(cfg) == cosine and concat_tasks(cfg) == concat
    assert tuple(cfg.multitask.cross_encode) == cross


def test_the_sentence_bert_sts_target_keeps_the_cosine_under_concat_heads():
    cfg, _ = mt.parse_args(["--preset", "broadhurst-2", "--sts_loss", "cosine_sbert"])
    assert concat_tasks(cfg) == ("para",)


@pytest.mark.slow
def test_compiled_layers_train_as_the_eager_ones(tiny_env):
    """--compile on the CPU (inductor, a C compiler): the same outputs and gradients as
    eager, dropout on, and SMART's replayed dropout masks still replayed."""
    bert_dir, _ = tiny_env
    batch = sentence_batch(vocab=40) | {"labels": torch.tensor([0, 4, 2])}
    models = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        models[compiled] = mt.model_factory(
            ModelConfig(bert=str(bert_dir)), mt.MULTITASK, (), compiled
        )()
    grads, outs = {}, {}
    for compiled, model in models.items():
        torch.manual_seed(1)
        outs[compiled] = model.train()("sst", batch)
        outs[compiled].square().sum().backward()
        grads[compiled] = torch.cat(
            [p.grad.flatten() for p in model.parameters() if p.grad is not None]
        )
    torch.testing.assert_close(outs[True], outs[False], rtol=1e-5, atol=1e-6)
    scale = grads[False].abs().max().item()
    torch.testing.assert_close(grads[True], grads[False], rtol=1e-4, atol=1e-5 * scale)
    smart = SmartConfig(lambda_s=1, mu=0, sigma=1e-9, eta=1e-7, epsilon=1e-9, dropout="shared")
    stage = Stage(("sst",), 1e-3, 3, smart=smart)
    ctx = StepContext(runtime.make_runtime("cpu", "fp32"))
    plain = Stage(("sst",), 1e-3, 3)
    torch.manual_seed(2)
    with_r_s = losses.batch_loss(models[True], "sst", batch, stage, ctx)
    torch.manual_seed(2)
    without = losses.batch_loss(models[True], "sst", batch, plain, ctx)
    assert 0 <= (with_r_s - without).item() < 1e-9  # the perturbed pass saw the same masks


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
    """plans.plan_files, checked before the run folder is made, against the loaders themselves."""
    cfg, _ = mt.parse_args(tiny_flags(tiny_env, tmp_path / "r", flags))
    stages = [s for plan in mt.PRESETS[cfg.preset].plans_of(cfg).values() for s in plan]
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
    plans.plan_data(cfg, stages, mt.BertTokenizer.from_pretrained(cfg.model.bert))
    assert sorted(set(read)) == sorted(plans.plan_files(cfg, stages))


def test_a_missing_data_file_stops_the_run_before_its_folder(tiny_env, tmp_path):
    bert_dir, data_dir = tiny_env
    (data_dir / "snli-dev.csv").unlink()
    mt.main(tiny_flags(tiny_env, tmp_path / "ok", "--preset thesis --loops 1 --max_length 64"))
    with pytest.raises(SystemExit, match=r"missing data file\(s\) in .*: snli-dev.csv; fetch them"):
        mt.main(tiny_flags(tiny_env, tmp_path / "r", "--heldout_size 10 --max_length 64"))
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_the_demo_trains_and_scores_the_same_sizes_on_the_handouts_real_size(
    tiny_env, tmp_path, capsys
):
    """On a data folder of the 2023 handout's size (141,506 Quora training pairs), the demo
    trains 12,000 and scores 2,000 per task: its length does not grow with the data."""
    from make_handout_standin import build

    bert_dir, small = tiny_env
    handout = tmp_path / "handout"
    assert build(small, handout)["quora-train.csv"] == 141_506
    flags = ["--preset", "demo", "--bert", str(bert_dir), "--data_dir", str(handout)]
    mt.main([*flags, "--precision", "fp32", "--estimate"])
    out = capsys.readouterr().out
    assert "QQP: 12000 train, 2000 dev, 2000 test" in out
    assert re.search(r"\nQQP +375 +12000 ", out) and re.search(r"\nloop 1: QQP 3% +12 +360 ", out)


def test_estimate_times_each_kind_of_stage_once_and_makes_no_folder(
    tiny_env, tmp_path, capsys, monkeypatch
):
    timed = []
    real = trainer.time_steps
    monkeypatch.setattr(trainer, "time_steps", lambda *a: timed.append(a[2].tasks) or real(*a))
    flags = "--preset thesis --loops 2 --max_length 64 --estimate"
    mt.main(tiny_flags(tiny_env, tmp_path / "r", flags))
    out = capsys.readouterr().out
    assert not (tmp_path / "r").exists()
    stages = ["QQP", "loop 1: STS", "loop 1: SST", "loop 1: QQP 3%", "loop 2: STS"]
    assert all(f"\n{s} " in out for s in stages) and "whole run: about" in out
    assert timed == [("para",), ("sts",), ("sst",)]  # QQP 3% is timed as QQP is
    rows = [line.split() for line in out.splitlines() if line.startswith("loop 1: SST ")]
    assert rows[0][3:5] == ["2", "48"]  # 48 training sentences in batches of 32: 2 steps


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_sentence_transformers_loads_the_export_and_gives_our_embeddings(
    tiny_env, tmp_path, pooling
):
    """sentence-transformers is an independent reader of the folder: its own tokenizer
    (transformers' BertTokenizer from vocab.txt and tokenizer_config.json), encoder and
    mean pooling must give our model's sentence embeddings. CLS pooling reads BERT's pooler,
    which sentence-transformers has no module for: no such layout is written."""
    import warnings

    from sentence_transformers import SentenceTransformer

    run(tiny_env, tmp_path / "run", "--loops", "0", "--pooling", pooling)
    export.main([str(tmp_path / "run")])
    out = tmp_path / "run" / "export"
    if pooling == "cls":
        assert not (out / "modules.json").exists()
        return
    cfg, _ = mt.parse_args(["--predict", str(tmp_path / "run")])
    model, _ = mt.best_model(cfg, tmp_path / "run", runtime.make_runtime("cpu", "fp32"))
    tokenizer = mt.BertTokenizer.from_pretrained(cfg.model.bert)
    sentences = ["a good film", "the dull one , awful !", "great"]
    batch = data.SentenceDataset(
        [data.SentenceExample(str(i), s, None) for i, s in enumerate(sentences)],
        tokenizer,
        cfg.data.max_length,
    ).collate([0, 1, 2])
    with torch.no_grad():
        ours = model.sentences(batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loads silently: no guessed pooling
        st = SentenceTransformer(str(out), device="cpu")
    theirs = st.encode(sentences, convert_to_tensor=True)
    assert st.max_seq_length == cfg.data.max_length
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
