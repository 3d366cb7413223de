"""`--show`: what a preset resolves to, its settings and its stages, printed without
loading anything."""

from commands import flags
from datasets import CONTRASTIVE
from evaluation import MULTITASK, TASKS
from losses import default_loss
from presets import PRESETS, Stage, loss_choices
from sbert import concat_tasks, cosine_tasks
from settings import RunConfig


def changed_settings(cfg: RunConfig) -> list[str]:
    """'--flag value' of every setting that differs from the defaults."""
    defaults = {path: value for path, _, value in flags.leaves(RunConfig())}
    unread = ("preset", "run_dir")
    if PRESETS[cfg.preset].handout_model:  # --option pretrain's head choice is SentenceBERT's
        unread += ("model.pair_head",)
    out = []
    for path, f, value in flags.leaves(cfg):
        if path in unread or value == defaults[path]:
            continue
        if isinstance(value, bool):
            out.append(flags.flag_of(f))  # a switch: typing it flips the default
        else:
            shown = " ".join(map(str, value)) if isinstance(value, tuple | list) else value
            out.append(f"{flags.flag_of(f)} {shown}")
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


def head_of(cfg: RunConfig, task: str) -> str:
    """What reads the task's output off the encoder, as the run's loss for it implies
    (SentenceBERT builds it from cosine_tasks and concat_tasks); --show prints it."""
    spec, euclidean = TASKS[task], cfg.model.siamese == "euclidean"
    if PRESETS[cfg.preset].handout_model:
        return "MultitaskBERT's (multitask_classifier.py: your design)"
    if task in cfg.multitask.cross_encode:
        return "Linear on [CLS] of the pair as one sequence"
    if spec.kind == "classification":
        return f"Linear({spec.num_labels}) on the pooled sentence"
    if task in concat_tasks(cfg):
        return "Linear on [u, v]"
    distance = "d = ||u - v||" if euclidean else "cos(u, v)"
    if spec.kind == "regression":
        return distance if euclidean else "cos(u, v) onto 0-5, no weights"
    if task in cosine_tasks(cfg):
        return f"{distance} above a threshold fit on training pairs, no weights"
    return "Linear on [u, v, |u - v|], both orders averaged"


def task_table(cfg: RunConfig) -> list[str]:
    """--show's lines on the tasks (evaluation.TASKS): files, metric, the run's loss of the
    ones it allows, and the head that loss implies."""
    chosen = loss_choices(cfg)
    rows = [["task", "files", "metric", "loss (--<task>_loss)", "head"]]
    for task in MULTITASK:
        spec = TASKS[task]
        loss = chosen.get(task) or default_loss(task)
        rows.append([task, f"{spec.files}-*.csv", spec.metric, loss, head_of(cfg, task)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    return ["tasks:", *table]


PRECISION_NOTE = (
    "auto: bf16 where the device multiplies it natively, fp16 on other GPUs, float32 "
    "elsewhere; the run's device line says which; the CS224n handout trains in float32"
)


def show(cfg: RunConfig, preset) -> str:
    """The resolved settings and the stages of cfg's preset (a presets.Preset), as `--show`
    prints them."""
    lines = [f"preset {cfg.preset}: {preset.help}", f"source: {preset.source}"]
    lines.append(f"precision: {cfg.device.resolved_precision} ({PRECISION_NOTE})")
    lines.append("settings that differ from the defaults:")
    lines += [f"  {x}" for x in changed_settings(cfg)] or ["  (none)"]
    lines += task_table(cfg)
    head = ["stage", "epochs", "fraction", "batch", "lr", "losses", "SMART", "distill"]
    for run, stages in preset.plans_of(cfg).items():
        rows = [head] + [describe(s, cfg) for s in stages]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines.append(f"stages{f' of the {run} model' if run else ''}:")
        lines += [
            "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows
        ]
    stages = preset.plans_of(cfg).stages()
    if any(s.contrastive and s.contrastive.simcse_data == "snli" for s in stages):
        lines.append(SNLI_NOTE)
    return "\n".join(lines)
