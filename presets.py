"""Every experiment as one row: the thesis's schedules and the CS224n reports' tables.

A plan is a list of `config.Stage`s, run by trainer.py. A preset is a plan builder (the
run config -> its stages) and the settings it
overrides, written out in its row below with its source and, for a report's row, the
sizes and epochs `--scale` shrinks and the scale `make reports` runs it at. Flags the user
types win over a preset's settings. `python multitask_classifier.py --preset X --show`
prints what a preset resolves to, stage by stage, without loading anything.

All checks that refuse a combination of flags live here too (`check_settings`,
`check_plans`): a run that cannot work stops before any data or model is loaded.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import config
import datasets as data
import losses
from base_bert import load_config, missing_files, resolve_model_dir
from config import RunConfig, Stage
from datasets import CONTRASTIVE
from evaluation import MULTITASK, TASKS
from simcse import OBJECTIVES

# ---------------------------------------------------------------------------------------
# Plan builders


def loss_choices(cfg: RunConfig) -> dict:
    """--para_loss / --sts_loss, where they differ from the task's default loss."""
    chosen = {"para": cfg.multitask.para_loss, "sts": cfg.multitask.sts_loss}
    return {task: loss for task, loss in chosen.items() if loss}


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
# The table


@dataclass(frozen=True)
class Preset:
    help: str  # its line in --help
    plan: Callable[[RunConfig], list[Stage]] | None  # one model's stages
    source: str  # the paper and table it reproduces
    overrides: dict = field(default_factory=dict)  # "group.field" -> value, under typed flags
    scaled: dict | None = None  # a report's row: sizes and epochs that --scale multiplies
    report_scale: float | None = None  # the --scale `make reports` runs it at (2-core CPU)
    plans: Callable[[RunConfig], dict] | None = None  # several models: name -> stages

    def plans_of(self, cfg: RunConfig) -> dict[str, list[Stage]]:
        """Sub-run name -> its stages; '' is the one model scored on all three tasks."""
        return self.plans(cfg) if self.plans else {"": self.plan(cfg)}

    def settings(self, typed: dict) -> dict:
        """The overrides, and for a report's row its sizes and epochs times --scale (at
        least 1) and the share of each training set --scale keeps."""
        if self.scaled is None:
            return self.overrides
        scale = typed.get("schedule.scale", config.ScheduleConfig.scale)
        shrunk = {k: max(1, round(v * scale)) for k, v in self.scaled.items()}
        return self.overrides | shrunk | {"data.train_share": scale}


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


