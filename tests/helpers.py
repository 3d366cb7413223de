"""Small batches, the tiny model with its data, and an end-to-end run of
command.main on the tiny BERT."""

import copy
import json
import shutil
from dataclasses import replace
from pathlib import Path

import torch

import batches
import datasets as data
import trainer
from commands import command
from engine import checkpoint, runtime
from evaluation import MULTITASK
from presets import Stage
from settings import DataConfig, ModelConfig, MultitaskConfig
from tokenizer import BertTokenizer
from trainer import StepContext


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


def tiny_flags(tiny_env, run_dir, flags: str = "", *extra) -> list[str]:
    """--bert, --data_dir and --run_dir of the tiny model, data and a run folder (the copies
    of its predictions beside it, not in ./predictions/), float32 whatever this CPU offers
    (a later --precision wins), then the flags in `flags` (split at spaces) and `extra`."""
    bert_dir, data_dir = tiny_env
    where = ["--bert", str(bert_dir), "--data_dir", str(data_dir), "--run_dir", str(run_dir)]
    where += ["--predictions_dir", f"{run_dir}-predictions"]
    return where + ["--precision", "fp32"] + flags.split() + list(extra)


def run(tiny_env, run_dir, *extra):
    """main() on the tiny data; returns the rows after the start row."""
    flags = "--batch_size 8 --lr 1e-3 --seed 0 --loops 1 --max_length 64"
    command.main(tiny_flags(tiny_env, run_dir, flags, *extra))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["stage"] == "start (no training)"  # scored before any training
    return rows[1:]


def tiny_model_and_data(tiny_env):
    """A SentenceBERT on the tiny checkpoint (seed 0) and the tiny data, tokenized."""
    bert_dir, data_dir = tiny_env
    tok = BertTokenizer.from_pretrained(str(bert_dir))
    task_data = data.load_task_data(DataConfig(data_dir=str(data_dir)), tok, MULTITASK, 0)
    torch.manual_seed(0)
    model = command.model_factory(ModelConfig(bert=str(bert_dir)), MULTITASK)()
    return model, task_data


def first_batch(task_data, task, size):
    return next(iter(batches.make_loader(task_data[task].train, size, shuffle=False)))


def two_sets(seed=0, B=5, H=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, generator=g), torch.randn(B, H, generator=g)


def embeddings(model, batch):
    z = model.sentences(batch)  # (2B, H); dropout is 0
    return z.view(2, -1, z.size(-1)).unbind(0)


def tiny_argv(tiny_env, run_dir, *extra):
    """tiny_flags for a one-loop run of 64 tokens in batches of 8, then `extra`."""
    return tiny_flags(tiny_env, run_dir, "--max_length 64 --loops 1 --batch_size 8", *extra)


def no_training(monkeypatch):
    """Make any training step fail the test: the checks must come before it."""

    def fail(*a, **k):
        raise AssertionError("training started before the input was checked")

    monkeypatch.setattr(trainer, "train_stage", fail)


def gradient_of_one_step(tiny_env, optim, weighting="random", precision="fp32"):
    """(loss, gradients, the norm it reports) of one multitask train_step (lr 0, eval mode:
    no dropout); under float16 the scaler's step leaves the gradients unscaled."""
    model, task_data = tiny_model_and_data(tiny_env)
    model.eval()
    stage = Stage(
        MULTITASK, 0.0, 7, kind="multitask", multitask=MultitaskConfig(weighting=weighting)
    )
    step = [(t, first_batch(task_data, t, 7)) for t in MULTITASK]
    optimizer = model.configure_optimizers(optim)
    rt = runtime.make_runtime("cpu", precision)
    generator = torch.Generator().manual_seed(3)
    loss, norm = trainer.train_step(
        model, optimizer, stage, step, StepContext(rt, optim), generator
    )
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert len(grads) > 20  # the encoder's and the heads' (the unused pooler has none)
    return loss.item(), grads, norm.item()


class RecordedBar:
    """A stand-in for tqdm that records what a progress bar was told."""

    made: list = []

    def __init__(self, iterable=None, **kwargs):
        self.iterable, self.kwargs, self.done = iterable, kwargs, 0
        RecordedBar.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __iter__(self):
        return iter(self.iterable)

    def update(self, n):
        self.done += n


class NoUpdate:
    """An optimizer that holds nothing: train_step sets its (no) learning rates."""

    param_groups: list = []

    def zero_grad(self, set_to_none=True):
        pass


class Catching:
    """A loss scaler that keeps each loss it is asked to scale and hands back one whose
    backward reaches nothing: the step runs whole, and no gradient is made."""

    def __init__(self):
        self.caught = []

    def scale(self, loss):
        self.caught.append(loss)
        return torch.zeros((), requires_grad=True)

    def unscale_(self, optimizer):
        pass

    def step(self, optimizer):
        pass

    def update(self):
        pass


def batch_loss(model, task, batch, stage, ctx) -> torch.Tensor:
    """One batch's loss as trainer.train_step computes it (the forward, the task's loss,
    SMART's and distillation's terms, the SimCSE term), its graph kept: the step itself,
    run on that one batch through its public seams: a scaler that catches the loss, an
    optimizer that holds nothing, SMART's teacher a copy (its update left on the copy)."""
    catching = Catching()
    teacher = copy.deepcopy(ctx.teacher) if ctx.teacher else None
    ctx = replace(ctx, rt=replace(ctx.rt, scaler=catching), teacher=teacher)
    trainer.train_step(model, NoUpdate(), stage, [(task, batch)], ctx, torch.Generator())
    (loss,) = catching.caught
    return loss


def a_clone(tmp_path) -> Path:
    """A folder holding the repository's code (the top-level modules, engine/ and commands/), where a
    student runs the handout's commands and prepare_submit.py."""
    repo = Path(__file__).resolve().parents[1]
    folder = tmp_path / "clone"
    folder.mkdir()
    for f in repo.glob("*.py"):
        shutil.copy2(f, folder / f.name)
    for package in ("engine", "commands"):
        shutil.copytree(repo / package, folder / package, ignore=shutil.ignore_patterns("__py*"))
    return folder
