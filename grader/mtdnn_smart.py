"""SMART's smoothness term as its reference code computes it, written out step by step
from namisan/mt-dnn at commit 7133352 (December 2020): SmartPerturbation.forward in
mt_dnn/perturbation.py, with stable_kl, SymKlCriterion and MseCriterion of mt_dnn/loss.py.

A second, independent path to smart.reference_regularizer for the grader (the TA's only),
tests/test_smart.py and docs/scripts/smart_reference.py: class outputs are logits (B, C) as mt-dnn's heads give
them (a binary head's logit x is the pair (0, x)), regression outputs (B,).
"""

import torch
import torch.nn.functional as F

GUARD = 1e-6  # mt-dnn's epsilon of stable_kl and of the ascent's normalization


def stable_kl_sum(logit, target):
    """mt-dnn's stable_kl with reduce=False: 2 sum p (rp - ry), rp and ry held constant."""
    p = F.log_softmax(logit.float(), 1).exp()
    y = F.log_softmax(target.float(), 1).exp()
    rp = -(1.0 / (p + GUARD) - 1 + GUARD).detach().log()
    ry = -(1.0 / (y + GUARD) - 1 + GUARD).detach().log()
    return (p * (rp - ry) * 2).sum()


def sym_kl(logits, adv_logits):
    """SymKlCriterion(logits, adv_logits): each KL's target distribution detached."""
    first = F.kl_div(
        F.log_softmax(logits, dim=-1),
        F.softmax(adv_logits.detach(), dim=-1),
        reduction="batchmean",
    )
    second = F.kl_div(
        F.log_softmax(adv_logits, dim=-1),
        F.softmax(logits.detach(), dim=-1),
        reduction="batchmean",
    )
    return first + second


def smart_r_s(f, embed, logits, regression: bool, noise_var: float, step_size: float, k=1):
    """The adversarial loss of SmartPerturbation.forward: noise from the default generator
    (normal_(0, 1) * noise_var on every position), k ascent steps on it, normalized per
    token by its largest coordinate, then the task's adversarial criterion."""
    noise = embed.data.new(embed.size()).normal_(0, 1) * noise_var
    noise.requires_grad_()
    for _ in range(k):
        adv_logits = f(embed + noise)
        if regression:
            adv_loss = F.mse_loss(adv_logits, logits.detach(), reduction="sum")
        else:
            adv_loss = stable_kl_sum(adv_logits, logits.detach())
        (delta_grad,) = torch.autograd.grad(adv_loss, noise, only_inputs=True)
        delta = noise + delta_grad * step_size
        noise = delta / (delta.abs().max(-1, keepdim=True)[0] + GUARD)
        noise = noise.detach()
        noise.requires_grad_()
    adv_logits = f(embed + noise)
    if regression:
        return F.mse_loss(logits.squeeze(), adv_logits)
    return sym_kl(logits, adv_logits)
