"""Multitask Sentence-BERT and the thesis's training schedules.

One shared BERT encoder, three task heads (Reimers & Gurevych, 2019, Sentence-BERT):
- sentiment (SST-5): mean-pooled sentence -> dropout -> Linear(5), cross-entropy;
- paraphrase (Quora): siamese [u, v, |u - v|] -> Linear(1), one logit, binary cross-entropy;
- similarity (STS-B): cosine(u, v) * 2.5 + 2.5 against the 0-5 score, mean squared error.

Training is a plan: a list of stages (task, share of its data, epochs, hyperparameters),
run by one loop. The thesis ("SMART-SBERT with SimCSE: a robust defense against
catastrophic forgetting") trains sequentially: one QQP epoch, then loops of
STS -> SST -> a fresh 3% of QQP, keeping the model with the best overall dev score.
After every stage all three dev sets are scored: one row of the forgetting table.

    python multitask_classifier.py                    # thesis preset, bert-base-uncased
    python multitask_classifier.py --preset sequential --bert minilm
    python multitask_classifier.py --resume runs/thesis-...
"""

import argparse
import json
import math
import os
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset
from tqdm.auto import tqdm

import datasets as data
import evaluation
import simcse
from bert import BertModel, mean_pool
from optimizer import AdamW, flatten_grads, pcgrad, random_loss_weights, write_flat_grads
from smart import EMATeacher, SmartConfig, beta_schedule, smart_loss
from tokenizer import BertTokenizer

TASKS = evaluation.TASKS  # task -> kind, labels, pair or not, title
MULTITASK = ("sst", "para", "sts")


# Losses of a task's output (out: (B, C) logits, or (B,) a logit or score; labels (B,)),
# each a batch mean, right on a short last batch too.
OUTPUT_LOSSES = {
    "ce": lambda out, y: F.cross_entropy(out, y),
    "bce": lambda out, y: F.binary_cross_entropy_with_logits(out, y.to(out.dtype)),
    "mse": lambda out, y: F.mse_loss(out, y.to(out.dtype)),
    "l1": lambda out, y: F.l1_loss(out, y.to(out.dtype)),  # Auslin et al.'s STS option
}
DEFAULT_LOSS = {"classification": "ce", "binary": "bce", "regression": "mse"}
LOSS_CHOICES = {  # task -> the losses it may use (--para_loss, --sts_loss)
    "para": ("bce", "contrastive", "mnrl"),
    "sts": ("mse", "l1", "cosine_mse", "mnrl"),
}
POSITIVE = {"binary": 1.0, "regression": 4.0}  # label from which a pair counts as positive


def ranking_on_positives(u, v, labels, kind):
    """Multiple-negatives ranking over the batch's positive pairs only (Broadhurst et al.)."""
    keep = labels >= POSITIVE[kind]  # (B,) duplicates, or STS scores >= 4
    if not keep.any():
        return (u.sum() + v.sum()) * 0.0  # no positive pair in this batch: nothing to rank
    return simcse.multiple_negatives_ranking_loss(u[keep], v[keep], temperature=0.05)


# Losses of the two sentence embeddings u, v (B, H) of siamese pairs, and labels (B,).
PAIR_LOSSES = {
    "cosine_mse": lambda u, v, y, kind: F.mse_loss(
        F.cosine_similarity(u, v, dim=-1),
        y.to(u.dtype) / 2.5 - 1,  # labels to [-1, 1]
    ),
    "contrastive": lambda u, v, y, kind: simcse.contrastive_margin_loss(u, v, y, margin=0.5),
    "mnrl": ranking_on_positives,
}


class MultitaskBERT(nn.Module):
    """A shared BERT with one small head per task.

    `forward(task, batch, embeds=None)` is the only prediction path: given `embeds` (the
    embedding output, e.g. perturbed by SMART) it runs from there instead of from ids.
    Pair batches are siamese, (2, B, T): both sentences go through BERT in one forward.
    """

    def __init__(self, bert: BertModel, tasks=MULTITASK, pooling="mean", dropout=0.1, cross=()):
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        self.bert, self.pooling, self.tasks = bert, pooling, tuple(tasks)
        self.dropout = nn.Dropout(dropout)
        H = bert.config.hidden_size
        self.heads = nn.ModuleDict()
        for name in self.tasks:
            spec = TASKS[name]
            if spec.kind == "classification":
                self.heads[name] = nn.Linear(H, spec.num_labels)
            elif spec.kind == "binary":
                self.heads[name] = nn.Linear(3 * H, 1)  # on [u, v, |u - v|]
            # regression (similarity) is a scaled cosine: no parameters
        self.cross = tuple(cross)
        for name in self.cross:  # cross-encoded pairs: a linear head on [CLS] a [SEP] b [SEP]
            self.heads[f"{name}_cross"] = nn.Linear(H, 1)

    def config(self) -> dict:
        """What a checkpoint must match to load into this model."""
        return {
            # the attention kernel does not change the weights, so it may differ
            "bert": {k: v for k, v in self.bert.config.to_dict().items() if k != "attention"},
            "tasks": list(self.tasks),
            "pooling": self.pooling,
            "dropout": self.dropout.p,
            "cross": list(self.cross),
        }

    @staticmethod
    def flat_inputs(batch):
        """(B, T) tensors as they are; K sentences per example (K, B, T) -> (K * B, T)."""
        ids, mask, types = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
        if ids.dim() == 3:
            T = ids.size(-1)
            ids, mask, types = ids.view(-1, T), mask.view(-1, T), types.view(-1, T)  # (KB, T)
        return ids, mask, types

    def embed(self, batch):
        """Embedding output (N, T, H) of a batch; N = 2B for siamese pairs."""
        ids, _, types = self.flat_inputs(batch)
        return self.bert.embed(ids, types)

    def sentences(self, batch, embeds=None):
        """Pooled sentence embeddings (N, H) of every sentence in the batch, before dropout."""
        ids, mask, types = self.flat_inputs(batch)
        if embeds is None:
            embeds = self.bert.embed(ids, types)
        out = self.bert.encode(embeds, mask)
        if self.pooling == "mean":
            return mean_pool(out["last_hidden_state"], mask)  # (N, H)
        return out["pooler_output"]  # (N, H): BERT's pooled [CLS]

    def forward(self, task, batch, embeds=None):
        pooled = self.dropout(self.sentences(batch, embeds))  # (N, H)
        kind = TASKS[task].kind
        if batch["input_ids"].dim() == 2:  # one sequence per example
            if TASKS[task].pair:  # a cross-encoded pair: one logit or score
                return self.heads[f"{task}_cross"](pooled).squeeze(-1)  # (B,)
            return self.heads[task](pooled)  # (B, C)
        u, v = pooled.view(2, -1, pooled.size(-1)).unbind(0)  # (2B, H) -> (B, H), (B, H)
        if kind == "regression":
            return F.cosine_similarity(u, v, dim=-1) * 2.5 + 2.5  # (B,) in [0, 5]
        head, d = self.heads[task], (u - v).abs()
        # A paraphrase is symmetric, so average both orders: W_u and W_v then act alike.
        both = head(torch.cat([u, v, d], -1)) + head(torch.cat([v, u, d], -1))  # (B, 1)
        return both.squeeze(-1) / 2  # (B,)

    def predict(self, task, batch):
        return self(task, batch)


