"""Evaluation: metrics, one evaluation loop for every task, CS224n prediction files.

Reference: the CS224n "minBERT" default final project handout (evaluation.py and
multitask_classifier.py's test_multitask): sentiment accuracy, paraphrase accuracy from
sigmoid(logit) > 0.5, STS Pearson correlation, and the overall score
(sst_acc + para_acc + (sts_r + 1) / 2) / 3. Macro and support-weighted F1 are also reported,
as in chapter 5 of the SMART-SBERT with SimCSE thesis. The forgetting table (one row of dev
scores after every training stage) is built and printed here too.

The model contract: `model.predict(task, batch)` returns raw outputs, (B, C) logits for
'sst' and 'cfimdb', (B,) one logit for 'para', (B,) a 0-5 score for 'sts'. The table TASKS
says how each task turns raw outputs into predictions and which metrics it computes.
"""

import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from engine.runtime import to_device
from losses import TASK_LOSSES

# ---------------------------------------------------------------------------------------
# Metrics (numpy in, float out)
#
# NaN, one rule: a metric or a forgetting measure whose inputs hold a NaN is NaN (scipy's
# answer; sklearn's would be an error), never a number that depends on where the NaN sat.
# A NaN score is printed as nan, and a stage whose selection score is NaN is never kept.


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Fraction of exact matches."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    return float(np.mean(y_true == y_pred))


