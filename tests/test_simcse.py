"""Contrastive losses against naive per-example loops, their limits, and SNLI triplets."""

import math
from collections import namedtuple

import pytest
import torch
import torch.nn.functional as F

import simcse
from helpers import two_sets
from simcse import (
    alignment,
    build_triplets,
    contrastive_margin_loss,
    multiple_negatives_ranking_loss,
    similarity_distillation,
    sup_simcse_loss,
    triplet_simcse_loss,
    uniformity,
    unsup_simcse_loss,
)

TOL = 1e-6
Pair = namedtuple("Pair", "premise hypothesis label")


def cos(u: list[float], v: list[float]) -> float:
    dot = sum(a * b for a, b in zip(u, v, strict=True))
    return dot / (math.sqrt(sum(a * a for a in u)) * math.sqrt(sum(b * b for b in v)))


def unit(u: list[float]) -> list[float]:
    n = math.sqrt(sum(a * a for a in u))
    return [a / n for a in u]


def ref_in_batch(anchors, candidates, t: float) -> float:
    """Mean over i of -log softmax_j(cos(a_i, c_j) / t) at j = i, one anchor at a time."""
    total = 0.0
    for i, a in enumerate(anchors):
        logits = [cos(a, c) / t for c in candidates]
        total += -(logits[i] - math.log(sum(math.exp(x) for x in logits)))
    return total / len(anchors)


def ref_triplet(anchors, positives, negatives, t: float) -> float:
    total = 0.0
    for a, p, n in zip(anchors, positives, negatives, strict=True):
        e_pos, e_neg = math.exp(cos(a, p) / t), math.exp(cos(a, n) / t)
        total += -math.log(e_pos / (e_pos + e_neg))
    return total / len(anchors)


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("t", [0.05, 0.5])
def test_losses_match_loops(t):
    a, p, n = rand(6, 10, seed=0), rand(6, 10, seed=1), rand(6, 10, seed=2)
    A, P, N = a.tolist(), p.tolist(), n.tolist()
    assert abs(multiple_negatives_ranking_loss(a, p, t).item() - ref_in_batch(A, P, t)) < TOL
    assert abs(unsup_simcse_loss(a, p, t).item() - ref_in_batch(A, P, t)) < TOL
    assert abs(sup_simcse_loss(a, p, n, t).item() - ref_in_batch(A, P + N, t)) < TOL
    assert abs(triplet_simcse_loss(a, p, n, t).item() - ref_triplet(A, P, N, t)) < TOL
    # float32, as in training, against the same float64 loops
    ref = ref_in_batch(A, P + N, t)
    assert abs(sup_simcse_loss(a.float(), p.float(), n.float(), t).item() - ref) < 1e-5


def test_in_batch_hard_negatives_are_not_the_triplet_loss():
    # anchor 0's own negative is far from it, but row 1's negative is anchor 0 itself:
    # the in-batch loss sees it, the triplet loss does not.
    anchors = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    positives = torch.tensor([[1.0, 0.2], [0.2, 1.0]])
    negatives = torch.tensor([[-1.0, 0.0], [1.0, 0.0]])
    sup = sup_simcse_loss(anchors, positives, negatives, 0.05).item()
    trip = triplet_simcse_loss(anchors, positives, negatives, 0.05).item()
    A, P, N = anchors.tolist(), positives.tolist(), negatives.tolist()
    assert abs(sup - ref_in_batch(A, P + N, 0.05)) < TOL
    assert abs(trip - ref_triplet(A, P, N, 0.05)) < TOL
    assert sup > trip + 0.1


def test_loss_vanishes_for_aligned_pairs_as_temperature_falls():
    e = torch.eye(4, 8, dtype=torch.float64)  # four orthonormal anchors; float64: exp(-20) > 0
    pos, neg = e.clone(), -e  # each positive equals its anchor, each negative is opposite
    for loss in (
        lambda t: multiple_negatives_ranking_loss(e, pos, t),
        lambda t: sup_simcse_loss(e, pos, neg, t),
        lambda t: triplet_simcse_loss(e, pos, neg, t),
    ):
        values = [loss(t).item() for t in (1.0, 0.1, 0.01)]
        assert values[0] > values[1] > values[2] >= 0
        assert values[2] < 1e-6  # exp(-1 / 0.01) terms are all that is left