# ---------------------------------------------------------------------------------------
# Plans: a training schedule is data


# simcse stages: objective -> (sentences per example, loss of z (K, B, H) at temperature t)
OBJECTIVES = {
    "sup": (3, lambda z, t: simcse.sup_simcse_loss(z[0], z[1], z[2], t)),
    "triplet": (3, lambda z, t: simcse.triplet_simcse_loss(z[0], z[1], z[2], t)),
    "unsup": (1, lambda z, t: simcse.unsup_simcse_loss(z[0], z[1], t)),
    "mnrl": (2, lambda z, t: simcse.multiple_negatives_ranking_loss(z[0], z[1], t)),
    "align_uniform": (
        2,
        lambda z, t: (
            simcse.alignment(z[0], z[1]) + (simcse.uniformity(z[0]) + simcse.uniformity(z[1])) / 2
        ),
    ),
}


STAGE_CHOICES = {  # multitask stages: the values each of these Stage fields may take
    "mixing": ("simultaneous", "round_robin"),
    "weighting": ("equal", "random", "pcgrad"),
    "order": ("fixed", "random"),
}


@dataclass
class Stage:
    task: str  # the task trained in this stage, or 'simcse' (contrastive, encoder only)
    fraction: float = 1.0  # share of its training set, a fresh random subset each stage
    epochs: int = 1  # passes over that share
    lr: float = 1e-5  # AdamW learning rate during the stage
    batch_size: int = 32  # examples per step
    smart: SmartConfig = field(default_factory=lambda: SmartConfig(lambda_s=0.0, mu=0.0))
    name: str = ""  # label of the stage's row in the forgetting table
    objective: str = "sup"  # simcse stages: a key of OBJECTIVES
    temperature: float = 0.05  # simcse stages: softmax temperature of the similarities
    select_by_sts: bool = False  # keep the epoch with the best STS dev Pearson (SimCSE)
    freeze_encoder: bool = False  # train only the heads (EquiBERT's frozen encoder)
    losses: dict = field(default_factory=dict)  # task -> loss name; default ce / bce / mse
    tasks: tuple = MULTITASK  # multitask stages: the tasks trained together
    mixing: str = "simultaneous"  # multitask: a batch of every task per step, or round_robin
    weighting: str = "equal"  # simultaneous: 'equal', 'random' (Lin et al.) or 'pcgrad'
    order: str = "fixed"  # round_robin: 'fixed' or 'random' task order in each cycle
    examples_per_task: int = 0  # multitask: each task sampled/repeated to this size (0: as is)

    def __post_init__(self):
        allowed = {"task": (*TASKS, "simcse", "multitask")} | STAGE_CHOICES
        for name, values in allowed.items():
            if getattr(self, name) not in values:
                raise ValueError(
                    f"unknown {name} {getattr(self, name)!r}; expected one of {sorted(values)}"
                )
        for task, loss in self.losses.items():
            allowed = LOSS_CHOICES.get(task, (DEFAULT_LOSS[TASKS[task].kind],))
            if loss not in allowed:
                raise ValueError(f"loss {loss!r} does not fit task {task!r}; expected {allowed}")
        if self.objective not in OBJECTIVES:
            raise ValueError(
                f"unknown objective {self.objective!r}; expected one of {list(OBJECTIVES)}"
            )
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")
        if self.task == "simcse":
            self.name = self.name or f"SimCSE ({self.objective})"
        if self.task == "multitask":
            how = self.weighting if self.mixing == "simultaneous" else f"{self.order} order"
            self.name = self.name or f"{self.mixing.replace('_', '-')} ({how})"
        self.name = self.name or (
            f"{TASKS[self.task].title}" + (f" {self.fraction:.0%}" if self.fraction < 1 else "")
        )


def task_stage(args, task, fraction=1.0, epochs=1, name=""):
    """A stage with this run's hyperparameters for `task` (lr, batch, SMART weights)."""
    lambda_s = getattr(args, f"lambda_{task}", 0.0) if args.smart else 0.0
    smart = SmartConfig(lambda_s=lambda_s, mu=args.mu if args.smart else 0.0)
    batch = args.smart_batch_size if args.smart else args.batch_size
    return Stage(task, fraction, epochs, args.lr, batch, smart, name, losses=loss_choices(args))


def loss_choices(args) -> dict:
    """--para_loss / --sts_loss, where they differ from the default loss."""
    return {t: getattr(args, f"{t}_loss") for t in ("para", "sts") if getattr(args, f"{t}_loss")}


