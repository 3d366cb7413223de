"""Plans: what a training schedule trains, stage by stage, and how to build one.

A `Stage` says what one part of a schedule trains (one task, several at once, or the
encoder alone on sentence tuples), for how long and with which settings; a plan is a list
of them, run in order by trainer.run_plan and scored after each. The builders below turn
a run's config into the plans the presets (presets.py) name: the thesis's loops, the
sequential and multitask schedules, SimCSE first, heads on a frozen encoder. `show` is
what `--preset NAME --show` prints; `check_plans` refuses what the stages cannot do
before any run folder is made.

    plan = [task_stage(cfg, "sst"), task_stage(cfg, "sts", epochs=2)]   # SST, then STS
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import config
import datasets as data
from config import MultitaskConfig, RunConfig, SimCSEConfig, refuse
from datasets import CONTRASTIVE
from evaluation import MULTITASK, TASKS
from losses import TASK_LOSSES, default_loss, loss_of
from optimizer import WEIGHTINGS
from simcse import OBJECTIVES
from smart import SmartConfig

# ---------------------------------------------------------------------------------------
# A stage of a plan: what one part of a training schedule trains, and how

STAGE_KINDS = ("task", "multitask", CONTRASTIVE)


@dataclass
class Stage:
    tasks: tuple  # data sets it trains on: one task, several (multitask), none (contrastive)
    lr: float  # AdamW learning rate during the stage
    batch_size: int  # examples per step (per task, for simultaneous multitask steps)
    kind: str = "task"  # 'task', 'multitask' or 'contrastive' (the encoder, no heads)
    fraction: float = 1.0  # share of the training set, a fresh random subset each stage
    epochs: int = 1  # passes over that share
    name: str = ""  # label of the stage's row in the forgetting table
    smart: SmartConfig = field(default_factory=SmartConfig.off)
    losses: dict = field(default_factory=dict)  # task -> loss name, where not the default
    freeze_encoder: bool = False  # train only the heads (EquiBERT's frozen encoder)
    multitask: MultitaskConfig | None = None  # multitask: mixing, weighting, order, sizes
    contrastive: SimCSEConfig | None = None  # contrastive: objective and temperature;
    # task stages: the weight and temperature of a SimCSE term added to every batch's loss
    select_by_sts: bool = False  # keep the epoch with the best STS dev Pearson (SimCSE)

    def __post_init__(self):
        if self.kind not in STAGE_KINDS:
            raise ValueError(f"unknown stage kind {self.kind!r}; expected one of {STAGE_KINDS}")
        for task in self.tasks:
            if task not in TASKS:
                raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASKS)}")
        for task, loss in self.losses.items():
            if loss not in TASK_LOSSES[task]:
                raise ValueError(
                    f"loss {loss!r} does not fit task {task!r}; expected {list(TASK_LOSSES[task])}"
                )
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")
        if self.kind == "task" and len(self.tasks) != 1:
            raise ValueError(f"a task stage trains one task, got {self.tasks}")
        if self.kind == "multitask" and (self.multitask is None or len(self.tasks) < 2):
            raise ValueError("a multitask stage needs several tasks and its multitask settings")
        if self.kind == CONTRASTIVE and (self.contrastive is None or self.tasks):
            raise ValueError("a contrastive stage needs its SimCSE settings and no task")
        self.name = self.name or self.default_name()

    def default_name(self) -> str:
        if self.kind == CONTRASTIVE:
            return f"SimCSE ({self.contrastive.simcse_loss})"
        if self.kind == "multitask":
            m = self.multitask
            how = m.weighting if m.mixing == "simultaneous" else f"{m.order} order"
            return f"{m.mixing.replace('_', '-')} ({how})"
        return TASKS[self.tasks[0]].title + (f" {self.fraction:.0%}" if self.fraction < 1 else "")

    @property
    def weighting(self) -> str:
        """How a step combines its task losses (one loss: 'equal', a weight of 1)."""
        return self.multitask.weighting if self.kind == "multitask" else WEIGHTINGS[0]

    @property
    def trains_encoder_on_tasks(self) -> bool:
        """A task stage that moves the encoder: where distillation and L2-SP pull."""
        return self.kind != CONTRASTIVE and not self.freeze_encoder


# ---------------------------------------------------------------------------------------
# Plan builders


def loss_choices(cfg: RunConfig) -> dict:
    """--para_loss / --sts_loss, where they differ from the task's default loss."""
    chosen = {"para": cfg.multitask.para_loss, "sts": cfg.multitask.sts_loss}
    return {task: loss for task, loss in chosen.items() if loss}


