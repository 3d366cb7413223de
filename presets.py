"""Every experiment as one row: the thesis's schedules and the CS224n reports' tables.

A preset names a plan (plans.py builds it from the run's config) and the settings it
overrides; flags the user types win over them. A report's row also carries the sizes and
epochs `--scale` shrinks, the scale `make reports` runs it at, and the dev scores the
report printed (lab/reports.py lists the rows of each table by name). To add a preset, add a
row to PRESETS (and `task_stage` to the names imported from plans):

    "sst-then-sts-smart": Preset(
        help="SST, then STS, with SMART",
        source="this project",
        plan=lambda cfg: [task_stage(cfg, "sst"), task_stage(cfg, "sts")],
        overrides=SMART_ON,
    ),

`python multitask_classifier.py --preset NAME --show` prints what it resolves to, stage by
stage, without loading anything (`show`, at the end). What a combination of flags cannot
do is refused by plans.check_run. The CS224n handout's own flags (`--use_gpu`, `--option
pretrain`, ...) are rewritten into this project's by `handout_argv`, last.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import config
from config import RunConfig, refuse
from datasets import CONTRASTIVE
from losses import default_loss
from plans import (
    Stage,
    frozen_heads_plan,
    individual_plans,
    multitask_plan,
    sequential_plan,
    simcse_stage,
    simcse_then,
    sst_plan,
    thesis_plan,
    uniform_plan,
)


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

    def plans_of(self, cfg: RunConfig) -> dict[str, list[Stage]]:
        """Sub-run name -> its stages; '' is the one model scored on all three tasks. With
        --freeze_encoder every stage trains the heads only."""
        plan = self.plan(cfg)
        plans = plan if isinstance(plan, dict) else {"": plan}
        if not cfg.model.freeze_encoder:
            return plans
        stages = [s for stages in plans.values() for s in stages]
        refuse(
            any(s.kind == "contrastive" for s in stages),
            f"--freeze_encoder (the handout's --option pretrain) trains the heads only; preset "
            f"{cfg.preset} also trains the encoder contrastively",
        )
        refuse(
            cfg.model.pair_head == "sbert" and any("sts" in s.tasks for s in stages),
            "--freeze_encoder: STS's output is the cosine, with no head to train on a frozen "
            "encoder; add --pair_head concat (a head on [u, v])",
        )
        return {n: [replace(s, freeze_encoder=True) for s in ss] for n, ss in plans.items()}

    def settings(self, typed: dict) -> dict:
        """The overrides, and for a report's row its sizes and epochs times --scale (at
        least 1) and the share of each training set --scale keeps. A --dev_size typed
        smaller than the preset's held-out pairs shrinks them with it (unless
        --heldout_size is typed too): a small run is scored small."""
        settings = self.overrides
        if self.scaled is not None:
            scale = typed.get("schedule.scale", config.ScheduleConfig.scale)
            shrunk = {k: max(1, round(v * scale)) for k, v in self.scaled.items()}
            settings = settings | shrunk | {"data.train_share": scale}
        dev, heldout = typed.get("data.dev_size"), settings.get("data.heldout_size")
        if dev and heldout and "data.heldout_size" not in typed:
            settings = settings | {"data.heldout_size": min(heldout, dev)}
        return settings


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
    return Preset(
        help, source, plan, overrides=overrides, scaled=scaled, report_scale=1.0, label=label
    )


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
        "the data), 2,000 held-out SNLI pairs (at most --dev_size) scored after every stage",
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


def overrides(typed: dict) -> dict:
    """The settings of the preset the user typed (or the default one), for config.parse."""
    name = typed.get("preset", RunConfig().preset)
    if name not in PRESETS:
        raise SystemExit(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    scaled = typed.get("schedule.scale", config.ScheduleConfig.scale) != 1
    refuse(
        scaled and PRESETS[name].scaled is None,
        f"--scale shrinks the reports' presets; {name} is not one",
    )
    return PRESETS[name].settings(typed)


def epilog() -> str:
    """The presets as --help lists them: each with its line and its source."""
    lines = [f"  {k:<20} {p.help} [{p.source}]" for k, p in PRESETS.items()]
    return "presets (--preset NAME --show prints what one trains):\n" + "\n".join(lines)


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
    "training split, or all 550,152 (the thesis's) after python -m lab.fetch --snli_all"
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


# The CS224n handout's own flags, as its commands take them: flag -> (how many values, the
# flags of this project it stands for, what --help says). Each command adds its own.
HANDOUT_FLAGS = {
    "--use_gpu": (0, lambda: ["--device", "cuda"], "--device cuda"),
    "--hidden_dropout_prob": (1, lambda p: ["--dropout", p], "--dropout"),
}


def handout_argv(argv: list[str], table: dict) -> list[str]:
    """argv with each of the handout's flags in `table` rewritten into this project's:
    `--use_gpu` becomes `--device cuda`."""
    out, i = [], 0
    while i < len(argv):
        flag, _, inline = argv[i].partition("=")
        if flag not in table:
            out, i = [*out, argv[i]], i + 1
            continue
        arity, ours, _ = table[flag]
        values = [inline] if inline else argv[i + 1 : i + 1 + arity]
        if len(values) != arity or any(v.startswith("--") for v in values):
            raise SystemExit(f"{flag} (the handout's flag) takes {arity} value(s)")
        out, i = [*out, *ours(*values)], i + 1 + (0 if inline else arity)
    return out


def handout_help(table: dict) -> str:
    """--help's lines on the handout's flags this command takes."""
    lines = [f"  {flag:22s} {help}" for flag, (_, _, help) in table.items()]
    return "the CS224n handout's flags, taken as this project's:\n" + "\n".join(lines)


OUTPUTS = "accepted: the run writes the handout's files to RUN_DIR/predictions/; submit.py copies them to ./predictions/"


def no_flags(_):
    return []


def multitask_option(option: str) -> list[str]:
    refuse(option not in ("pretrain", "finetune"), f"--option {option}: pretrain or finetune")
    return ["--freeze_encoder", "--pair_head", "concat"] if option == "pretrain" else []


def epochs_flags(n: str) -> list[str]:
    return ["--loops", n, "--individual_epochs", n, "--multitask_epochs", n]


MULTITASK_HANDOUT = HANDOUT_FLAGS | {  # multitask_classifier.py's
    "--option": (
        1,
        multitask_option,
        "pretrain: --freeze_encoder --pair_head concat; finetune: the default",
    ),
    "--epochs": (1, epochs_flags, "--loops (thesis presets), --individual/multitask_epochs"),
    **{
        f"--{t}_{s}_out": (1, no_flags, OUTPUTS)
        for t in ("sst", "para", "sts")
        for s in ("dev", "test")
    },
}
