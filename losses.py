"""Every loss a task can train with, one table per task, and the loss of one batch.

- TASK_LOSSES: for each task, the losses a stage may name (`--para_loss`, `--sts_loss`),
  the default first. Each entry says what its function reads (the task's output, or the
  two sentence embeddings u, v of a siamese pair), whether it trains their cosine and
  whether the batch's other examples are its negatives; the flags' choices and help, the
  heads the model builds and the checks that refuse a combination are all read from it.
  Adding a loss is one entry here.
- `batch_loss`: one batch's task loss, plus SMART's terms (Jiang et al., 2020) and the
  distillation pull toward the untouched encoder when the run asks for them;
- `task_loss`: what a stage trains on a batch: a contrastive objective (simcse.OBJECTIVES)
  or the task's `batch_loss`, plus a weighted unsupervised SimCSE term (Sicurello).

A step's `ctx` (trainer.StepContext) carries its runtime, the run's optimization settings,
SMART's teacher and the untouched reference model.
"""

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import evaluation
import simcse
from evaluation import TASKS
from smart import SameDropout, SmartConfig, passes_in_float32, smart_loss

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


def loss_help(task: str) -> str:
    """The --<task>_loss help: every choice with its words, the default first."""
    items = [f"{name} ({loss.help})" for name, loss in TASK_LOSSES[task].items()]
    return f"{TASKS[task].title} loss: {items[0]}, the default; or " + ", ".join(items[1:])


def smart_autocast(rt, smart: SmartConfig):
    """The autocast of a batch's passes: the runtime's, or none (float32) where SMART's
    passes need it (smart.passes_in_float32); then the clean pass, whose graph R_s and D_Breg
    share with the task loss, runs in float32 too, and no pass runs twice."""
    if passes_in_float32(smart, rt.amp_dtype):
        return torch.autocast(rt.device.type, enabled=False)
    return rt.autocast()


def smart_term(model, task, smart: SmartConfig, batch, embeds, out, ctx, masks):
    """SMART's lambda_s * R_s + mu * D_Breg for this batch, the same code for every task.

    embeds, out: the clean pass's embedding output and task output, whose graphs R_s and
    D_Breg share with the task loss. masks: (before the embedding, after it) SameDropout
    states, so that the perturbed and the teacher's passes draw the clean pass's dropout
    masks; None: masks of their own. The reference variant perturbs an embedding output of
    its own, as mt-dnn's SmartPerturbation runs the embedding again. Every pass runs in the
    caller's precision (smart_autocast).
    """
    same_embed, same = masks or (None, None)

    def replayed(state):
        return state.replay() if state else nullcontext()

    def from_embeddings(e):  # (N, T, H) embedding output -> the task's output
        with replayed(same):
            return model(task, batch, e).float()

    teacher_out = None
    if ctx.teacher:
        with replayed(same_embed):
            teacher_out = ctx.teacher.forward(model, task, batch).float()
    mask = model.flat_inputs(batch)[1]  # (N, T): padding gets no noise
    kind = TASKS[task].kind
    if smart.variant == "reference":  # as SmartPerturbation: a fresh embedding forward,
        embeds = model.embed(batch)  # its own dropout mask in training
    return smart_loss(from_embeddings, embeds, out.float(), kind, teacher_out, smart, mask)


def distillation(z, batch, masks: SameDropout, training: bool, ctx):
    """The gap between the cosines of the examples' first sentences, z's first B rows, and
    those the untouched model (ctx.reference) gives them; a pair's own cosine stays free.

    The reference runs the whole batch in the model's mode (`training`), with the dropout
    masks of the pass that made z (`masks` replays its draws), in the same precision: at
    the loaded weights both passes are one computation, so the gap and its gradient are
    exactly 0 and the term pulls only once the encoder has moved. (An eval-mode reference
    differs from the dropped-out model at step 0 and pushes the encoder from its first step.)
    """
    B = batch["input_ids"].size(-2)  # (B, T) or (2, B, T): the examples, first sentences first
    with torch.no_grad(), masks.replay():
        z0 = ctx.reference.train(training).sentences(batch)[:B]  # (B, H)
    (z, z0), weight = ctx.in_batch(z[:B].float(), z0.float())
    return weight * simcse.similarity_distillation(z, z0)


