"""Multitask Sentence-BERT and the thesis's training schedules.

One shared BERT encoder, three task heads (Reimers & Gurevych, 2019, Sentence-BERT):
- sentiment (SST-5): mean-pooled sentence -> dropout -> Linear(5), cross-entropy;
- paraphrase (Quora): siamese [u, v, |u - v|] -> Linear(1), one logit, binary cross-entropy;
- similarity (STS-B): cosine(u, v) * 2.5 + 2.5 against the 0-5 score, mean squared error.
(evaluation.TASKS lists each task's kind and the losses it may train with.)

Training is a plan: a list of stages (trainer.Stage), run by one loop (trainer.run_plan).
Each preset below is a named plan; the thesis ("SMART-SBERT with SimCSE: a robust defense
against catastrophic forgetting") trains sequentially: one QQP epoch, then loops of
STS -> SST -> a fresh 3% of QQP, keeping the model with the best overall dev score. After
every stage all three dev sets are scored: one row of the forgetting table.

    python multitask_classifier.py                    # thesis preset, bert-base-uncased
    python multitask_classifier.py --preset sequential --bert minilm
    python multitask_classifier.py --resume runs/thesis-...
"""

import json
import os
import random
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import checkpoint
import config
import datasets as data
import evaluation
import simcse
from base_bert import load_config, resolve_model_dir
from bert import BertModel, mean_pool
from config import ModelConfig, RunConfig
from evaluation import MULTITASK, TASKS
from simcse import OBJECTIVES
from tokenizer import BertTokenizer
from trainer import (
    CONTRASTIVE,
    METRICS,
    Run,
    Stage,
    check_runtime,
    finish,
    from_main,
    make_runtime,
    run_plan,
    write_predictions,
)


class MultitaskBERT(nn.Module):
    """A shared BERT with one small head per task.

    `forward(task, batch, embeds=None)` is the only prediction path: given `embeds` (the
    embedding output, e.g. perturbed by SMART) it runs from there instead of from ids; it
    is `readout(task, batch, sentences(batch, embeds))`, so a training step can keep the
    sentence embeddings it computed on the way. Pair batches are siamese, (2, B, T): both
    sentences go through BERT in one forward.
    """

    def __init__(
        self, bert: BertModel, tasks=MULTITASK, pooling="mean", dropout=0.1, cross=(),
        cosine=(), concat=(), siamese="cosine",
    ):  # fmt: skip
        """cross: pair tasks encoded as one sequence; cosine: binary pair tasks read out by
        their siamese similarity against a threshold (their loss trains only the embeddings,
        e.g. --para_loss contrastive): no head, trainer.fit_thresholds; concat: pair tasks
        with a Linear on [u, v] (Broadhurst & Maffezzoli); siamese: the score of pairs
        without a head, the cosine or d = ||u - v|| (Auslin et al.; STS then outputs d)."""
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        if siamese not in simcse.DISTANCES:
            raise ValueError(f"siamese must be one of {simcse.DISTANCES}, got {siamese!r}")
        self.bert, self.pooling, self.tasks = bert, pooling, tuple(tasks)
        self.dropout = nn.Dropout(dropout)
        H = bert.config.hidden_size
        self.cosine, self.concat, self.siamese = tuple(cosine), tuple(concat), siamese
        self.heads = nn.ModuleDict()
        for name in self.tasks:
            spec = TASKS[name]
            if spec.kind == "classification":
                self.heads[name] = nn.Linear(H, spec.num_labels)
            elif name in self.concat:
                self.heads[name] = nn.Linear(2 * H, 1)  # on [u, v]
            elif spec.kind == "binary" and name not in self.cosine:
                self.heads[name] = nn.Linear(3 * H, 1)  # on [u, v, |u - v|]
            # otherwise (STS; thresholded QQP) the siamese similarity: no parameters
        for name in self.cosine:  # a paraphrase when similarity(u, v) > threshold
            self.register_buffer(f"{name}_threshold", torch.zeros(()))
        self.cross = tuple(cross)
        for name in self.cross:  # cross-encoded pairs: a linear head on [CLS] a [SEP] b [SEP]
            self.heads[f"{name}_cross"] = nn.Linear(H, 1)

    def config(self) -> dict:
        """What a checkpoint must match to load into this model."""
        saved = {
            # the attention kernel does not change the weights, so it may differ
            "bert": {k: v for k, v in self.bert.config.to_dict().items() if k != "attention"},
            "tasks": list(self.tasks),
            "pooling": self.pooling,
            "dropout": self.dropout.p,
            "cross": list(self.cross),
        }
        # settings that older runs lack, kept only where they are not the default
        newer = {"cosine": list(self.cosine), "concat": list(self.concat)}
        newer["siamese"] = self.siamese if self.siamese != "cosine" else None
        return saved | {k: v for k, v in newer.items() if v}

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
        return self.readout(task, batch, self.sentences(batch, embeds))

    def readout(self, task, batch, sentences):
        """The task's output from the batch's pooled sentence embeddings (N, H)."""
        pooled = self.dropout(sentences)
        kind = TASKS[task].kind
        if batch["input_ids"].dim() == 2:  # one sequence per example
            if TASKS[task].pair:  # a cross-encoded pair: one logit or score
                return self.heads[f"{task}_cross"](pooled).squeeze(-1)  # (B,)
            return self.heads[task](pooled)  # (B, C)
        u, v = pooled.view(2, -1, pooled.size(-1)).unbind(0)  # (2B, H) -> (B, H), (B, H)
        if task in self.concat:
            return self.heads[task](torch.cat([u, v], -1)).squeeze(-1)  # (B,)
        if self.siamese == "euclidean" and (kind == "regression" or task in self.cosine):
            # d of the embeddings themselves, as the pair losses see them: dropout's masks
            # would inflate it in training only
            u, v = sentences.view(2, -1, sentences.size(-1)).unbind(0)  # (B, H) each
        if kind == "regression":
            if self.siamese == "euclidean":
                return self.similarity(u, v)  # (B,): d, trained toward the 0-5 score
            return F.cosine_similarity(u, v, dim=-1) * 2.5 + 2.5  # (B,) in [0, 5]
        if task in self.cosine:  # > 0: a paraphrase
            return self.similarity(u, v) - getattr(self, f"{task}_threshold")  # (B,)
        head, d = self.heads[task], (u - v).abs()
        # A paraphrase is symmetric, so average both orders: W_u and W_v then act alike.
        both = head(torch.cat([u, v, d], -1)) + head(torch.cat([v, u, d], -1))  # (B, 1)
        return both.squeeze(-1) / 2  # (B,)

    def similarity(self, u, v):
        """(B,) the pair score a threshold cuts: the cosine, or (siamese='euclidean') Auslin
        et al.'s output d = ||u - v||, which their losses make grow with similarity."""
        if self.siamese == "cosine":
            return F.cosine_similarity(u, v, dim=-1)
        return simcse.euclidean_distance(u, v)

    def predict(self, task, batch):
        return self(task, batch)


