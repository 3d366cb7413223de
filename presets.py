"""The schedules: what a run trains, stage by stage, and every experiment as one named row.

A `Stage` is one part of a schedule (one task, several at once, or the encoder alone on
sentence tuples); a plan is a list of stages, run in order by commands/runner.run_plan and scored
after each. The builders make the plans: the thesis's loops (`thesis_plan`), sequential,
multitask, SimCSE first, heads on a frozen encoder. A preset (`PRESETS`) names a plan and
the settings it overrides (typed flags win); a report's row adds the sizes `--scale`
shrinks and the scores the report printed. To add a preset, add a row to PRESETS:

    "sst-then-sts-smart": Preset(
        help="SST, then STS, with SMART",
        source="this project",
        plan=lambda cfg: [task_stage(cfg, "sst"), task_stage(cfg, "sts")],
        overrides=SMART_ON,
    ),

`--preset NAME --show` prints what a row resolves to; how typed flags combine with it, the
data a plan reads and what flags cannot do are the commands' (commands/).
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from datasets import CONTRASTIVE
from evaluation import MULTITASK, TASKS
from losses import TASK_LOSSES
from optimizer import WEIGHTINGS
from settings import MultitaskConfig, RunConfig, SimCSEConfig
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
    candidate: bool = True  # its model may be the kept one (the handout's: an epoch's last)

    def __post_init__(self):
        if self.kind not in STAGE_KINDS:
            raise ValueError(f"unknown stage kind {self.kind!r}; expected one of {STAGE_KINDS}")
        for task in self.tasks:
            if task not in TASKS:
                raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASKS)}")
        for task, loss in self.losses.items():
            allowed = list(TASK_LOSSES[task])
            if loss not in allowed:
                raise ValueError(f"loss {loss!r} does not fit task {task!r}; expected {allowed}")
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


def handout_plan(cfg: RunConfig) -> list[Stage]:
    """The handout's --epochs passes over the data: each one SST, then QQP, then STS, every
    stage scored; as the handout's, only an epoch's end may be the kept model."""
    epochs = range(1, cfg.multitask.multitask_epochs + 1)
    return [
        replace(task_stage(cfg, t, name=f"epoch {e}: {TASKS[t].title}"), candidate=t == "sts")
        for e in epochs
        for t in MULTITASK
    ]


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


class Plans(dict):
    """What a preset trains: {model name: its stages}. '' is the one model scored on all
    three tasks; the individual preset trains one per task. `stages()` lists them all."""

    def stages(self) -> list[Stage]:
        return [s for plan in self.values() for s in plan]


@dataclass(frozen=True)
class Preset:
    help: str  # its line in --help
    source: str  # the paper and table it reproduces
    # its stages; or {name: stages} for a model each (individual: one per task)
    plan: Callable[[RunConfig], list[Stage] | dict[str, list[Stage]]] | None = None
    overrides: dict = field(default_factory=dict)  # "group.field" -> value, under typed flags
    scaled: dict | None = None  # a report's row: sizes and epochs that --scale multiplies
    report_scale: float | None = None  # the --scale `make reports` runs it at (2-core CPU)
    label: str = ""  # a report's row: its name in the report's table
    published: tuple | None = None  # a report's row: its dev SST acc, QQP acc, STS r
    select_by: str = ""  # a task whose dev metric keeps the best model ("": the overall score)
    # the model it trains: multitask_classifier.MultitaskBERT (the handout's, the student's
    # design) where True, else sbert.SentenceBERT
    handout_model: bool = False

    def plans_of(self, cfg: RunConfig) -> Plans:
        """Sub-run name -> its stages (Plans); '' is the one model scored on all three
        tasks. With --freeze_encoder every stage trains the heads only, at --head_lr (what
        that cannot do is commands.checks.check_frozen's)."""
        plan = self.plan(cfg)
        plans = Plans(plan if isinstance(plan, dict) else {"": plan})
        if not cfg.model.freeze_encoder:
            return plans
        frozen = {"freeze_encoder": True, "lr": cfg.schedule.head_lr}  # heads at --head_lr
        return Plans({n: [replace(s, **frozen) for s in ss] for n, ss in plans.items()})


# Named groups of settings, each written out flat (none is built from another); a row
# merges some of them with its own.
SMART_ON = {"smart.enabled": True, "smart.smart_dropout": "independent"}  # the thesis's R-Drop
# What the forgetting study (docs/forgetting.md) found keeps what the encoder knew: STS
# toward cosines in [0, 1] as it was trained, fast heads on a slow encoder, a warmup, and
# the batch's cosines distilled from the untouched encoder; over ten loops, each loop at a
# lower lr (docs/results.md).
DEFENDED = {
    "multitask.sts_loss": "cosine_sbert",
    "optim.lr": 3e-5,
    "optim.head_lr_scale": 50.0,
    "optim.warmup": 0.1,
    "optim.decay": "linear",
    "optim.distill": 30.0,
    "schedule.loop_decay": "linear",
}
# The CS224n 2023 handout's multitask_classifier.py: its argparse defaults (--epochs 10,
# --batch_size 8, --hidden_dropout_prob 0.3, --lr 1e-5) and 512 tokens (its tokenizer call
# truncates at BERT's limit); the model is its MultitaskBERT, the student's design.
HANDOUT = {
    "multitask.multitask_epochs": 10,
    "optim.batch_size": 8,
    "model.dropout": 0.3,
    "optim.lr": 1e-5,
    "data.max_length": 512,
}
BROADHURST = {  # section 5.3: lr 1e-5, batch 8, dropout 0.3, random weights, concat heads
    "optim.lr": 1e-5,
    "optim.batch_size": 8,
    "model.dropout": 0.3,
    "model.pair_head": "concat",
    "multitask.weighting": "random",
}
BROADHURST_SIZES = {"multitask.examples_per_task": 12080, "multitask.multitask_epochs": 6}
GS = {"multitask.mixing": "simultaneous", "multitask.weighting": "pcgrad"}  # PCGrad steps
AUSLIN_SIAMESE = {  # section 5.3: the first 2,048 per task, batch 32, lr 3e-5, no GS
    "optim.lr": 3e-5,
    "optim.batch_size": 32,
    "data.train_size": 2048,
    "data.train_first": True,
    "multitask.mixing": "round_robin",  # 'no GS': an update after each task's batch
    "model.siamese": "euclidean",
    "multitask.para_loss": "distance_margin",
}
AUSLIN_SEGMENTS = {  # the same, pairs cross-encoded as one sequence
    "optim.lr": 3e-5,
    "optim.batch_size": 32,
    "data.train_size": 2048,
    "data.train_first": True,
    "multitask.mixing": "round_robin",
    "multitask.cross_encode": ["para", "sts"],
    "multitask.para_loss": "sigmoid_margin",
}
AUSLIN_EARLY = {  # their siamese table: cosine, GS, 4 epochs over all the data
    "optim.lr": 3e-5,
    "optim.batch_size": 32,
    "multitask.sts_loss": "cosine_sbert",
    "multitask.mixing": "simultaneous",
    "multitask.weighting": "pcgrad",
}
# Sicurello, section 5.3: lr 1e-5, 3 epochs, round robin, "128 batches evenly between each
# task". The batch size is not stated: 8 here, so 43 batches x 8 = 344 examples per task.
SICURELLO = {
    "optim.lr": 1e-5,
    "optim.batch_size": 8,
    "data.train_size": 344,
    "multitask.mixing": "round_robin",
    "schedule.head_lr": 1e-5,
    "simcse.simcse_data": "sst",
}
SICURELLO_EPOCHS = {"multitask.multitask_epochs": 3}
UNIFORM_EPOCHS = {"simcse.simcse_epochs": 5, "schedule.individual_epochs": 3}  # SST, heads
SIMCSE_TERM = {"simcse.simcse_weight": 1.0}  # the weight is not in the report
UNIF = {"simcse.simcse_loss": "dropout_align_uniform"}
CANON = {"simcse.simcse_loss": "dropout_align_uniform_simcse"}

SRC_THESIS = "Fig. 4.10"  # the thesis's schedule
SRC_BH = "Broadhurst & Maffezzoli, Table 1"
SRC_AUSLIN = "Auslin et al., section 5.4, ablation table"
SRC_AUSLIN_TABLE = "Auslin et al., section 5.4, siamese table"
SRC_SICURELLO_1, SRC_SICURELLO_2 = "Sicurello, Table 1", "Sicurello, Table 2"
AUSLIN_EPOCHS = {"multitask.multitask_epochs": 6}
SIAMESE_EPOCHS = {"multitask.multitask_epochs": 4}


def broadhurst(help, label, published, overrides=BROADHURST, scaled=BROADHURST_SIZES, plan=None):
    """A row of Broadhurst & Maffezzoli's Table 1 (make reports: --scale 0.1)."""
    plan = plan or multitask_plan
    return Preset(help, SRC_BH, plan, overrides, scaled, 0.1, label, published)


def auslin(help, label, published, overrides, scaled=AUSLIN_EPOCHS, source=SRC_AUSLIN):
    """A row of Auslin et al.'s tables: the ablation's 6 epochs of the first 2,048 of each
    task (--scale 0.25), or the siamese table's 4 over all the data (--scale 0.05)."""
    scale = 0.25 if source == SRC_AUSLIN else 0.05
    return Preset(help, source, multitask_plan, overrides, scaled, scale, label, published)


def sicurello(help, label, plan, overrides, scaled=SICURELLO_EPOCHS, source=SRC_SICURELLO_1):
    """A row of Sicurello's tables, whose scores were lost in the text; their 128-batch
    subsample is already CPU-sized (--scale 1)."""
    return Preset(help, source, plan, overrides, scaled, 1.0, label)


PRESETS = {
    "thesis": Preset(
        help="SBERT, the thesis schedule",
        source=f"thesis {SRC_THESIS}, Table 4.11",
        plan=thesis_plan,
    ),
    "thesis-smart": Preset(
        help="SMART + SBERT, the thesis schedule",
        source="thesis Table 4.10",
        plan=thesis_plan,
        overrides=SMART_ON,
    ),
    "thesis-smart-simcse": Preset(
        help="SimCSE on SNLI, then SMART + SBERT, the thesis schedule",
        source="thesis Tables 4.12-4.13",
        plan=simcse_then(thesis_plan),
        overrides=SMART_ON,
    ),
    "defended": Preset(
        help="the thesis schedule defended against forgetting: the Sentence-BERT STS target, "
        "heads at 50x the lr, warmup and linear decay, the batch's cosines distilled from "
        "the untouched encoder, later loops at a lower lr",
        source=f"thesis {SRC_THESIS}; this project's forgetting study (docs/forgetting.md)",
        plan=thesis_plan,
        overrides=DEFENDED,
    ),
    "demo": Preset(
        help="make demo: defended on the embedded MiniLM, one loop, 64 tokens, at most 12,000 "
        "training and 2,000 dev and test examples per task (a fixed-size sample, however large "
        "the data), 2,000 held-out SNLI pairs (at most --dev_size) scored after every stage; "
        "where training and scoring would take over 10 minutes, both sizes shrunk by one "
        "measured factor, to half at most (--fit_minutes)",
        source="this project (docs/demo.md)",
        plan=thesis_plan,
        overrides=DEFENDED
        | {
            "model.bert": "minilm",
            "schedule.loops": 1,
            "data.max_length": 64,
            "data.train_size": 12_000,
            "data.dev_size": 2_000,
            "data.heldout_size": 2_000,
            "data.fit_minutes": 10.0,
        },
    ),
    "simcse": Preset(
        help="SimCSE alone, scored on all tasks",
        source="thesis Table 4.12",
        plan=lambda cfg: [simcse_stage(cfg)],
    ),
    "unsup-simcse": Preset(
        help="unsupervised SimCSE, then heads on the frozen encoder",
        source="Gao et al. 2021 (unsupervised SimCSE)",
        plan=simcse_then(frozen_heads_plan),
        overrides={"simcse.simcse_loss": "unsup"},
    ),
    "equibert": Preset(
        help="alignment + uniformity, then heads on the frozen encoder",
        source="Sicurello (EquiBERT)",
        plan=simcse_then(frozen_heads_plan),
        overrides={"simcse.simcse_loss": "align_uniform"},
    ),
    "sequential": Preset(
        help="QQP -> STS -> SST, no revisits",
        source="thesis section 4.2.2.1",
        plan=sequential_plan,
    ),
    "individual": Preset(
        help="one model per task", source="thesis Table 4.2", plan=individual_plans
    ),
    "multitask": Preset(
        help="all tasks at once: --mixing, --weighting, --order",
        source="CS224n reports",
        plan=multitask_plan,
    ),
    "handout": Preset(
        help="this project's completion of the handout's starter, picked by the handout's flags "
        "(--option or --fine-tune-mode, --epochs, --use_gpu, its data and output paths) when no "
        "--preset is typed: --epochs passes over SST, then QQP, then STS, the best overall dev "
        "score kept; the model is multitask_classifier.py's MultitaskBERT (your design; the "
        "given one: BERT's pooled [CLS], a Linear on [u, v] for each pair task); 512 tokens, "
        "batch 8, dropout 0.3, lr 1e-5; the frozen option (its default) trains the heads at "
        "--head_lr",
        source="this project, on the CS224n handouts' multitask_classifier.py (2023, 2024)",
        plan=handout_plan,
        overrides=HANDOUT,
        handout_model=True,
    ),
    "handout-starter": Preset(
        help="the handout's starter itself: its train_multitask trains SST alone (\"currently "
        'only trains on sst"), --multitask_epochs passes, the best SST dev accuracy kept; the '
        "handout preset's settings otherwise",
        source="the CS224n handouts' multitask_classifier.py (2023, 2024), as given",
        plan=sst_plan,
        overrides=HANDOUT,
        select_by="sst",
        handout_model=True,
    ),
    "broadhurst-1": broadhurst(
        "exp. 1: SST only, 10 epochs, all three scored",
        "1 baseline: SST only",
        (0.509, 0.509, 0.031),
        scaled={"multitask.multitask_epochs": 10},
        plan=sst_plan,
    ),
    "broadhurst-2": broadhurst(
        "exp. 2: all tasks, random weights, CE / BCE / MSE, concatenation heads",
        "2 multitask, random weights",
        (0.471, 0.721, 0.344),
    ),
    "broadhurst-3": broadhurst(
        "exp. 3: MNRL for QQP and STS",
        "3 MNRL for QQP and STS",
        (0.505, 0.675, 0.272),
        BROADHURST | {"multitask.para_loss": "mnrl", "multitask.sts_loss": "mnrl"},
    ),
    "broadhurst-4": broadhurst(
        "exp. 4: MNRL for QQP, cosine-MSE for STS",
        "4 MNRL QQP, cosine STS",
        (0.490, 0.648, 0.433),
        BROADHURST | {"multitask.para_loss": "mnrl", "multitask.sts_loss": "cosine_mse"},
    ),
    "broadhurst-5": broadhurst(
        "exp. 5: BCE for QQP, cosine-MSE for STS",
        "5 BCE QQP, cosine STS",
        (0.505, 0.730, 0.471),
        BROADHURST | {"multitask.sts_loss": "cosine_mse"},
    ),
    "broadhurst-6": broadhurst(
        "exp. 6: exp. 5 on 50,000 examples per task, 10 epochs",
        "6 exp. 5, 50k examples, 10 epochs",
        (0.488, 0.757, 0.519),
        BROADHURST | {"multitask.sts_loss": "cosine_mse"},
        {"multitask.examples_per_task": 50000, "multitask.multitask_epochs": 10},
    ),
    "auslin-siamese": auslin(
        "siamese, d = ||u - v||, their contrastive formula on d for QQP, MSE STS, no GS",
        "siamese, no GS",
        (0.254, 0.375, 0.021),
        AUSLIN_SIAMESE,
    ),
    "auslin-siamese-gs": auslin(
        "siamese, gradient surgery (PCGrad)",
        "siamese, GS",
        (0.253, 0.375, -0.105),
        AUSLIN_SIAMESE | GS,
    ),
    "auslin-segments": auslin(
        "segments (cross-encoded pairs), sigmoid margin QQP, MSE STS, no GS",
        "segments, no GS",
        (0.278, 0.375, 0.743),
        AUSLIN_SEGMENTS,
    ),
    "auslin-segments-gs-mean": auslin(
        "segments, GS, mean pooling",
        "segments, GS, mean pooling",
        (0.282, 0.375, 0.765),
        AUSLIN_SEGMENTS | GS,
    ),
    "auslin-segments-gs-cls": auslin(
        "segments, GS, CLS pooling",
        "segments, GS, CLS pooling",
        (0.274, 0.375, 0.726),
        AUSLIN_SEGMENTS | GS | {"model.pooling": "cls"},
    ),
    "auslin-segments-gs-l1": auslin(
        "segments, GS, L1 for both pair tasks",
        "segments, GS, L1 loss",
        (0.280, 0.375, 0.760),
        AUSLIN_SEGMENTS | GS | {"multitask.para_loss": "sigmoid_l1", "multitask.sts_loss": "l1"},
    ),
    "auslin-segments-rand": auslin(
        "segments, no GS, random task order",
        "segments, no GS, random order",
        (0.278, 0.375, 0.728),
        AUSLIN_SEGMENTS | {"multitask.order": "random"},
    ),
    "auslin-segments-gs-rand": auslin(
        "segments, GS, random task order",
        "segments, GS, random order",
        (0.268, 0.375, 0.751),
        AUSLIN_SEGMENTS | GS | {"multitask.order": "random"},
    ),
    "auslin-siamese-cosine-mse": auslin(
        "siamese table: GS, cosine, MSE for both pair tasks",
        "siamese, GS, cosine, MSE",
        (0.470, 0.471, 0.042),
        AUSLIN_EARLY | {"multitask.para_loss": "cosine_mse"},
        SIAMESE_EPOCHS,
        SRC_AUSLIN_TABLE,
    ),
    "auslin-siamese-cosine-contrastive": auslin(
        "siamese table: GS, cosine, contrastive QQP, MSE STS",
        "siamese, GS, cosine, contrastive",
        (0.470, 0.375, 0.014),
        AUSLIN_EARLY | {"multitask.para_loss": "contrastive"},
        SIAMESE_EPOCHS,
        SRC_AUSLIN_TABLE,
    ),
    "sicurello-vanilla": sicurello(
        "BERT_vanilla, round robin on all tasks, 128 batches",
        "all tasks: BERT_vanilla",
        multitask_plan,
        SICURELLO,
    ),
    "sicurello-simcse": sicurello(
        "BERT_simCSE: the task losses + SimCSE of each batch's sentences",
        "all tasks: BERT_simCSE",
        multitask_plan,
        SICURELLO | SIMCSE_TERM,
    ),
    "sicurello-unif": sicurello(
        "BERT_unif: alignment + uniformity on SST, then heads on the frozen encoder",
        "all tasks: BERT_unif",
        uniform_plan(("sst", "para")),
        SICURELLO | UNIF,
        UNIFORM_EPOCHS,
    ),
    "sicurello-simcsecanon": sicurello(
        "BERT_simCSEcanon: BERT_unif with a SimCSE term",
        "all tasks: BERT_simCSEcanon",
        uniform_plan(("sst", "para")),
        SICURELLO | CANON,
        UNIFORM_EPOCHS,
    ),
    "sicurello-vanilla-sst": sicurello(
        "BERT_vanilla trained on SST only",
        "SST only: BERT_vanilla",
        sst_plan,
        SICURELLO,
        source=SRC_SICURELLO_2,
    ),
    "sicurello-simcse-sst": sicurello(
        "BERT_simCSE trained on SST only",
        "SST only: BERT_simCSE",
        sst_plan,
        SICURELLO | SIMCSE_TERM,
        source=SRC_SICURELLO_2,
    ),
    "sicurello-unif-sst": sicurello(
        "BERT_unif, the SST head only",
        "SST only: BERT_unif",
        uniform_plan(("sst",)),
        SICURELLO | UNIF,
        UNIFORM_EPOCHS,
        SRC_SICURELLO_2,
    ),
    "sicurello-simcsecanon-sst": sicurello(
        "BERT_simCSEcanon, the SST head only",
        "SST only: BERT_simCSEcanon",
        uniform_plan(("sst",)),
        SICURELLO | CANON,
        UNIFORM_EPOCHS,
        SRC_SICURELLO_2,
    ),
}
