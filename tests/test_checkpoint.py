"""Checkpoints: safetensors + JSON, atomic writes, no unpickling, clear refusals."""

import errno
import json
import os
import signal

import pytest
import torch

import sbert
from bert import BertModel
from engine import checkpoint
from smart import EMATeacher


def tiny(tiny_config, **kw):
    torch.manual_seed(0)
    return sbert.SentenceBERT(BertModel(tiny_config), **kw)


def test_checkpoint_from_another_config_says_what_differs(tiny_config, tmp_path):
    checkpoint.save_best(tiny(tiny_config), {}, tmp_path / "m.safetensors")
    other = tiny(tiny_config, pooling="cls")
    with pytest.raises(checkpoint.CheckpointError, match="pooling: 'mean' vs 'cls'"):
        checkpoint.load_model(other, tmp_path / "m.safetensors")


def test_state_round_trip_restores_model_optimizer_and_generators(tiny_config, tmp_path):
    model = tiny(tiny_config)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model.heads["sst"].weight.sum().backward()
    opt.step()
    progress = {"best": {"score": float("-inf"), "stage": None, "index": None}, "rows": [{"a": 1}]}
    progress["next_stage"] = 3
    checkpoint.save_state(model, opt, None, progress, tmp_path / "s.safetensors")
    expected_draw = torch.rand(3)
    other = tiny(tiny_config)
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    loaded, extra, rng = checkpoint.load_state(other, other_opt, None, tmp_path / "s.safetensors")
    assert loaded == progress and extra == {}
    checkpoint.set_rng_state(*rng)
    assert torch.equal(torch.rand(3), expected_draw)  # the generator continues where it was
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    sa, sb = opt.state_dict()["state"], other_opt.state_dict()["state"]
    assert all(torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) for i in sa)


def test_a_best_model_copied_over_the_training_state_is_refused(tiny_config, tmp_path):
    model = tiny(tiny_config)
    checkpoint.save_best(model, {"stage": "1 sst"}, tmp_path / checkpoint.STATE)
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(checkpoint.CheckpointError, match="not a training state .*best.safetensors"):
        checkpoint.load_state(model, opt, None, tmp_path / checkpoint.STATE)


def test_a_crafted_pickle_is_refused_not_run(tiny_config, tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"model": Evil()}, tmp_path / "best.safetensors")
    with pytest.raises(checkpoint.CheckpointError, match="not a readable checkpoint"):
        checkpoint.load_model(tiny(tiny_config), tmp_path / "best.safetensors")
    assert not marker.exists()


