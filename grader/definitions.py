"""The public definitions: what the handout's words and the exercises' hints say, written
out plainly, as checks that need no answer (a masked mean, a pair batch, the STS score,
the step's loss by its definition). A student's copy holds this file, so a wrong body
fails on the student's side too; references.py, the TA's, keeps what would give an answer
away (attention, AdamW, SMART, SimCSE, PCGrad, ...).
"""

import torch


def mean_pool(hidden, mask):
    """Each sentence's average over the tokens its mask keeps."""
    return torch.stack([hidden[b][mask[b].bool()].mean(0) for b in range(len(hidden))])


def sentiment_logits(sentences, head):
    """The handout's sentiment classifier's logits (eval: dropout is the identity)."""
    return torch.stack([head.weight @ z + head.bias for z in sentences])


def pair_batch(ids1, mask1, ids2, mask2):
    """The two sentences of each pair as one (2, B, T) batch, the shorter side padded."""
    T = max(ids1.size(1), ids2.size(1))

    def pad(x):
        return torch.cat([x, x.new_zeros(x.size(0), T - x.size(1))], 1)

    ids, mask = torch.stack([pad(ids1), pad(ids2)]), torch.stack([pad(mask1), pad(mask2)])
    types = torch.zeros_like(ids)  # one segment per side
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


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
# outside the square root (the second: |g| near sqrt(eps)), correct_bias (the third).
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
        "groups": [([0.0, 1.0, 0.0], [0.5, -0.3, 0.2], 1e-2, 0.0)],
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