def multitask_plan(args):
    """All tasks at once for --multitask_epochs: simultaneous (weighted or PCGrad) or
    round-robin batches, as in the CS224n reports of Broadhurst & Maffezzoli, Auslin et al.
    and Sicurello."""
    stage = Stage(
        "multitask",
        epochs=args.multitask_epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        losses=loss_choices(args),
        mixing=args.mixing,
        weighting=args.weighting,
        order=args.order,
        examples_per_task=args.examples_per_task,
    )
    return [
        replace(stage, name=f"{stage.name} epoch {e + 1}", epochs=1) for e in range(stage.epochs)
    ]


def thesis_plan(args):
    """One QQP epoch, then `loops` x (STS -> SST -> a fresh 3% of QQP): thesis Fig. 4.10."""
    plan = [task_stage(args, "para", name="QQP")]
    for i in range(1, args.loops + 1):
        plan += [
            task_stage(args, "sts", name=f"loop {i}: STS"),
            task_stage(args, "sst", name=f"loop {i}: SST"),
            task_stage(
                args, "para", args.para_fraction, name=f"loop {i}: QQP {args.para_fraction:.0%}"
            ),
        ]
    return plan


def sequential_plan(args):
    """QQP 3 epochs -> STS 10 -> SST 10 (thesis 4.2.2.1): forgetting in plain sight."""
    e = args.sequential_epochs
    return [
        task_stage(args, t, epochs=n) for t, n in (("para", e[0]), ("sts", e[1]), ("sst", e[2]))
    ]


def individual_plans(args):
    """Three separate models, one per task (thesis Table 4.2)."""
    return {t: [task_stage(args, t, epochs=args.individual_epochs)] for t in MULTITASK}


def simcse_stage(args, objective=None):
    """Contrastive training of the encoder, keeping the epoch with the best STS dev r."""
    return Stage(
        "simcse",
        epochs=args.simcse_epochs,
        lr=args.simcse_lr,
        batch_size=args.simcse_batch_size,
        objective=objective or args.simcse_loss,
        temperature=args.temperature,
        select_by_sts=True,
    )


def frozen_heads_plan(args):
    """Heads on a frozen encoder (EquiBERT); STS is the encoder's own cosine, no training."""
    return [
        Stage(t, epochs=args.individual_epochs, lr=args.head_lr, freeze_encoder=True)
        for t in ("sst", "para")
    ]


PRESETS = {
    "thesis": ("SBERT, thesis schedule (Table 4.10)", thesis_plan),
    "thesis-smart": ("SMART + SBERT, thesis schedule (SS, Table 4.11)", thesis_plan),
    "thesis-smart-simcse": (
        "SimCSE on SNLI, then SMART + SBERT thesis schedule (SSS, Table 4.12)",
        lambda a: [simcse_stage(a)] + thesis_plan(a),
    ),
    "simcse": ("SimCSE alone, scored on STS (Table 4.12's first row)", lambda a: [simcse_stage(a)]),
    "unsup-simcse": (
        "unsupervised SimCSE, then heads on the frozen encoder",
        lambda a: [simcse_stage(a, "unsup")] + frozen_heads_plan(a),
    ),
    "equibert": (
        "alignment + uniformity, then heads on the frozen encoder (EquiBERT)",
        lambda a: [simcse_stage(a, "align_uniform")] + frozen_heads_plan(a),
    ),
    "sequential": ("QQP -> STS -> SST, no revisits (4.2.2.1)", sequential_plan),
    "individual": ("one model per task (Table 4.2)", None),
    "multitask": (
        "all tasks at once: --mixing, --weighting, --order (CS224n reports)",
        multitask_plan,
    ),
}


def build_plans(args) -> dict[str, list[Stage]]:
    """{sub-run name: plan}; most presets are one plan, `individual` is three."""
    if args.preset not in PRESETS:
        raise SystemExit(f"unknown preset {args.preset!r}; choose from {', '.join(PRESETS)}")
    if args.preset.startswith("thesis-smart"):
        args.smart = True
    if args.preset == "individual":
        return individual_plans(args)
    return {"": PRESETS[args.preset][1](args)}


# ---------------------------------------------------------------------------------------
# Device and precision, decided once


@dataclass
class Runtime:
    device: torch.device
    amp_dtype: torch.dtype | None  # autocast dtype, None for float32
    scaler: torch.amp.GradScaler | None  # only for float16

    def autocast(self):
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)


def make_runtime(device_arg: str, amp: bool) -> Runtime:
    if device_arg.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {device_arg}: no CUDA device is available here; use cpu")
    device = torch.device(
        device_arg if device_arg != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    )
    if device.type != "cuda" or not amp:
        return Runtime(device, None, None)
    if torch.cuda.is_bf16_supported(including_emulation=False):  # Ampere or newer
        return Runtime(device, torch.bfloat16, None)
    return Runtime(device, torch.float16, torch.amp.GradScaler("cuda"))


# ---------------------------------------------------------------------------------------
# Data


@dataclass
class TaskData:
    train: data.SentenceDataset | data.PairDataset | data.TupleDataset | None
    dev: data.SentenceDataset | data.PairDataset | None
    test: data.SentenceDataset | data.PairDataset | None


def random_subset(examples, n, seed):
    """A fixed random subset of n examples (all when n is 0 or covers them)."""
    if not n or n >= len(examples):
        return examples
    keep = sorted(random.Random(seed).sample(range(len(examples)), n))
    return [examples[i] for i in keep]