def cosine_tasks(cfg: RunConfig) -> tuple:
    """Binary pair tasks whose loss trains only the sentence embeddings: the model reads them
    out by a cosine threshold, not by a head that loss would never train."""
    return tuple(
        t
        for t, loss in loss_choices(cfg).items()
        if loss_of(t, loss).pair and TASKS[t].kind == "binary"
    )


def concat_tasks(cfg: RunConfig) -> tuple:
    """Siamese pair tasks that get a Linear on [u, v] (--pair_head concat): those whose loss
    trains a head's output."""
    if cfg.model.pair_head != "concat":
        return ()
    chosen = loss_choices(cfg)
    return tuple(
        t
        for t in ("para", "sts")
        if not (loss_of(t, chosen.get(t)).pair or loss_of(t, chosen.get(t)).cosine)
        and t not in cfg.multitask.cross_encode
    )


def simcse_term(cfg: RunConfig):
    """The SimCSE settings of a task stage that adds --simcse_weight x SimCSE, else None."""
    return cfg.simcse if cfg.simcse.simcse_weight > 0 else None


def task_stage(cfg: RunConfig, task, fraction=1.0, epochs=1, name="", lr_scale=1.0) -> Stage:
    """A stage of one task with this run's lr (times lr_scale), batch and SMART weights for
    that task."""
    smart = cfg.smart
    batch_size = smart.smart_batch_size if smart.enabled else cfg.optim.batch_size
    return Stage(
        (task,),
        cfg.optim.lr * lr_scale,
        batch_size,
        fraction=fraction,
        epochs=epochs,
        name=name,
        smart=smart.for_task(task),
        losses=loss_choices(cfg),
        contrastive=simcse_term(cfg),
    )


def thesis_plan(cfg: RunConfig) -> list[Stage]:
    """One QQP epoch, then `loops` x (STS -> SST -> a fresh 3% of QQP): thesis Fig. 4.10."""
    share, loops = cfg.schedule.para_fraction, cfg.schedule.loops
    plan = [task_stage(cfg, "para", name="QQP")]
    for i in range(1, loops + 1):
        scale = (loops - i + 1) / loops if cfg.schedule.loop_decay == "linear" else 1.0
        plan += [
            task_stage(cfg, "sts", name=f"loop {i}: STS", lr_scale=scale),
            task_stage(cfg, "sst", name=f"loop {i}: SST", lr_scale=scale),
            task_stage(cfg, "para", share, name=f"loop {i}: QQP {share:.0%}", lr_scale=scale),
        ]
    return plan


def sequential_plan(cfg: RunConfig) -> list[Stage]:
    """QQP -> STS -> SST, --sequential_epochs each (thesis 4.2.2.1): forgetting in plain sight."""
    epochs = zip(("para", "sts", "sst"), cfg.schedule.sequential_epochs, strict=True)
    return [task_stage(cfg, task, epochs=n) for task, n in epochs]


def simcse_stage(cfg: RunConfig, select_by_sts=True) -> Stage:
    """Contrastive training of the encoder, keeping the epoch with the best STS dev r."""
    s = cfg.simcse
    return Stage(
        (),
        s.simcse_lr,
        s.simcse_batch_size,
        kind=CONTRASTIVE,
        epochs=s.simcse_epochs,
        contrastive=s,
        select_by_sts=select_by_sts,
    )


