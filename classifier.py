"""Single-task sentiment classification: the CS224n handout's Part 1 (the thesis's Phase 1).

BertSentimentClassifier is the handout's model, by its name: BERT, dropout on the pooled
[CLS] vector, one linear layer onto the task's classes (SST-5: 5, CFIMDB: 2). Its forward
is the `classifier` exercise; it reads without Part 2 (multitask_classifier.py).
- `--option pretrain` (2023's default; 2024: `--fine-tune-mode last-linear-layer`, its
  default): BERT frozen, only the linear layer learns (lr 1e-3 unless --lr);
- `--option finetune` (2024: `--fine-tune-mode full-model`): every parameter learns
  (--lr, default 1e-5).
The other defaults are the handout's classifier.py's: 10 epochs, batch 8 (CFIMDB always at
most 8), dropout 0.3, up to 512 tokens, seed 11711; the handout trains in float32, this
command in --precision (auto: bf16 where the device multiplies it natively, the first line
says which). The one
training loop (engine/runner.run_plan) trains it, one stage per epoch, the best dev accuracy
kept. As the handout's command does, one run trains SST, then CFIMDB (`--task` picks one),
and writes predictions/{option}-{sst|cfimdb}-{dev|test}-out.csv, named by the word typed
(2023: pretrain, finetune; 2024: last-linear-layer, full-model), into each task's run
folder and into ./predictions/ (--predictions_dir), where prepare_submit.py finds them.

    python classifier.py --option finetune --use_gpu --epochs 10 --lr 1e-5
    python classifier.py --fine-tune-mode full-model --use_gpu --lr 1e-5
"""

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

import datasets as data
from bert import BertModel
from engine import checkpoint, cli, flags
from engine.checks import check_compile
from engine.flags import (
    DataConfig,
    DeviceConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    ScheduleConfig,
    refuse,
)
from engine.handout import HANDOUT_FLAGS, handout_argv, handout_help, no_flags
from engine.runfolder import Run, finish
from engine.runner import run_plan
from engine.runtime import check_attention, compile_layers, fast_dropout, make_runtime
from evaluation import TASKS
from optimizer import AdamW
from presets import Stage
from tokenizer import BertTokenizer

FROZEN_LR = ScheduleConfig.head_lr  # the handout's learning rate for a head on a frozen encoder


class BertSentimentClassifier(nn.Module):
    """The handout's Part 1 model: BERT, dropout on the sentence's pooled [CLS] vector, one
    linear layer onto the task's C classes (SST: 5, CFIMDB: 2)."""

    def __init__(self, bert: BertModel, num_labels: int, dropout: float = 0.3):
        super().__init__()
        self.bert = bert
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(bert.config.hidden_size, num_labels)

    def forward(self, input_ids, attention_mask):
        """(B, T) token ids and mask -> (B, C) logits: F.cross_entropy's input, no softmax."""
        # BEGIN EXERCISE classifier: BERT's pooled [CLS] vector (its "pooler_output"), dropout, then the linear layer: (B, C) logits
        cls = self.bert(input_ids, attention_mask)["pooler_output"]  # (B, H)
        return self.classifier(self.dropout(cls))  # (B, C)
        # END EXERCISE classifier

    # How the one training loop (trainer.train_step: embed -> sentences -> readout) and the
    # evaluation (model.predict) read this model: forward is whole, so its logits stand
    # where a multitask model's pooled sentences stand, and nothing is perturbed (no SMART).
    cosine = ()  # no pair task cut by a threshold (evaluation.fit_thresholds)

    def embed(self, batch):
        return None

    def sentences(self, batch, embeds=None):
        return self(batch["input_ids"], batch["attention_mask"])  # (B, C) logits

    def readout(self, task, batch, logits):
        return logits

    def predict(self, task, batch):
        return self(batch["input_ids"], batch["attention_mask"])

    def config(self) -> dict:
        """What a checkpoint must match to load into this model."""
        bert = {k: v for k, v in self.bert.config.to_dict().items() if k != "attention"}
        return {"bert": bert, "classes": self.classifier.out_features, "dropout": self.dropout.p}

    def configure_optimizers(self, cfg: OptimConfig) -> AdamW:
        """AdamW over every parameter at one learning rate, as the handout's classifier.py:
        a frozen BERT has no gradients, and AdamW skips it."""
        return AdamW(
            self.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=cfg.foreach_adamw
        )


@dataclass
class ClassifierConfig:
    """what to run"""

    task: str = flags.option(
        "both", "data set; both: SST, then CFIMDB", choices=("sst", "cfimdb", "both")
    )
    option: str = flags.option(
        "pretrain",
        f"pretrain (2024: last-linear-layer): BERT frozen, train the head (--lr {FROZEN_LR} "
        "unless given); finetune (2024: full-model): train everything; the prediction files "
        "are named by the word typed",
        choices=("pretrain", "last-linear-layer", "finetune", "full-model"),
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


def main(argv=None):
    argv = handout_argv(sys.argv[1:] if argv is None else argv, HANDOUT)
    cfg, _, _ = flags.parse(
        ClassifierConfig(),
        argv,
        "Sentiment classification with a frozen or fine-tuned BERT.",
        handout_help(HANDOUT),
        overrides=frozen_lr,
    )
    refuse(
        cfg.model.pooling != "cls",
        f"--pooling {cfg.model.pooling}: Part 1's model reads BERT's pooled [CLS], as the "
        "handout's; mean pooling is Part 2's (multitask_classifier.py)",
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


def model_factory(cfg: ClassifierConfig, task: str):
    """Builds the task's BertSentimentClassifier from the checkpoint when called (its head
    draws from the seeded RNG at the same point of every run)."""

    def make():
        bert = BertModel.from_pretrained(cfg.model.bert, attention=cfg.model.attention)
        check_attention(bert)  # torch's SDPA only where it computes what bert.py's does
        if cfg.device.compile:
            compile_layers(bert)
        return fast_dropout(
            BertSentimentClassifier(bert, TASKS[task].num_labels, cfg.model.dropout)
        )

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


if __name__ == "__main__":
    cli.run_cli(main)
