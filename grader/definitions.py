"""The public definitions: what the handout's words and the exercises' hints say, written
out plainly, as checks that need no answer (a masked mean, the STS score,
the step's loss by its definition). A student's copy holds this file, so a wrong body
fails on the student's side too; references.py, the TA's, keeps what would give an answer
away (attention, AdamW, SMART, SimCSE, PCGrad, ...).
"""

import math

import torch


def mean_pool(hidden, mask):
    """Each sentence's average over the tokens its mask keeps."""
    return torch.stack([hidden[b][mask[b].bool()].mean(0) for b in range(len(hidden))])


def sentiment_logits(sentences, head):
    """The handout's sentiment classifier's logits (eval: dropout is the identity)."""
    return torch.stack([head.weight @ z + head.bias for z in sentences])


def sts_score(u, v):
    """The cosine of each pair stretched from [-1, 1] onto STS's 0-5 scale."""
    cos = (u * v).sum(-1) / (u.norm(dim=-1) * v.norm(dim=-1))
    return 5 * (cos + 1) / 2


def pair_logit(u, v, head):
    """The paraphrase logit: the head on [u, v, |u - v|] and on [v, u, |u - v|], averaged."""
    w, b = head.weight[0], head.bias[0]
    out = [
        (w @ torch.cat([x, y, (x - y).abs()]) + w @ torch.cat([y, x, (x - y).abs()])) / 2 + b
        for x, y in zip(u, v, strict=True)
    ]
    return torch.stack(out)


def multitask_loss(model, step_batches, weights, loss_of):
    """One multitask step's loss: sum over tasks of its weight times its batch's loss."""
    return sum(
        w * loss_of(task, batch) for (task, batch), w in zip(step_batches, weights, strict=True)
    )


# AdamW's first step, where its definition is short: m_hat = g and v_hat = g^2 with the
# bias corrections, (1 - beta1) g and (1 - beta2) g^2 without. Each case: its groups
# (parameter, gradient, lr, weight decay) and the optimizer's eps and correct_bias. The
# cases tell apart what a convention cannot: a group's own lr and decay (the first), eps
# outside the square root (the second: |g| near sqrt(eps)), correct_bias, with its decay
# (the third).
FIRST_STEPS = [
    {
        "groups": [
            ([10.0, -10.0, 3.0], [0.5, -0.3, 0.2], 1e-2, 0.1),
            ([10.0, -10.0, 3.0], [0.5, -0.3, 0.2], 3e-3, 0.5),
        ],
        "eps": 1e-6,
        "correct_bias": True,
    },
    {
        "groups": [([0.0, 0.0, 0.0], [1e-4, -1e-4, 2e-4], 1e-2, 0.0)],
        "eps": 1e-8,
        "correct_bias": True,
    },
    {
        "groups": [([10.0, -10.0, 3.0], [0.5, -0.3, 0.2], 1e-2, 0.2)],
        "eps": 1e-6,
        "correct_bias": False,
    },
]
BETAS = (0.9, 0.999)
FIRST_STEP_TOL = 2e-4  # the conventions' spread (decay before or after, eps by sqrt(1 - b2))


def adamw_first_step(case: dict) -> torch.Tensor:
    """Every parameter of `case` after AdamW's first step, flat, in float64."""
    b1, b2 = BETAS
    out = []
    for p, g, lr, wd in case["groups"]:
        p, g = torch.tensor(p, dtype=torch.float64), torch.tensor(g, dtype=torch.float64)
        m, v = (g, g * g) if case["correct_bias"] else ((1 - b1) * g, (1 - b2) * g * g)
        out.append(p - lr * wd * p - lr * m / (v.sqrt() + case["eps"]))
    return torch.cat(out)


# A tensor whose first gradient comes at its group's second step: (its value, its gradient,
# lr); its update is a first step's, whatever the group's other tensors did before.
LATE = ([0.5, -1.0, 2.0], [0.2, -0.4, 0.1], 1e-2)


def late_first_step() -> torch.Tensor:
    return adamw_first_step({"groups": [(*LATE, 0.0)], "eps": 1e-6, "correct_bias": True})


def two_sentence_distillation(z, ref) -> torch.Tensor:
    """Two sentences: one pair, both ways, so the mean is the squared change of their one
    cosine, (cos(z0, z1) - cos(ref0, ref1))^2."""
    cos = torch.nn.functional.cosine_similarity
    return (cos(z[0], z[1], dim=0) - cos(ref[0], ref[1], dim=0)) ** 2


def orthogonal_simcse(B: int, K: int, t: float) -> float:
    """SimCSE's loss where each anchor's own positive has cosine 1 and every other candidate
    (the other positives, the K - 2 hard negatives each) cosine 0: each anchor's
    cross-entropy is log(1 + (n - 1) exp(-1 / t)), n = (K - 1) B candidates."""
    n = (K - 1) * B
    return math.log(1 + (n - 1) * math.exp(-1 / t))


# Two tasks' gradients and PCGrad's sum, by hand: conflicting (each projected off the
# other's original gradient) and agreeing (left as they are).
PCGRAD_BY_HAND = [
    ([[1.0, 0.0], [-1.0, 1.0]], [0.5, 1.5]),  # g1 - (-1/2) g2 = [.5, .5]; g2 - (-1) g1 = [0, 1]
    ([[1.0, 0.0], [1.0, 1.0]], [2.0, 1.0]),
]
