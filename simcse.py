"""Contrastive sentence-embedding objectives and their diagnostics, as functions of embeddings.

- Multiple-negatives ranking (Henderson et al., 2017, "Efficient Natural Language Response
  Suggestion for Smart Reply"): each anchor must pick its own positive among all the batch's.
- SimCSE (Gao et al., 2021, "SimCSE: Simple Contrastive Learning of Sentence Embeddings"):
  unsupervised = the same with one batch encoded twice, dropout being the only noise;
  supervised = NLI entailments as positives plus contradictions as in-batch hard negatives.
- The thesis's triplet form: each anchor against its own positive and its own negative only.
- Alignment and uniformity (Wang & Isola, 2020, "Understanding Contrastive Representation
  Learning through Alignment and Uniformity on the Hypersphere").
- `build_triplets`: (premise, entailment, contradiction) triplets from SNLI pairs.

OBJECTIVES, at the end, names the losses of K sentence embeddings per example that a
contrastive stage can pick; the task losses (of a head's output or of siamese pairs) are
in losses.py.

As in sentence-transformers' losses, the math is `scores = sim(a, b) / temperature;
cross_entropy(scores, target)`, kept apart from encoding the sentences.
"""

import itertools
import math
import random
from collections.abc import Iterable
from typing import Protocol

import torch
import torch.nn.functional as F

ENTAILMENT, NEUTRAL, CONTRADICTION = 0, 1, 2  # SNLI labels, Hugging Face convention


def cos_sim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """All pairwise cosine similarities: a (N, H), b (M, H) -> (N, M)."""
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T  # (N, H) @ (H, M)


