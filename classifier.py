"""Single-task sentiment classification: the thesis's Phase 1 (CS224n handout part 1).

SST-5 (5 classes) and CFIMDB (2 classes), each with a linear head on BERT's pooled [CLS]:
- `--option pretrain` (the handout's default; or last-linear-layer): BERT frozen, only
  the head learns (lr 1e-3 unless --lr);
- `--option finetune`: every parameter learns (--lr, default 1e-5).
The defaults are the handout's classifier.py's: 10 epochs, batch 8 (CFIMDB always at most
8, as the handout's), dropout 0.3, up to 512 tokens, seed 11711. It is the multitask code
with one task: the same model class, the same training loop (trainer.run_plan) and the
same evaluation, scored on that task's dev set. As the handout's command does, one run
trains SST, then CFIMDB (`--task` picks one), and writes
predictions/{pretrain|finetune}-{sst|cfimdb}-{dev|test}-out.csv, the handout's names, into
each task's run folder and into ./predictions/ (--predictions_dir), where the handout's
prepare_submit.py finds them.

    python classifier.py --option finetune --use_gpu --epochs 10 --lr 1e-5
"""

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import datasets as data
import multitask_classifier as mt
from engine import checkpoint, flags, runtime
from engine.checks import check_compile
from engine.flags import (
    DataConfig,
    DeviceConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    ScheduleConfig,
)
from engine.handout import HANDOUT_FLAGS, handout_argv, handout_help, no_flags
from engine.runfolder import Run, finish
from engine.runtime import make_runtime
from presets import Stage
from tokenizer import BertTokenizer
from trainer import run_plan

FROZEN_LR = ScheduleConfig.head_lr  # the handout's learning rate for a head on a frozen encoder


class BertSentimentClassifier(mt.MultitaskBERT):
    """The handout's Part 1 model: BERT, dropout on the pooled sentence, a linear layer onto
    the task's classes (MultitaskBERT.readout's one-sentence branch: the `classifier`
    exercise). It is MultitaskBERT with one task, so the one training loop trains it."""

    def __init__(self, bert, task: str = "sst", pooling: str = "cls", dropout: float = 0.3):
        super().__init__(bert, (task,), pooling, dropout)
        self.task = task

    def logits(self, input_ids, attention_mask):
        """The handout's forward: (B, T) ids and mask -> (B, C) logits."""
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        return self(self.task, batch | {"token_type_ids": 0 * input_ids})  # one segment


@dataclass
class ClassifierConfig:
    """what to run"""

    task: str = flags.option(
        "both", "data set; both: SST, then CFIMDB", choices=("sst", "cfimdb", "both")
    )
    option: str = flags.option(
        "pretrain",
        f"pretrain (or last-linear-layer): BERT frozen, train the head (--lr {FROZEN_LR} "
        "unless given); finetune: train everything",
        choices=("pretrain", "last-linear-layer", "finetune"),
    )
    epochs: int = flags.option(10, "passes over the training set", minimum=1)
    seed: int = flags.option(RunConfig.seed, "random seed")
    run_dir: str | None = flags.option(
        None, "output folder; unset: runs/<option>-<time>, a subfolder per task when both train"
    )
    predictions_dir: str | None = flags.option(
        "predictions", "also copy the prediction files here, where the handout's command writes"
    )
    data: DataConfig = field(default_factory=lambda: DataConfig(max_length=512))
    model: ModelConfig = field(default_factory=lambda: ModelConfig(dropout=0.3, pooling="cls"))
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


def main(argv=None):
    argv = handout_argv(sys.argv[1:] if argv is None else argv, HANDOUT)
    cfg, _, _ = flags.parse(
        ClassifierConfig(),
        argv,
        "Sentiment classification with a frozen or fine-tuned BERT.",
        handout_help(HANDOUT),
        overrides=frozen_lr,
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.run_dir or f"runs/{cfg.option}-{stamp}")
    rt = make_runtime(cfg.device.device, cfg.device.resolved_precision, cfg.device.dist_timeout)
    check_compile(cfg.device.compile, rt.device)
    tasks = ("sst", "cfimdb") if cfg.task == "both" else (cfg.task,)
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    return {
        t: train_task(cfg, t, run_dir / t if len(tasks) > 1 else run_dir, rt, tokenizer)
        for t in tasks
    }


def train_task(cfg: ClassifierConfig, task: str, run_dir: Path, rt, tokenizer):
    """Train and score one task, the best epoch kept; its predictions by the handout's names."""
    torch.manual_seed(cfg.seed)
    task_data = data.load_task_data(cfg.data, tokenizer, (task,), cfg.seed)
    frozen = cfg.option in FROZEN
    batch = cfg.optim.batch_size if task == "sst" else min(cfg.optim.batch_size, CFIMDB_BATCH)
    make_model = mt.model_factory(
        cfg.model, (task,), compile=cfg.device.compile, model_class=BertSentimentClassifier
    )
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
        f"dropout {cfg.model.dropout:g}, {cfg.data.max_length} tokens, {cfg.model.pooling} pooling"
    )
    run_dir.mkdir(parents=True, exist_ok=True)  # its settings, for prepare_submit.py to read
    checkpoint.atomic_write(json.dumps(flags.to_dict(cfg), indent=1), run_dir / "config.json")
    option = "pretrain" if frozen else "finetune"  # the handout's names of the two

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


if __name__ == "__main__":
    runtime.run_cli(main)