PRESETS = {
    "thesis": Preset("SBERT, the thesis schedule", thesis_plan, f"thesis {SRC_THESIS}, Table 4.11"),
    "thesis-smart": Preset(
        "SMART + SBERT, the thesis schedule", thesis_plan, "thesis Table 4.10", SMART_ON
    ),
    "thesis-smart-simcse": Preset(
        "SimCSE on SNLI, then SMART + SBERT, the thesis schedule",
        simcse_then(thesis_plan),
        "thesis Tables 4.12-4.13",
        SMART_ON,
    ),
    "defended": Preset(
        "the thesis schedule defended against forgetting: the Sentence-BERT STS target, "
        "heads at 50x the lr, warmup and linear decay, the batch's cosines distilled from "
        "the untouched encoder, later loops at a lower lr",
        thesis_plan,
        f"thesis {SRC_THESIS}; this project's forgetting study (docs/forgetting.md)",
        DEFENDED,
    ),
    "demo": Preset(
        "make demo: defended on the embedded MiniLM, one loop, 64 tokens, 2,000 held-out "
        "SNLI pairs scored after every stage (about 7 minutes on a 2-core CPU in bf16)",
        thesis_plan,
        "this project (docs/demo.md)",
        DEFENDED
        | {
            "model.bert": "minilm",
            "schedule.loops": 1,
            "data.max_length": 64,
            "data.heldout_size": 2000,
        },
    ),
    "simcse": Preset(
        "SimCSE alone, scored on all tasks", lambda cfg: [simcse_stage(cfg)], "thesis Table 4.12"
    ),
    "unsup-simcse": Preset(
        "unsupervised SimCSE, then heads on the frozen encoder",
        simcse_then(frozen_heads_plan),
        "Gao et al. 2021 (unsupervised SimCSE)",
        {"simcse.simcse_loss": "unsup"},
    ),
    "equibert": Preset(
        "alignment + uniformity, then heads on the frozen encoder",
        simcse_then(frozen_heads_plan),
        "Sicurello (EquiBERT)",
        {"simcse.simcse_loss": "align_uniform"},
    ),
    "sequential": Preset(
        "QQP -> STS -> SST, no revisits", sequential_plan, "thesis section 4.2.2.1"
    ),
    "individual": Preset(
        "one model per task", None, "thesis Table 4.2", plans=individual_plans
    ),
    "multitask": Preset(
        "all tasks at once: --mixing, --weighting, --order", multitask_plan, "CS224n reports"
    ),
    # Broadhurst & Maffezzoli, Table 1 (make reports: --scale 0.1)
    "broadhurst-1": Preset(
        "exp. 1: SST only, 10 epochs, all three scored", sst_plan, SRC_BH, BROADHURST,
        {"multitask.multitask_epochs": 10}, 0.1,
    ),
    "broadhurst-2": Preset(
        "exp. 2: all tasks, random weights, CE / BCE / MSE, concatenation heads",
        multitask_plan, SRC_BH, BROADHURST, BROADHURST_SIZES, 0.1,
    ),
    "broadhurst-3": Preset(
        "exp. 3: MNRL for QQP and STS", multitask_plan, SRC_BH,
        BROADHURST | {"multitask.para_loss": "mnrl", "multitask.sts_loss": "mnrl"},
        BROADHURST_SIZES, 0.1,
    ),
    "broadhurst-4": Preset(
        "exp. 4: MNRL for QQP, cosine-MSE for STS", multitask_plan, SRC_BH,
        BROADHURST | {"multitask.para_loss": "mnrl", "multitask.sts_loss": "cosine_mse"},
        BROADHURST_SIZES, 0.1,
    ),
    "broadhurst-5": Preset(
        "exp. 5: BCE for QQP, cosine-MSE for STS", multitask_plan, SRC_BH,
        BROADHURST | {"multitask.sts_loss": "cosine_mse"}, BROADHURST_SIZES, 0.1,
    ),
    "broadhurst-6": Preset(
        "exp. 6: exp. 5 on 50,000 examples per task, 10 epochs", multitask_plan, SRC_BH,
        BROADHURST | {"multitask.sts_loss": "cosine_mse"},
        {"multitask.examples_per_task": 50000, "multitask.multitask_epochs": 10}, 0.1,
    ),
    # Auslin et al.'s ablation: 6 epochs of the first 2,048 of each task (--scale 0.25)
    "auslin-siamese": Preset(
        "siamese, d = ||u - v||, their contrastive formula on d for QQP, MSE STS, no GS",
        multitask_plan, SRC_AUSLIN,
        AUSLIN_SIAMESE, {"multitask.multitask_epochs": 6}, 0.25,
    ),
    "auslin-siamese-gs": Preset(
        "siamese, gradient surgery (PCGrad)", multitask_plan, SRC_AUSLIN, AUSLIN_SIAMESE | GS,
        {"multitask.multitask_epochs": 6}, 0.25,
    ),
    "auslin-segments": Preset(
        "segments (cross-encoded pairs), sigmoid margin QQP, MSE STS, no GS", multitask_plan,
        SRC_AUSLIN, AUSLIN_SEGMENTS, {"multitask.multitask_epochs": 6}, 0.25,
    ),
    "auslin-segments-gs-mean": Preset(
        "segments, GS, mean pooling", multitask_plan, SRC_AUSLIN, AUSLIN_SEGMENTS | GS,
        {"multitask.multitask_epochs": 6}, 0.25,
    ),
    "auslin-segments-gs-cls": Preset(
        "segments, GS, CLS pooling", multitask_plan, SRC_AUSLIN,
        AUSLIN_SEGMENTS | GS | {"model.pooling": "cls"}, {"multitask.multitask_epochs": 6}, 0.25,
    ),
    "auslin-segments-gs-l1": Preset(
        "segments, GS, L1 for both pair tasks", multitask_plan, SRC_AUSLIN,
        AUSLIN_SEGMENTS | GS | {"multitask.para_loss": "sigmoid_l1", "multitask.sts_loss": "l1"},
        {"multitask.multitask_epochs": 6}, 0.25,
    ),
    "auslin-segments-rand": Preset(
        "segments, no GS, random task order", multitask_plan, SRC_AUSLIN,
        AUSLIN_SEGMENTS | {"multitask.order": "random"}, {"multitask.multitask_epochs": 6},
        0.25,
    ),
    "auslin-segments-gs-rand": Preset(
        "segments, GS, random task order", multitask_plan, SRC_AUSLIN,
        AUSLIN_SEGMENTS | GS | {"multitask.order": "random"},
        {"multitask.multitask_epochs": 6}, 0.25,
    ),
    # Auslin et al.'s siamese table: 4 epochs over all the data (--scale 0.05)
    "auslin-siamese-cosine-mse": Preset(
        "siamese table: GS, cosine, MSE for both pair tasks", multitask_plan, SRC_AUSLIN_TABLE,
        AUSLIN_EARLY | {"multitask.para_loss": "cosine_mse"},
        {"multitask.multitask_epochs": 4}, 0.05,
    ),
    "auslin-siamese-cosine-contrastive": Preset(
        "siamese table: GS, cosine, contrastive QQP, MSE STS", multitask_plan, SRC_AUSLIN_TABLE,
        AUSLIN_EARLY | {"multitask.para_loss": "contrastive"},
        {"multitask.multitask_epochs": 4}, 0.05,
    ),
    # Sicurello (EquiBERT): their 128-batch subsample is already CPU-sized (--scale 1)
    "sicurello-vanilla": Preset(
        "BERT_vanilla, round robin on all tasks, 128 batches", multitask_plan, SRC_SICURELLO_1,
        SICURELLO, SICURELLO_EPOCHS, 1.0,
    ),
    "sicurello-simcse": Preset(
        "BERT_simCSE: the task losses + SimCSE of each batch's sentences", multitask_plan,
        SRC_SICURELLO_1, SICURELLO | SIMCSE_TERM, SICURELLO_EPOCHS, 1.0,
    ),
    "sicurello-unif": Preset(
        "BERT_unif: alignment + uniformity on SST, then heads on the frozen encoder",
        uniform_plan(("sst", "para")), SRC_SICURELLO_1, SICURELLO | UNIF, UNIFORM_EPOCHS, 1.0,
    ),
    "sicurello-simcsecanon": Preset(
        "BERT_simCSEcanon: BERT_unif with a SimCSE term", uniform_plan(("sst", "para")),
        SRC_SICURELLO_1, SICURELLO | CANON, UNIFORM_EPOCHS, 1.0,
    ),
    "sicurello-vanilla-sst": Preset(
        "BERT_vanilla trained on SST only", sst_plan, SRC_SICURELLO_2, SICURELLO,
        SICURELLO_EPOCHS, 1.0,
    ),
    "sicurello-simcse-sst": Preset(
        "BERT_simCSE trained on SST only", sst_plan, SRC_SICURELLO_2, SICURELLO | SIMCSE_TERM,
        SICURELLO_EPOCHS, 1.0,
    ),
    "sicurello-unif-sst": Preset(
        "BERT_unif, the SST head only", uniform_plan(("sst",)), SRC_SICURELLO_2, SICURELLO | UNIF,
        UNIFORM_EPOCHS, 1.0,
    ),
    "sicurello-simcsecanon-sst": Preset(
        "BERT_simCSEcanon, the SST head only", uniform_plan(("sst",)), SRC_SICURELLO_2,
        SICURELLO | CANON, UNIFORM_EPOCHS, 1.0,
    ),
}  # fmt: skip


