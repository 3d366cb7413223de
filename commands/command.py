"""The command `python multitask_classifier.py`: its flags, what it checks before a run
folder is made, and what it runs: a preset's plans trained in a run folder, --resume,
--predict, --show, --score, --estimate. It builds a run from the lesson's pieces
(sbert.py's SentenceBERT, or the handout's MultitaskBERT; presets, trainer, settings) and
the engine's.

A preset under the flags the user typed (`settings_of`): the settings it overrides, its
sizes under --scale, and the rules that keep a typed flag from being replaced without a
word.
"""

import io
import json
import random
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext, redirect_stderr, redirect_stdout
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import nn

import datasets as data
import multitask_classifier
import simcse
import trainer
from base_bert import BertConfig, read_json_object
from bert import BertLayer, BertModel
from commands import checks, cli, flags, handout, outputs
from commands.checks import check_loading, check_run
from commands.cli import out_of_memory
from commands.estimate import estimate_plans, fit_sizes, scoring_seconds
from commands.flags import from_dict, refuse
from commands.handout import MULTITASK_HANDOUT, model_config
from commands.runfolder import Run, finish, write_prediction_files
from commands.runner import run_plan
from commands.show import show
from datasets import CONTRASTIVE
from engine import checkpoint
from engine.runtime import (
    Runtime,
    attention_line,
    check_attention,
    compile_layers,
    fast_dropout,
    from_main,
    layer_times,
    make_runtime,
)
from engine.tsv import require
from evaluation import MULTITASK, TASKS
from presets import PRESETS, Preset, Stage
from sbert import SentenceBERT, concat_tasks, cosine_tasks
from settings import ModelConfig, RunConfig, ScheduleConfig
from tokenizer import BertTokenizer

# ---------------------------------------------------------------------------------------
# The command line

DESCRIPTION = "Multitask SBERT (SST-5, Quora, STS-B) with the thesis's schedules."
RESUME = ("--resume", "continue the run in this folder from its last checkpoint")
# settings of the machine rather than of the experiment: a resumed run may change them
MACHINE = {"device.device", "device.precision", "device.amp", "device.compile", "data.data_dir"}
MACHINE |= {"checkpoint_minutes", "stage_checkpoints", "device.dist_timeout", "tensorboard"}
MACHINE |= {"optim.accumulate", "predictions_dir"}
SCORING = {"data.dev_size", "data.test_predictions", "data.eval_batch_size"}  # --predict's own
PREDICT = ("--predict", "score the best model of the run in this folder; rewrite its predictions")
SHOW = (
    "--show",
    "print what the preset resolves to (settings, then each stage) and stop; loads nothing",
    "switch",
)
SCORE = (
    "--score",
    "score the model as the preset loads it, untrained, on the dev sets (the forgetting "
    "table's first row) and stop: the effect of an edit, e.g. to attention; no run folder",
    "switch",
)
ESTIMATE = (
    "--estimate",
    "time a few real steps of each kind of stage here, print each stage's and the whole "
    "run's expected minutes, and stop before any run folder is made",
    "switch",
)


def parse_args(argv=None) -> tuple[RunConfig, dict]:
    """(the run's config, {'resume' | 'predict': folder or None, 'show' | 'score' |
    'estimate': True or None})."""
    argv = sys.argv[1:] if argv is None else argv
    argv = handout.handout_argv(argv, MULTITASK_HANDOUT, handout.MULTITASK_DEFAULTS)
    cfg, typed, folders = cli.parse(
        RunConfig(),
        argv,
        DESCRIPTION,
        epilog() + "\n\n" + handout.handout_help(MULTITASK_HANDOUT, run=True),
        overrides,
        extra=[RESUME, PREDICT, SHOW, SCORE, ESTIMATE],
    )
    chosen = [(name, folders[name]) for name in ("resume", "predict") if folders[name]]
    if chosen:  # the run's own config; only the machine's settings may differ
        (name, folder), *more = chosen
        if more:
            raise SystemExit(f"--{name} takes no --{more[0][0]}; give one run folder flag")
        saved = load_run_config(folder)
        free = MACHINE | (SCORING if name == "predict" else set())  # sampling is not the model
        cfg = flags.replace_paths(saved, {p: v for p, v in typed.items() if p in free})
        if changed := cli.changed_flags(saved, typed, free):  # the same ones may stay
            raise SystemExit(f"--{name} {folder}: the run was made otherwise: {changed}")
    check_run(cfg, PRESETS[cfg.preset].plans_of(cfg))  # before any folder is made
    return cfg, folders