def model_factory(
    cfg: ModelConfig, tasks, cross=(), compile=False, cosine=(), concat=()
) -> Callable[[], MultitaskBERT]:
    """Builds the model from a checkpoint when called (so its heads draw from the seeded RNG
    at the same point of every run)."""

    def make():
        bert = BertModel.from_pretrained(cfg.bert, attention=cfg.attention)
        if compile:
            for layer in bert.encoder["layer"]:
                layer.compile(dynamic=True)
        return MultitaskBERT(
            bert, tasks, cfg.pooling, cfg.dropout, cross, cosine, concat, cfg.siamese
        )

    return make


# ---------------------------------------------------------------------------------------
# Plans: a training schedule is data


def loss_choices(cfg: RunConfig) -> dict:
    """--para_loss / --sts_loss, where they differ from the task's default loss."""
    chosen = {"para": cfg.multitask.para_loss, "sts": cfg.multitask.sts_loss}
    return {task: loss for task, loss in chosen.items() if loss}


def cosine_tasks(cfg: RunConfig) -> tuple:
    """Binary pair tasks whose loss trains only the sentence embeddings: the model reads them
    out by a cosine threshold, not by a head that loss would never train."""
    return tuple(
        t for t, loss in loss_choices(cfg).items()
        if loss in simcse.PAIR_LOSSES and TASKS[t].kind == "binary"
    )  # fmt: skip


def concat_tasks(cfg: RunConfig) -> tuple:
    """Siamese pair tasks that get a Linear on [u, v] (--pair_head concat): those whose loss
    trains a head's output."""
    if cfg.model.pair_head != "concat":
        return ()
    losses = loss_choices(cfg)
    return tuple(
        t for t in ("para", "sts")
        if losses.get(t, TASKS[t].losses[0]) in simcse.OUTPUT_LOSSES
        and losses.get(t) != "cosine_sbert"  # the cosine's own target: no head
        and t not in cfg.multitask.cross_encode
    )  # fmt: skip


def run_model(cfg: RunConfig, compile=False) -> Callable[[], MultitaskBERT]:
    """model_factory for a run: its model settings, cross-encoded, thresholded and
    concatenation-head tasks."""
    return model_factory(
        cfg.model, MULTITASK, cfg.multitask.cross_encode, compile, cosine_tasks(cfg),
        concat_tasks(cfg),
    )  # fmt: skip


def task_stage(cfg: RunConfig, task, fraction=1.0, epochs=1, name="") -> Stage:
    """A stage of one task with this run's lr, batch and SMART weights for that task."""
    smart = cfg.smart
    batch_size = smart.smart_batch_size if smart.enabled else cfg.optim.batch_size
    return Stage(
        (task,), cfg.optim.lr, batch_size, fraction=fraction, epochs=epochs, name=name,
        smart=smart.for_task(task), losses=loss_choices(cfg), contrastive=simcse_term(cfg),
    )  # fmt: skip


