"""Multitask Sentence-BERT: the model, and the command that trains it.

One shared BERT encoder, three task heads (Reimers & Gurevych, 2019, Sentence-BERT):
- sentiment (SST-5): mean-pooled sentence -> dropout -> Linear(5), cross-entropy;
- paraphrase (Quora): siamese [u, v, |u - v|] -> Linear(1), one logit, binary cross-entropy;
- similarity (STS-B): the cosine of u and v stretched onto 0-5, mean squared error.
(losses.TASK_LOSSES lists the losses each task may train with; they decide the heads.)

The CS224n handout's three methods are one call here, `model(task, batch)`:
    predict_sentiment(ids, mask)          -> model("sst", batch)    (B, 5) logits
    predict_paraphrase(ids1, m1, ids2, m2) -> model("para", batch)  (B,) one logit
    predict_similarity(ids1, m1, ids2, m2) -> model("sts", batch)   (B,) a 0-5 score
where a pair batch holds both sentences as (2, B, T) tensors, encoded in one pass.

Training is a plan: a list of stages (presets.Stage), run by one loop (trainer.run_plan)
that `train_multitask`, the handout's driver, calls.
Each preset (presets.py) is a named plan; the thesis ("SMART-SBERT with SimCSE: a robust
defense against catastrophic forgetting") trains sequentially: one QQP epoch, then loops of
STS -> SST -> a fresh 3% of QQP, keeping the model with the best overall dev score. After
every stage all three dev sets are scored: one row of the forgetting table.

    python multitask_classifier.py                    # thesis preset, bert-base-uncased
    python multitask_classifier.py --preset sequential --bert minilm
    python multitask_classifier.py --preset defended --show   # what it trains, stage by stage
    python multitask_classifier.py --preset demo --score      # the untrained model's dev row
    python multitask_classifier.py --resume runs/thesis-...
"""

import json
import random
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import datasets as data
import evaluation
import simcse
import trainer
from bert import BertModel, mean_pool
from engine import checkpoint, flags, handout, preset_flags, runtime
from engine.checks import check_loading, check_run
from engine.estimate import estimate_plans, scoring_seconds
from engine.flags import ModelConfig, OptimConfig, RunConfig
from engine.handout import MULTITASK_HANDOUT
from engine.plan_data import plan_data, plan_files
from engine.runfolder import Run, finish, load_run_config, write_prediction_files
from engine.runtime import (
    attention_line,
    check_attention,
    compile_layers,
    fast_dropout,
    from_main,
    make_runtime,
    out_of_memory,
)
from engine.show import show
from evaluation import MULTITASK, TASKS
from losses import cosine_to_score
from optimizer import AdamW
from presets import PRESETS, Stage, concat_tasks, cosine_tasks
from tokenizer import BertTokenizer
from trainer import run_plan