def _f1_per_class(y_true: np.ndarray, y_pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """F1 and support of every class seen in y_true or y_pred (F1 = 0 when undefined)."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    classes = np.union1d(y_true, y_pred)
    tp = np.array([np.sum((y_pred == c) & (y_true == c)) for c in classes], dtype=float)
    predicted = np.array([np.sum(y_pred == c) for c in classes], dtype=float)
    support = np.array([np.sum(y_true == c) for c in classes], dtype=float)
    # F1 = 2 tp / (predicted + actual); a class never predicted nor present cannot occur here.
    f1 = 2 * tp / (predicted + support)
    return f1, support


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Unweighted mean of per-class F1 (sklearn's average='macro', zero_division=0)."""
    f1, _ = _f1_per_class(y_true, y_pred)
    return float(np.mean(f1))


def weighted_f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Per-class F1 averaged with weights = the class's number of true samples
    (sklearn's average='weighted', zero_division=0)."""
    f1, support = _f1_per_class(y_true, y_pred)
    return float(np.sum(f1 * support) / np.sum(support))


def pearson_r(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; nan when either input is constant."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    # BEGIN EXERCISE pearson: covariance over the product of the standard deviations; nan when either is constant
    dx, dy = x - x.mean(), y - y.mean()
    denom = np.sqrt(np.sum(dx * dx) * np.sum(dy * dy))
    return float(np.sum(dx * dy) / denom) if denom > 0 else float("nan")
    # END EXERCISE pearson


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of x's values, ties sharing the mean of the ranks they span; all NaN
    when x holds a NaN (NaN has no rank)."""
    x = np.asarray(x, dtype=float)
    if np.isnan(x).any():
        return np.full(len(x), math.nan)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    values, inverse = np.unique(x, return_inverse=True)
    sums = np.bincount(inverse, weights=ranks, minlength=len(values))
    return (sums / np.bincount(inverse))[inverse]  # each tie group's mean rank


def spearman_rho(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation: Pearson r of the average ranks (MTEB's STS score)."""
    return pearson_r(average_ranks(x), average_ranks(y))


def overall_score(sst_acc: float, para_acc: float, sts_r: float) -> float:
    """The CS224n leaderboard score: Pearson r in [-1, 1] is mapped to [0, 1] first."""
    return (sst_acc + para_acc + (sts_r + 1) / 2) / 3


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    return {
        "accuracy": accuracy(y_true, y_pred),
        "macro_f1": macro_f1(y_true, y_pred),
        "weighted_f1": weighted_f1(y_true, y_pred),
    }


def regression_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """Pearson r (CS224n's score: the overall score and the forgetting measures read it)
    and Spearman's rho (sentence-transformers' and MTEB's STS score), side by side."""
    return {"pearson": pearson_r(y_true, y_pred), "spearman": spearman_rho(y_true, y_pred)}


# ---------------------------------------------------------------------------------------
# The task table


@dataclass(frozen=True)
class TaskSpec:
    name: str  # its key: --<name>_loss, the run's rows
    kind: str  # 'classification': (B, C) logits; 'binary': (B,) a logit; 'regression': (B,) a score
    num_labels: int  # classes of a classification head; 1 otherwise
    pair: bool  # two sentences per example
    title: str  # name in tables
    column: str  # prediction-file header, as the handout writes it
    files: str  # the handout's file names: {files}-train.csv, -dev.csv, -test-student.csv

    @property
    def losses(self) -> dict:
        """The losses it may train with, by name, the default first (losses.TASK_LOSSES)."""
        return TASK_LOSSES[self.name]

    @property
    def metric(self) -> str:
        """Its score in the overall score, the forgetting table and the best model's choice."""
        return "pearson" if self.kind == "regression" else "accuracy"


# kind -> (raw output -> predictions, (labels, predictions) -> metrics). A binary logit > 0
# is a sigmoid > 0.5; the handout's sigmoid().round() also maps 0.5 to 0.
RULES = {
    "classification": (lambda out: out.argmax(dim=-1), classification_metrics),  # (B, C) -> (B,)
    "binary": (lambda out: (out > 0).long(), classification_metrics),  # (B,) -> (B,) 0 or 1
    "regression": (lambda out: out.float(), regression_metrics),  # (B,) -> (B,)
}

MULTITASK = ("sst", "para", "sts")  # the tasks of the overall score
# The task table: every task, its files, its metric (by its kind) and its losses. The head
# a loss implies is commands.show.head_of's; `--show` prints the table for a run.
TASKS = {
    spec.name: spec
    for spec in (
        TaskSpec("sst", "classification", 5, False, "SST", "Predicted_Sentiment", "ids-sst"),
        TaskSpec(
            "cfimdb", "classification", 2, False, "CFIMDB", "Predicted_Sentiment", "ids-cfimdb"
        ),
        TaskSpec("para", "binary", 1, True, "QQP", "Predicted_Is_Paraphrase", "quora"),
        # "Similiary" is the handout's spelling; kept so our files match its format exactly.
        TaskSpec("sts", "regression", 1, True, "STS", "Predicted_Similiary", "sts"),
    )
}


# ---------------------------------------------------------------------------------------
# One evaluation loop


@dataclass
class TaskResult:
    metrics: dict[str, float]  # empty for unlabeled (test) data
    ids: list[str] = field(default_factory=list)
    preds: list = field(default_factory=list)  # int classes, or float scores for sts
    labels: list = field(default_factory=list)  # the gold labels, where labeled


def evaluate(
    model: torch.nn.Module, loaders: Mapping[str, Iterable[dict]], device: torch.device | str
) -> dict[str, TaskResult]:
    """Predictions (and metrics, where labeled) of `model` for every task in `loaders`.

    Runs in eval mode under no_grad and restores the model's previous mode afterwards.
    """
    unknown = set(loaders) - set(TASKS)
    if unknown:
        raise ValueError(f"no evaluation rule for task(s) {sorted(unknown)}; known: {list(TASKS)}")
    was_training = model.training
    model.eval()
    results = {}
    try:
        with torch.no_grad():
            for task, loader in loaders.items():
                results[task] = _evaluate_task(model, task, loader, device)
    finally:
        model.train(was_training)
    return results


def _evaluate_task(model, task: str, loader: Iterable[dict], device) -> TaskResult:
    predict, metrics_of = RULES[TASKS[task].kind]
    output_ndim = 2 if TASKS[task].kind == "classification" else 1
    ids, preds, labels = [], [], []
    bar = tqdm(loader, desc=f"scoring {TASKS[task].title}", leave=False, delay=2)
    for batch in bar:  # the bar shows once scoring takes over 2 seconds
        batch = to_device(batch, device)
        out = model.predict(task, batch)
        B = len(batch["ids"])
        if out.dim() != output_ndim or out.shape[0] != B:
            expected = "(B, C) logits" if output_ndim == 2 else "(B,)"
            raise ValueError(
                f"model.predict({task!r}) returned shape {tuple(out.shape)} for a batch of {B}; "
                f"expected {expected}"
            )
        preds.append(predict(out).cpu())
        ids.extend(batch["ids"])
        if "labels" in batch:
            labels.append(batch["labels"].cpu())
    if labels and len(labels) != len(preds):
        raise ValueError(f"{task}: some batches have labels and some do not")
    preds = torch.cat(preds).numpy() if preds else np.array([])
    labels = torch.cat(labels).numpy() if labels else None
    metrics = metrics_of(labels, preds) if labels is not None else {}
    return TaskResult(metrics, ids, preds.tolist(), [] if labels is None else labels.tolist())


def half_of(results: Mapping[str, TaskResult], which: int) -> dict[str, TaskResult]:
    """Each task's results on one half of its examples (which: 0 or 1), the halves cut by a
    hash of the example id (the same on every run and machine), metrics on that half."""
    out = {}
    for task, r in results.items():
        keep = [i for i, id_ in enumerate(r.ids) if zlib.crc32(id_.encode()) % 2 == which]
        preds, labels = np.array(r.preds)[keep], np.array(r.labels)[keep] if r.labels else None
        metrics = RULES[TASKS[task].kind][1](labels, preds) if r.labels else {}
        ids = [r.ids[i] for i in keep]
        out[task] = TaskResult(metrics, ids, preds.tolist(), [] if labels is None else list(labels))
    return out


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: the chance that a random positive scores above a random
    negative, ties counting half (the Mann-Whitney U statistic over n_pos * n_neg)."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels).astype(bool)
    n_pos, n_neg = labels.sum(), (~labels).sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    # BEGIN EXERCISE auc: rank the scores (average_ranks: ties share their mean); U = positives' rank sum - n_pos(n_pos + 1)/2
    ranks = average_ranks(scores)  # 1..n in score order
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
    # END EXERCISE auc


def best_threshold(scores: np.ndarray, labels: np.ndarray) -> float:
    """The cut t for which `score > t` predicts the 0/1 labels most accurately: the midpoint
    between two neighbouring sorted scores (or just outside their range); the first best."""
    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels).astype(bool)
    order = np.argsort(scores, kind="stable")
    s, y = scores[order], labels[order]
    # cutting before position i: negatives below it right, positives from it on right
    right = np.concatenate([[0], np.cumsum(~y)]) + np.concatenate([np.cumsum(y[::-1])[::-1], [0]])
    cuts = [i for i in range(len(s) + 1) if i in (0, len(s)) or s[i - 1] < s[i]]
    i = max(cuts, key=lambda c: right[c])  # ties: the first
    if i == 0:
        return float(s[0] - 1.0) if len(s) else 0.0
    if i == len(s):
        return float(s[-1])
    return float((s[i - 1] + s[i]) / 2)


# ---------------------------------------------------------------------------------------
# Siamese pairs scored by their similarity: held-out transfer, cosine read-outs


def cosine(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(u, v, dim=-1)  # (B,)


def pair_scores(model, pairs, rt, batch_size: int, n=None, similarity=cosine):
    """(scores, labels) of the first n siamese pairs of a PairDataset (all by default):
    similarity(u, v) of the two sentence embeddings in eval mode, as numpy arrays (n,) in
    the pairs' order. Batches are cut from the pairs sorted by length, longest first, so
    little compute goes to padding (a third of it in SNLI's order); they are collated
    directly, so scoring draws nothing from the random generators."""
    n = len(pairs) if n is None else min(n, len(pairs))
    order = sorted(range(n), key=lambda i: -pairs.lengths[i])  # stable: ties keep order
    scores, labels = [], []
    was_training = model.training
    model.eval()
    with torch.no_grad(), rt.autocast():
        for i in range(0, n, batch_size):
            batch = pairs.collate(order[i : i + batch_size])
            z = model.sentences(to_device(batch, rt.device)).float()  # (2b, H)
            u, v = z.view(2, -1, z.size(-1)).unbind(0)  # (b, H) each
            scores.append(similarity(u, v).cpu())
            labels.append(batch["labels"])
    model.train(was_training)
    place = torch.empty(n, dtype=torch.long)
    place[order] = torch.arange(n)  # pair i's place in the sorted order
    return torch.cat(scores)[place].numpy(), torch.cat(labels)[place].numpy()


THRESHOLD_PAIRS = 2000  # training pairs a cosine read-out's threshold is fit on


def fit_thresholds(model, task_data, rt, batch_size: int):
    """The threshold of every task the model reads out by its siamese similarity
    (model.cosine): the most accurate cut on its first THRESHOLD_PAIRS training pairs, fit
    again before each scoring since every stage moves the embeddings."""
    for task in model.cosine:
        scores, labels = pair_scores(
            model, task_data[task].train, rt, batch_size, THRESHOLD_PAIRS, model.similarity
        )
        getattr(model, f"{task}_threshold").fill_(best_threshold(scores, labels))


def overall_from_results(results: Mapping[str, TaskResult]) -> float:
    """The overall score from the sst, para and sts results of one evaluate() call."""
    missing = [t for t in MULTITASK if not results.get(t, TaskResult({})).metrics]
    if missing:
        raise ValueError(f"the overall score needs labeled results for {missing}")
    return overall_score(
        results["sst"].metrics["accuracy"],
        results["para"].metrics["accuracy"],
        results["sts"].metrics["pearson"],
    )


# ---------------------------------------------------------------------------------------
# The forgetting table: one row of dev scores after every stage


def score_row(results: Mapping[str, TaskResult], tasks) -> dict:
    """Flatten evaluation results into one forgetting-table row."""
    row = {t: results[t].metrics for t in tasks}
    if set(MULTITASK) <= set(tasks):
        row["overall"] = overall_from_results(results)
    return row


def main_score(row: dict, task: str) -> float:
    """A row's main number for `task`: Pearson r, accuracy, the overall score, or the
    held-out transfer AUC."""
    if task in ("overall", "heldout"):
        return row[task]
    return row[task][TASKS[task].metric]


def selection_score(row: dict, tasks) -> float:
    """Overall score when all three tasks are scored, else the one task's main metric."""
    return main_score(row, "overall" if "overall" in row else tasks[0])


def kept_stage(rows: list[dict]) -> int | None:
    """Position in rows[1:] of the stage runner.run_plan keeps: the first best selection score,
    never a NaN one (rows[0] is the untouched model; its keys say which tasks are scored)."""
    tasks = [t for t in TASKS if t in rows[0]]
    scores = [selection_score(row, tasks) for row in rows[1:]]
    numeric = [i for i, s in enumerate(scores) if not math.isnan(s)]
    return max(numeric, key=scores.__getitem__, default=None)


def kept_row(rows: list[dict]) -> dict | None:
    """The row of the stage run_plan keeps; None before a stage has a score."""
    kept = kept_stage(rows) if rows else None
    return None if kept is None else rows[1 + kept]


# ---------------------------------------------------------------------------------------
# Forgetting measured: three numbers per task from the table's rows


def forgetting(rows: list[dict], tasks) -> dict[str, dict[str, float | None]]:
    """Forgetting measures of a run, from its table: rows[0] scores the untouched model,
    row k >= 1 the model after stage k. For each task t (and 'overall' when all three are
    scored), s_k being t's dev score in row k and K the last row:

    forgetting: max(s_1 .. s_{K-1}) - s_K, the best score after a stage before the last
        less the final one: Chaudhry et al.'s (2018) forgetting at the end of the run, its
        max over trained models only (the untouched one is final_minus_start's); negative
        when the run ends at its best; None with a single stage.
    backward_transfer: mean over the stages k < K that trained t of s_K - s_k (Lopez-Paz &
        Ranzato 2017, whose sum stops before the last task): what the later stages did to
        what t's own stages reached; None when no stage before the last trained t
        ('overall' and 'heldout': every stage counts).
    final_minus_start: s_K - s_0, what the whole run did to the untouched model's score.
    mean_drop_below_best: mean over k >= 1 of max(0, max(s_0 .. s_{k-1}) - s_k), how far
        each stage leaves the score below the best reached before it, averaged over the
        run (a new best counts 0, so one stage's gain cannot hide another's loss; the
        measure this project's forgetting study was chosen on, there called "average
        forgetting").
    'heldout' (when every row has it): the held-out transfer AUC (runfolder.Run.evaluate).
    """
    if len(rows) < 2:
        raise ValueError(f"forgetting needs the start row and a stage's, got {len(rows)} rows")
    names = list(tasks) + (["overall"] if set(MULTITASK) <= set(tasks) else [])
    names += ["heldout"] if all("heldout" in row for row in rows) else []
    out = {}
    for t in names:
        s = [main_score(row, t) for row in rows]
        drops = [np.maximum(0.0, np.max(s[:k]) - s[k]) for k in range(1, len(s))]  # NaN stays
        every = t in ("overall", "heldout")  # no stage names these: every stage counts
        trained = [k for k in range(1, len(s) - 1) if every or t in rows[k].get("tasks", ())]
        backward = [s[-1] - s[k] for k in trained]
        out[t] = {
            "forgetting": float(np.max(s[1:-1]) - s[-1]) if len(s) > 2 else None,
            "backward_transfer": float(np.mean(backward)) if backward else None,
            "final_minus_start": s[-1] - s[0],
            "mean_drop_below_best": float(np.mean(drops)),
        }
    return out