def simcse_term(cfg: RunConfig):
    """The SimCSE settings of a task stage that adds --simcse_weight x SimCSE, else None."""
    return cfg.simcse if cfg.simcse.simcse_weight > 0 else None


def thesis_plan(cfg: RunConfig) -> list[Stage]:
    """One QQP epoch, then `loops` x (STS -> SST -> a fresh 3% of QQP): thesis Fig. 4.10."""
    share = cfg.schedule.para_fraction
    plan = [task_stage(cfg, "para", name="QQP")]
    for i in range(1, cfg.schedule.loops + 1):
        plan += [
            task_stage(cfg, "sts", name=f"loop {i}: STS"),
            task_stage(cfg, "sst", name=f"loop {i}: SST"),
            task_stage(cfg, "para", share, name=f"loop {i}: QQP {share:.0%}"),
        ]
    return plan


def sequential_plan(cfg: RunConfig) -> list[Stage]:
    """QQP -> STS -> SST, --sequential_epochs each (thesis 4.2.2.1): forgetting in plain sight."""
    epochs = zip(("para", "sts", "sst"), cfg.schedule.sequential_epochs, strict=True)
    return [task_stage(cfg, task, epochs=n) for task, n in epochs]


def simcse_stage(cfg: RunConfig) -> Stage:
    """Contrastive training of the encoder, keeping the epoch with the best STS dev r."""
    s = cfg.simcse
    return Stage(
        (), s.simcse_lr, s.simcse_batch_size, kind=CONTRASTIVE, epochs=s.simcse_epochs,
        contrastive=s, select_by_sts=True,
    )  # fmt: skip


def frozen_heads_plan(cfg: RunConfig) -> list[Stage]:
    """Heads on a frozen encoder (EquiBERT); STS is the encoder's own cosine, no training."""
    lr, epochs = cfg.schedule.head_lr, cfg.schedule.individual_epochs
    return [
        Stage((t,), lr, cfg.optim.batch_size, epochs=epochs, freeze_encoder=True)
        for t in ("sst", "para")
    ]


def multitask_plan(cfg: RunConfig) -> list[Stage]:
    """All tasks at once, one stage per epoch: simultaneous (weighted or PCGrad) or
    round-robin batches, as in the CS224n reports of Broadhurst & Maffezzoli, Auslin et al.
    and Sicurello."""
    stage = Stage(
        MULTITASK, cfg.optim.lr, cfg.optim.batch_size, kind="multitask",
        losses=loss_choices(cfg), multitask=cfg.multitask, contrastive=simcse_term(cfg),
    )  # fmt: skip
    return [
        replace(stage, name=f"{stage.name} epoch {e + 1}")
        for e in range(cfg.multitask.multitask_epochs)
    ]


def one_run(plan: Callable[[RunConfig], list[Stage]]):
    """A preset trained as one model, scored on all three tasks (sub-run name '')."""
    return lambda cfg: {"": plan(cfg)}


def individual_plans(cfg: RunConfig) -> dict[str, list[Stage]]:
    """Three separate models, one per task, each scored on its own task (thesis Table 4.2)."""
    return {t: [task_stage(cfg, t, epochs=cfg.schedule.individual_epochs)] for t in MULTITASK}


def sst_plan(cfg: RunConfig) -> list[Stage]:
    """SST alone, one stage per --multitask_epochs, all three tasks scored after each
    (Broadhurst & Maffezzoli's experiment 1, Sicurello's baselines trained on SST only)."""
    return [
        task_stage(cfg, "sst", name=f"SST epoch {e + 1}")
        for e in range(cfg.multitask.multitask_epochs)
    ]


@dataclass(frozen=True)
class Preset:
    help: str  # one line in --help
    plans: Callable[[RunConfig], dict[str, list[Stage]]]  # sub-run name -> its stages
    overrides: dict = field(default_factory=dict)  # "group.field" -> value, under typed flags
    scaled: dict | None = None  # a report's row: sizes and epochs that --scale shrinks

    def settings(self, typed: dict) -> dict:
        """The preset's overrides, its sizes and epochs times --scale (at least 1), and the
        share of each training set --scale keeps."""
        scale = typed.get("schedule.scale", config.ScheduleConfig.scale)
        if self.scaled is None:
            return self.overrides
        shrunk = {k: max(1, round(v * scale)) for k, v in self.scaled.items()}
        return self.overrides | shrunk | {"data.train_share": scale}


# The thesis's SMART presets switch SMART on with the SMART group's weights and batch size
# (config.SmartSettings, the thesis's) and the thesis's independent dropout masks (R-Drop).
SMART_ON = {"smart.enabled": True, "smart.smart_dropout": "independent"}

# What the ablation (README, "Forgetting") found to keep what the encoder knew while it
# learns the tasks: STS trained toward cosines in [0, 1] as the encoder was, heads that
# learn fast on an encoder that moves slowly, and a warmup that spares the first steps.
DEFENDED = {
    "multitask.sts_loss": "cosine_sbert",
    "optim.lr": 3e-5,
    "optim.head_lr_scale": 50.0,
    "optim.warmup": 0.1,
    "optim.decay": "linear",
    "optim.distill": 30.0,
}