class MultitaskBERT(nn.Module):
    """A shared BERT with one small head per task.

    `forward(task, batch, embeds=None)` is the only prediction path: given `embeds` (the
    embedding output, e.g. perturbed by SMART) it runs from there instead of from ids; it
    is `readout(task, batch, sentences(batch, embeds))`, so a training step can keep the
    sentence embeddings it computed on the way. Pair batches are siamese, (2, B, T): both
    sentences go through BERT in one forward.
    """

    def __init__(
        self,
        bert: BertModel,
        tasks=MULTITASK,
        pooling="mean",
        dropout=0.1,
        cross=(),
        cosine=(),
        concat=(),
        siamese="cosine",
    ):
        """cross: pair tasks encoded as one sequence; cosine: binary pair tasks read out by
        their siamese similarity against a threshold (their loss trains only the embeddings,
        e.g. --para_loss contrastive): no head, evaluation.fit_thresholds; concat: pair tasks
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
        kind = TASKS[task].kind
        if batch["input_ids"].dim() == 2 and TASKS[task].pair:  # a cross-encoded pair
            return self.heads[f"{task}_cross"](self.dropout(sentences)).squeeze(-1)  # (B,)
        if batch["input_ids"].dim() == 2:  # one sentence per example: SST's classes
            # BEGIN EXERCISE multitask: dropout on the pooled sentences, then the task's linear head: (B, C) logits
            return self.heads[task](self.dropout(sentences))  # (B, C)
            # END EXERCISE multitask
        pooled = self.dropout(sentences)
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
            # BEGIN EXERCISE multitask: the cosine of u and v, stretched from [-1, 1] onto 0-5 (losses.cosine_to_score)
            return cosine_to_score(F.cosine_similarity(u, v, dim=-1))  # (B,) in [0, 5]
            # END EXERCISE multitask
        if task in self.cosine:  # > 0: a paraphrase
            return self.similarity(u, v) - getattr(self, f"{task}_threshold")  # (B,)
        # BEGIN EXERCISE pair_head: the head on [u, v, |u - v|] and on [v, u, |u - v|], averaged: (B,)
        head, d = self.heads[task], (u - v).abs()
        # A paraphrase is symmetric, so average both orders: W_u and W_v then act alike.
        both = head(torch.cat([u, v, d], -1)) + head(torch.cat([v, u, d], -1))  # (B, 1)
        return both.squeeze(-1) / 2  # (B,)
        # END EXERCISE pair_head

    def similarity(self, u, v):
        """(B,) the pair score a threshold cuts: the cosine, or (siamese='euclidean') Auslin
        et al.'s output d = ||u - v||, which their losses make grow with similarity."""
        if self.siamese == "cosine":
            return F.cosine_similarity(u, v, dim=-1)
        return simcse.euclidean_distance(u, v)

    def predict(self, task, batch):
        return self(task, batch)

    # The CS224n handout's methods, by its names: each builds the batch forward takes.
    def predict_sentiment(self, input_ids, attention_mask):
        """(B, T) ids and mask -> (B, 5) logits."""
        # BEGIN EXERCISE multitask: a batch of the ids, their mask and zero token types; the model's "sst" output
        types = torch.zeros_like(input_ids)
        return self(
            "sst",
            {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": types},
        )
        # END EXERCISE multitask

    def predict_paraphrase(self, input_ids_1, attention_mask_1, input_ids_2, attention_mask_2):
        """Two sentences per example, (B, T1) and (B, T2) -> (B,) logits (> 0: paraphrase)."""
        return self(
            "para", self.pair_batch(input_ids_1, attention_mask_1, input_ids_2, attention_mask_2)
        )

    def predict_similarity(self, input_ids_1, attention_mask_1, input_ids_2, attention_mask_2):
        """Two sentences per example, (B, T1) and (B, T2) -> (B,) similarities on 0-5."""
        return self(
            "sts", self.pair_batch(input_ids_1, attention_mask_1, input_ids_2, attention_mask_2)
        )

    @staticmethod
    def pair_batch(ids_1, mask_1, ids_2, mask_2) -> dict:
        """The siamese batch of two (B, T1), (B, T2) sides: each (2, B, max(T1, T2))."""
        # BEGIN EXERCISE multitask: pad the shorter side (ids and mask 0) to the longer's T, stack the sides: (2, B, T); zero token types
        T = max(ids_1.size(1), ids_2.size(1))
        ids = torch.stack(
            [F.pad(ids_1, (0, T - ids_1.size(1))), F.pad(ids_2, (0, T - ids_2.size(1)))]
        )
        mask = torch.stack(
            [F.pad(mask_1, (0, T - mask_1.size(1))), F.pad(mask_2, (0, T - mask_2.size(1)))]
        )
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
        # END EXERCISE multitask

    def configure_optimizers(self, cfg: OptimConfig) -> AdamW:
        """AdamW over two parameter groups: the encoder, then the heads (lr x
        --head_lr_scale: a fresh head barely moves at an encoder's lr)."""
        heads = [p for name, p in self.named_parameters() if not name.startswith("bert.")]
        groups = [
            {"params": list(self.bert.parameters()), "lr_scale": 1.0},
            {"params": heads, "lr_scale": cfg.head_lr_scale},
        ]
        groups = [g for g in groups if g["params"]]
        return AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=cfg.foreach_adamw)


