"""The command `python classifier.py`, the handout's Part 1: its flags (the handout's
defaults and names, 2023's --option and 2024's --fine-tune-mode), each task trained one
stage per epoch by the one training loop (runner.run_plan), the best dev accuracy kept,
its predictions written by the handout's file names."""

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import datasets as data
import settings
from base_bert import load_config, resolve_model_dir
from classifier import BertSentimentClassifier
from commands import cli, flags
from commands.checks import check_compile
from commands.command import run_runtime
from commands.flags import refuse
from commands.handout import (
    HANDOUT_FLAGS,
    MODES,
    handout_argv,
    handout_help,
    model_config,
    no_flags,
)
from commands.runfolder import Run, finish
from commands.runner import run_plan
from engine import checkpoint
from engine.runtime import check_attention, compile_layers, fast_dropout
from evaluation import TASKS
from presets import Stage
from settings import DataConfig, DeviceConfig, ModelConfig, OptimConfig, RunConfig, ScheduleConfig
from tokenizer import BertTokenizer

FROZEN_LR = ScheduleConfig.head_lr  # the handout's learning rate for a head on a frozen encoder


@dataclass
class ClassifierConfig:
    """what to run"""

    task: str = settings.option(
        "both", "data set; both: SST, then CFIMDB", choices=("sst", "cfimdb", "both")
    )
    option: str = settings.option(
        "pretrain",
        f"pretrain (2024: last-linear-layer): BERT frozen, train the head (--lr {FROZEN_LR} "
        "unless given); finetune (2024: full-model): train everything; the prediction files "
        "are named by the word typed",
        choices=("pretrain", "last-linear-layer", "finetune", "full-model"),
    )
    epochs: int = settings.option(10, "passes over the training set", minimum=1)
    seed: int = settings.option(RunConfig.seed, "random seed")
    run_dir: str | None = settings.option(
        None, "output folder; unset: runs/<option>-<time>, a subfolder per task when both train"
    )
    predictions_dir: str | None = settings.option(
        "predictions", "also copy the prediction files here, where the handout's command writes"
    )
    data: DataConfig = field(default_factory=lambda: DataConfig(max_length=512))
    model: ModelConfig = field(
        default_factory=lambda: ModelConfig(dropout=0.3, pooling="cls")
    )  # [CLS]
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(batch_size=8))
    device: DeviceConfig = field(default_factory=DeviceConfig)


FROZEN = ("pretrain", "last-linear-layer")
CFIMDB_BATCH = 8  # the handout's classifier.py trains CFIMDB (up to 512 tokens) at 8
# The handout's classifier.py names its files itself, whatever its --dev_out and --test_out say
NAMED = "accepted: predictions/{option}-{task}-{split}-out.csv, as the handout names them"
HANDOUT = HANDOUT_FLAGS | {"--dev_out": (1, no_flags, NAMED), "--test_out": (1, no_flags, NAMED)}


def frozen_lr(typed: dict) -> dict:
    """The frozen option's own learning rate, under an --lr the user typed."""
    return {"optim.lr": FROZEN_LR} if typed.get("option", ClassifierConfig.option) in FROZEN else {}


# Where this command differs from the 2024 handout's classifier.py on purpose
LR_2024 = (
    "--fine-tune-mode full-model: lr 1e-5, the 2023 handout's; the 2024 handout's "
    "classifier.py defaults to 1e-3 in both modes, its frozen mode's lr, where Devlin et al. "
    "fine-tune BERT at 2e-5 to 5e-5 (--lr 1e-3 gives the 2024 default)"
)


def typed_2024_full_model_lr(argv: list[str]) -> bool:
    """Whether argv asks for the 2024 handout's full-model mode and leaves --lr out."""
    words = [w for a in argv for w in a.split("=", 1)]
    mode = any(
        a == "--fine-tune-mode" and b == "full-model"
        for a, b in zip(words, words[1:], strict=False)
    )
    return mode and "--lr" not in words