# The CS224n reports' rows (../shared/papers): their settings are the defaults, on
# bert-base-uncased; --scale shrinks data and epochs for a CPU run (reports.py runs them).
BROADHURST = {  # section 5.3: lr 1e-5, batch 8, dropout 0.3, random weights, concat heads
    "optim.lr": 1e-5,
    "optim.batch_size": 8,
    "model.dropout": 0.3,
    "model.pair_head": "concat",
    "multitask.weighting": "random",
}
BROADHURST_SIZES = {"multitask.examples_per_task": 12080, "multitask.multitask_epochs": 6}
AUSLIN = {  # section 5.3: the first 2,048 examples per task, batch 32, lr 3e-5, 6 epochs
    "optim.lr": 3e-5,
    "optim.batch_size": 32,
    "data.train_size": 2048,
    "multitask.mixing": "round_robin",  # 'no GS': an update after each task's batch
}
AUSLIN_SIAMESE = AUSLIN | {"model.siamese": "euclidean", "multitask.para_loss": "distance_margin"}
AUSLIN_SEGMENTS = AUSLIN | {
    "multitask.cross_encode": ["para", "sts"],
    "multitask.para_loss": "sigmoid_margin",
}
GS = {"multitask.mixing": "simultaneous", "multitask.weighting": "pcgrad"}
AUSLIN_EARLY = {  # their second table: the siamese network, 4 epochs over all the data
    "optim.lr": 3e-5,
    "optim.batch_size": 32,
    "multitask.sts_loss": "cosine_sbert",
} | GS
SICURELLO = {  # section 5.3: lr 1e-5, 3 epochs, round robin, 128 batches of 8 (43 per task)
    "optim.lr": 1e-5,
    "optim.batch_size": 8,
    "data.train_size": 344,
    "multitask.mixing": "round_robin",
    "schedule.head_lr": 1e-5,
    "simcse.simcse_data": "sst",
}
UNIFORM_EPOCHS = {  # 5 epochs on SST sentences, then 3 of the heads
    "simcse.simcse_epochs": 5,
    "schedule.individual_epochs": 3,
}
SIMCSE_TERM = {"simcse.simcse_weight": 1.0}  # the weight is not in the report
UNIF = {"simcse.simcse_loss": "dropout_align_uniform"}
CANON = {"simcse.simcse_loss": "dropout_align_uniform_simcse"}


def report(help, plan, overrides, scaled) -> Preset:
    return Preset(help, one_run(plan), overrides, scaled)


def uniform_plan(tasks):
    """Sicurello's uniformity models: the encoder trained on SST sentences alone, then heads
    on the frozen encoder for `tasks` (STS is the encoder's cosine)."""

    def plan(cfg):
        heads = [s for s in frozen_heads_plan(cfg) if s.tasks[0] in tasks]
        return [replace(simcse_stage(cfg), select_by_sts=False)] + heads

    return plan


