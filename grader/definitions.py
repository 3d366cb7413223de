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


# The symmetric KL worked by hand: (kind, p, q, its value). Class logits log P and log Q
# for P = (1/2, 1/4, 1/4), Q = (1/4, 1/4, 1/2): KL(P||Q) = KL(Q||P) = 1/2 ln 2 - 1/4 ln 2,
# their sum 1/2 ln 2; a second row where P = Q adds 0: the batch mean is 1/4 ln 2. Binary
# logits 0 and ln 3 (P = (1/2, 1/2), Q = (1/4, 3/4)): 1/4 ln 2 + 1/4 ln (3/2) = 1/4 ln 3;
# a second pair of equal logits: the mean is 1/8 ln 3.
KL_BY_HAND = [
    (
        "classification",
        [[math.log(0.5), math.log(0.25), math.log(0.25)], [0.0, 0.0, 0.0]],
        [[math.log(0.25), math.log(0.25), math.log(0.5)], [0.0, 0.0, 0.0]],
        math.log(2) / 4,
    ),
    ("binary", [0.0, math.log(3)], [math.log(3), math.log(3)], math.log(3) / 8),
]

# SMART's ascent worked by hand on a regression output: embeddings 0 (B = 2, T = 2, H = 2),
# a head f(e) = sum_t c_t (e_t . v), c = (1, 2), v = (1, 1/2), clean outputs -1 and -2, no
# first noise (sigma 0), eta 0.1, two steps. The paper's: each step moves the noise by eta
# times the gradient 2 (f - y) c_t v over its largest element in the example, so token 1
# ends at (.1, .05) and token 2 at (.2, .1), held in the ball (epsilon .15) at (.15, .1):
# f rises by .125 + 2 * .2 = .525, and R_s is the mean of 1.525^2 and 2.525^2. The reference
# code's: each token's noise is s / (max |s| + 1e-6) after each step, (1, 1/2) to 1e-6, so
# its perturbed output is (1 + 2) * 1.25 in both examples.
ASCENT_BY_HAND = {
    "c": [1.0, 2.0],
    "v": [1.0, 0.5],
    "clean": [-1.0, -2.0],
    "cfg": {"sigma": 0.0, "eta": 0.1, "epsilon": 0.15, "steps": 2},
    "R_s": (1.525**2 + 2.525**2) / 2,
    "perturbed": [3.75, 3.75],
}