def load_task_data(args, tokenizer, tasks, train_tasks=None) -> dict[str, TaskData]:
    """Read and tokenize each task's splits once; the ids are reused every epoch.

    Training sets are read only for `train_tasks` (None: every task), so a run that trains
    one task, or only the encoder (simcse), does not tokenize the others for nothing.
    """
    folder = data.data_dir(args.data_dir)
    out = {}
    for task in tasks:

        def load(split, limit, task=task):
            examples = random_subset(
                data.read_task(folder, task, split, args.strict), limit, args.seed
            )
            if not TASKS[task].pair:
                return data.SentenceDataset(examples, tokenizer, args.max_length)
            cross = task in args.cross_encode  # one [CLS] a [SEP] b [SEP] sequence per pair
            return data.PairDataset(examples, tokenizer, args.max_length, cross_encode=cross)

        out[task] = TaskData(
            train=load("train", args.train_size)
            if train_tasks is None or task in train_tasks
            else None,
            dev=load("dev", args.dev_size),
            test=load("test", args.dev_size) if args.test_predictions else None,
        )
        sizes = {k: len(v) for k, v in vars(out[task]).items() if v is not None}
        print(f"{TASKS[task].title}: " + ", ".join(f"{n} {k}" for k, n in sizes.items()))
    return out


def load_contrastive_data(args, tokenizer, objective) -> TaskData:
    """Sentence tuples for a simcse stage, tokenized once.

    snli: (premise, entailment, contradiction) triplets, one per premise (simcse.build_triplets);
    para: Quora duplicate pairs (no negatives: for mnrl, align_uniform and unsup only).
    Objectives that need fewer sentences take the first columns (unsup: the anchors).
    """
    folder = data.data_dir(args.data_dir)
    columns = OBJECTIVES[objective][0]
    if args.simcse_data == "snli":
        snli = data.read_task(folder, "snli", "train", strict=args.strict)
        tuples = simcse.build_triplets(snli, max_per_premise=1, seed=args.seed)
    else:
        if columns == 3:
            raise SystemExit(f"--simcse_loss {objective} needs negatives: use --simcse_data snli")
        para = data.read_task(folder, "para", "train", strict=args.strict)
        tuples = [(e.sentence1, e.sentence2) for e in para if e.label == 1]
    tuples = random_subset([t[:columns] for t in tuples], args.train_size, args.seed)
    print(f"simcse ({objective}, {args.simcse_data}): {len(tuples)} examples of {columns}")
    return TaskData(
        train=data.TupleDataset(tuples, tokenizer, args.max_length), dev=None, test=None
    )


def subset_loader(dataset, keep: list[int], batch_size: int, generator) -> DataLoader:
    """Shuffled, length-bucketed batches over dataset[keep] (keep may repeat indices)."""
    lengths = [dataset.lengths[i] for i in keep]
    sampler = data.LengthBucketSampler(lengths, batch_size, shuffle=True, generator=generator)
    return DataLoader(Subset(dataset, keep), batch_sampler=sampler, collate_fn=dataset.collate)


def stage_loader(dataset, stage: Stage, generator: torch.Generator) -> DataLoader:
    """Batches over a fresh random `fraction` of the data."""
    n = len(dataset)
    keep = torch.randperm(n, generator=generator)[: max(1, round(stage.fraction * n))].tolist()
    return subset_loader(dataset, keep, stage.batch_size, generator)


class SingleTask:
    """A one-task loader seen as steps of [(task, batch)], like a multitask stage's."""

    def __init__(self, loader, task):
        self.loader, self.task = loader, task

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        return ([(self.task, batch)] for batch in self.loader)


def stage_tasks(stage: Stage) -> tuple:
    """The data sets a stage trains on."""
    return stage.tasks if stage.task == "multitask" else (stage.task,)


def stage_steps(task_data, stage: Stage, generator: torch.Generator):
    """The steps of a stage: each a list of (task, batch) trained together."""
    if stage.task != "multitask":
        return SingleTask(stage_loader(task_data[stage.task].train, stage, generator), stage.task)
    loaders = {}
    for task in stage.tasks:
        dataset = task_data[task].train
        if stage.examples_per_task:
            keep = data.standardized_indices(len(dataset), stage.examples_per_task, generator)
        else:
            keep = torch.randperm(len(dataset), generator=generator).tolist()
        loaders[task] = subset_loader(dataset, keep, stage.batch_size, generator)
    return data.MultiTaskBatches(loaders, stage.mixing, stage.order, generator)


# ---------------------------------------------------------------------------------------
# Checkpoints (atomic: a crash never leaves a half-written file)


def atomic_save(obj, path: Path):
    """torch.save (or, for a str, a text file) to a temporary name, then rename."""
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(obj, str):
        tmp.write_text(obj)
    else:
        torch.save(obj, tmp)
    os.replace(tmp, path)


def check_compatible(saved: dict, current: dict, path):
    """Stop with the differing fields when a checkpoint was made for another model."""
    diffs = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += [
                f"{key}.{k}: {a.get(k)!r} vs {b.get(k)!r}"
                for k in sorted(set(a) | set(b))
                if a.get(k) != b.get(k)
            ]
        elif a != b:
            diffs.append(f"{key}: {a!r} vs {b!r}")
    if diffs:
        raise SystemExit(
            f"{path} was saved for another model (checkpoint vs now): " + "; ".join(diffs)
        )


def load_model_checkpoint(model: MultitaskBERT, path: Path) -> dict:
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    check_compatible(ckpt["config"], model.config(), path)
    model.load_state_dict(ckpt["model"])
    return ckpt


def rng_state() -> dict:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict):
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------
# The one training loop


def selection_score(metrics: dict, tasks) -> float:
    """Overall score when all three tasks are scored, else the one task's main metric."""
    if set(MULTITASK) <= set(tasks):
        return metrics["overall"]
    task = tasks[0]
    return metrics[task]["pearson" if TASKS[task].kind == "regression" else "accuracy"]


def score_row(results: dict, tasks) -> dict:
    """Flatten evaluation results into one forgetting-table row."""
    row = {t: results[t].metrics for t in tasks}
    if set(MULTITASK) <= set(tasks):
        row["overall"] = evaluation.overall_from_results(results)
    return row