REPORT_PRESETS = (
    {
        "broadhurst-1": report(
            "Broadhurst & Maffezzoli Table 1, exp. 1: SST only, 10 epochs, all three scored",
            sst_plan,
            BROADHURST,
            {"multitask.multitask_epochs": 10},
        ),
        "broadhurst-2": report(
            "exp. 2: all tasks, random weights, CE / BCE / MSE, concatenation heads",
            multitask_plan,
            BROADHURST,
            BROADHURST_SIZES,
        ),
        "broadhurst-3": report(
            "exp. 3: MNRL for QQP and STS",
            multitask_plan,
            BROADHURST | {"multitask.para_loss": "mnrl", "multitask.sts_loss": "mnrl"},
            BROADHURST_SIZES,
        ),
        "broadhurst-4": report(
            "exp. 4: MNRL for QQP, cosine-MSE for STS",
            multitask_plan,
            BROADHURST | {"multitask.para_loss": "mnrl", "multitask.sts_loss": "cosine_mse"},
            BROADHURST_SIZES,
        ),
        "broadhurst-5": report(
            "exp. 5: BCE for QQP, cosine-MSE for STS",
            multitask_plan,
            BROADHURST | {"multitask.sts_loss": "cosine_mse"},
            BROADHURST_SIZES,
        ),
        "broadhurst-6": report(
            "exp. 6: exp. 5 on 50,000 examples per task, 10 epochs",
            multitask_plan,
            BROADHURST | {"multitask.sts_loss": "cosine_mse"},
            {"multitask.examples_per_task": 50000, "multitask.multitask_epochs": 10},
        ),
    }
    | {  # Auslin et al. section 5.4, the ablation: 6 epochs of the first 2,048 of each task
        name: report(help, multitask_plan, overrides, {"multitask.multitask_epochs": 6})
        for name, help, overrides in [
            (
                "auslin-siamese",
                "Auslin et al. ablation: siamese, d = ||u - v||, contrastive QQP, MSE STS, no GS",
                AUSLIN_SIAMESE,
            ),
            ("auslin-siamese-gs", "siamese, gradient surgery (PCGrad)", AUSLIN_SIAMESE | GS),
            (
                "auslin-segments",
                "segments (cross-encoded pairs), sigmoid margin QQP, MSE STS, no GS",
                AUSLIN_SEGMENTS,
            ),
            ("auslin-segments-gs-mean", "segments, GS, mean pooling", AUSLIN_SEGMENTS | GS),
            (
                "auslin-segments-gs-cls",
                "segments, GS, CLS pooling",
                AUSLIN_SEGMENTS | GS | {"model.pooling": "cls"},
            ),
            (
                "auslin-segments-gs-l1",
                "segments, GS, L1 for both pair tasks",
                AUSLIN_SEGMENTS
                | GS
                | {"multitask.para_loss": "sigmoid_l1", "multitask.sts_loss": "l1"},
            ),
            (
                "auslin-segments-rand",
                "segments, no GS, random task order",
                AUSLIN_SEGMENTS | {"multitask.order": "random"},
            ),
            (
                "auslin-segments-gs-rand",
                "segments, GS, random task order",
                AUSLIN_SEGMENTS | GS | {"multitask.order": "random"},
            ),
        ]
    }
    | {
        "auslin-siamese-cosine-mse": report(
            "Auslin et al. siamese table: GS, cosine, MSE for both pair tasks, 4 epochs, all data",
            multitask_plan,
            AUSLIN_EARLY | {"multitask.para_loss": "cosine_mse"},
            {"multitask.multitask_epochs": 4},
        ),
        "auslin-siamese-cosine-contrastive": report(
            "siamese table: GS, cosine, contrastive QQP, MSE STS, 4 epochs, all data",
            multitask_plan,
            AUSLIN_EARLY | {"multitask.para_loss": "contrastive"},
            {"multitask.multitask_epochs": 4},
        ),
        "sicurello-vanilla": report(
            "Sicurello Table 1: BERT_vanilla, round robin on all tasks, 128 batches",
            multitask_plan,
            SICURELLO,
            {"multitask.multitask_epochs": 3},
        ),
        "sicurello-simcse": report(
            "BERT_simCSE: the task losses + SimCSE of each batch's sentences",
            multitask_plan,
            SICURELLO | SIMCSE_TERM,
            {"multitask.multitask_epochs": 3},
        ),
        "sicurello-unif": report(
            "BERT_unif: alignment + uniformity on SST, then heads on the frozen encoder",
            uniform_plan(("sst", "para")),
            SICURELLO | UNIF,
            UNIFORM_EPOCHS,
        ),
        "sicurello-simcsecanon": report(
            "BERT_simCSEcanon: BERT_unif with a SimCSE term",
            uniform_plan(("sst", "para")),
            SICURELLO | CANON,
            UNIFORM_EPOCHS,
        ),
        "sicurello-vanilla-sst": report(
            "Sicurello Table 2: BERT_vanilla trained on SST only",
            sst_plan,
            SICURELLO,
            {"multitask.multitask_epochs": 3},
        ),
        "sicurello-simcse-sst": report(
            "BERT_simCSE trained on SST only",
            sst_plan,
            SICURELLO | SIMCSE_TERM,
            {"multitask.multitask_epochs": 3},
        ),
        "sicurello-unif-sst": report(
            "BERT_unif, the SST head only", uniform_plan(("sst",)), SICURELLO | UNIF, UNIFORM_EPOCHS
        ),
        "sicurello-simcsecanon-sst": report(
            "BERT_simCSEcanon, the SST head only",
            uniform_plan(("sst",)),
            SICURELLO | CANON,
            UNIFORM_EPOCHS,
        ),
    }
)

PRESETS = {
    "thesis": Preset("SBERT, the thesis schedule (Fig. 4.10, Table 4.11)", one_run(thesis_plan)),
    "thesis-smart": Preset(
        "SMART + SBERT, the thesis schedule (Table 4.10)", one_run(thesis_plan), SMART_ON
    ),
    "thesis-smart-simcse": Preset(
        "SimCSE on SNLI, then SMART + SBERT, the thesis schedule (Tables 4.12-4.13)",
        one_run(lambda cfg: [simcse_stage(cfg)] + thesis_plan(cfg)),
        SMART_ON,
    ),
    "defended": Preset(
        "the thesis schedule defended against forgetting: the Sentence-BERT STS target, "
        "heads at 50x the lr, warmup and linear decay, the batch's cosines distilled from "
        "the untouched encoder (README, 'Forgetting')",
        one_run(thesis_plan),
        DEFENDED,
    ),
    "simcse": Preset(
        "SimCSE alone, scored on all tasks (Table 4.12)", one_run(lambda cfg: [simcse_stage(cfg)])
    ),
    "unsup-simcse": Preset(
        "unsupervised SimCSE, then heads on the frozen encoder",
        one_run(lambda cfg: [simcse_stage(cfg)] + frozen_heads_plan(cfg)),
        {"simcse.simcse_loss": "unsup"},
    ),
    "equibert": Preset(
        "alignment + uniformity, then heads on the frozen encoder (Sicurello, EquiBERT)",
        one_run(lambda cfg: [simcse_stage(cfg)] + frozen_heads_plan(cfg)),
        {"simcse.simcse_loss": "align_uniform"},
    ),
    "sequential": Preset("QQP -> STS -> SST, no revisits (4.2.2.1)", one_run(sequential_plan)),
    "individual": Preset("one model per task (Table 4.2)", individual_plans),
    "multitask": Preset(
        "all tasks at once: --mixing, --weighting, --order (CS224n reports)",
        one_run(multitask_plan),
    ),
} | REPORT_PRESETS


