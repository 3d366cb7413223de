"""Plans: what a training schedule trains, stage by stage, and how to build one.

A `Stage` says what one part of a schedule trains (one task, several at once, or the
encoder alone on sentence tuples), for how long and with which settings; a plan is a list
of them, run in order by trainer.run_plan and scored after each. The builders below turn
a run's config into the plans the presets (presets.py) name: the thesis's loops, the
sequential and multitask schedules, SimCSE first, heads on a frozen encoder.

Every check of a run's flags lives here, at the end: `check_run` refuses what the
settings and their stages cannot do, `check_loading` what the model, the packages or the
device cannot; both run before any run folder is made.

    plan = [task_stage(cfg, "sst"), task_stage(cfg, "sts", epochs=2)]   # SST, then STS
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import config
import datasets as data
from base_bert import load_config, missing_files, resolve_model_dir
from config import MultitaskConfig, RunConfig, SimCSEConfig, refuse
from datasets import CONTRASTIVE
from evaluation import MULTITASK, TASKS
from losses import TASK_LOSSES, loss_of
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


def added_simcse(cfg: RunConfig):
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
        contrastive=added_simcse(cfg),
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
        contrastive=added_simcse(cfg),
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
# What a plan reads


def plan_data(cfg: RunConfig, stages: list[Stage], tokenizer) -> dict:
    """Every split a run scores, and the training sets its stages train on."""
    cross = cfg.multitask.cross_encode
    trained = {t for s in stages for t in s.tasks}
    task_data = data.load_task_data(cfg.data, tokenizer, MULTITASK, cfg.seed, trained, cross)
    contrastive = [s.contrastive for s in stages if s.kind == CONTRASTIVE]
    if contrastive:
        s = contrastive[0]
        task_data[CONTRASTIVE] = data.load_contrastive_data(
            cfg.data, tokenizer, s.simcse_loss, s.simcse_data, cfg.seed
        )
    return task_data


def plan_files(cfg: RunConfig, stages: list[Stage]) -> list[Path]:
    """The files plan_data will read for these stages (checked before a folder is made)."""
    trained = {t for s in stages for t in s.tasks}
    contrastive = [s.contrastive.simcse_data for s in stages if s.kind == CONTRASTIVE]
    return data.files_read(cfg.data, MULTITASK, trained, (contrastive or [None])[0])


# ---------------------------------------------------------------------------------------
# What a run's flags cannot do, refused before the run folder is made: check_run (the
# settings and the stages, loading nothing), then check_loading (the model's files, the
# packages and the device a run needs)


def check_run(cfg: RunConfig, plans: dict) -> None:
    """Combinations of flags that cannot work, from the config and its stages alone."""
    check_settings(cfg)
    check_plans(cfg, plans)


def check_loading(cfg: RunConfig, device) -> None:
    """What the run will load or run on: the checkpoint, TensorBoard, --compile's device."""
    check_model(cfg)
    check_tensorboard(cfg)
    check_compile(cfg.device.compile, device)


def check_losses(cfg: RunConfig):
    """--para_loss / --sts_loss against SMART, cross-encoding and the siamese read-out."""
    euclidean = cfg.model.siamese == "euclidean"
    for task, loss in loss_choices(cfg).items():
        flag, pair = f"--{task}_loss {loss}", loss_of(task, loss).pair
        refuse(
            pair and cfg.smart.enabled,
            f"{flag} works on sentence embeddings, which "
            "SMART cannot perturb through a head; use it without --smart",
        )
        refuse(
            pair and task in cfg.multitask.cross_encode,
            f"{flag} needs siamese "
            f"sentence embeddings; it cannot be used with --cross_encode {task}",
        )
        refuse(
            loss_of(task, loss).cosine and euclidean,
            f"{flag} trains a cosine, and --siamese "
            "euclidean reads the pair by d = ||u - v||: use --siamese cosine, or "
            "--para_loss distance_margin and --sts_loss mse|l1",
        )
        refuse(
            pair and not loss_of(task, loss).cosine and not euclidean,
            f"{flag} trains d = ||u - v||, which only --siamese euclidean reads out; add it",
        )