def batch_loss(model, task, batch, stage, ctx) -> torch.Tensor:
    """The training loss of one batch of `task` in `stage` (a presets.Stage): the task's
    loss, plus SMART's terms when on, plus --distill times the distillation gap when the
    stage trains the encoder."""
    loss_fn = loss_of(task, stage.losses.get(task))
    smart = stage.smart
    shared = smart.active and smart.dropout == "shared"
    distill = 0.0 if stage.freeze_encoder else ctx.optim.distill
    same_embed = SameDropout(ctx.rt.device) if shared or distill > 0 else None
    with smart_autocast(ctx.rt, smart if not loss_fn.pair else SmartConfig.off()):
        if loss_fn.pair:  # a loss of the two sentence embeddings, no head
            z = model.sentences(batch)  # (2B, H)
            u, v = z.float().view(2, -1, z.size(-1)).unbind(0)  # (B, H) each
            labels, weight = batch["labels"], 1.0
            if loss_fn.in_batch:  # the other examples are the negatives
                (u, v, labels), weight = ctx.in_batch(u, v, labels)
            loss = weight * loss_fn.fn(u, v, labels, TASKS[task].kind)
        else:
            embeds = model.embed(batch)  # (N, T, H), kept so SMART can perturb it
            masks = (same_embed, SameDropout(ctx.rt.device)) if shared else None
            z = model.sentences(batch, embeds)  # (N, H)
            out = model.readout(task, batch, z)
            loss = loss_fn.fn(out.float(), batch["labels"])
            if smart.active:
                loss = loss + smart_term(model, task, smart, batch, embeds, out, ctx, masks)
        if distill > 0:
            loss = loss + distill * distillation(z, batch, same_embed, model.training, ctx)
    return loss


def contrastive_loss(model, cfg, batch, ctx) -> torch.Tensor:
    """A contrastive stage's loss on a (K, B, T) batch of sentence tuples (no heads);
    cfg: the stage's SimCSE settings (objective and temperature)."""
    if batch["input_ids"].size(0) == 1:  # the same sentences twice: dropout is the only noise
        batch = {k: v.repeat(2, 1, 1) if k != "ids" else v for k, v in batch.items()}  # (2, B, T)
    K = batch["input_ids"].size(0)
    with ctx.rt.autocast():
        z = model.sentences(batch).float()  # (K * B, H)
    (z,), weight = ctx.in_batch(z.view(K, -1, z.size(-1)).transpose(0, 1))  # (B, K, H)
    return weight * simcse.OBJECTIVES[cfg.simcse_loss][1](z.transpose(0, 1), cfg.temperature)


def simcse_term(model, batch, temperature: float, ctx) -> torch.Tensor:
    """Unsupervised SimCSE of the batch's sentences (both sides of pairs): two passes, two
    dropout masks (Sicurello adds it to the task losses)."""
    with ctx.rt.autocast():
        z1, z2 = (model.sentences(batch).float() for _ in range(2))  # (N, H) each
    ids = batch["input_ids"]
    S = ids.size(0) if ids.dim() == 3 else 1  # sentences per example
    # (S * B, H) -> (B, S, H): gathered by example, as the processes' shares are cut
    by_example = (z.view(S, -1, z.size(-1)).transpose(0, 1) for z in (z1, z2))
    (z1, z2), weight = ctx.in_batch(*by_example)
    z1, z2 = (z.transpose(0, 1).reshape(-1, z.size(-1)) for z in (z1, z2))  # (S * N, H)
    return weight * simcse.unsup_simcse_loss(z1, z2, temperature)


def task_loss(model, stage, task, batch, ctx) -> torch.Tensor:
    """One batch's loss in this stage: a contrastive objective or the task's loss, plus a
    weighted SimCSE term when the stage has one."""
    batch = evaluation.to_device(batch, ctx.rt.device)
    if stage.kind == "contrastive":
        return contrastive_loss(model, stage.contrastive, batch, ctx)
    loss = batch_loss(model, task, batch, stage, ctx)
    term = stage.contrastive
    if term and term.simcse_weight > 0:
        loss = loss + term.simcse_weight * simcse_term(model, batch, term.temperature, ctx)
    return loss
