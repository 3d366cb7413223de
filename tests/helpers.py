"""Small batches and an end-to-end run of multitask_classifier.main on the tiny BERT."""

import json

import torch

import checkpoint
import multitask_classifier as mt


def sentence_batch(B=3, T=5, vocab=100, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 3:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def pair_batch(B=3, T=5, vocab=100, seed=0):
    a, b = sentence_batch(B, T, vocab, seed), sentence_batch(B, T, vocab, seed + 1)
    return {k: torch.stack([a[k], b[k]]) for k in a}  # (2, B, T)


def weights(path):
    """The model tensors of a checkpoint file (best or state), by parameter name."""
    return checkpoint.split(checkpoint.read_tensors(path)[0], "model.")


def interrupt_stage(monkeypatch, n):
    """Make the n-th call of trainer.train_stage raise KeyboardInterrupt (a Ctrl-C)."""
    import trainer

    real, calls = trainer.train_stage, {"n": 0}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "train_stage", interrupted)


def sigterm_on_call(monkeypatch, owner, name, n):
    """Make the n-th call of owner.name send SIGTERM to this process (a stop from outside)."""
    import os
    import signal

    real, calls = getattr(owner, name), {"n": 0}

    def stopped(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, stopped)


def assert_same_run(straight_rows, straight_dir, resumed_dir):
    """The resumed run's table rows (but their times) and final weights equal the
    uninterrupted run's, bit for bit."""
    rows = [json.loads(r) for r in (resumed_dir / "metrics.jsonl").read_text().splitlines()[1:]]
    drop = ("seconds",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows] == [
        {k: v for k, v in r.items() if k not in drop} for r in straight_rows
    ]
    a, b = weights(straight_dir / "state.safetensors"), weights(resumed_dir / "state.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def run(tiny_env, run_dir, *extra):
    """main() on the tiny data; returns the rows after the start row."""
    bert_dir, data_dir = tiny_env
    argv = [
        "--bert", str(bert_dir), "--data_dir", str(data_dir), "--run_dir", str(run_dir),
        "--batch_size", "8", "--lr", "1e-3", "--seed", "0", "--loops", "1", "--max_length", "64",
        *extra,
    ]  # fmt: skip
    mt.main(argv)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["stage"] == "start (no training)"  # scored before any training
    return rows[1:]
