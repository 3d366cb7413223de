"""The training loss of one batch, and the tables of every loss a stage can name.

- OUTPUT_LOSSES: losses of a task's output (a head's logits or STS's 0-5 cosine score);
- PAIR_LOSSES: losses of the two sentence embeddings u, v of siamese pairs, no head;
- `batch_loss`: one batch's task loss, plus SMART's terms (Jiang et al., 2020) and the
  distillation pull toward the untouched encoder when the run asks for them;
- `task_loss`: what a stage trains on a batch: a contrastive objective (simcse.OBJECTIVES)
  or the task's `batch_loss`, plus a weighted unsupervised SimCSE term (Sicurello).

A step carries its runtime, SMART's teacher and the untouched reference model in one
`StepContext`. evaluation.TASKS says which loss a task may train with.
"""

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import evaluation
import simcse
from config import OptimConfig
from evaluation import TASKS
from runtime import Runtime, gather_rows
from smart import EMATeacher, SameDropout, SmartConfig, below_resolution, smart_loss

INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # what a model reads of a batch


def report_margin(d: torch.Tensor, labels: torch.Tensor, margin: float = 0.5) -> torch.Tensor:
    """The contrastive formula as Auslin et al. print it, 1/2 (1 - y) d^2 + 1/2 y
    max(0, m - d)^2, on an output d that grows with similarity: non-paraphrases are pulled
    to 0 and paraphrases pushed past the margin. d, labels: (B,); batch mean."""
    y = labels.to(d.dtype)
    return 0.5 * ((1 - y) * d.pow(2) + y * F.relu(margin - d).pow(2)).mean()


def margin_on_score(out: torch.Tensor, labels: torch.Tensor, margin: float = 0.5) -> torch.Tensor:
    """Auslin et al.'s segments network on Quora: report_margin of d = sigmoid(logit)."""
    return report_margin(torch.sigmoid(out), labels, margin)


# Losses of a task's output (out: (B, C) logits, or (B,) a logit or score; labels (B,)),
# each a batch mean, right on a short last batch too.
OUTPUT_LOSSES = {
    "ce": lambda out, y: F.cross_entropy(out, y),
    "bce": lambda out, y: F.binary_cross_entropy_with_logits(out, y.to(out.dtype)),
    "mse": lambda out, y: F.mse_loss(out, y.to(out.dtype)),
    "l1": lambda out, y: F.l1_loss(out, y.to(out.dtype)),  # Auslin et al.'s STS option
    # STS only: the head's cosine (out = 2.5 cos + 2.5) against score / 5 in [0, 1], the
    # Sentence-BERT target (Reimers & Gurevych 2019); 'mse' asks cos = -1 of unrelated pairs
    "cosine_sbert": lambda out, y: F.mse_loss((out - 2.5) / 2.5, y.to(out.dtype) / 5),
    # paraphrase logits through a sigmoid against the 0/1 label (Auslin et al.'s submitted
    # model, their L1 row) and their segments network's margin loss
    "sigmoid_mse": lambda out, y: F.mse_loss(torch.sigmoid(out), y.to(out.dtype)),
    "sigmoid_l1": lambda out, y: F.l1_loss(torch.sigmoid(out), y.to(out.dtype)),
    "sigmoid_margin": margin_on_score,
}

POSITIVE = {"binary": 1.0, "regression": 4.0}  # label from which a pair counts as positive


def ranking_on_positives(u, v, labels, kind, temperature: float = 0.05):
    """Multiple-negatives ranking over the batch's positive pairs only (Broadhurst et al.);
    temperature 0.05 is sentence-transformers' scale of 20."""
    keep = labels >= POSITIVE[kind]  # (B,) duplicates, or STS scores >= 4
    if not keep.any():
        return (u.sum() + v.sum()) * 0.0  # no positive pair in this batch: nothing to rank
    return simcse.multiple_negatives_ranking_loss(u[keep], v[keep], temperature)


# Losses of the two sentence embeddings u, v (B, H) of siamese pairs, labels (B,), task kind.
COSINE_TARGET = {"binary": lambda y: y, "regression": lambda y: y / 2.5 - 1}  # 0/1; 0-5 to [-1, 1]
PAIR_LOSSES = {
    "cosine_mse": lambda u, v, y, kind: F.mse_loss(
        F.cosine_similarity(u, v, dim=-1), COSINE_TARGET[kind](y.to(u.dtype))
    ),
    "contrastive": lambda u, v, y, kind: simcse.contrastive_margin_loss(u, v, y, margin=0.5),
    "mnrl": ranking_on_positives,
    # Auslin et al.'s siamese network: their formula on its output d = ||u - v||
    "distance_margin": lambda u, v, y, kind: report_margin(simcse.euclidean_distance(u, v), y),
}
IN_BATCH_LOSSES = {"mnrl"}  # task losses whose negatives are the batch's other examples