def model_factory(
    cfg: ModelConfig, tasks, cross=(), compile=False, cosine=(), concat=()
) -> Callable[[], MultitaskBERT]:
    """Builds the model from a checkpoint when called (so its heads draw from the seeded RNG
    at the same point of every run)."""

    def make():
        bert = BertModel.from_pretrained(cfg.bert, attention=cfg.attention)
        check_attention(bert)  # torch's SDPA only where it computes what bert.py's does
        if compile:
            compile_layers(bert)
        model = MultitaskBERT(
            bert, tasks, cfg.pooling, cfg.dropout, cross, cosine, concat, cfg.siamese
        )
        return fast_dropout(model)

    return make


def run_model(cfg: RunConfig, compile=False) -> Callable[[], MultitaskBERT]:
    """model_factory for a run: its model settings, cross-encoded, thresholded and
    concatenation-head tasks."""
    return model_factory(
        cfg.model,
        MULTITASK,
        cfg.multitask.cross_encode,
        compile,
        cosine_tasks(cfg),
        concat_tasks(cfg),
    )


# ---------------------------------------------------------------------------------------
# Command line

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
    cfg, typed, folders = flags.parse(
        RunConfig(),
        argv,
        DESCRIPTION,
        preset_flags.epilog() + "\n\n" + handout.handout_help(MULTITASK_HANDOUT, run=True),
        preset_flags.overrides,
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
        if changed := flags.changed_flags(saved, typed, free):  # the same ones may stay
            raise SystemExit(f"--{name} {folder}: the run was made otherwise: {changed}")
    check_run(cfg, PRESETS[cfg.preset].plans_of(cfg))  # before any folder is made
    return cfg, folders


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


def estimate(cfg: RunConfig, plans: dict, rt) -> float:
    """Print each stage's expected minutes and return the whole run's, before any run
    folder exists (--estimate; lab/sweep.py asks it through main): engine.estimate.estimate_plans
    times a few real steps of each kind of stage, plus one dev scoring (scoring_seconds)."""
    task_data = seeded_data(cfg, plans)
    model = run_model(cfg, cfg.device.compile)().to(rt.device)
    reference = trainer.frozen_copy(model) if cfg.optim.l2sp or cfg.optim.distill else None
    scoring = scoring_seconds(task_data, lambda d: sub_run(cfg, Path(), "", rt).score(model, d))
    return estimate_plans(plans, model, task_data, cfg, reference, rt, scoring)


def score_untrained(cfg: RunConfig, rt) -> dict:
    """--score: the model as loaded, scored on the dev sets; its row of the table."""
    torch.manual_seed(cfg.seed)
    cfg = replace(cfg, data=replace(cfg.data, test_predictions=False))  # dev only: no test set
    tokenizer = BertTokenizer.from_pretrained(cfg.model.bert)
    fitted = [Stage((task,), 0.0, 1) for task in cosine_tasks(cfg)]  # thresholds: train pairs
    data.require(plan_files(cfg, fitted))  # the dev sets (and those), no other file
    task_data = plan_data(cfg, fitted, tokenizer)
    model = run_model(cfg)().to(rt.device).eval()
    print(attention_line(model.bert, rt.device))
    run = sub_run(cfg, Path(), "", rt)
    row = {"stage": "start (no training)"} | run.score(model, task_data)
    print(evaluation.table_header(run.eval_tasks))
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


def kept_model(run_dir: Path, rt) -> tuple[RunConfig, MultitaskBERT, dict]:
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
        print(evaluation.table_header(run.eval_tasks))
        run.show({"stage": f"best: {info['row']['stage']}"} | run.evaluate(model, task_data))
        out_dir = write_prediction_files(model, task_data, run, cfg.data.test_predictions)
        print(f"predictions: {out_dir}")


def main(argv=None):
    cfg, folders = parse_args(argv)
    if folders["show"]:  # loads nothing
        return print(show(cfg, PRESETS[cfg.preset]))
    preset = PRESETS[cfg.preset]
    if cfg.preset == "handout-starter":  # the handout's own run; `handout` completes it
        print(f"the handout's starter run: {preset.help} [{preset.source}]")
    else:
        print(f"this project's preset {cfg.preset}: {preset.help} [{preset.source}]")
    rt = make_runtime(cfg.device.device, cfg.device.resolved_precision, cfg.device.dist_timeout)
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
    data.require(plan_files(cfg, plans.stages()))
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


if __name__ == "__main__":
    runtime.run_cli(main)