def load_run_config(run_dir: str) -> RunConfig:
    """The config a run folder keeps, over today's defaults for settings added since."""
    saved = Path(run_dir) / "config.json"
    if not saved.is_file():
        raise SystemExit(f"{run_dir}: no config.json there; is it a run folder?")
    text = read_json_object(saved)
    cfg = from_dict(RunConfig, text, str(saved))
    overrides({"preset": cfg.preset})  # a preset that no longer exists stops here
    if "precision" not in text.get("device", {}):  # saved before --precision: float32 on CPUs
        old = "auto" if cfg.device.amp and torch.cuda.is_available() else "fp32"
        cfg = replace(cfg, device=replace(cfg.device, precision=old))
    return replace(cfg, run_dir=str(run_dir))


def seeded_data(cfg: RunConfig, plans: dict) -> dict:
    """Seed every generator, then read and check the data (before any run folder exists)."""
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    return plan_data(cfg, plans.stages(), tokenizer)


def train_multitask(cfg: RunConfig, plans: dict, task_data: dict, run_dir: Path, resume: bool, rt):
    """The handout's driver: each plan of the preset (one, or the individual preset's one
    per task) trained stage by stage in its folder, its best model scored and kept."""
    print(f"device {rt.device}, precision {rt.precision} ({rt.why}), model {cfg.model.bert}")
    print(f"run folder {run_dir}")
    make_model = run_model(cfg, cfg.device.compile)
    saving = ("checkpoint_minutes", "stage_checkpoints", "tensorboard")
    saving = {name: getattr(cfg, name) for name in saving}
    for k, (name, plan) in enumerate(plans.items()):
        run = sub_run(cfg, run_dir, name, rt, resume=resume, **saving)
        t0 = time.time()
        model = make_model()
        if k == 0:
            print(attention_line(model.bert, rt.device))
        model, rows, best = run_plan(plan, model, task_data, cfg.optim, run)
        finish(model, rows, best, task_data, run, cfg.data.test_predictions, time.time() - t0)


def fitted(cfg: RunConfig, plans: dict, rt) -> RunConfig:
    """--fit_minutes: the config at the sizes commands.estimate.fit_sizes picks here (the main
    process's), with that line printed; timed on a model of its own, before seeded_data
    seeds the run, which thus trains as one started at these sizes."""
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):  # said again below
        task_data = seeded_data(cfg, plans)
    model = run_model(cfg)().to(rt.device)
    reference = trainer.reference_of(model, cfg.optim)
    n, d, line = from_main(fit_sizes(cfg, plans.stages(), task_data, model, reference, rt), rt)
    print(line)
    sizes = {"train_size": n, "dev_size": d, "fit_minutes": 0.0}
    if cfg.data.heldout_size:  # as a typed --dev_size shrinks them (settings_of)
        sizes["heldout_size"] = min(cfg.data.heldout_size, d)
    return replace(cfg, data=replace(cfg.data, **sizes))