# ---------------------------------------------------------------------------------------
# Command line

DESCRIPTION = "Multitask SBERT (SST-5, Quora, STS-B) with the thesis's schedules."
RESUME = ("--resume", "continue the run in this folder from its last checkpoint")
# settings of the machine rather than of the experiment: a resumed run may change them
MACHINE = {"device.device", "device.amp", "device.compile", "data.data_dir", "checkpoint_minutes"}
PREDICT = ("--predict", "score the best model of the run in this folder; rewrite its predictions")
EXPORT = (
    "--export",
    "write the best model of this run folder as a Hugging Face folder, RUN/export",
)
LABEL = ("--label", "label the lines of standard input with this run's best model: a sentence "
         "gets a sentiment, 'sentence<TAB>sentence' a paraphrase probability and a similarity")  # fmt: skip


def preset_overrides(typed: dict) -> dict:
    name = typed.get("preset", RunConfig().preset)
    if name not in PRESETS:
        raise SystemExit(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name].settings(typed)


# losses that make the cosine (or 1 - cos, for contrastive) track similarity
COSINE_LOSSES = ("cosine_mse", "cosine_sbert", "mnrl", "contrastive")


def check_settings(cfg: RunConfig):
    """Combinations of flags that cannot work, refused before anything is loaded."""
    for task, loss in loss_choices(cfg).items():
        if loss in simcse.PAIR_LOSSES and cfg.smart.enabled:
            raise SystemExit(
                f"--{task}_loss {loss} works on sentence embeddings, "
                "which SMART cannot perturb through a head; use it without --smart"
            )
        if loss in simcse.PAIR_LOSSES and task in cfg.multitask.cross_encode:
            raise SystemExit(
                f"--{task}_loss {loss} needs siamese sentence embeddings; "
                f"it cannot be used with --cross_encode {task}"
            )
        if loss in COSINE_LOSSES and cfg.model.siamese == "euclidean":
            raise SystemExit(
                f"--{task}_loss {loss} trains a cosine, and --siamese euclidean reads the "
                "pair by d = ||u - v||: use --siamese cosine, or --para_loss distance_margin "
                "and --sts_loss mse|l1"
            )
        if loss == "distance_margin" and cfg.model.siamese != "euclidean":
            raise SystemExit(
                f"--{task}_loss distance_margin trains d = ||u - v||, which only "
                "--siamese euclidean reads out; add it"
            )
    if cfg.schedule.scale != 1 and PRESETS[cfg.preset].scaled is None:
        raise SystemExit(f"--scale shrinks the reports' presets; {cfg.preset} is not one")
    m = cfg.multitask
    if m.mixing == "round_robin" and m.weighting != "equal":
        raise SystemExit(
            f"--weighting {m.weighting} combines the losses of one step, and a round-robin "
            "step has one task: use it with --mixing simultaneous"
        )
    if cfg.data.dev_size == 1:
        raise SystemExit("--dev_size 1 cannot be scored (a Pearson r needs 2); use 0 or >= 2")


def check_model(cfg: RunConfig):
    """The checkpoint's config, read before any data: what it cannot do stops the run now."""
    positions = load_config(resolve_model_dir(cfg.model.bert)).max_position_embeddings
    if cfg.data.max_length > positions:
        raise SystemExit(
            f"--max_length {cfg.data.max_length} is longer than the {positions} positions of "
            f"{cfg.model.bert} (max_position_embeddings in its config.json)"
        )


