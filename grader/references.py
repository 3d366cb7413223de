"""The TA's references: each exercise's definition written out, slowly and plainly.

Only the TA's grader holds this file: it is the answers. Every function is written from
the paper or the handout's words (loops over the definition where one is short), not from
the project's solution, so the two agreeing means something.
"""

import math

import torch
import torch.nn.functional as F

import mtdnn_smart  # SMART's reference code, transcribed step by step


def attention(q, k, v, keep):
    """(out, probs) of softmax(q . k / sqrt(hs)) over the keys `keep` (B, T) marks, times v:
    a loop over batch, head and query, differentiable."""
    B, nh, T, hs = q.shape
    rows_out, rows_p = [], []
    for b in range(B):
        kept = [j for j in range(T) if keep[b, j]]
        for h in range(nh):
            for i in range(T):
                scores = torch.stack([q[b, h, i] @ k[b, h, j] / math.sqrt(hs) for j in kept])
                weights = torch.exp(scores - scores.max())
                weights = weights / weights.sum()
                rows_p.append(
                    torch.zeros(T, dtype=q.dtype).index_put((torch.tensor(kept),), weights)
                )
                rows_out.append(sum(w * v[b, h, j] for w, j in zip(weights, kept, strict=True)))
    outs = torch.stack(rows_out).view(B, nh, T, hs)  # (B * nh * T, hs) -> (B, nh, T, hs)
    probs = torch.stack(rows_p).view(B, nh, T, T)  # (B * nh * T, T) -> (B, nh, T, T)
    return outs, probs


class HandoutAdamW(torch.optim.Optimizer):
    """AdamW as the CS224n handout asks for it: Kingma & Ba's "efficient version" of the
    bias correction (alpha_t = lr sqrt(1 - beta2^t) / (1 - beta1^t), eps added to sqrt(v)),
    then the weight decay, with the learning rate, after the Adam update. The choices the
    handout's tolerance also takes: decay_first (torch's order), eps_on_v_hat (torch's
    eps), and correct_bias=False (alpha_t = lr)."""

    def __init__(self, params, lr, eps=1e-6, weight_decay=0.0, **how):
        how = {"decay_first": False, "eps_on_v_hat": False, "correct_bias": True} | how
        super().__init__(params, {"lr": lr, "eps": eps, "weight_decay": weight_decay} | how)

    @torch.no_grad()
    def step(self):
        (b1, b2) = (0.9, 0.999)
        for group in self.param_groups:
            lr, eps = group["lr"], group["eps"]
            for p in (p for p in group["params"] if p.grad is not None):
                s = self.state[p]
                if not s:
                    s.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                s["t"] += 1
                s["m"] = b1 * s["m"] + (1 - b1) * p.grad
                s["v"] = b2 * s["v"] + (1 - b2) * p.grad * p.grad
                c1, c2 = (1 - b1 ** s["t"], 1 - b2 ** s["t"]) if group["correct_bias"] else (1, 1)
                if group["eps_on_v_hat"]:
                    eps = group["eps"] * math.sqrt(c2)  # eps + sqrt(v_hat), scaled by sqrt(c2)
                if group["decay_first"]:
                    p -= lr * group["weight_decay"] * p
                p -= lr * math.sqrt(c2) / c1 * s["m"] / (s["v"].sqrt() + eps)
                if not group["decay_first"]:
                    p -= lr * group["weight_decay"] * p


def symmetric_kl(p, q, kind: str):
    """KL(P||Q) + KL(Q||P), class by class, batch mean; the squared error for regression."""
    if kind == "regression":
        return sum((a - b) ** 2 for a, b in zip(p, q, strict=True)) / len(p)
    P, Q = distributions(p, q, kind)
    rows = [
        sum(a * (a / b).log() + b * (b / a).log() for a, b in zip(x, y, strict=True))
        for x, y in zip(P, Q, strict=True)
    ]
    return sum(rows) / len(rows)


def distributions(p, q, kind: str):
    """(P, Q): the softmax of class logits, or [1 - sigmoid, sigmoid] of binary logits."""
    if kind == "binary":
        return (torch.stack([1 - x.sigmoid(), x.sigmoid()], -1) for x in (p, q))
    return p.softmax(-1), q.softmax(-1)