def estimate(cfg: RunConfig, plans: dict, rt) -> float:
    """Print each stage's expected minutes and return the whole run's, before any run
    folder exists (--estimate; lab/sweep.py asks it through main): commands.estimate.estimate_plans
    times a few real steps of each kind of stage, plus one dev scoring (scoring_seconds)."""
    task_data = seeded_data(cfg, plans)
    model = run_model(cfg, cfg.device.compile)().to(rt.device)
    reference = trainer.reference_of(model, cfg.optim)
    scoring = scoring_seconds(task_data, lambda d: sub_run(cfg, Path(), "", rt).score(model, d))
    return estimate_plans(plans, model, task_data, cfg, reference, rt, scoring)


def score_untrained(cfg: RunConfig, rt) -> dict:
    """--score: the model as loaded, scored on the dev sets; its row of the table."""
    torch.manual_seed(cfg.seed)
    cfg = replace(cfg, data=replace(cfg.data, test_predictions=False))  # dev only: no test set
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    fitted = [Stage((task,), 0.0, 1) for task in cosine_tasks(cfg)]  # thresholds: train pairs
    require(plan_files(cfg, fitted))  # the dev sets (and those), no other file
    task_data = plan_data(cfg, fitted, tokenizer)
    model = run_model(cfg)().to(rt.device).eval()
    print(attention_line(model.bert, rt.device))
    run = sub_run(cfg, Path(), "", rt)
    row = {"stage": "start (no training)"} | run.score(model, task_data)
    print(outputs.table_header(run.eval_tasks))
    run.show(row)
    return row


def sub_run(cfg: RunConfig, run_dir: Path, name: str, rt, **settings) -> Run:
    """The run of sub-plan `name`: the folder itself and all tasks for '', else a folder of
    its own scored on its one task (the individual preset)."""
    tasks = (name,) if name else MULTITASK
    settings |= {"split_dev": cfg.data.split_dev, "patience": cfg.schedule.patience}
    settings |= {"copy_to": Path(cfg.predictions_dir) if cfg.predictions_dir else None}
    settings |= {"select_by": PRESETS[cfg.preset].select_by if not name else ""}
    return Run(run_dir / name, rt, tasks, cfg.data.eval_batch_size, cfg.seed, **settings)


def best_model(cfg: RunConfig, run_dir: Path, rt):
    """(model, checkpoint info) of a run folder's best model, on rt.device."""
    model = run_model(cfg)().to(rt.device).eval()
    return model, checkpoint.load_model(model, run_dir / checkpoint.BEST)


def one_model(cfg: RunConfig, where: str) -> None:
    """Stops, in one line, a preset whose plans keep a model each (the individual preset's
    one per task) where one model is needed."""
    if list(PRESETS[cfg.preset].plans_of(cfg)) != [""]:
        raise SystemExit(f"{where}: --preset {cfg.preset} keeps a model per task; this needs one")


def sentence_bert(cfg: RunConfig, where: str) -> None:
    """Stops, in one line, a run of the handout's MultitaskBERT where a tool reads sbert.py's
    SentenceBERT (its sentence embeddings and heads)."""
    if PRESETS[cfg.preset].handout_model:
        raise SystemExit(
            f"{where}: --preset {cfg.preset} trains the handout's MultitaskBERT (your design); "
            "this reads sbert.py's SentenceBERT, which this project's presets train"
        )


def kept_model(run_dir: Path, rt) -> tuple[RunConfig, nn.Module, dict]:
    """(config, best model, checkpoint info) of a finished run that keeps one model."""
    cfg = load_run_config(run_dir)
    one_model(cfg, str(run_dir))
    return cfg, *best_model(cfg, Path(run_dir), rt)


def predict(cfg: RunConfig, run_dir: Path, rt) -> None:
    """--predict: each kept model of the run scored on dev again, its prediction files
    (the handout's format) written again."""
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    task_data = plan_data(cfg, [], tokenizer)  # every split scored, no training set
    for name in PRESETS[cfg.preset].plans_of(cfg):
        run = sub_run(cfg, run_dir, name, rt)
        model, info = best_model(cfg, run.run_dir, rt)
        print(outputs.table_header(run.eval_tasks))
        row, dev = run.evaluated(model, task_data)  # dev scored once, its files written from it
        run.show({"stage": f"best: {info['row']['stage']}"} | row)
        out_dir = write_prediction_files(model, task_data, run, cfg.data.test_predictions, dev)
        print(f"predictions: {out_dir}")