def frozen_heads_plan(cfg: RunConfig, tasks=("sst", "para")) -> list[Stage]:
    """Heads on a frozen encoder (EquiBERT); STS is the encoder's own cosine, no training."""
    lr, epochs = cfg.schedule.head_lr, cfg.schedule.individual_epochs
    return [
        Stage((t,), lr, cfg.optim.batch_size, epochs=epochs, freeze_encoder=True) for t in tasks
    ]


def multitask_plan(cfg: RunConfig) -> list[Stage]:
    """All tasks at once, one stage per epoch: simultaneous (weighted or PCGrad) or
    round-robin batches, as in the CS224n reports."""
    stage = Stage(
        MULTITASK,
        cfg.optim.lr,
        cfg.optim.batch_size,
        kind="multitask",
        losses=loss_choices(cfg),
        multitask=cfg.multitask,
        contrastive=simcse_term(cfg),
    )
    epochs = cfg.multitask.multitask_epochs
    return [replace(stage, name=f"{stage.name} epoch {e + 1}") for e in range(epochs)]


def sst_plan(cfg: RunConfig) -> list[Stage]:
    """SST alone, one stage per --multitask_epochs, all three tasks scored after each."""
    epochs = cfg.multitask.multitask_epochs
    return [task_stage(cfg, "sst", name=f"SST epoch {e + 1}") for e in range(epochs)]


def simcse_then(tail: Callable[[RunConfig], list[Stage]]):
    """A SimCSE stage, then the stages of `tail`."""
    return lambda cfg: [simcse_stage(cfg)] + tail(cfg)


def uniform_plan(tasks):
    """Sicurello's uniformity models: the encoder trained on SST sentences alone (no STS
    choice of epoch), then heads on the frozen encoder for `tasks`."""
    return lambda cfg: [simcse_stage(cfg, select_by_sts=False)] + frozen_heads_plan(cfg, tasks)


def individual_plans(cfg: RunConfig) -> dict[str, list[Stage]]:
    """Three separate models, one per task, each scored on its own task (thesis Table 4.2)."""
    return {t: [task_stage(cfg, t, epochs=cfg.schedule.individual_epochs)] for t in MULTITASK}


# ---------------------------------------------------------------------------------------
# What the stages cannot do, refused before the run folder is made


def check_plans(cfg: RunConfig, plans: dict):
    """What only the stages tell, refused before the run folder is made."""
    stages = [s for plan in plans.values() for s in plan]
    name = f"--preset {cfg.preset}"
    refuse(
        cfg.smart.enabled and not any(s.smart.active for s in stages),
        f"--smart changes "
        f"no stage of {name}: it regularizes single-task stages (thesis, sequential, "
        "individual)",
    )
    trains = [s for s in stages if s.trains_encoder_on_tasks]
    refuse(
        cfg.simcse.simcse_weight > 0 and not any(s.contrastive for s in trains),
        f"--simcse_weight adds to task losses that train the encoder; no stage of {name} has one",
    )
    refuse(
        cfg.optim.distill > 0 and not trains,
        f"--distill pulls task stages that train the encoder; no stage of {name} has one",
    )
    check_update(stages, cfg.optim)
    for s in (s for s in stages if s.kind == CONTRASTIVE):
        objective, source = s.contrastive.simcse_loss, s.contrastive.simcse_data
        need, has = OBJECTIVES[objective][0], data.CONTRASTIVE_SOURCES[source]
        refuse(
            need > has,
            f"--simcse_loss {objective} needs {need} sentences per example "
            f"and --simcse_data {source} has {has}: use --simcse_data snli",
        )


def check_update(stages: list[Stage], optim=None):
    """What the update's tools (accumulation, L2-SP, PCGrad) cannot do with these stages."""
    optim = optim or config.OptimConfig()
    pcgrad = any(s.weighting == "pcgrad" for s in stages)
    refuse(
        pcgrad and (optim.accumulate > 1 or optim.l2sp > 0),
        "--weighting pcgrad takes "
        "each task's whole-batch gradient and would project the L2-SP pull: use it "
        "without --accumulate and --l2sp",
    )
    in_batch = [s.name for s in stages if in_batch_stage(s, optim)]
    first = in_batch[0] if in_batch else ""
    refuse(
        optim.accumulate > 1 and in_batch,
        f"--accumulate {optim.accumulate}: stage "
        f"'{first}' compares each example with the others of its batch, so "
        "micro-batches would change its loss; use 1",
    )