def format_row(name, row, tasks) -> str:
    cells = [f"{name:<20s}"]
    for t in tasks:
        m = row.get(t)
        if TASKS[t].kind == "regression":
            cells.append(f"{m['pearson']:>7.3f}" if m else f"{'':>7s}")
        else:
            cells.append(f"{m['accuracy']:>7.3f} {m['weighted_f1']:>6.3f}" if m else f"{'':>14s}")
    if "overall" in row:
        cells.append(f"{row['overall']:>8.4f}")
    if "train" in row:
        cells.append("train " + format_row("", row["train"], tasks).strip(" |"))
    return " | ".join(cells)


def table_header(tasks) -> str:
    cells = [f"{'stage':<20s}"]
    for t in tasks:
        title = TASKS[t].title
        cells.append(
            f"{title + ' r':>7s}"
            if TASKS[t].kind == "regression"
            else f"{title + ' acc':>7s} {'F1w':>6s}"
        )
    if set(MULTITASK) <= set(tasks):
        cells.append(f"{'overall':>8s}")
    line = " | ".join(cells)
    return f"{line}\n{'-' * len(line)}"


def smart_term(model, task, cfg: SmartConfig, batch, embeds, out, teacher):
    """SMART's lambda_s * R_s + mu * D_Breg for this batch, the same code for every task."""

    def from_embeddings(e):  # (N, T, H) embedding output -> the task's output
        return model(task, batch, e).float()

    teacher_out = teacher.forward(model, task, batch).float() if teacher else None
    mask = model.flat_inputs(batch)[1]  # (N, T): padding gets no noise
    kind = TASKS[task].kind
    return smart_loss(from_embeddings, embeds, out.float(), kind, teacher_out, cfg, mask)


def batch_loss(model, task, batch, smart: SmartConfig, teacher, rt: Runtime, loss_name=None):
    """The training loss of one batch: the task's loss, plus SMART's terms when on."""
    name = loss_name or DEFAULT_LOSS[TASKS[task].kind]
    with rt.autocast():
        if name in PAIR_LOSSES:  # a loss of the two sentence embeddings, no head
            z = model.sentences(batch).float()  # (2B, H)
            u, v = z.view(2, -1, z.size(-1)).unbind(0)  # (B, H) each
            return PAIR_LOSSES[name](u, v, batch["labels"], TASKS[task].kind)
        embeds = model.embed(batch)  # (N, T, H), kept so SMART can perturb it
        out = model(task, batch, embeds)
        loss = OUTPUT_LOSSES[name](out.float(), batch["labels"])
        if smart.active:
            loss = loss + smart_term(model, task, smart, batch, embeds, out, teacher)
    return loss


def contrastive_loss(model, stage: Stage, batch, rt: Runtime):
    """A simcse stage's loss on a (K, B, T) batch of sentence tuples (no heads involved)."""
    if stage.objective == "unsup":  # the same sentences twice: dropout is the only noise
        batch = {k: v.repeat(2, 1, 1) if k != "ids" else v for k, v in batch.items()}  # (2, B, T)
    K = batch["input_ids"].size(0)
    with rt.autocast():
        z = model.sentences(batch).float()  # (K * B, H)
    z = z.view(K, -1, z.size(-1))  # (K, B, H)
    return OBJECTIVES[stage.objective][1](z, stage.temperature)


def optimizer_step(loss, optimizer, rt: Runtime):
    optimizer.zero_grad(set_to_none=True)
    if rt.scaler:  # float16: scale the loss so small gradients do not underflow
        rt.scaler.scale(loss).backward()
        rt.scaler.step(optimizer)
        rt.scaler.update()
    else:
        loss.backward()
        optimizer.step()


class NonFiniteLoss(RuntimeError):
    pass


def pcgrad_step(model, optimizer, losses, generator):
    """One update from several task losses with gradient surgery (PCGrad, Yu et al., 2020).

    Each task's gradient on the shared encoder is taken alone (one flat copy per task),
    projected off the others where they conflict, and summed; the heads are per task, so
    their gradients just accumulate.
    """
    shared = [p for p in model.bert.parameters() if p.requires_grad]
    optimizer.zero_grad(set_to_none=True)
    grads = []
    for loss in losses:
        for p in shared:
            p.grad = None
        loss.backward()
        grads.append(flatten_grads(shared))  # (P,)
    write_flat_grads(shared, pcgrad(grads, generator))
    optimizer.step()


def train_stage(
    model, optimizer, stage, steps, rt: Runtime, desc: str, after_epoch=None, generator=None
) -> float:
    """Train one stage; returns the mean training loss. after_epoch(epoch) runs after each.

    `steps` yields lists of (task, batch): one pair for single-task stages, several for
    simultaneous multitask ones, whose losses are combined by stage.weighting.
    """
    for group in optimizer.param_groups:
        group["lr"] = stage.lr
    if stage.weighting == "pcgrad" and rt.scaler:
        raise SystemExit("PCGrad needs unscaled gradients: use bf16 or --no_amp, not fp16")
    model.bert.requires_grad_(not stage.freeze_encoder)  # frozen: AdamW skips grad-less params
    teacher = EMATeacher(model) if stage.smart.mu > 0 else None
    total_steps = stage.epochs * len(steps)
    model.train()
    step, running = 0, 0.0
    with tqdm(total=total_steps, desc=desc, leave=False, dynamic_ncols=True) as bar:
        for epoch in range(stage.epochs):
            for step_batches in steps:
                losses = []
                for task, batch in step_batches:
                    batch = evaluation.to_device(batch, rt.device)
                    if task == "simcse":
                        losses.append(contrastive_loss(model, stage, batch, rt))
                    else:
                        loss_name = stage.losses.get(task)
                        losses.append(
                            batch_loss(model, task, batch, stage.smart, teacher, rt, loss_name)
                        )
                if stage.weighting == "random":
                    weights = random_loss_weights(len(losses), generator)
                else:
                    weights = torch.full((len(losses),), 1 / len(losses))
                loss = sum(w * x for w, x in zip(weights.tolist(), losses, strict=True))
                if not torch.isfinite(loss):
                    raise NonFiniteLoss(
                        f"loss is {loss.item()} at step {step + 1} of stage '{stage.name}' "
                        f"(task {'+'.join(t for t, _ in step_batches)})"
                    )
                if stage.weighting == "pcgrad" and len(losses) > 1:
                    pcgrad_step(model, optimizer, losses, generator)
                else:
                    optimizer_step(loss, optimizer, rt)
                if teacher:
                    cfg = stage.smart
                    beta = beta_schedule(
                        step, total_steps, cfg.beta_start, cfg.beta_end, cfg.warmup_frac
                    )
                    teacher.update(model, beta)
                step += 1
                running += (loss.item() - running) / step
                bar.update()
                bar.set_postfix(loss=f"{running:.4f}")
            if after_epoch:
                after_epoch(epoch)
    model.bert.requires_grad_(True)
    return running