PROBE_TOKENS = 32  # a CS224n sentence's tokens, padded: auto's precision probe's length


def run_runtime(cfg, config: BertConfig) -> Runtime:
    """The run's device and precision (runtime.make_runtime); auto on a CPU times bert.py's
    BertLayer of the checkpoint's `config`, with the run's dropout, on the run's batch of
    PROBE_TOKENS-token sentences."""
    shape = (cfg.optim.batch_size, PROBE_TOKENS, config.hidden_size)  # (B, T, H)
    probe = partial(layer_times, shape, lambda H: fast_dropout(BertLayer(config)))
    device = cfg.device
    return make_runtime(device.device, device.resolved_precision, device.dist_timeout, probe)


def main(argv=None):
    cfg, folders = parse_args(argv)
    if folders["show"]:  # loads nothing
        return print(show(cfg, PRESETS[cfg.preset]))
    preset = PRESETS[cfg.preset]
    if cfg.preset == "handout-starter":  # the handout's own run; `handout` completes it
        print(f"the handout's starter run: {preset.help} [{preset.source}]")
    else:
        print(f"this project's preset {cfg.preset}: {preset.help} [{preset.source}]")
    rt = run_runtime(cfg, checks.check_model(cfg))  # auto's precision probe: its layer
    check_loading(cfg, rt.device)
    run_dir = Path(
        from_main(cfg.run_dir or f"runs/{cfg.preset}-{time.strftime('%Y%m%d-%H%M%S')}", rt)
    )
    if folders["predict"]:
        return predict(cfg, run_dir, rt)
    resume = bool(folders["resume"])
    plans = PRESETS[cfg.preset].plans_of(cfg)
    if folders["score"]:
        return score_untrained(cfg, rt)
    require(plan_files(cfg, plans.stages()))
    if cfg.data.fit_minutes and not resume:
        cfg = fitted(cfg, plans, rt)
    if folders["estimate"]:
        return estimate(cfg, plans, rt)
    if not resume:  # a forgotten --resume stops before the data is read
        checkpoint.refuse_held(run_dir)
    task_data = seeded_data(cfg, plans)
    with checkpoint.locked(run_dir) if rt.main else nullcontext():
        if not resume:  # again, now that no other process can start one here
            checkpoint.refuse_held(run_dir)
        cfg = replace(cfg, run_dir=str(run_dir))
        if not resume and rt.main:
            checkpoint.atomic_write(
                json.dumps(flags.to_dict(cfg), indent=1), run_dir / "config.json"
            )
        try:
            with checkpoint.sigterm_stops():
                train_multitask(cfg, plans, task_data, run_dir, resume, rt)
        except KeyboardInterrupt:
            print(f"\ninterrupted; the run is saved: continue it with --resume {run_dir}")
            raise SystemExit(130) from None
        except torch.cuda.OutOfMemoryError as e:
            raise SystemExit(out_of_memory(e, cfg.optim.accumulate, run_dir)) from None


# ---------------------------------------------------------------------------------------
# The model a run builds


def model_factory(
    cfg: ModelConfig, tasks, readouts=None, compile=False
) -> Callable[[], SentenceBERT]:
    """Builds the model from a checkpoint when called (so its heads draw from the seeded RNG
    at the same point of every run); readouts: SentenceBERT's."""

    def make():
        bert = BertModel.from_pretrained(cfg.bert, attention=cfg.attention)
        check_attention(bert)  # torch's SDPA only where it computes what bert.py's does
        if compile:
            compile_layers(bert)
        model = SentenceBERT(bert, tasks, cfg.pooling, cfg.dropout, readouts, cfg.siamese)
        return fast_dropout(model)

    return make