def reference_kl(p, q, kind: str):
    """mt-dnn's SymKlCriterion: KL(Q||P) with Q constant + KL(P||Q) with P constant, batch
    mean (regression: the squared error, both sides learning)."""
    if kind == "regression":
        return ((p - q) ** 2).mean()
    P, Q = distributions(p, q, kind)
    Pc, Qc = P.detach(), Q.detach()
    rows = [
        sum(
            b * (b.log() - a.log()) + c * (c.log() - d.log()) for a, b, c, d in zip(*r, strict=True)
        )
        for r in zip(P, Qc, Pc, Q, strict=True)
    ]
    return sum(rows) / len(rows)


def mtdnn_perturbed(f, embeds, kind: str, sigma: float, eta: float, steps: int):
    """f's output at the noise mt-dnn's SmartPerturbation ends its ascent with
    (mtdnn_smart.py); binary logits x become its heads' pairs (0, x)."""
    last = {}

    def theirs(e):
        last["input"] = e
        out = f(e)
        return torch.stack([torch.zeros_like(out), out], -1) if kind == "binary" else out

    mtdnn_smart.smart_r_s(theirs, embeds, theirs(embeds), kind == "regression", sigma, eta, steps)
    return f(last["input"])


def smart_ascent(f, embeds, mask, cfg, divergence, kind="classification"):
    """SMART's Algorithm 1, lines 4-8 (Jiang et al., 2020): noise ~ sigma * N(0, 1) on the
    kept tokens, `steps` ascent steps normalised by each example's largest |gradient|, each
    projected into the epsilon ball; returns the divergence at the final noise. Where it
    departs from the paper: the first noise is projected too (the paper draws it and
    projects only after a step; at SMART's sigma = 1e-5 inside epsilon = 1e-5 the two
    agree), as smart.adversarial_regularizer does and its hint says."""
    keep, eps = mask[..., None].to(embeds.dtype), cfg.epsilon
    noise = (torch.randn_like(embeds) * cfg.sigma).clamp(-eps, eps) * keep
    clean = f(embeds)
    for _ in range(cfg.steps):
        n = noise.clone().requires_grad_(True)
        d = divergence(f(embeds.detach() + n), clean.detach(), kind)
        (grad,) = torch.autograd.grad(d, n)
        largest = grad.abs().flatten(1).max(1).values[:, None, None]  # (B, 1, 1)
        noise = (noise + cfg.eta * grad / largest).clamp(-eps, eps) * keep
    return divergence(f(embeds + noise), clean, kind)


def ema(teacher: dict, model: dict, beta: float) -> dict:
    """beta * teacher + (1 - beta) * model, tensor by tensor of {name: tensor}."""
    return {n: beta * teacher[n] + (1 - beta) * model[n] for n in teacher}


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def in_batch(anchors, candidates, t: float):
    """Mean over anchors i of -log softmax_j(cos(a_i, c_j) / t) at j = i, differentiable."""
    total = 0.0
    for i, a in enumerate(anchors):
        s = torch.stack([F.cosine_similarity(a, c, dim=0) / t for c in candidates])
        total = total + torch.logsumexp(s, 0) - s[i]
    return total / len(anchors)


def pcgrad(grads: list[list[float]], generator: torch.Generator) -> list[float]:
    """Algorithm 1 of Yu et al. (2020) in plain Python floats, each task visiting the others
    in torch.randperm(T, generator) order; the sum of the projected gradients."""
    num_tasks = len(grads)
    total = [0.0] * len(grads[0])
    for i in range(num_tasks):
        g_i = list(grads[i])
        for j in torch.randperm(num_tasks, generator=generator).tolist():
            if j == i:
                continue
            dot = sum(a * b for a, b in zip(g_i, grads[j], strict=True))
            if dot < 0:
                norm2 = sum(b * b for b in grads[j])
                g_i = [a - dot / norm2 * b for a, b in zip(g_i, grads[j], strict=True)]
        total = [t + a for t, a in zip(total, g_i, strict=True)]
    return total


def distillation(z, ref):
    """Mean over pairs i != j of (cos(z_i, z_j) - cos(ref_i, ref_j))^2, ref a constant."""
    ref = ref.detach()
    n = len(z)
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
    cos = F.cosine_similarity
    return sum((cos(z[i], z[j], dim=0) - cos(ref[i], ref[j], dim=0)) ** 2 for i, j in pairs) / len(
        pairs
    )