def overrides(typed: dict) -> dict:
    """The settings of the preset the user typed (or the default one), for config.parse."""
    name = typed.get("preset", RunConfig().preset)
    if name not in PRESETS:
        raise SystemExit(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name].settings(typed)


def epilog() -> str:
    """The presets as --help lists them: each with its line and its source."""
    lines = [f"  {k:<20} {p.help} [{p.source}]" for k, p in PRESETS.items()]
    return "presets (--preset NAME --show prints what one trains):\n" + "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Combinations that cannot work, refused before anything is loaded

# losses that make the cosine (or 1 - cos, for contrastive) track similarity
COSINE_LOSSES = ("cosine_mse", "cosine_sbert", "mnrl", "contrastive")


def refuse(condition, message: str):
    """Stop with one line saying why, when a combination of flags cannot work."""
    if condition:
        raise SystemExit(message)


def check_losses(cfg: RunConfig):
    """--para_loss / --sts_loss against SMART, cross-encoding and the siamese read-out."""
    euclidean = cfg.model.siamese == "euclidean"
    for task, loss in loss_choices(cfg).items():
        flag, pair = f"--{task}_loss {loss}", loss in losses.PAIR_LOSSES
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
            loss in COSINE_LOSSES and euclidean,
            f"{flag} trains a cosine, and --siamese "
            "euclidean reads the pair by d = ||u - v||: use --siamese cosine, or "
            "--para_loss distance_margin and --sts_loss mse|l1",
        )
        refuse(
            loss == "distance_margin" and not euclidean,
            f"{flag} trains d = ||u - v||, which only --siamese euclidean reads out; add it",
        )


def check_settings(cfg: RunConfig):
    """Combinations of flags that cannot work, read from the config alone."""
    check_losses(cfg)
    refuse(
        cfg.schedule.scale != 1 and PRESETS[cfg.preset].scaled is None,
        f"--scale shrinks the reports' presets; {cfg.preset} is not one",
    )
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
        or bool(set(s.losses.values()) & losses.IN_BATCH_LOSSES)
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
        names = {t: stage.losses.get(t, TASKS[t].losses[0]) for t in stage.tasks}
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


def show(cfg: RunConfig) -> str:
    """The resolved settings and the stages of cfg's preset, as `--show` prints them."""
    preset = PRESETS[cfg.preset]
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
    return "\n".join(lines)