def run_model(cfg: RunConfig, compile=False) -> Callable[[], nn.Module]:
    """The factory of a run's model: the handout's MultitaskBERT for its presets, else
    model_factory with the run's cross-encoded, thresholded and concatenation-head tasks."""
    if PRESETS[cfg.preset].handout_model:
        return handout_factory(cfg, compile)
    readouts = {t: "cross" for t in cfg.multitask.cross_encode}
    readouts |= {t: "cosine" for t in cosine_tasks(cfg)} | {t: "concat" for t in concat_tasks(cfg)}
    return model_factory(cfg.model, MULTITASK, readouts, compile)


def handout_factory(cfg: RunConfig, compile=False) -> Callable[[], nn.Module]:
    """Builds multitask_classifier.py's MultitaskBERT (the handout's: the student's design)
    from the handout's config when called; the handout's BERT_HIDDEN_SIZE, bert-base's 768,
    is set to the checkpoint's width first, so a body written with it runs on any."""

    def make():
        config = model_config(cfg.model, TASKS["sst"].num_labels, cfg.model.freeze_encoder)
        multitask_classifier.BERT_HIDDEN_SIZE = config.hidden_size
        model = multitask_classifier.MultitaskBERT(config)
        check_attention(model.bert)  # torch's SDPA only where it computes what bert.py's does
        if compile:
            compile_layers(model.bert)
        return fast_dropout(model)

    return make


# ---------------------------------------------------------------------------------------
# A preset under the typed flags


def settings_of(preset: Preset, typed: dict) -> dict:
    """The preset's overrides, and for a report's row its sizes and epochs times --scale (at
    least 1) and the share of each training set --scale keeps. A --dev_size typed
    smaller than the preset's held-out pairs shrinks them with it (unless
    --heldout_size is typed too): a small run is scored small. A typed --batch_size is
    SMART stages' batch too, unless --smart_batch_size is typed, and a typed --lr on a
    frozen encoder is the heads' (--head_lr), unless that is typed: no typed flag is lost.
    A typed --train_size or --dev_size turns --fit_minutes off unless it is typed too."""
    settings = preset.overrides
    if preset.scaled is not None:
        scale = typed.get("schedule.scale", ScheduleConfig.scale)
        shrunk = {k: max(1, round(v * scale)) for k, v in preset.scaled.items()}
        settings = settings | shrunk | {"data.train_share": scale}
    dev, heldout = typed.get("data.dev_size"), settings.get("data.heldout_size")
    if dev and heldout and "data.heldout_size" not in typed:
        settings = settings | {"data.heldout_size": min(heldout, dev)}
    if {"data.train_size", "data.dev_size"} & set(typed) and "data.fit_minutes" not in typed:
        settings = settings | {"data.fit_minutes": 0.0}  # a typed size is the size
    if "optim.batch_size" in typed and "smart.smart_batch_size" not in typed:
        settings = settings | {"smart.smart_batch_size": typed["optim.batch_size"]}
    frozen = typed.get("model.freeze_encoder", settings.get("model.freeze_encoder"))
    if frozen and "optim.lr" in typed and "schedule.head_lr" not in typed:
        settings = settings | {"schedule.head_lr": typed["optim.lr"]}  # what trains: heads
    refuse(
        typed.get("smart.smart_dropout") == "shared"
        and typed.get("smart.smart_variant", settings.get("smart.smart_variant")) == "reference",
        "--smart_dropout shared: --smart_variant reference draws every pass's own masks, as "
        "SMART's code does; leave --smart_dropout out, or use --smart_variant paper",
    )
    return settings