@dataclass
class StepContext:
    """What a training step carries besides its batches."""

    rt: Runtime
    optim: OptimConfig = field(default_factory=OptimConfig)  # the update's tools and weights
    teacher: EMATeacher | None = None  # SMART's momentum teacher of the current stage
    reference: torch.nn.Module | None = None  # the untouched model: L2-SP and distillation
    gather: bool = False  # in-batch objectives see every process's rows (train_step decides)

    def in_batch(self, *tensors: torch.Tensor) -> tuple[list[torch.Tensor], float]:
        """The rows an in-batch objective compares, and its loss's weight: this process's
        own, or under torchrun the whole batch's (runtime.gather_rows)."""
        return gather_rows(list(tensors), self.rt) if self.gather else (list(tensors), 1.0)


def smart_term(model, task, smart: SmartConfig, batch, embeds, out, ctx: StepContext, masks):
    """SMART's lambda_s * R_s + mu * D_Breg for this batch, the same code for every task.

    masks: (before the embedding, after it) SameDropout states, so that the perturbed and
    the teacher's passes draw the clean pass's dropout masks; None: masks of their own.
    A perturbation below autocast's resolution (bf16 ~8e-3, fp16 ~1e-3; the paper's is 1e-5)
    would be rounded away: then the clean, perturbed and teacher passes all run in float32,
    so each divergence compares passes of one precision (0 for a teacher equal to the model).
    """
    rt = ctx.rt
    exact = below_resolution(min(smart.sigma, smart.epsilon), rt.amp_dtype)
    same_embed, same = masks or (None, None)

    def replayed(state):
        return state.replay() if state else nullcontext()

    def precision():
        return torch.autocast(rt.device.type, enabled=False) if exact else nullcontext()

    def from_embeddings(e):  # (N, T, H) embedding output -> the task's output
        with replayed(same), precision():
            return model(task, batch, e.float() if exact else e).float()

    clean = from_embeddings(embeds) if exact else out.float()
    teacher_out = None
    if ctx.teacher:
        with replayed(same_embed), precision():
            teacher_out = ctx.teacher.forward(model, task, batch).float()
    mask = model.flat_inputs(batch)[1]  # (N, T): padding gets no noise
    return smart_loss(from_embeddings, embeds, clean, TASKS[task].kind, teacher_out, smart, mask)


def distillation(z, batch, masks: SameDropout, training: bool, ctx: StepContext):
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


def batch_loss(model, task, batch, stage, ctx: StepContext) -> torch.Tensor:
    """The training loss of one batch of `task` in `stage` (a config.Stage): the task's
    loss, plus SMART's terms when on, plus --distill times the distillation gap when the
    stage trains the encoder."""
    name = stage.losses.get(task) or TASKS[task].losses[0]
    smart = stage.smart
    shared = smart.active and smart.dropout == "shared"
    distill = 0.0 if stage.freeze_encoder else ctx.optim.distill
    same_embed = SameDropout(ctx.rt.device) if shared or distill > 0 else None
    with ctx.rt.autocast():
        if name in PAIR_LOSSES:  # a loss of the two sentence embeddings, no head
            z = model.sentences(batch)  # (2B, H)
            u, v = z.float().view(2, -1, z.size(-1)).unbind(0)  # (B, H) each
            labels, weight = batch["labels"], 1.0
            if name in IN_BATCH_LOSSES:  # the other examples are the negatives
                (u, v, labels), weight = ctx.in_batch(u, v, labels)
            loss = weight * PAIR_LOSSES[name](u, v, labels, TASKS[task].kind)
        else:
            embeds = model.embed(batch)  # (N, T, H), kept so SMART can perturb it
            masks = (same_embed, SameDropout(ctx.rt.device)) if shared else None
            z = model.sentences(batch, embeds)  # (N, H)
            out = model.readout(task, batch, z)
            loss = OUTPUT_LOSSES[name](out.float(), batch["labels"])
            if smart.active:
                loss = loss + smart_term(model, task, smart, batch, embeds, out, ctx, masks)
        if distill > 0:
            loss = loss + distill * distillation(z, batch, same_embed, model.training, ctx)
    return loss


def contrastive_loss(model, cfg, batch, ctx: StepContext) -> torch.Tensor:
    """A contrastive stage's loss on a (K, B, T) batch of sentence tuples (no heads);
    cfg: the stage's SimCSE settings (objective and temperature)."""
    if batch["input_ids"].size(0) == 1:  # the same sentences twice: dropout is the only noise
        batch = {k: v.repeat(2, 1, 1) if k != "ids" else v for k, v in batch.items()}  # (2, B, T)
    K = batch["input_ids"].size(0)
    with ctx.rt.autocast():
        z = model.sentences(batch).float()  # (K * B, H)
    (z,), weight = ctx.in_batch(z.view(K, -1, z.size(-1)).transpose(0, 1))  # (B, K, H)
    return weight * simcse.OBJECTIVES[cfg.simcse_loss][1](z.transpose(0, 1), cfg.temperature)


def simcse_term(model, batch, temperature: float, ctx: StepContext) -> torch.Tensor:
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


def task_loss(model, stage, task, batch, ctx: StepContext) -> torch.Tensor:
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