def test_a_truncated_checkpoint_says_so(tiny_config, tmp_path):
    path = tmp_path / "best.safetensors"
    checkpoint.save_best(tiny(tiny_config), {}, path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(checkpoint.CheckpointError, match=r"best.safetensors: not a readable"):
        checkpoint.load_model(tiny(tiny_config), path)


def test_a_full_disk_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    checkpoint.atomic_write("old\n", path)

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", no_space)
    with pytest.raises(checkpoint.CheckpointError, match="disk is full.*previous metrics.jsonl"):
        checkpoint.atomic_write("new\n", path)
    assert path.read_text() == "old\n" and sorted(tmp_path.iterdir()) == [path]


def test_an_interrupt_during_a_write_waits_for_the_write(tmp_path, monkeypatch):
    real = os.replace

    def interrupted_replace(a, b):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of the write
        real(a, b)

    monkeypatch.setattr(checkpoint.os, "replace", interrupted_replace)
    # Ctrl-C as a terminal delivers it (a background job, `make test &`, starts ignoring it)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            checkpoint.atomic_write("whole\n", tmp_path / "f.txt")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (tmp_path / "f.txt").read_text() == "whole\n"


def test_a_run_folder_that_cannot_be_made_says_why(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(checkpoint.CheckpointError, match="cannot make the run folder .*afile"):
        with checkpoint.locked(tmp_path / "afile" / "run"):
            pass


def test_a_run_folder_that_cannot_be_written_says_why(tmp_path):
    (tmp_path / "run" / ".lock").mkdir(parents=True)  # unopenable, even for root
    match = "cannot write in the run folder .*run: Is a directory"
    with pytest.raises(checkpoint.CheckpointError, match=match):
        with checkpoint.locked(tmp_path / "run"):
            pass


def test_a_run_folder_is_locked_while_a_run_writes(tmp_path):
    with checkpoint.locked(tmp_path / "run"):
        with pytest.raises(checkpoint.CheckpointError, match="in use by another run"):
            with checkpoint.locked(tmp_path / "run"):
                pass
    with checkpoint.locked(tmp_path / "run"):  # released when the first run ends
        pass


def test_an_interrupt_during_a_write_inside_a_stage_is_noted_not_raised(tmp_path, monkeypatch):
    real = os.replace

    def interrupted_replace(a, b):
        os.kill(os.getpid(), signal.SIGTERM)  # a stop while a checkpoint is being written
        real(a, b)

    monkeypatch.setattr(checkpoint.os, "replace", interrupted_replace)
    with checkpoint.signals_caught() as stop:  # as train_stage holds them
        checkpoint.atomic_write("whole\n", tmp_path / "f.txt")
    assert stop == [signal.SIGTERM] and (tmp_path / "f.txt").read_text() == "whole\n"


def test_the_step_log_keeps_what_the_checkpoint_holds(tmp_path):
    path = tmp_path / checkpoint.STEPS
    lines = [json.dumps({"stage": s, "step": t}) for s in (0, 1) for t in (1, 2, 3)]
    path.write_text("\n".join(lines) + '\n{"stage": 1, "st')  # a kill cut the last line short
    checkpoint.keep_logged_steps(path, {"next_stage": 1, "within": {"step": 2}})
    kept = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(r["stage"], r["step"]) for r in kept] == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)]
    checkpoint.keep_logged_steps(path, {"next_stage": 1})  # a checkpoint between stages
    assert len(path.read_text().splitlines()) == 3


def test_rows_round_trip_through_the_run_folder(tmp_path):
    rows = [{"stage": "start (no training)", "index": -1}, {"stage": "QQP", "index": 0}]
    checkpoint.write_rows(tmp_path, rows)
    assert checkpoint.read_rows(tmp_path) == rows
    assert (tmp_path / checkpoint.METRICS).read_text().count("\n") == 2


def test_generator_states_come_back_in_the_order_of_their_devices():
    states = {"cuda.10": "ten", "cuda.2": "two", "cuda.0": "zero", "torch": "cpu"}
    assert checkpoint.by_index(states, "cuda.") == ["zero", "two", "ten"]


def test_a_model_saved_by_hugging_faces_names_loads_and_a_stranger_is_refused(
    tiny_config, tmp_path
):
    """A run written before bert.py took the handout's names (its encoder's tensors by
    Hugging Face's: bert.encoder.layer.0.attention.self.query.weight, ...) loads through
    BertModel's name map; a tensor this model lacks is refused in one line, naming it."""
    from base_bert import ours_to_hf

    model = tiny(tiny_config)
    path = tmp_path / "m.safetensors"
    checkpoint.save_best(model, {}, path)
    tensors, info = checkpoint.read_tensors(path)
    bert = "model.bert."
    old = {
        bert + ours_to_hf(k[len(bert) :]) if k.startswith(bert) else k: v
        for k, v in tensors.items()
    }
    assert "model.bert.encoder.layer.0.attention.self.query.weight" in old
    checkpoint.write_tensors(old, info, path)
    other = tiny(tiny_config)
    torch.nn.init.zeros_(other.bert.bert_layers[0].self_attention.query.weight)
    checkpoint.load_model(other, path)
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    checkpoint.write_tensors(old | {"model.bert.stray.weight": torch.zeros(1)}, info, path)
    with pytest.raises(checkpoint.CheckpointError, match="not this model's .*bert.stray.weight"):
        checkpoint.load_model(tiny(tiny_config), path)
    teacher = EMATeacher(model)  # its saved parameters, by the same old names
    saved = {
        "bert." + ours_to_hf(k[5:]) if k.startswith("bert.") else k: v.clone()
        for k, v in teacher.params.items()
    }
    teacher.restore(saved, 7)
    assert teacher.params.keys() == dict(model.named_parameters()).keys() and teacher.step == 7