def check_settings(cfg: RunConfig):
    """Combinations of flags that cannot work, read from the config alone."""
    check_losses(cfg)
    m = cfg.multitask
    refuse(
        m.mixing == "round_robin" and m.weighting != "equal",
        f"--weighting {m.weighting} "
        "combines the losses of one step, and a round-robin step has one task: use it "
        "with --mixing simultaneous",
    )
    refuse(
        cfg.data.dev_size == 1, "--dev_size 1 cannot be scored (a Pearson r needs 2); use 0 or >= 2"
    )


def check_tensorboard(cfg: RunConfig):
    """--tensorboard needs the package, which training itself never imports."""
    if cfg.tensorboard:
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            raise SystemExit(
                "--tensorboard needs the tensorboard package: pip install tensorboard"
            ) from None


def check_model(cfg: RunConfig):
    """The checkpoint's config, read before any data: what it cannot do stops the run now."""
    model_dir = resolve_model_dir(cfg.model.bert)
    missing = missing_files(model_dir)
    refuse(
        bool(missing),
        f"--bert {cfg.model.bert}: {model_dir} has no {' and no '.join(missing)}; a "
        "Hugging Face BERT folder holds config.json, vocab.txt and the weights",
    )
    positions = load_config(model_dir).max_position_embeddings
    if cfg.data.max_length > positions:
        raise SystemExit(
            f"--max_length {cfg.data.max_length} is longer than the {positions} positions of "
            f"{cfg.model.bert} (max_position_embeddings in its config.json)"
        )


def check_compile(compile: bool, device) -> None:
    """--compile is for GPUs (the H100's compiled step took 0.94 of eager's). On this
    project's CPU compiled layers trained slower than eager, 1.04 x without dropout and
    1.05-1.13 x with it (docs/precision.md), so there it stops before anything runs."""
    if compile and device.type != "cuda":
        raise SystemExit(
            "--compile: on the CPU compiled layers train slower than eager (docs/precision.md); "
            "use it with --device cuda, or leave it out"
        )


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


def check_update(stages: list[Stage], optim: config.OptimConfig):
    """What the update's tools (accumulation, L2-SP, PCGrad) cannot do with these stages."""
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


def from_dict(cls, saved: dict, source="config"):
    """A config from its JSON form; fields added since it was saved keep today's defaults.
    A value of the wrong type, or a setting this version lacks (a typo, one removed since),
    stops with the field and the file (`source`). `saved` is a dict: base_bert.read_json_object
    reads a run's config.json and refuses anything else."""
    cfg = cls()
    known = {path for path, _, _ in config.leaves(cfg)}
    given = set()
    for key, value in saved.items():  # 'seed' on top, 'optim.lr' inside a group
        given |= {f"{key}.{n}" for n in value} if isinstance(value, dict) else {key}
    if given - known:  # a typo would otherwise run with the default
        raise SystemExit(f"{source}: unknown settings {', '.join(sorted(given - known))}")
    if not given:
        raise SystemExit(f"{source}: no settings; expected those of a run's config.json")
    changes = {}
    for path, _, default in config.leaves(cfg):
        owner, _, name = path.rpartition(".")
        node = saved.get(owner, {}) if owner else saved
        if not isinstance(node, dict) or name not in node:
            continue
        value = node[name]
        expected = str if default is None else type(default)
        numeric = expected is float and isinstance(value, int) and not isinstance(value, bool)
        fits = isinstance(value, list if expected is tuple else expected) or numeric
        if not (fits or (default is None and value is None)):
            raise SystemExit(f"{source}: {path} is {value!r}; expected a {expected.__name__}")
        changes[path] = tuple(value) if expected is tuple else value
    cfg = config.replace_paths(cfg, changes)
    config.check(cfg)
    return cfg
