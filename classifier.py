"""Single-task sentiment classification: the thesis's Phase 1 (CS224n handout part 1).

SST-5 (5 classes) or CFIMDB (2 classes) with a linear head on the pooled sentence:
- `--option last-linear-layer`: BERT frozen, only the head learns (lr 1e-3 unless --lr);
- `--option finetune`: every parameter learns (--lr, default 1e-5).
It is the multitask code with one task: the same model class, the same training loop
(trainer.run_plan) and the same evaluation, scored on that task's dev set.

    python classifier.py --task sst --option finetune
"""

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import cli
import config
import datasets as data
import multitask_classifier as mt
from base_bert import EMBEDDED
from config import (
    DataConfig,
    DeviceConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    ScheduleConfig,
)
from plans import Stage, check_compile
from runfolder import Run, finish
from runtime import make_runtime
from tokenizer import BertTokenizer
from trainer import run_plan

FROZEN_LR = ScheduleConfig.head_lr  # the handout's learning rate for a head on a frozen encoder


@dataclass
class ClassifierConfig:
    """what to run"""

    task: str = config.option("sst", "data set", choices=("sst", "cfimdb"))
    option: str = config.option(
        "finetune",
        f"last-linear-layer: BERT frozen, train the head (--lr {FROZEN_LR} unless given); "
        "finetune: train everything",
        choices=("last-linear-layer", "finetune"),
    )
    epochs: int = config.option(10, "passes over the training set", minimum=1)
    seed: int = config.option(RunConfig.seed, "random seed")
    run_dir: str | None = config.option(None, "output folder; unset: runs/<task>-<option>-<time>")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig(bert=EMBEDDED, dropout=0.3))
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(batch_size=16))
    device: DeviceConfig = field(default_factory=DeviceConfig)


def frozen_lr(typed: dict) -> dict:
    """The frozen option's own learning rate, under an --lr the user typed."""
    return {"optim.lr": FROZEN_LR} if typed.get("option") == "last-linear-layer" else {}


def main(argv=None):
    cfg, _, _ = cli.parse(
        ClassifierConfig(),
        argv,
        "Sentiment classification with a frozen or fine-tuned BERT.",
        overrides=frozen_lr,
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.run_dir or f"runs/{cfg.task}-{cfg.option}-{stamp}")
    torch.manual_seed(cfg.seed)
    rt = make_runtime(cfg.device.device, cfg.device.resolved_precision, cfg.device.dist_timeout)
    check_compile(cfg.device.compile, rt.device)
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    tasks = (cfg.task,)
    task_data = data.load_task_data(cfg.data, tokenizer, tasks, cfg.seed)
    frozen = cfg.option == "last-linear-layer"
    make_model = mt.model_factory(cfg.model, tasks, compile=cfg.device.compile)
    stages = [  # one stage per epoch, so each epoch gets a row and a chance to be kept
        Stage(
            tasks, cfg.optim.lr, cfg.optim.batch_size, name=f"epoch {e + 1}", freeze_encoder=frozen
        )
        for e in range(cfg.epochs)
    ]
    print(f"{cfg.task} {cfg.option}: {cfg.model.bert} on {rt.device} ({rt.precision}: {rt.why})")
    run = Run(run_dir, rt, tasks, cfg.data.eval_batch_size, cfg.seed, score_train=True)
    t0 = time.time()
    model, rows, best = run_plan(stages, make_model(), task_data, cfg.optim, run)
    finish(model, rows, best, task_data, run, cfg.data.test_predictions, time.time() - t0)
    return rows, best


if __name__ == "__main__":
    cli.run_cli(main)