def in_batch_stage(s: Stage, optim) -> bool:
    """A stage whose loss compares each example with the others of its batch."""
    return (
        s.kind == CONTRASTIVE
        or any(loss_of(t, name).in_batch for t, name in s.losses.items())
        or bool(s.contrastive and s.contrastive.simcse_weight > 0)  # a SimCSE term's negatives
        or optim.distill > 0  # a task batch's cosines, distilled
    )


# ---------------------------------------------------------------------------------------
# --show: what a preset resolves to


def changed_settings(cfg: RunConfig) -> list[str]:
    """'--flag value' of every setting that differs from the defaults."""
    defaults = {path: value for path, _, value in config.leaves(RunConfig())}
    out = []
    for path, f, value in config.leaves(cfg):
        if path in ("preset", "run_dir") or value == defaults[path]:
            continue
        if isinstance(value, bool):
            out.append(config.flag_of(f))  # a switch: typing it flips the default
        else:
            shown = " ".join(map(str, value)) if isinstance(value, tuple | list) else value
            out.append(f"{config.flag_of(f)} {shown}")
    return out


def describe(stage: Stage, cfg: RunConfig) -> list[str]:
    """The cells of a stage's line in --show."""
    if stage.kind == CONTRASTIVE:
        c = stage.contrastive
        what = f"encoder: {c.simcse_loss} on {c.simcse_data}, t={c.temperature:g}"
        what += ", best epoch by STS r" if stage.select_by_sts else ""
    else:
        names = {t: stage.losses.get(t, default_loss(t)) for t in stage.tasks}
        what = " ".join(f"{t}:{loss}" for t, loss in names.items())
        if stage.kind == "multitask":
            m = stage.multitask
            what += f"; {m.mixing} {m.weighting} {m.order}"
            what += f", {m.examples_per_task}/task" if m.examples_per_task else ""
        if stage.contrastive:
            what += f"; + {stage.contrastive.simcse_weight:g} x SimCSE"
        what += "; heads only" if stage.freeze_encoder else ""
    s = stage.smart
    masks = s.dropout if s.variant == "paper" else f"{s.dropout}, {s.variant} ascent"
    smart = f"ls={s.lambda_s:g} mu={s.mu:g} {masks}" if s.active else "-"
    distill = (
        f"{cfg.optim.distill:g}" if cfg.optim.distill and stage.trains_encoder_on_tasks else "-"
    )
    cells = [stage.name, str(stage.epochs), f"{stage.fraction:g}", str(stage.batch_size)]
    return cells + [f"{stage.lr:g}", what, smart, distill]


SNLI_NOTE = (
    "SNLI: the triplets of snli-train.csv as fetched: the first 100,000 rows of SNLI 1.0's "
    "training split, or all 550,152 (the thesis's) after python fetch.py --snli_all"
)


def show(cfg: RunConfig, preset) -> str:
    """The resolved settings and the stages of cfg's preset (a presets.Preset), as `--show`
    prints them."""
    lines = [f"preset {cfg.preset}: {preset.help}", f"source: {preset.source}"]
    lines.append("settings that differ from the defaults:")
    lines += [f"  {x}" for x in changed_settings(cfg)] or ["  (none)"]
    head = ["stage", "epochs", "fraction", "batch", "lr", "losses", "SMART", "distill"]
    for run, stages in preset.plans_of(cfg).items():
        rows = [head] + [describe(s, cfg) for s in stages]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines.append(f"stages{f' of the {run} model' if run else ''}:")
        lines += [
            "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows
        ]
    stages = [s for plan in preset.plans_of(cfg).values() for s in plan]
    if any(s.contrastive and s.contrastive.simcse_data == "snli" for s in stages):
        lines.append(SNLI_NOTE)
    return "\n".join(lines)
