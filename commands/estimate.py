"""--estimate: a run's expected minutes on this device and precision, from a few real steps
of each kind of stage (trainer.train_step), before any run folder is made; --fit_minutes:
the sizes whose run fits a time, from a few timed steps (fit_sizes)."""

import time
from dataclasses import replace

import torch

from datasets import head
from engine.runtime import to_device
from presets import Stage
from settings import OptimConfig
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


PROBE_STEPS = 4  # real steps timed of each kind of stage


def estimate_plans(plans: dict, model, task_data, cfg, reference, rt, scoring: float):
    """Print each stage's expected minutes and return the whole run's: PROBE_STEPS real steps
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
                rates[kind] = time_steps(
                    model, cfg.optim, stage, steps[:PROBE_STEPS], reference, rt
                )
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


FIT_STEPS = 3  # steps of the first stage timed by --fit_minutes
# never below half the sizes: the demo kept overall 0.7261 at 50% and 0.7062 at 35%, under
# its 0.72 target (docs/demo.md)
FIT_FLOOR = 0.5


def time_scoring(model, steps, rt) -> float:
    """Seconds per padded token of scoring (the encoder's forward in eval mode, without
    gradients) on `steps`' batches, timed on a second pass."""
    model.eval()
    with torch.no_grad(), rt.autocast():
        for step in steps:
            for _, batch in step:
                model.sentences(to_device(batch, rt.device))
        t0 = time.perf_counter()
        for step in steps:
            for _, batch in step:
                model.sentences(to_device(batch, rt.device))
    model.train()
    return (time.perf_counter() - t0) / sum(b["input_ids"].numel() for s in steps for _, b in s)


def run_tokens(plan, task_data, cfg):
    """tokens(n, d) -> (training tokens, scored tokens) of `plan`, each task's training set
    cut to n examples and its dev and held-out sets to d: the padded tokens of the loaded
    sets' steps, counted once here, then scaled; the dev sets (sorted for scoring: little
    padding) scored after the start and each epoch, and once more (twice with test
    predictions) for the kept model's files."""
    stages = []  # (a stage's padded training tokens, its tasks' training set sizes)
    for k, stage in enumerate(plan):
        order = torch.Generator().manual_seed(cfg.seed * 1000 + k)
        steps = stage_steps(task_data, stage, order, cfg.seed)
        tokens = sum(b["input_ids"].numel() for step in steps for _, b in step)
        sizes = [len(task_data[t].train) for t in stage.tasks if t in task_data]
        stages.append((tokens * stage.epochs, sizes))  # a contrastive stage's: none, uncut
    dev = [  # (a dev set's tokens, its size): sentences per example times their lengths
        (sum(d.dev.lengths) * (1 if d.dev.joint else len(d.dev.input_ids)), len(d.dev))
        for d in task_data.values()
        if d.dev
    ]
    passes = 1 + sum(s.epochs for s in plan) + (2 if cfg.data.test_predictions else 1)

    def tokens(n: float, d: float) -> tuple[float, float]:
        trained = sum(t * sum(min(n, m) for m in s) / sum(s) if s else t for t, s in stages)
        return trained, passes * sum(t * min(d, m) / m for t, m in dev)

    return tokens


def fit_sizes(cfg, plan, task_data, model, reference, rt) -> tuple[int, int, str]:
    """--fit_minutes: (train_size, dev_size, the line saying why) for `plan`, whose data
    were loaded at the configured sizes: one factor, from 1 down by 0.05 to FIT_FLOOR at
    most, shrinks both until the run's tokens (run_tokens), at the seconds per token of
    training and of scoring FIT_STEPS steps of its first stage here, fit the minutes."""
    data = cfg.data
    order = torch.Generator().manual_seed(cfg.seed * 1000)
    steps = list(stage_steps(task_data, plan[0], order, cfg.seed))[:FIT_STEPS]
    rates = (
        time_steps(model, cfg.optim, plan[0], steps, reference, rt),
        time_scoring(model, steps, rt),
    )
    n0 = max(len(d.train) for d in task_data.values() if d.train)  # the sizes as loaded
    d0 = max(len(d.dev) for d in task_data.values() if d.dev)

    tokens_at = run_tokens(plan, task_data, cfg)

    def seconds(factor):
        tokens = tokens_at(n0 * factor, d0 * factor)
        return sum(rate * n for rate, n in zip(rates, tokens, strict=True))

    factor = 1.0
    while factor > FIT_FLOOR and seconds(factor) > 60 * data.fit_minutes:
        factor = round(factor - 0.05, 2)
    n, d = round(n0 * factor), round(d0 * factor)
    step = rates[0] * sum(b["input_ids"].numel() for s in steps for _, b in s) / len(steps)
    short = seconds(factor) > 60 * data.fit_minutes  # at the floor, and still too long
    line = (
        f"sample: {n:,} training and {d:,} dev examples per task at most ({factor:.0%} of "
        f"{n0:,} and {d0:,}{', the floor' if short else ''}), for about "
        f"{seconds(factor) / 60:.1f} minutes of training and scoring here (--fit_minutes "
        f"{data.fit_minutes:g}; a step of '{plan[0].name}' took {step:.2f} s, {rt.precision}); "
        f"--train_size {n} --dev_size {d} runs this table again"
    )
    return n, d, line
