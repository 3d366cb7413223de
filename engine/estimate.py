"""--estimate: a run's expected minutes on this device and precision, from a few real steps
of each kind of stage (trainer.train_step), before any run folder is made."""

import time
from dataclasses import replace

import torch

from datasets import head
from engine.flags import OptimConfig
from presets import Stage
from smart import EMATeacher
from trainer import StepContext, prepare, stage_steps, train_step


def time_steps(model, optim: OptimConfig, stage: Stage, steps, reference, rt) -> float:
    """Seconds per padded token of train_step on `steps` (--estimate), timed on a second
    pass: the first use of a shape builds its kernels."""
    teacher = EMATeacher(model, stage.smart) if stage.smart.mu > 0 else None
    ctx = StepContext(rt, optim, teacher, reference)
    optimizer = model.configure_optimizers(optim)
    prepare(model, stage)
    model.train()
    for step in steps:
        train_step(model, optimizer, stage, step, ctx, torch.Generator())
    t0 = time.perf_counter()
    for step in steps:
        train_step(model, optimizer, stage, step, ctx, torch.Generator())
    seconds = time.perf_counter() - t0
    model.bert.requires_grad_(True)
    return seconds / sum(b["input_ids"].numel() for step in steps for _, b in step)


def estimate_plans(plans: dict, model, task_data, cfg, reference, rt, scoring: float, probe=4):
    """Print each stage's expected minutes and return the whole run's: `probe` real steps
    of each kind of stage on this device and precision, each run twice and timed the second
    time (kernels for a new shape are built on first use), give seconds per padded token,
    times the stage's tokens; plus `scoring` seconds of dev scoring after each epoch."""
    rates, total = {}, 0.0
    print(f"{'stage':28s} {'steps':>6s} {'examples':>9s} {'s/step':>7s} {'minutes':>8s}")
    for name, plan in plans.items():
        for k, stage in enumerate(plan):
            order = torch.Generator().manual_seed(cfg.seed * 1000 + k)
            steps = list(stage_steps(task_data, stage, order, cfg.seed))
            tokens = sum(b["input_ids"].numel() for step in steps for _, b in step)
            kind = repr(replace(stage, name="", fraction=1.0, epochs=1))
            if kind not in rates:  # seconds per token of this kind of stage
                rates[kind] = time_steps(model, cfg.optim, stage, steps[:probe], reference, rt)
            n, seconds = len(steps) * stage.epochs, rates[kind] * tokens * stage.epochs
            examples = sum(b["input_ids"].shape[-2] for step in steps for _, b in step)
            label = f"{name}: {stage.name}" if name else stage.name
            print(f"{label[:28]:28s} {n:6d} {examples:9d} {seconds / n:7.2f} {seconds / 60:8.1f}")
            total += seconds + scoring * stage.epochs
    print(f"dev scoring: {scoring:.0f} s, after the start and after each epoch of a stage")
    minutes = (total + scoring) / 60
    print(f"whole run: about {minutes:.1f} minutes ({rt.device}, {rt.precision})")
    return minutes


ESTIMATE_DEV = (128, 384)  # dev scoring is timed on these many examples of each set


def scoring_seconds(task_data: dict, score) -> float:
    """One dev scoring's seconds (`score(task_data)`), timed on two samples of each dev set
    (ESTIMATE_DEV examples each): the fixed part and the per-example part apart, then the
    whole sets, which are never scored in full here."""
    seconds, sizes = [], []
    for n in ESTIMATE_DEV:
        sample = {t: replace(d, dev=head(d.dev, n)) if d.dev else d for t, d in task_data.items()}
        t0 = time.perf_counter()
        score(sample)
        seconds.append(time.perf_counter() - t0)
        sizes.append(sum(len(d.dev) for d in sample.values() if d.dev))
    whole = sum(len(d.dev) for d in task_data.values() if d.dev)
    per_example = max(0.0, seconds[1] - seconds[0]) / max(1, sizes[1] - sizes[0])
    return seconds[1] + per_example * max(0, whole - sizes[1])