def overrides(typed: dict) -> dict:
    """The settings of the preset the user typed (or the default one), for config.parse."""
    name = typed.get("preset", RunConfig().preset)
    if name not in PRESETS:
        raise SystemExit(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    scaled = typed.get("schedule.scale", ScheduleConfig.scale) != 1
    refuse(
        scaled and PRESETS[name].scaled is None,
        f"--scale shrinks the reports' presets; {name} is not one",
    )
    return settings_of(PRESETS[name], typed)


def epilog() -> str:
    """The presets as --help lists them: each with its line and its source."""
    lines = [f"  {k:<20} {p.help} [{p.source}]" for k, p in PRESETS.items()]
    return "presets (--preset NAME --show prints what one trains):\n" + "\n".join(lines)


# ---------------------------------------------------------------------------------------
# What a run reads: the data sets a plan trains and scores on, and the files behind them


def plan_data(cfg: RunConfig, stages: list[Stage], tokenizer) -> dict:
    """Every split a run scores, and the training sets its stages train on."""
    cross = cfg.multitask.cross_encode
    trained = {t for s in stages for t in s.tasks}
    task_data = data.load_task_data(cfg.data, tokenizer, MULTITASK, cfg.seed, trained, cross)
    contrastive = [s.contrastive for s in stages if s.kind == CONTRASTIVE]
    if contrastive:
        s = contrastive[0]
        task_data[CONTRASTIVE] = load_contrastive_data(
            cfg.data, tokenizer, s.simcse_loss, s.simcse_data, cfg.seed
        )
    return task_data


def load_contrastive_data(cfg, tokenizer, objective: str, source: str, seed: int) -> data.TaskData:
    """Sentence tuples for a contrastive stage, tokenized once.

    source 'snli': (premise, entailment, contradiction) triplets, one per premise
    (simcse.build_triplets); 'para': Quora duplicate pairs (no negatives: for mnrl,
    align_uniform and the one-sentence objectives only); 'sst': SST training sentences (the
    one-sentence objectives only, Sicurello). Objectives that need fewer sentences take the
    first columns (unsup: the anchors).
    """
    folder = data.data_dir(cfg.data_dir)
    columns = simcse.OBJECTIVES[objective][0]
    examples = data.read_task(folder, source, "train", strict=cfg.strict)
    if source == "snli":
        tuples = simcse.build_triplets(examples, max_per_premise=1, seed=seed)
    elif source == "para":
        tuples = [(e.sentence1, e.sentence2) for e in examples if e.label == 1]
    else:
        tuples = [(e.sentence,) for e in examples]
    if not tuples:
        raise data.DataError(f"{folder}: no {source} sentence tuples for the {objective} objective")
    tuples = [t[:columns] for t in tuples]
    tuples = data.subset(tuples, cfg.train_size, cfg.train_share, seed, cfg.train_first)
    print(f"simcse ({objective}, {source}): {len(tuples)} examples of {columns}")
    return data.TaskData(data.TupleDataset(tuples, tokenizer, cfg.max_length), None, None)


def plan_files(cfg: RunConfig, stages: list[Stage]) -> list[Path]:
    """The files plan_data will read for these stages (checked before a folder is made)."""
    trained = {t for s in stages for t in s.tasks}
    contrastive = [s.contrastive.simcse_data for s in stages if s.kind == CONTRASTIVE]
    return files_read(cfg.data, MULTITASK, trained, (contrastive or [None])[0])


def files_read(cfg, tasks, train_tasks, contrastive_source: str | None = None) -> list[Path]:
    """The files load_task_data (and load_heldout, load_contrastive_data with that source)
    read for these arguments, so a run can name what is missing before it starts."""
    folder = data.data_dir(cfg.data_dir)
    files = []
    for task in tasks:
        splits = ["train"] if train_tasks is None or task in train_tasks else []
        splits += ["dev"] + (["test"] if cfg.test_predictions else [])
        files += [data.task_file(folder, task, split) for split in splits]
    if cfg.heldout_size:
        files.append(data.task_file(folder, "snli", "dev"))
    if contrastive_source:
        files.append(data.task_file(folder, contrastive_source, "train"))
    return list(dict.fromkeys(files))