def test_gradients_finite_for_identical_embeddings():
    row = torch.randn(1, 16)
    for make in (lambda: row.repeat(5, 1), lambda: torch.zeros(5, 16)):
        a, p, n = (make().requires_grad_(True) for _ in range(3))
        total = (
            multiple_negatives_ranking_loss(a, p)
            + sup_simcse_loss(a, p, n)
            + triplet_simcse_loss(a, p, n)
            + alignment(a, p)
            + uniformity(a)
        )
        total.backward()
        for x in (a, p, n):
            assert torch.isfinite(x.grad).all()
    # all rows equal: every candidate ties, so the in-batch loss is log(number of candidates)
    same = row.repeat(5, 1)
    assert abs(sup_simcse_loss(same, same, same).item() - math.log(10)) < 1e-5


def test_alignment_and_uniformity_match_loops():
    x, y = rand(7, 5, seed=3), rand(7, 5, seed=4)
    X, Y = [unit(r) for r in x.tolist()], [unit(r) for r in y.tolist()]
    for alpha in (2.0, 1.0):
        ref = sum(
            math.sqrt(sum((a - b) ** 2 for a, b in zip(u, v, strict=True))) ** alpha
            for u, v in zip(X, Y, strict=True)
        ) / len(X)
        assert abs(alignment(x, y, alpha).item() - ref) < TOL
    for t in (2.0, 0.5):
        pairs = [(i, j) for i in range(len(X)) for j in range(i + 1, len(X))]
        sq = [sum((a - b) ** 2 for a, b in zip(X[i], X[j], strict=True)) for i, j in pairs]
        ref = math.log(sum(math.exp(-t * d) for d in sq) / len(pairs))
        assert abs(uniformity(x, t).item() - ref) < TOL
    assert alignment(x, x * 3).item() < TOL  # scale does not matter: rows are normalised


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match=r"one shape \(B, H\)"):
        sup_simcse_loss(torch.zeros(3, 4), torch.zeros(3, 4), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="B >= 2"):
        uniformity(torch.zeros(1, 4))


def test_build_triplets():
    pairs = [
        Pair("p1", "e1", 0),
        Pair("p1", "n1", 1),
        Pair("p1", "c1", 2),
        Pair("p2", "n2", 1),  # neutral and contradiction only: no positive, no triplet
        Pair("p2", "c2", 2),
        Pair("p3", "e3a", 0),
        Pair("p3", "c3a", 2),
        Pair("p3", "e3b", 0),
        Pair("p3", "c3b", 2),
        Pair("p3", "c3c", 2),
        Pair("p1", "e1b", "0"),  # a label read from a CSV as text is accepted
    ]
    everything = build_triplets(pairs, max_per_premise=None)
    assert len(everything) == 2 * 1 + 2 * 3  # p1: 2 x 1 combinations, p3: 2 x 3
    assert {(a, p, n) for a, p, n in everything if a == "p3"} == {
        ("p3", e, c) for e in ("e3a", "e3b") for c in ("c3a", "c3b", "c3c")
    }
    assert all(not p.startswith("n") and not n.startswith("n") for _, p, n in everything)

    capped = build_triplets(pairs, max_per_premise=1, seed=0)
    assert [a for a, _, _ in capped] == ["p1", "p3"]  # one per premise, in order of appearance
    assert set(capped) <= set(everything)
    assert build_triplets(pairs, max_per_premise=1, seed=0) == capped  # deterministic
    assert len(build_triplets(pairs, max_per_premise=4)) == 2 + 4
    # the choice for p3 does not depend on the other premises
    only_p3 = [x for x in pairs if x.premise == "p3"]
    for seed in range(5):
        assert build_triplets(only_p3, 1, seed) == [
            t for t in build_triplets(pairs, 1, seed) if t[0] == "p3"
        ]
    # and different seeds pick different combinations (6 choose 2 = 15 possibilities)
    assert len({tuple(build_triplets(only_p3, 2, s)) for s in range(20)}) > 1

    with pytest.raises(ValueError, match="not an SNLI label"):
        build_triplets([Pair("p", "h", "-")])
    with pytest.raises(ValueError, match="max_per_premise"):
        build_triplets(pairs, max_per_premise=0)