def _check_pairs(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(s != first for s in shapes.values()):
        raise ValueError(f"expected embeddings of one shape (B, H), got {shapes}")


def in_batch_negatives_loss(
    anchors: torch.Tensor, candidates: torch.Tensor, temperature: float = 0.05
) -> torch.Tensor:
    """Cross-entropy over in-batch candidates; the right answer for anchor i is candidate i.

    anchors: (B, H); candidates: (N, H) with N >= B, rows 0..B-1 the positives and any
    further rows extra negatives shared by every anchor. Returns the batch mean.
    """
    if anchors.dim() != 2 or candidates.dim() != 2 or candidates.size(0) < anchors.size(0):
        raise ValueError(
            f"need anchors (B, H) and candidates (N >= B, H), got {tuple(anchors.shape)} "
            f"and {tuple(candidates.shape)}"
        )
    # BEGIN EXERCISE simcse: cross-entropy over cos(anchor i, every candidate) / temperature; the answer is candidate i
    scores = cos_sim(anchors, candidates) / temperature  # (B, N)
    target = torch.arange(anchors.size(0), device=anchors.device)  # (B,): the diagonal
    return F.cross_entropy(scores, target)
    # END EXERCISE simcse


def multiple_negatives_ranking_loss(
    anchors: torch.Tensor, positives: torch.Tensor, temperature: float = 0.05
) -> torch.Tensor:
    """Henderson et al. 2017: anchors (B, H) vs all positives (B, H); logits (B, B)."""
    _check_pairs(anchors=anchors, positives=positives)
    return in_batch_negatives_loss(anchors, positives, temperature)


def unsup_simcse_loss(
    z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.05
) -> torch.Tensor:
    """Unsupervised SimCSE: z1, z2 (B, H) are one batch encoded twice (different dropout)."""
    return multiple_negatives_ranking_loss(z1, z2, temperature)


def sup_simcse_loss(
    anchors: torch.Tensor,
    positives: torch.Tensor,
    negatives: torch.Tensor,
    temperature: float = 0.05,
) -> torch.Tensor:
    """Supervised SimCSE (Gao et al. 2021, Eq. 5): anchors (B, H) vs every positive and every
    hard negative of the batch, logits (B, 2B) = cos(anchor_i, [pos; neg]_j) / temperature."""
    _check_pairs(anchors=anchors, positives=positives, negatives=negatives)
    # BEGIN EXERCISE simcse: every positive and every hard negative of the batch are the anchors' candidates
    return in_batch_negatives_loss(anchors, torch.cat([positives, negatives]), temperature)
    # END EXERCISE simcse


def triplet_simcse_loss(
    anchors: torch.Tensor,
    positives: torch.Tensor,
    negatives: torch.Tensor,
    temperature: float = 0.05,
) -> torch.Tensor:
    """The thesis's form: anchor i against its own positive and its own negative only,
    -log(exp(s+/t) / (exp(s+/t) + exp(s-/t))). All inputs (B, H); batch mean.

    Unlike `sup_simcse_loss`, other rows' sentences are not negatives here.
    """
    _check_pairs(anchors=anchors, positives=positives, negatives=negatives)
    s_pos = F.cosine_similarity(anchors, positives, dim=-1)  # (B,)
    s_neg = F.cosine_similarity(anchors, negatives, dim=-1)  # (B,)
    scores = torch.stack([s_pos, s_neg], dim=1) / temperature  # (B, 2): the positive is class 0
    return F.cross_entropy(scores, scores.new_zeros(scores.size(0), dtype=torch.long))


def contrastive_margin_loss(
    u: torch.Tensor, v: torch.Tensor, labels: torch.Tensor, margin: float = 0.5
) -> torch.Tensor:
    """Contrastive loss of pairs (Hadsell et al., 2006; sentence-transformers' ContrastiveLoss):
    with the cosine distance d = 1 - cos(u, v), similar pairs (label 1) pay d^2 and
    dissimilar ones (label 0) pay max(0, margin - d)^2; halved, batch mean.

    u, v: (B, H); labels: (B,) 0/1.
    """
    _check_pairs(u=u, v=v)
    d = 1 - F.cosine_similarity(u, v, dim=-1)  # (B,)
    y = labels.to(d.dtype)
    return 0.5 * (y * d.pow(2) + (1 - y) * F.relu(margin - d).pow(2)).mean()


DISTANCES = ("cosine", "euclidean")  # how a siamese pair task compares its two embeddings


def euclidean_distance(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(B,) ||u - v|| of each pair of rows; eps inside the root keeps the gradient finite
    when u = v."""
    return ((u - v).pow(2).sum(-1) + 1e-12).sqrt()


def alignment(x: torch.Tensor, y: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
    """Wang & Isola 2020: E ||x_i - y_i||^alpha over positive pairs, on L2-normalised rows.

    x, y: (B, H) -> scalar; 0 when each pair points the same way, at most 2^alpha.
    """
    _check_pairs(x=x, y=y)
    d2 = (F.normalize(x, dim=-1) - F.normalize(y, dim=-1)).pow(2).sum(-1)  # (B,)
    # through the squared distance: the gradient of a norm is undefined at 0
    return d2.pow(alpha / 2).mean()


def uniformity(x: torch.Tensor, t: float = 2.0) -> torch.Tensor:
    """Wang & Isola 2020: log E exp(-t ||x_i - x_j||^2) over pairs i < j, L2-normalised rows.

    x: (B, H) with B >= 2 -> scalar in [-4t, 0]; lower means more spread over the sphere.
    """
    if x.dim() != 2 or x.size(0) < 2:
        raise ValueError(f"uniformity needs (B >= 2, H) embeddings, got {tuple(x.shape)}")
    i, j = torch.triu_indices(x.size(0), x.size(0), offset=1, device=x.device)  # pairs i < j
    d2 = 2 - 2 * cos_sim(x, x)[i, j]  # (B(B-1)/2,): |a - b|^2 = 2 - 2 cos for unit vectors
    return torch.logsumexp(-t * d2, dim=0) - math.log(d2.numel())  # log of the mean, stably


def similarity_distillation(z: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Mean squared difference between the cosines of every two rows of z and those of the
    same rows under a reference encoder: relational knowledge distillation (Park et al.,
    2019) with the cosine as the relation. Embeddings may move, rotate or scale as long as
    the batch's similarities stay what the reference made them.

    z, reference: (N, H) -> scalar over the N(N-1) pairs i != j; a batch of one has none: 0.
    """
    _check_pairs(z=z, reference=reference)
    N = z.size(0)
    if N < 2:
        return z.sum() * 0.0
    # BEGIN EXERCISE distillation: mean over pairs i != j of (cos(z_i, z_j) - cos(ref_i, ref_j))^2, the reference constant
    off = 1 - torch.eye(N, dtype=z.dtype, device=z.device)  # (N, N): 1 for the pairs i != j
    gap = cos_sim(z, z) - cos_sim(reference, reference).detach()  # (N, N)
    return (gap * off).pow(2).sum() / (N * (N - 1))
    # END EXERCISE distillation


def align_uniform(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Alignment of positive pairs plus the mean uniformity of both sides (Wang & Isola);
    a batch of one (a data set's last) has no pairs to spread: alignment alone."""
    if x.size(0) < 2:
        return alignment(x, y)
    return alignment(x, y) + (uniformity(x) + uniformity(y)) / 2


# ---------------------------------------------------------------------------------------
# The objectives a contrastive stage may name

# Contrastive stages: objective -> (sentences per example K, loss of z (K', B, H) at
# temperature t). K = 1: the batch is encoded twice, dropout making the two views (K' = 2).
OBJECTIVES = {
    "sup": (3, lambda z, t: sup_simcse_loss(z[0], z[1], z[2], t)),
    "triplet": (3, lambda z, t: triplet_simcse_loss(z[0], z[1], z[2], t)),
    "unsup": (1, lambda z, t: unsup_simcse_loss(z[0], z[1], t)),
    "mnrl": (2, lambda z, t: multiple_negatives_ranking_loss(z[0], z[1], t)),
    "align_uniform": (2, lambda z, t: align_uniform(z[0], z[1])),
    # Sicurello's BERT_unif and BERT_simCSEcanon: one sentence, two dropout views
    "dropout_align_uniform": (1, lambda z, t: align_uniform(z[0], z[1])),
    "dropout_align_uniform_simcse": (
        1,
        lambda z, t: align_uniform(z[0], z[1]) + unsup_simcse_loss(z[0], z[1], t),
    ),
}


class NLIPair(Protocol):
    premise: str
    hypothesis: str
    label: int


def build_triplets(
    examples: Iterable[NLIPair], max_per_premise: int | None = 1, seed: int = 0
) -> list[tuple[str, str, str]]:
    """(anchor, positive, negative) triplets from SNLI pairs (thesis Appendix B.1).

    For each premise, its entailment hypotheses are the positives and its contradiction
    hypotheses the negatives (neutral ones are not used). Every (positive, negative)
    combination is a candidate triplet; a premise keeps at most `max_per_premise` of them
    (None: all), so that premises with many hypotheses do not dominate. The choice uses a
    random generator seeded by (seed, premise): the same input gives the same triplets, and
    a premise's triplets do not depend on the other premises. Premises come out in order of
    first appearance.
    """
    if max_per_premise is not None and max_per_premise < 1:
        raise ValueError(f"max_per_premise must be >= 1 or None, got {max_per_premise}")
    by_premise: dict[str, tuple[list[str], list[str]]] = {}
    for n, ex in enumerate(examples):
        try:
            label = int(ex.label)
        except (TypeError, ValueError):
            label = None
        if label not in (ENTAILMENT, NEUTRAL, CONTRADICTION):
            raise ValueError(
                f"example {n}: label {ex.label!r} is not an SNLI label "
                "(0 entailment, 1 neutral, 2 contradiction)"
            )
        pos, neg = by_premise.setdefault(ex.premise, ([], []))
        if label == ENTAILMENT:
            pos.append(ex.hypothesis)
        elif label == CONTRADICTION:
            neg.append(ex.hypothesis)
    triplets = []
    for premise, (pos, neg) in by_premise.items():
        combos = list(itertools.product(pos, neg))  # empty unless the premise has both
        if max_per_premise is not None and len(combos) > max_per_premise:
            rng = random.Random(f"{seed}:{premise}")
            keep = sorted(rng.sample(range(len(combos)), max_per_premise))
            combos = [combos[k] for k in keep]
        triplets.extend((premise, p, n) for p, n in combos)
    return triplets