def main(argv=None):
    raw = sys.argv[1:] if argv is None else argv
    if typed_2024_full_model_lr(raw):
        print(LR_2024)
    argv = handout_argv(raw, HANDOUT)
    cfg, _, _ = cli.parse(
        ClassifierConfig(),
        argv,
        "Sentiment classification with a frozen or fine-tuned BERT.",
        handout_help(HANDOUT),
        overrides=frozen_lr,
    )
    refuse(
        cfg.model.pooling != "cls",
        f"--pooling {cfg.model.pooling}: Part 1's model reads BERT's pooled [CLS], as the "
        "handout's; mean pooling is this project's SentenceBERT's (sbert.py)",
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.run_dir or f"runs/{cfg.option}-{stamp}")
    rt = run_runtime(cfg, load_config(resolve_model_dir(cfg.model.bert)))
    check_compile(cfg.device.compile, rt.device)
    tasks = ("sst", "cfimdb") if cfg.task == "both" else (cfg.task,)
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    return {
        t: train_task(cfg, t, run_dir / t if len(tasks) > 1 else run_dir, rt, tokenizer)
        for t in tasks
    }


def model_factory(cfg: ClassifierConfig, task: str):
    """Builds the task's BertSentimentClassifier from the checkpoint when called (its head
    draws from the seeded RNG at the same point of every run)."""

    def make():
        config = model_config(cfg.model, TASKS[task].num_labels, MODES[cfg.option])
        model = BertSentimentClassifier(config)
        check_attention(model.bert)  # torch's SDPA only where it computes what bert.py's does
        if cfg.device.compile:
            compile_layers(model.bert)
        return fast_dropout(model)

    return make


def train_task(cfg: ClassifierConfig, task: str, run_dir: Path, rt, tokenizer):
    """Train and score one task, the best epoch kept; its predictions by the handout's names."""
    torch.manual_seed(cfg.seed)
    task_data = data.load_task_data(cfg.data, tokenizer, (task,), cfg.seed)
    frozen = cfg.option in FROZEN
    batch = cfg.optim.batch_size if task == "sst" else min(cfg.optim.batch_size, CFIMDB_BATCH)
    make_model = model_factory(cfg, task)
    stages = [  # one stage per epoch, so each epoch gets a row and a chance to be kept
        Stage(
            (task,),
            cfg.optim.lr,
            batch,
            name=f"epoch {e + 1}",
            freeze_encoder=frozen,
        )
        for e in range(cfg.epochs)
    ]
    print(f"{task} {cfg.option}: {cfg.model.bert} on {rt.device} ({rt.precision}: {rt.why})")
    print(
        f"the handout's Part 1: {cfg.epochs} epochs, lr {cfg.optim.lr:g}, batch {batch}, "
        f"dropout {cfg.model.dropout:g}, {cfg.data.max_length} tokens, BERT's pooled [CLS]"
    )
    run_dir.mkdir(parents=True, exist_ok=True)  # its settings, for prepare_submit.py to read
    checkpoint.atomic_write(json.dumps(flags.to_dict(cfg), indent=1), run_dir / "config.json")
    option = cfg.option  # the handout's names: 2023's pretrain, finetune; 2024's words

    def named(folder, task, split):  # the handout's Part 1 files
        return Path(folder) / f"{option}-{task}-{split}-out.csv"

    run = Run(
        run_dir,
        rt,
        (task,),
        cfg.data.eval_batch_size,
        cfg.seed,
        score_train=True,
        prediction_file=named,
        copy_to=Path(cfg.predictions_dir) if cfg.predictions_dir else None,
    )
    t0 = time.time()
    model, rows, best = run_plan(stages, make_model(), task_data, cfg.optim, run)
    finish(model, rows, best, task_data, run, cfg.data.test_predictions, time.time() - t0)
    return rows, best