def test_contrastive_margin_loss_matches_loop():
    torch.manual_seed(0)
    u, v = torch.randn(6, 5), torch.randn(6, 5)
    v[0] = u[0] * 2  # a similar pair at distance 0
    labels = torch.tensor([1, 0, 1, 0, 1, 0])
    total = 0.0
    for i in range(6):
        cos = float(u[i] @ v[i] / (u[i].norm() * v[i].norm()))
        d = 1 - cos
        total += 0.5 * (d * d if labels[i] == 1 else max(0.0, 0.5 - d) ** 2)
    assert abs(contrastive_margin_loss(u, v, labels).item() - total / 6) < 1e-6
    # dissimilar pairs farther apart than the margin cost nothing
    far = contrastive_margin_loss(u[:1], -u[:1], torch.tensor([0]))
    assert far.item() == 0.0


# ---------------------------------------------------------------- the loss tables


def test_similarity_distillation_matches_loop_and_allows_rotations():
    torch.manual_seed(0)
    z, ref = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    Z, R = z.tolist(), ref.tolist()
    gaps = [(cos(Z[i], Z[j]) - cos(R[i], R[j])) ** 2 for i in range(5) for j in range(5) if i != j]
    assert similarity_distillation(z, ref).item() == pytest.approx(sum(gaps) / len(gaps), abs=TOL)
    # a rotation and a scale of the reference keep every cosine: nothing to distil
    q, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64))
    assert similarity_distillation(3 * ref @ q, ref).item() == pytest.approx(0.0, abs=1e-12)
    assert similarity_distillation(z[:1], ref[:1]).item() == 0.0  # one sentence, no pair
    z.requires_grad_(), ref.requires_grad_()
    similarity_distillation(z, ref).backward()
    assert z.grad.abs().sum() > 0 and ref.grad is None  # the reference is a fixed target
    with pytest.raises(ValueError, match="one shape"):
        similarity_distillation(z, ref[:4])


def test_dropout_views_objectives_are_alignment_plus_uniformity():
    z1, z2 = two_sets(2, B=6)
    n1, n2 = F.normalize(z1, dim=-1), F.normalize(z2, dim=-1)
    align = sum(((a - b) ** 2).sum().item() for a, b in zip(n1, n2, strict=True)) / 6

    def unif(n):
        terms = [
            math.exp(-2 * ((n[i] - n[j]) ** 2).sum().item())
            for i in range(6)
            for j in range(i + 1, 6)
        ]
        return math.log(sum(terms) / len(terms))

    expected = align + (unif(n1) + unif(n2)) / 2
    k, objective = simcse.OBJECTIVES["dropout_align_uniform"]
    assert k == 1  # one sentence per example: two dropout views
    assert objective(torch.stack([z1, z2]), 0.05).item() == pytest.approx(expected, rel=1e-5)
    k, canon = simcse.OBJECTIVES["dropout_align_uniform_simcse"]
    term = simcse.unsup_simcse_loss(z1, z2, 0.05).item()
    assert canon(torch.stack([z1, z2]), 0.05).item() == pytest.approx(expected + term, rel=1e-5)


def test_a_batch_of_one_has_alignment_only():
    z1, z2 = two_sets(4, B=1)
    _, objective = simcse.OBJECTIVES["dropout_align_uniform"]
    loss = objective(torch.stack([z1, z2]), 0.05)
    assert loss.item() == pytest.approx(simcse.alignment(z1, z2).item())
