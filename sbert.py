"""Sentence-BERT on one shared encoder: the model this project's presets train.

One shared BERT encoder, three task heads (Reimers & Gurevych, 2019, Sentence-BERT):
- sentiment (SST-5): mean-pooled sentence -> dropout -> Linear(5), cross-entropy;
- paraphrase (Quora): siamese [u, v, |u - v|] -> Linear(1), one logit, binary cross-entropy;
- similarity (STS-B): the cosine of u and v stretched onto 0-5, mean squared error.
(losses.TASK_LOSSES lists the losses each task may train with; they decide the heads.)

`model(task, batch)` is its one prediction path: a sentence batch holds (B, T) tensors, a
pair batch both sentences as (2, B, T) tensors, encoded in one pass. The handout's own
multitask model, MultitaskBERT with predict_*, is the student's design in
multitask_classifier.py; the `handout` preset trains that one.
"""

import torch
import torch.nn.functional as F
from torch import nn

import simcse
from bert import BertModel, mean_pool
from evaluation import MULTITASK, TASKS
from losses import cosine_to_score, loss_of
from optimizer import AdamW
from presets import loss_choices
from settings import OptimConfig, RunConfig

READOUTS = ("cross", "cosine", "concat")  # a pair task's other ways than Sentence-BERT's


class SentenceBERT(nn.Module):
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
        readouts=None,
        siamese="cosine",
    ):
        """readouts: {pair task: how it is read out} where not Sentence-BERT's way: 'cross',
        encoded as one sequence; 'cosine', a binary task read out by its siamese similarity
        against a threshold (its loss trains only the embeddings, e.g. --para_loss
        contrastive): no head, evaluation.fit_thresholds; 'concat', a Linear on [u, v]
        (Broadhurst & Maffezzoli). siamese: the score of pairs without a head, the cosine or
        d = ||u - v|| (Auslin et al.; STS then outputs d)."""
        super().__init__()
        readouts = readouts or {}
        if unknown := {t: r for t, r in readouts.items() if r not in READOUTS}:
            raise ValueError(f"readouts must be among {READOUTS}, got {unknown}")
        cross, cosine, concat = ([t for t, r in readouts.items() if r == k] for k in READOUTS)
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

    def checkpoint_config(self) -> dict:
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
        with self.bert.token_types(types):
            return self.bert.embed(ids)

    def sentences(self, batch, embeds=None):
        """Pooled sentence embeddings (N, H) of every sentence in the batch, before dropout."""
        if embeds is None:
            embeds = self.embed(batch)
        _, mask, _ = self.flat_inputs(batch)
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
            # BEGIN EXERCISE sbert: dropout on the pooled sentences, then the task's linear head: (B, C) logits
            return self.heads[task](self.dropout(sentences))  # (B, C)
            # END EXERCISE sbert
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
            # BEGIN EXERCISE sbert: the cosine of u and v, stretched from [-1, 1] onto 0-5 (losses.cosine_to_score)
            return cosine_to_score(F.cosine_similarity(u, v, dim=-1))  # (B,) in [0, 5]
            # END EXERCISE sbert
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


# ---------------------------------------------------------------------------------------
# The heads a run's losses ask for


def cosine_tasks(cfg: RunConfig) -> tuple:
    """Binary pair tasks whose loss trains only the sentence embeddings: the model reads them
    out by a cosine threshold, not by a head that loss would never train."""
    return tuple(
        t
        for t, loss in loss_choices(cfg).items()
        if loss_of(t, loss).pair and TASKS[t].kind == "binary"
    )


def concat_tasks(cfg: RunConfig) -> tuple:
    """Siamese pair tasks that get a Linear on [u, v] (--pair_head concat): those whose loss
    trains a head's output."""
    if cfg.model.pair_head != "concat":
        return ()
    chosen = loss_choices(cfg)
    return tuple(
        t
        for t in ("para", "sts")
        if not (loss_of(t, chosen.get(t)).pair or loss_of(t, chosen.get(t)).cosine)
        and t not in cfg.multitask.cross_encode
    )
