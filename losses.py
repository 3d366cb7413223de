"""Every loss a task can train with: small functions of the model's outputs and the labels,
one table per task.

TASK_LOSSES: for each task of the task table (evaluation.TASKS), the losses a stage may name (`--para_loss`, `--sts_loss`), the
default first. Each entry says what its function reads (the task's output, or the two
sentence embeddings u, v of a siamese pair), whether it trains their cosine and whether
the batch's other examples are its negatives; the flags' choices and help, the heads the
model builds and the checks that refuse a combination are all read from it. Adding a loss
is one entry here. The training step (trainer.train_step) calls them; SMART's term is
smart.py's, the contrastive objectives simcse.py's.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import simcse

# ---------------------------------------------------------------------------------------
# STS's read-out: the cosine's [-1, 1] stretched onto the 0-5 scores

STS_HALF = 2.5  # half of STS's 0-5 range


def cosine_to_score(cos: torch.Tensor) -> torch.Tensor:
    """(B,) cosines in [-1, 1] -> STS scores in [0, 5]: the model's STS output."""
    return cos * STS_HALF + STS_HALF


def score_to_cosine(score: torch.Tensor) -> torch.Tensor:
    """(B,) STS scores in [0, 5] -> [-1, 1], the inverse of cosine_to_score."""
    return (score - STS_HALF) / STS_HALF


# ---------------------------------------------------------------------------------------
# Losses of a task's output: out (B, C) logits, or (B,) a logit or STS score; labels (B,).
# Each is a batch mean, right on a short last batch too.


def bce(out, labels):
    return F.binary_cross_entropy_with_logits(out, labels.to(out.dtype))


def mse(out, labels):
    """On STS's 0-5 score: 6.25 times the MSE of its cosine against labels in [-1, 1]."""
    return F.mse_loss(out, labels.to(out.dtype))


def l1(out, labels):
    return F.l1_loss(out, labels.to(out.dtype))


def cosine_sbert(out, labels):
    """The cosine behind STS's score against score / 5 in [0, 1] (Sentence-BERT's target,
    Reimers & Gurevych 2019); `mse` asks cos = -1 of unrelated pairs."""
    return F.mse_loss(score_to_cosine(out), labels.to(out.dtype) / 5)


def sigmoid_mse(out, labels):
    return F.mse_loss(torch.sigmoid(out), labels.to(out.dtype))


def sigmoid_l1(out, labels):
    return F.l1_loss(torch.sigmoid(out), labels.to(out.dtype))


def report_margin(d: torch.Tensor, labels: torch.Tensor, margin: float = 0.5) -> torch.Tensor:
    """The contrastive formula as Auslin et al. print it, 1/2 (1 - y) d^2 + 1/2 y
    max(0, m - d)^2, on an output d that grows with similarity: non-paraphrases are pulled
    to 0 and paraphrases pushed past the margin. d, labels: (B,); batch mean."""
    y = labels.to(d.dtype)
    return 0.5 * ((1 - y) * d.pow(2) + y * F.relu(margin - d).pow(2)).mean()


def sigmoid_margin(out, labels, margin: float = 0.5):
    """Auslin et al.'s segments network on Quora: report_margin of d = sigmoid(logit)."""
    return report_margin(torch.sigmoid(out), labels, margin)


# ---------------------------------------------------------------------------------------
# Losses of the two sentence embeddings u, v (B, H) of siamese pairs: (u, v, labels, kind)

COSINE_TARGET = {"binary": lambda y: y, "regression": score_to_cosine}  # 0/1; 0-5 to [-1, 1]
POSITIVE = {"binary": 1.0, "regression": 4.0}  # label from which a pair counts as positive


def cosine_mse(u, v, labels, kind):
    target = COSINE_TARGET[kind](labels.to(u.dtype))
    return F.mse_loss(F.cosine_similarity(u, v, dim=-1), target)


def contrastive(u, v, labels, kind, margin: float = 0.5):
    return simcse.contrastive_margin_loss(u, v, labels, margin)


def ranking_on_positives(u, v, labels, kind, temperature: float = 0.05):
    """Multiple-negatives ranking over the batch's positive pairs only (Broadhurst et al.);
    temperature 0.05 is sentence-transformers' scale of 20."""
    keep = labels >= POSITIVE[kind]  # (B,) duplicates, or STS scores >= 4
    if not keep.any():
        return (u.sum() + v.sum()) * 0.0  # no positive pair in this batch: nothing to rank
    return simcse.multiple_negatives_ranking_loss(u[keep], v[keep], temperature)


def distance_margin(u, v, labels, kind, margin: float = 0.5):
    """Auslin et al.'s siamese network: their formula on its output d = ||u - v||."""
    return report_margin(simcse.euclidean_distance(u, v), labels, margin)


# ---------------------------------------------------------------------------------------
# The table: each task's losses, its default first


@dataclass(frozen=True)
class Loss:
    fn: Callable[..., torch.Tensor]  # (out, labels), or with pair=True (u, v, labels, kind)
    help: str  # its words in --help
    pair: bool = False  # reads u, v, not a head: a binary task is then cut by a threshold
    cosine: bool = False  # trains the cosine of u and v (no head; not with --siamese euclidean)
    in_batch: bool = False  # the batch's other examples are its negatives


MNRL = Loss(ranking_on_positives, "ranking against the batch's other pairs", True, True, True)
COSINE_MSE = Loss(cosine_mse, "MSE of the cosine against the label in [-1, 1]", True, True)
TASK_LOSSES = {
    "sst": {"ce": Loss(F.cross_entropy, "cross-entropy of the 5 logits")},
    "cfimdb": {"ce": Loss(F.cross_entropy, "cross-entropy of the 2 logits")},
    "para": {
        "bce": Loss(bce, "binary cross-entropy of the head's logit"),
        "contrastive": Loss(contrastive, "margin 0.5 on the cosine distance", True, True),
        "mnrl": MNRL,
        "cosine_mse": COSINE_MSE,
        "sigmoid_mse": Loss(sigmoid_mse, "MSE of the sigmoid (Auslin et al.)"),
        "sigmoid_l1": Loss(sigmoid_l1, "L1 of the sigmoid (Auslin et al.)"),
        "sigmoid_margin": Loss(sigmoid_margin, "their margin formula on the sigmoid"),
        "distance_margin": Loss(distance_margin, "their margin formula on ||u - v||", True),
    },
    "sts": {
        "mse": Loss(mse, "MSE of the 0-5 score"),
        "l1": Loss(l1, "L1 of the 0-5 score (Auslin et al.)"),
        "cosine_mse": COSINE_MSE,
        "cosine_sbert": Loss(cosine_sbert, "MSE of the cosine against score / 5", cosine=True),
        "mnrl": MNRL,
    },
}


def default_loss(task: str) -> str:
    return next(iter(TASK_LOSSES[task]))


def loss_of(task: str, name: str | None) -> Loss:
    """The task's loss called `name` (None: its default)."""
    return TASK_LOSSES[task][name or default_loss(task)]