def best_epoch_by_sts(model, task_data, rt: Runtime, args):
    """(after_epoch, restore): score STS dev after each epoch; restore the best epoch's weights."""
    best = {"r": -math.inf, "state": None}

    def after_epoch(epoch):
        results = evaluate_split(model, task_data, "dev", ("sts",), rt, args.eval_batch_size)
        r = results["sts"].metrics["pearson"]
        tqdm.write(f"  epoch {epoch + 1}: STS dev Pearson of the cosine {r:.4f}")
        if r > best["r"]:
            best["r"] = r
            best["state"] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def restore():
        if best["state"] is not None:
            model.load_state_dict(best["state"])

    return after_epoch, restore


def evaluate_split(model, task_data: dict, split: str, tasks, rt: Runtime, batch_size: int):
    loaders = {
        t: data.make_loader(getattr(task_data[t], split), batch_size, shuffle=False) for t in tasks
    }
    with rt.autocast():
        return evaluation.evaluate(model, loaders, rt.device)


def new_optimizer(model, args):
    params = [p for p in model.parameters() if p.requires_grad]
    return AdamW(params, lr=args.lr, weight_decay=args.weight_decay, foreach=args.foreach_adamw)


def run_plan(
    plan, make_model, task_data, args, run_dir: Path, eval_tasks, rt: Runtime, score_train=False
):
    """Run every stage of `plan`, scoring `eval_tasks` after each; resumable.

    Files in run_dir: metrics.jsonl (one row per stage), best.pt (best model so far),
    state.pt (everything needed to continue after the last finished stage).
    score_train: also score the whole training split after each stage (classifier.py).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    model = make_model().to(rt.device)
    optimizer = new_optimizer(model, args)
    best = {"score": -math.inf, "stage": None, "index": None}
    rows, start = [], 0
    state_path, best_path = run_dir / "state.pt", run_dir / "best.pt"
    if state_path.exists() and not getattr(args, "resume", None):
        raise SystemExit(f"{run_dir} already holds a run: continue it with --resume {run_dir}")
    if state_path.exists():
        state = torch.load(state_path, map_location="cpu", weights_only=False)
        check_compatible(state["config"], model.config(), state_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if rt.scaler and state.get("scaler"):
            rt.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        best, rows, start = state["best"], state["rows"], state["next_stage"]
        print(f"resuming {run_dir} after stage {start}/{len(plan)}")
    print(table_header(eval_tasks))
    for r in rows:
        print(format_row(r["stage"], r, eval_tasks))
    if start == 0 and not rows:  # the starting point: what training has to beat
        results = evaluate_split(model, task_data, "dev", eval_tasks, rt, args.eval_batch_size)
        rows.append({"stage": "start (no training)", "index": -1} | score_row(results, eval_tasks))
        print(format_row(rows[-1]["stage"], rows[-1], eval_tasks))
    for k in range(start, len(plan)):
        stage = plan[k]
        generator = torch.Generator().manual_seed(args.seed * 1000 + k)
        steps = stage_steps(task_data, stage, generator)
        t0 = time.time()
        after_epoch, restore = (
            best_epoch_by_sts(model, task_data, rt, args) if stage.select_by_sts else (None, None)
        )
        desc = f"[{k + 1}/{len(plan)}] {stage.name}"
        try:
            train_loss = train_stage(
                model, optimizer, stage, steps, rt, desc, after_epoch, generator
            )
        except NonFiniteLoss as e:
            kept = f"; the best model so far is kept in {best_path}" if best_path.exists() else ""
            raise SystemExit(f"stopped: {e}{kept}") from None
        if restore:
            restore()
        results = evaluate_split(model, task_data, "dev", eval_tasks, rt, args.eval_batch_size)
        row = {
            "stage": stage.name,
            "index": k,
            "task": stage.task,
            "train_loss": train_loss,
            "seconds": time.time() - t0,
        }
        row |= score_row(results, eval_tasks)
        if score_train:
            train = evaluate_split(model, task_data, "train", eval_tasks, rt, args.eval_batch_size)
            row["train"] = score_row(train, eval_tasks)
        score = selection_score(row, eval_tasks)
        score = -math.inf if math.isnan(score) else score  # e.g. Pearson of a constant
        rows.append(row)
        atomic_save("".join(json.dumps(r) + "\n" for r in rows), run_dir / "metrics.jsonl")
        if best["index"] is None or score > best["score"]:
            best = {"score": score, "stage": stage.name, "index": k}
            atomic_save(
                {"model": model.state_dict(), "config": model.config(), "row": row}, best_path
            )
        print(format_row(stage.name, row, eval_tasks) + (" *" if best["index"] == k else ""))
        atomic_save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": rt.scaler.state_dict() if rt.scaler else None,
                "rng": rng_state(),
                "best": best,
                "rows": rows,
                "next_stage": k + 1,
                "config": model.config(),
            },
            state_path,
        )
    return model, rows, best


def write_predictions(model, task_data, args, run_dir, eval_tasks, rt):
    """Dev and test predictions of the model in the CS224n output format."""
    out_dir = run_dir / "predictions"
    for split in ("dev", "test") if args.test_predictions else ("dev",):
        results = evaluate_split(model, task_data, split, eval_tasks, rt, args.eval_batch_size)
        for task, res in results.items():
            evaluation.write_predictions(
                evaluation.prediction_path(out_dir, task, split), task, res.ids, res.preds
            )
    return out_dir


def finish(model, rows, best, task_data, args, run_dir, eval_tasks, rt, wall):
    print(f"\nforgetting table ({run_dir}, {wall / 60:.1f} min):")
    print(table_header(eval_tasks))
    for r in rows:
        print(format_row(r["stage"], r, eval_tasks) + (" *" if r["index"] == best["index"] else ""))
    print(f"best stage: {best['stage']} (score {best['score']:.4f}), kept in {run_dir / 'best.pt'}")
    load_model_checkpoint(model, run_dir / "best.pt")
    out_dir = write_predictions(model, task_data, args, run_dir, eval_tasks, rt)
    print(f"predictions of the best model: {out_dir}")


# ---------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Multitask SBERT (SST-5, Quora, STS-B) with the thesis's schedules.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("what to run")
    g.add_argument(
        "--preset", default="thesis", help="; ".join(f"{k}: {v[0]}" for k, v in PRESETS.items())
    )
    g.add_argument(
        "--bert",
        default="bert-base-uncased",
        help="checkpoint folder, 'minilm' (embedded) or a hub name",
    )
    g.add_argument("--run_dir", default=None, help="output folder (default runs/<preset>-<time>)")
    g.add_argument(
        "--resume",
        default=None,
        help="continue the run in this folder after its last finished stage",
    )
    g.add_argument(
        "--seed", type=int, default=11711, help="seed for data order, subsets and dropout"
    )
    g = p.add_argument_group("data")
    g.add_argument(
        "--data_dir", default=None, help="CS224n data folder (default $MINBERT_DATA, else data/)"
    )
    g.add_argument(
        "--train_size",
        type=int,
        default=0,
        help="use this many training examples per task (0: all)",
    )
    g.add_argument(
        "--dev_size",
        type=int,
        default=0,
        help="score this many dev/test examples per task (0: all)",
    )
    g.add_argument(
        "--max_length", type=int, default=128, help="truncate sentences to this many tokens"
    )
    g.add_argument(
        "--strict",
        action="store_true",
        help="stop at the first bad data row instead of skipping it",
    )
    g.add_argument(
        "--no_test_predictions",
        dest="test_predictions",
        action="store_false",
        help="skip test-set predictions",
    )
    g = p.add_argument_group("model")
    g.add_argument(
        "--pooling",
        choices=("mean", "cls"),
        default="mean",
        help="sentence embedding: masked mean or BERT's pooled [CLS]",
    )
    g.add_argument(
        "--dropout",
        type=float,
        default=0.1,
        help="dropout on the sentence embedding before each head",
    )
    g.add_argument(
        "--attention",
        choices=("manual", "sdpa"),
        default="manual",
        help="hand-written attention or torch's fused SDPA",
    )
    g = p.add_argument_group("schedule")
    g.add_argument(
        "--loops", type=int, default=10, help="thesis preset: STS -> SST -> QQP 3%% loops"
    )
    g.add_argument(
        "--para_fraction", type=float, default=0.03, help="thesis preset: share of QQP per loop"
    )
    g.add_argument(
        "--sequential_epochs",
        type=int,
        nargs=3,
        default=(3, 10, 10),
        metavar=("QQP", "STS", "SST"),
        help="sequential preset: epochs per task",
    )
    g.add_argument(
        "--individual_epochs", type=int, default=3, help="individual preset: epochs per task"
    )
    g = p.add_argument_group("optimization")
    g.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate")
    g.add_argument("--weight_decay", type=float, default=0.0, help="AdamW decoupled weight decay")
    g.add_argument("--batch_size", type=int, default=32, help="training batch size")
    g.add_argument("--eval_batch_size", type=int, default=128, help="evaluation batch size")
    g.add_argument("--foreach_adamw", action="store_true", help="AdamW's multi-tensor fast path")
    g.add_argument("--head_lr", type=float, default=1e-3, help="heads on a frozen encoder")
    g = p.add_argument_group("multitask training and loss options (CS224n reports)")
    g.add_argument(
        "--mixing",
        choices=STAGE_CHOICES["mixing"],
        default="simultaneous",
        help="multitask preset: a batch of every task per step, or tasks taking turns",
    )
    g.add_argument(
        "--weighting",
        choices=STAGE_CHOICES["weighting"],
        default="equal",
        help="simultaneous: equal weights, random weights (Lin et al. 2022) or PCGrad",
    )
    g.add_argument(
        "--order", choices=STAGE_CHOICES["order"], default="fixed", help="round-robin task order"
    )
    g.add_argument(
        "--examples_per_task",
        type=int,
        default=0,
        help="multitask: sample or repeat each task's data to this many examples (0: as is)",
    )
    g.add_argument("--multitask_epochs", type=int, default=3, help="multitask preset: epochs")
    g.add_argument(
        "--para_loss",
        choices=LOSS_CHOICES["para"],
        default=None,
        help="QQP loss: BCE on the logit (default), contrastive margin 0.5, or ranking",
    )
    g.add_argument(
        "--sts_loss",
        choices=LOSS_CHOICES["sts"],
        default=None,
        help="STS loss: MSE on the 0-5 score (default), L1, cosine vs labels in [-1, 1], ranking",
    )
    g.add_argument(
        "--cross_encode",
        nargs="*",
        choices=("para", "sts"),
        default=[],
        help="encode these pair tasks as one [CLS] a [SEP] b [SEP] sequence (Auslin et al.)",
    )
    g = p.add_argument_group("SimCSE (Gao et al., 2021) and other contrastive stages")
    g.add_argument("--simcse_loss", choices=tuple(OBJECTIVES), default="sup", help="objective")
    g.add_argument(
        "--simcse_data",
        choices=("snli", "para"),
        default="snli",
        help="SNLI triplets (premise, entailment, contradiction) or Quora duplicate pairs",
    )
    g.add_argument("--simcse_epochs", type=int, default=3, help="epochs, best kept by STS dev r")
    g.add_argument("--simcse_lr", type=float, default=1e-5, help="learning rate (thesis code)")
    g.add_argument(
        "--simcse_batch_size",
        type=int,
        default=8,
        help="batch, i.e. in-batch negatives (thesis: 8)",
    )
    g.add_argument("--temperature", type=float, default=0.05, help="similarity temperature")
    g = p.add_argument_group("SMART (Jiang et al., 2020)")
    g.add_argument(
        "--smart", action="store_true", help="add lambda_s * R_s + mu * D_Breg to every task's loss"
    )
    g.add_argument("--lambda_sst", type=float, default=10.0, help="smoothness weight for SST")
    g.add_argument("--lambda_para", type=float, default=5.0, help="smoothness weight for QQP")
    g.add_argument("--lambda_sts", type=float, default=5.0, help="smoothness weight for STS")
    g.add_argument("--mu", type=float, default=1.0, help="Bregman proximal point weight")
    g.add_argument(
        "--smart_batch_size",
        type=int,
        default=8,
        help="batch size when SMART is on (the thesis's memory limit)",
    )
    g = p.add_argument_group("device")
    g.add_argument("--device", default="auto", help="'auto' (CUDA if present), 'cpu' or 'cuda'")
    g.add_argument(
        "--no_amp",
        dest="amp",
        action="store_false",
        help="float32 on GPU (default: bf16 autocast, fp16 + scaler where bf16 is missing)",
    )
    g.add_argument("--compile", action="store_true", help="torch.compile the encoder layers (GPU)")
    return p


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.resume:  # the run's own flags, over today's defaults for flags added since
        saved = Path(args.resume) / "args.json"
        if not saved.is_file():
            raise SystemExit(f"--resume {args.resume}: no args.json there; is it a run folder?")
        defaults = vars(parser.parse_args([]))
        changed = sorted(k for k, v in vars(args).items() if k != "resume" and v != defaults[k])
        if changed:
            raise SystemExit(
                f"--resume continues a run with its own flags; drop: --{', --'.join(changed)}"
            )
        resume = args.resume
        args = argparse.Namespace(**(defaults | json.loads(saved.read_text())))
        args.resume, args.run_dir = resume, resume
    minimum = {"batch_size": 1, "eval_batch_size": 1, "smart_batch_size": 1, "max_length": 3,
               "loops": 0, "train_size": 0, "dev_size": 0, "examples_per_task": 0,
               "multitask_epochs": 1, "simcse_epochs": 1, "individual_epochs": 1,
               "simcse_batch_size": 2}  # fmt: skip
    for name, low in minimum.items():
        if getattr(args, name) < low:
            raise SystemExit(f"--{name} must be at least {low}, got {getattr(args, name)}")
    if min(args.sequential_epochs) < 1:
        raise SystemExit(
            f"--sequential_epochs must be at least 1 each, got {args.sequential_epochs}"
        )
    smart_on = args.smart or args.preset.startswith("thesis-smart")
    for task in ("para", "sts"):
        if smart_on and (getattr(args, f"{task}_loss") or "") in PAIR_LOSSES:
            raise SystemExit(
                f"--{task}_loss {getattr(args, f'{task}_loss')} works on sentence embeddings, "
                "which SMART cannot perturb through a head; use it without --smart"
            )
    for task in args.cross_encode:
        if (getattr(args, f"{task}_loss") or "") in PAIR_LOSSES:
            raise SystemExit(
                f"--{task}_loss {getattr(args, f'{task}_loss')} needs siamese sentence embeddings; "
                f"it cannot be used with --cross_encode {task}"
            )
    if not 0 < args.para_fraction <= 1:
        raise SystemExit(f"--para_fraction must be in (0, 1], got {args.para_fraction}")
    return args


def model_factory(args, tasks):
    def make():
        bert = BertModel.from_pretrained(args.bert, attention=args.attention)
        if args.compile:
            for layer in bert.encoder["layer"]:
                layer.compile(dynamic=True)
        return MultitaskBERT(bert, tasks, args.pooling, args.dropout, args.cross_encode)

    return make


def main(argv=None):
    args = parse_args(argv)
    plans = build_plans(args)
    run_dir = Path(args.run_dir or f"runs/{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "args.json").write_text(json.dumps(vars(args), indent=1))
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    rt = make_runtime(args.device, args.amp)
    print(
        f"device {rt.device}, precision {rt.amp_dtype or torch.float32}, model {args.bert}, run {run_dir}"
    )
    tokenizer = BertTokenizer.from_pretrained(args.bert)
    trained = {t for plan in plans.values() for s in plan for t in stage_tasks(s)}
    task_data = load_task_data(args, tokenizer, MULTITASK, train_tasks=trained)
    contrastive = [s for plan in plans.values() for s in plan if s.task == "simcse"]
    if contrastive:
        task_data["simcse"] = load_contrastive_data(args, tokenizer, contrastive[0].objective)
    for name, plan in plans.items():
        tasks = (name,) if name else MULTITASK
        sub_dir = run_dir / name if name else run_dir
        t0 = time.time()
        model, rows, best = run_plan(
            plan, model_factory(args, MULTITASK), task_data, args, sub_dir, tasks, rt
        )
        finish(model, rows, best, task_data, args, sub_dir, tasks, rt, time.time() - t0)


if __name__ == "__main__":
    main()