def load_run_config(run_dir: str) -> RunConfig:
    """The config a run folder keeps, over today's defaults for settings added since."""
    saved = Path(run_dir) / "config.json"
    if not saved.is_file():
        raise SystemExit(f"{run_dir}: no config.json there; is it a run folder?")
    try:
        text = json.loads(saved.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SystemExit(f"{saved}: not valid JSON ({e})") from None
    cfg = config.from_dict(RunConfig, text, str(saved))
    preset_overrides({"preset": cfg.preset})  # a preset that no longer exists stops here
    return replace(cfg, run_dir=str(run_dir))


def parse_args(argv=None) -> tuple[RunConfig, dict]:
    """(the run's config, {'resume' | 'predict' | 'export' | 'label': folder or None})."""
    epilog = "presets:\n" + "\n".join(f"  {k:<20} {p.help}" for k, p in PRESETS.items())
    cfg, typed, folders = config.parse(
        RunConfig(),
        argv,
        DESCRIPTION,
        epilog,
        preset_overrides,
        extra=[RESUME, PREDICT, EXPORT, LABEL],
    )
    chosen = [(name, folder) for name, folder in folders.items() if folder]
    if chosen:  # the run's own config; only the machine's settings may differ
        (name, folder), *more = chosen
        experiment = {p: v for p, v in typed.items() if p not in MACHINE}
        if experiment or more:
            drop = config.flags_of(cfg, experiment) or [f"--{n}" for n, _ in more]
            raise SystemExit(f"--{name} uses the run's own flags; drop: {', '.join(drop)}")
        machine = {p: v for p, v in typed.items() if p in MACHINE}
        cfg = config.replace_paths(load_run_config(folder), machine)
    check_settings(cfg)
    return cfg, folders


def load_data(cfg: RunConfig, stages: list[Stage], tokenizer) -> dict:
    """Every split the run scores, and the training sets its stages train on."""
    cross = cfg.multitask.cross_encode
    trained = {t for s in stages for t in s.tasks}
    task_data = data.load_task_data(cfg.data, tokenizer, MULTITASK, cfg.seed, trained, cross)
    contrastive = [s.contrastive for s in stages if s.kind == CONTRASTIVE]
    if contrastive:
        s = contrastive[0]
        task_data[CONTRASTIVE] = data.load_contrastive_data(
            cfg.data, tokenizer, s.simcse_loss, s.simcse_data, cfg.seed
        )
    return task_data


def check_plans(cfg: RunConfig, plans: dict, rt):
    """What only the stages and the device tell, refused before the run folder is touched."""
    stages = [s for plan in plans.values() for s in plan]
    if cfg.smart.enabled and not any(s.smart.active for s in stages):
        raise SystemExit(f"--smart changes no stage of --preset {cfg.preset}: it regularizes "
                         "single-task stages (thesis, sequential, individual)")  # fmt: skip
    if cfg.simcse.simcse_weight > 0 and not any(
        s.kind != CONTRASTIVE and s.contrastive and not s.freeze_encoder for s in stages
    ):
        raise SystemExit(f"--simcse_weight adds to task losses that train the encoder; "
                         f"no stage of --preset {cfg.preset} has one")  # fmt: skip
    if cfg.optim.distill > 0 and not any(
        s.kind != CONTRASTIVE and not s.freeze_encoder for s in stages
    ):
        raise SystemExit(f"--distill pulls task stages that train the encoder; "
                         f"no stage of --preset {cfg.preset} has one")  # fmt: skip
    check_runtime(stages, rt, cfg.optim)
    for s in stages:
        objective = s.contrastive.simcse_loss if s.kind == CONTRASTIVE else None
        source = s.contrastive.simcse_data if objective else None
        if source and OBJECTIVES[objective][0] > data.CONTRASTIVE_SOURCES[source]:
            raise SystemExit(
                f"--simcse_loss {objective} needs {OBJECTIVES[objective][0]} sentences per "
                f"example and --simcse_data {source} has {data.CONTRASTIVE_SOURCES[source]}: "
                "use --simcse_data snli"
            )


def train(cfg: RunConfig, plans: dict, run_dir: Path, resume: bool, rt):
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    precision = rt.amp_dtype or torch.float32
    print(f"device {rt.device}, precision {precision}, model {cfg.model.bert}, run {run_dir}")
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    task_data = load_data(cfg, [s for plan in plans.values() for s in plan], tokenizer)
    make_model = run_model(cfg, cfg.device.compile)
    for name, plan in plans.items():
        minutes = cfg.checkpoint_minutes
        run = sub_run(cfg, run_dir, name, rt, checkpoint_minutes=minutes, resume=resume)
        t0 = time.time()
        model, rows, best = run_plan(plan, make_model(), task_data, cfg.optim, run)
        finish(model, rows, best, task_data, run, cfg.data.test_predictions, time.time() - t0)


def sub_run(cfg: RunConfig, run_dir: Path, name: str, rt, **settings) -> Run:
    """The run of sub-plan `name`: the folder itself and all tasks for '', else a folder of
    its own scored on its one task (the individual preset)."""
    tasks = (name,) if name else MULTITASK
    return Run(run_dir / name, rt, tasks, cfg.data.eval_batch_size, cfg.seed, **settings)


def best_model(cfg: RunConfig, run_dir: Path, rt):
    """(model, checkpoint info) of a run folder's best model, on rt.device."""
    model = run_model(cfg)().to(rt.device).eval()
    return model, checkpoint.load_model(model, run_dir / checkpoint.BEST)


def predict(cfg: RunConfig, run_dir: Path, rt):
    """Score each sub-run's best model on dev and rewrite its prediction files."""
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    cross = cfg.multitask.cross_encode
    task_data = data.load_task_data(cfg.data, tokenizer, MULTITASK, cfg.seed, set(), cross)
    for name in PRESETS[cfg.preset].plans(cfg):
        run = sub_run(cfg, run_dir, name, rt)
        model, info = best_model(cfg, run.run_dir, rt)
        print(evaluation.table_header(run.eval_tasks))
        run.show({"stage": f"best: {info['row']['stage']}"} | run.evaluate(model, task_data))
        out_dir = write_predictions(model, task_data, run, cfg.data.test_predictions)
        print(f"predictions: {out_dir}")


def export(cfg: RunConfig, run_dir: Path, rt):
    """The best model as a standard folder, with a short report of the run."""
    model, info = best_model(cfg, run_dir, rt)
    rows = [json.loads(x) for x in (run_dir / METRICS).read_text().splitlines()]
    table = evaluation.format_table(rows, MULTITASK, info["row"]["index"])
    report = (
        f"# {cfg.preset} run: {run_dir}\n\nBest stage: {info['row']['stage']}. "
        f"torch {torch.__version__}, trained from {cfg.model.bert}.\n\n"
        "```\n" + table + "\n```\n\nConfig:\n\n```json\n"
        + json.dumps(config.to_dict(cfg), indent=1) + "\n```\n"
    )  # fmt: skip
    vocab = resolve_model_dir(cfg.model.bert) / "vocab.txt"
    checkpoint.export_model_folder(model, vocab, run_dir / "export", report)
    print(f"exported {run_dir / 'export'}: load it with --bert {run_dir / 'export'}")


def label(cfg: RunConfig, run_dir: Path, rt, lines):
    """Print labels for each input line as it comes: a sentence, or two separated by a tab
    (blank lines are skipped)."""
    model, _ = best_model(cfg, run_dir, rt)
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    for n, line in enumerate(x.strip("\r\n ") for x in lines):
        a, _, b = line.partition("\t")
        if b:
            pair, batches = [data.PairExample(str(n), a, b, None)], {}
            for cross in {t in cfg.multitask.cross_encode for t in ("para", "sts")}:
                dataset = data.PairDataset(pair, tokenizer, cfg.data.max_length, cross_encode=cross)
                batches[cross] = evaluation.to_device(dataset.collate([0]), rt.device)
            with torch.no_grad():  # each task as it was trained: siamese or cross-encoded
                p, score = (
                    model(t, batches[t in cfg.multitask.cross_encode]) for t in ("para", "sts")
                )
            if "para" in model.cosine:  # a cosine read-out has a cut, not a probability
                how = "cos" if model.siamese == "cosine" else "-d"
                para = f"paraphrase {'yes' if p.item() > 0 else 'no'} ({how} - cut {p.item():+.3f})"
            else:
                para = f"paraphrase {torch.sigmoid(p).item():.3f}"
            print(f"{para}\tsimilarity {score.item():.2f}\t{line}", flush=True)
        elif a:
            example = data.SentenceExample(str(n), a, None)
            batch = data.SentenceDataset([example], tokenizer, cfg.data.max_length).collate([0])
            with torch.no_grad():
                probs = model("sst", evaluation.to_device(batch, rt.device)).softmax(-1)[0]
            sentiment = f"sentiment {probs.argmax().item()} (p {probs.max().item():.2f})"
            print(f"{sentiment}\t{line}", flush=True)


def main(argv=None):
    cfg, folders = parse_args(argv)
    check_model(cfg)
    rt = make_runtime(cfg.device.device, cfg.device.amp)
    run_dir = Path(
        from_main(cfg.run_dir or f"runs/{cfg.preset}-{time.strftime('%Y%m%d-%H%M%S')}", rt)
    )
    if folders["predict"] or folders["export"] or folders["label"]:
        if cfg.preset == "individual" and not folders["predict"]:
            raise SystemExit("the individual preset keeps a model per task; this needs one")
        if folders["label"]:
            return label(cfg, run_dir, rt, sys.stdin)
        return (predict if folders["predict"] else export)(cfg, run_dir, rt)
    resume = bool(folders["resume"])
    plans = PRESETS[cfg.preset].plans(cfg)
    check_plans(cfg, plans, rt)
    if not rt.main:  # under torchrun the main process prints and writes; the others train
        sys.stdout = open(os.devnull, "w")  # for the rest of the process
    with checkpoint.locked(run_dir) if rt.main else nullcontext():
        if not resume and any(run_dir.rglob(checkpoint.STATE)):
            raise SystemExit(f"{run_dir} already holds a run: continue it with --resume {run_dir}")
        cfg = replace(cfg, run_dir=str(run_dir))
        if not resume and rt.main:
            checkpoint.atomic_write(
                json.dumps(config.to_dict(cfg), indent=1), run_dir / "config.json"
            )
        try:
            with checkpoint.sigterm_stops():
                train(cfg, plans, run_dir, resume, rt)
        except KeyboardInterrupt:
            print(f"\ninterrupted; the run is saved: continue it with --resume {run_dir}")
            raise SystemExit(130) from None


if __name__ == "__main__":
    config.run_cli(main)
