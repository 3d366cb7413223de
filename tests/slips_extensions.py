"""Slips of the project's exercises (grader/extensions.py): each a small change of the
solution that its check must fail (tests/test_grader.py grades them).

A slip is (what it is, [(old, new), ...]): each old text occurs once in the exercise's
marked bodies, and is replaced by new."""

from slips_checks import NAN

# what bodies that call what computes the answer, or hand it back complex, edit
POOLED = "return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)"
KL = "return ((lp.exp() - lq.exp()) * (lp - lq)).sum(-1).mean()"
R = 'return float(np.sum(dx * dy) / denom) if denom > 0 else float("nan")'
CENTRED = "dx, dy = x - x.mean(), y - y.mean()"


def first(lines: str, old: str) -> list:
    """An edit that runs `lines` (a body's, unindented) above the text `old`."""
    return [(old, lines.replace("\n", "\n    ") + "\n    " + old)]


def complex_r(dtype: str) -> list:
    """An edit that hands r back as a 0-d tensor or array of a complex dtype."""
    return [(R, R.replace("return ", "r = ") + f"\n    return {dtype}")]


# exercise -> [(what the slip is, [(old, new), ...])]
SLIPS = {
    "wordpiece": [
        (
            "no '##' inside a word",
            [
                (
                    'piece = word[start:end] if start == 0 else "##" + word[start:end]',
                    "piece = word[start:end]",
                )
            ],
        ),
        (
            "[UNK] for one character, not the word",
            [("return [self.unk_token_id]", "piece_id, end = self.unk_token_id, start + 1")],
        ),
        (
            "the longest piece never tried",
            [
                (
                    "end = min(len(word), start + self.max_piece_chars)",
                    "end = min(len(word), start + self.max_piece_chars) - 1",
                )
            ],
        ),
        (
            "the longest pieces out of reach",
            [("start + self.max_piece_chars)", "start + self.max_piece_chars - 1)")],
        ),
    ],
    "adamw_foreach": [
        (
            "weight decay only with correct_bias",
            [('if group["weight_decay"]:', 'if group["weight_decay"] and group["correct_bias"]:')],
        ),
        (
            "the first tensor's step count for the whole group",
            [
                (
                    "roots2 = [math.sqrt(bias2) for _, bias2 in biases]",
                    "biases = [biases[0]] * len(biases)\n        roots2 = [math.sqrt(bias2) for _, bias2 in biases]",
                )
            ],
        ),
        (
            "decay without the lr",
            [
                (
                    'torch._foreach_mul_(params, 1.0 - lr * group["weight_decay"])',
                    'torch._foreach_mul_(params, 1.0 - group["weight_decay"])',
                )
            ],
        ),
        (
            "no bias correction",
            [
                (
                    "roots2 = [math.sqrt(bias2) for _, bias2 in biases]",
                    "roots2 = [1.0 for _ in biases]",
                )
            ],
        ),
        (
            "beta2 for the first moment",
            [
                (
                    "torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)",
                    "torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta2)",
                )
            ],
        ),
        (
            "the square root left out",
            [
                (
                    "denoms = torch._foreach_sqrt(exp_avg_sqs)",
                    "denoms = [v.clone() for v in exp_avg_sqs]",
                )
            ],
        ),
    ],
    "mean_pool": [
        (
            "divided by T, padding counted",
            [
                (
                    "return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)",
                    "return (hidden * m).sum(1) / hidden.size(1)",
                )
            ],
        ),
        ("detached", [("return (hidden * m).sum(1)", "return (hidden.detach() * m).sum(1)")]),
        (
            "squeeze() without a dim",
            [
                (
                    "return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)",
                    "return ((hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)).squeeze()",
                )
            ],
        ),
        (
            "the mask upcast to float64",
            [
                (
                    "m = attention_mask.unsqueeze(-1).to(hidden.dtype)",
                    "m = attention_mask.unsqueeze(-1).double()",
                )
            ],
        ),
        (
            "padding counted",
            [("return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)", "return hidden.mean(1)")],
        ),
        (
            "a sum, not a mean",
            [("(hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)", "(hidden * m).sum(1)")],
        ),
        ("divided by T", [("/ m.sum(1).clamp(min=1e-9)", "/ hidden.size(1)")]),
        (
            "the grader's definitions.mean_pool called",
            first(
                "import definitions\nreturn definitions.mean_pool(hidden, attention_mask)", POOLED
            ),
        ),
        (
            "the grader's definitions, imported as grader.definitions",
            first(
                "from grader.definitions import mean_pool\nreturn mean_pool(hidden, attention_mask)",
                POOLED,
            ),
        ),
    ],
    "pair_head": [
        (
            "squeeze() without a dim",
            [("return both.squeeze(-1) / 2", "return both.squeeze() / 2")],
        ),
        (
            "one order only",
            [
                (
                    "both = head(torch.cat([u, v, d], -1)) + head(torch.cat([v, u, d], -1))",
                    "both = 2 * head(torch.cat([u, v, d], -1))",
                )
            ],
        ),
        (
            "u - v without the absolute value",
            [("head, d = self.heads[task], (u - v).abs()", "head, d = self.heads[task], u - v")],
        ),
        ("not halved", [("return both.squeeze(-1) / 2", "return both.squeeze(-1)")]),
        (
            "u * v for |u - v|",
            [("head, d = self.heads[task], (u - v).abs()", "head, d = self.heads[task], u * v")],
        ),
    ],
    "symmetric_kl": [
        ("KL(P||Q) only", [("((lp.exp() - lq.exp()) * (lp - lq))", "(lp.exp() * (lp - lq))")]),
        (
            "each KL's target detached",
            [
                (
                    "((lp.exp() - lq.exp()) * (lp - lq))",
                    "(lp.exp() * (lp - lq.detach()) + lq.exp() * (lq - lp.detach()))",
                )
            ],
        ),
        ("a mean over classes", [(".sum(-1).mean()", ".mean()")]),
        ("NaN", [(".sum(-1).mean()", f".sum(-1).mean() * {NAN}")]),
        (
            "mt-dnn's: nothing detached",
            [("(lq.detach().exp() * (lq.detach() - lp))", "(lq.exp() * (lq - lp))")],
        ),
        (
            "a squared difference of the probabilities, not a KL (mt-dnn's: each side half)",
            [
                (KL, "return ((lp.exp() - lq.exp()) ** 2).sum(-1).mean()"),
                (
                    "return (kl_q_p + kl_p_q).mean()",
                    "P, Q = lp.exp(), lq.exp()\n"
                    "    return ((P - Q.detach()) ** 2 + (P.detach() - Q) ** 2).sum(-1).mean() / 2",
                ),
            ],
        ),
        (
            "the TA's references.symmetric_kl called",
            first("import references\nreturn references.symmetric_kl(p, q, kind)", KL),
        ),
    ],
    "smart_ascent": [
        (
            "a step over the gradient's L2 norm, not its largest element",
            [
                (
                    "grad.abs().amax(dim=per_example, keepdim=True)",
                    "grad.norm(dim=(1, 2), keepdim=True)",
                )
            ],
        ),
        (
            "mt-dnn's: each token's step over its L2 norm",
            [("step.abs().amax(dim=-1, keepdim=True)", "step.norm(dim=-1, keepdim=True)")],
        ),
        (
            "the reference code's divergence read as class logits (mt-dnn's SymKlCriterion)",
            [
                (
                    "return reference_divergence(clean, f(embeds + noise), kind)",
                    'return reference_divergence(clean, f(embeds + noise), "classification")',
                )
            ],
        ),
        (
            "the noise drawn in float64",
            [
                (
                    "noise = project(torch.randn_like(embeds) * sigma)",
                    "noise = project(torch.randn_like(embeds, dtype=torch.float64) * sigma)",
                )
            ],
        ),
        (
            "every output read as class logits",
            [
                (
                    "adv = divergence(f(base + noise), target, kind)",
                    'adv = divergence(f(base + noise), target, "classification")',
                ),
                (
                    "return divergence(f(embeds + noise.detach()), clean, kind)",
                    'return divergence(f(embeds + noise.detach()), clean, "classification")',
                ),
            ],
        ),
        (
            "one max over the batch",
            [("grad.abs().amax(dim=per_example, keepdim=True)", "grad.abs().max()")],
        ),
        (
            "no projection after a step",
            [
                (
                    "noise = project(noise.detach() + eta * grad / scale.clamp(min=1e-12))",
                    "noise = noise.detach() + eta * grad / scale.clamp(min=1e-12)",
                )
            ],
        ),
        ("descent, not ascent", [("noise.detach() + eta * grad", "noise.detach() - eta * grad")]),
        (
            "noise not scaled by sigma",
            [("project(torch.randn_like(embeds) * sigma)", "project(torch.randn_like(embeds))")],
        ),
        (
            "mt-dnn's: one max per example",
            [
                (
                    "step.abs().amax(dim=-1, keepdim=True)",
                    "step.abs().amax(dim=(1, 2), keepdim=True)",
                )
            ],
        ),
        (
            "mt-dnn's: regression's error averaged",
            [("climb = (adv - y).pow(2).sum()", "climb = (adv - y).pow(2).mean()")],
        ),
        (
            "the final pass on detached embeddings",
            [
                (
                    "return divergence(f(embeds + noise.detach()), clean, kind)",
                    "return divergence(f(base + noise.detach()), clean, kind)",
                )
            ],
        ),
        (
            "mt-dnn's: the final pass on detached embeddings",
            [
                (
                    "return reference_divergence(clean, f(embeds + noise), kind)",
                    "return reference_divergence(clean, f(base + noise), kind)",
                )
            ],
        ),
        (
            "backward() for the noise's gradient",
            [
                (
                    "(grad,) = torch.autograd.grad(\n            adv / adv.detach().clamp(min=1e-30),\n            noise,\n            allow_unused=True,\n            materialize_grads=True,\n        )",
                    "adv.backward()\n        grad = noise.grad",
                )
            ],
        ),
        (
            "mt-dnn's: backward() for the noise's gradient",
            [
                (
                    "(grad,) = torch.autograd.grad(climb, noise, allow_unused=True, materialize_grads=True)",
                    "climb.backward()\n        grad = noise.grad",
                )
            ],
        ),
    ],
    "momentum_teacher": [
        (
            "beta and 1 - beta swapped",
            [
                (
                    "student[n].detach() for n in names], 1.0 - beta",
                    "student[n].detach() for n in names], beta",
                )
            ],
        ),
        ("not in place", [("torch._foreach_lerp_(", "torch._foreach_lerp(")]),
        (
            "the teacher kept in float64",
            [
                (
                    "torch._foreach_lerp_(\n            [self.params[n] for n in names], [student[n].detach() for n in names], 1.0 - beta\n        )",
                    "for n in names:\n            self.params[n] = beta * self.params[n].double() + (1 - beta) * student[n].detach().double()",
                )
            ],
        ),
        (
            "the teacher copies the model",
            [
                (
                    "student[n].detach() for n in names], 1.0 - beta",
                    "student[n].detach() for n in names], 1.0",
                )
            ],
        ),
    ],
    "simcse": [
        (
            "the targets made without device=",
            [
                (
                    "target = torch.arange(anchors.size(0), device=anchors.device)",
                    "target = torch.arange(anchors.size(0))",
                )
            ],
        ),
        (
            "no temperature",
            [("cos_sim(anchors, candidates) / temperature", "cos_sim(anchors, candidates)")],
        ),
        (
            "dot products, not cosines",
            [
                (
                    "cos_sim(anchors, candidates) / temperature",
                    "anchors @ candidates.T / temperature",
                )
            ],
        ),
        ("hard negatives left out", [("torch.cat([positives, negatives])", "positives")]),
        (
            "candidate 0 the answer",
            [
                (
                    "torch.arange(anchors.size(0), device=anchors.device)",
                    "torch.zeros(anchors.size(0), dtype=torch.long)",
                )
            ],
        ),
    ],
    "pcgrad": [
        (
            "a fixed order",
            [
                (
                    "order = torch.randperm(num_tasks, generator=generator).tolist()",
                    "order = list(range(num_tasks))",
                )
            ],
        ),
        (
            "projected off already-projected gradients",
            [("g_j = grads[j]", "g_j = projected[j] if j < len(projected) else grads[j]")],
        ),
        ("projected whether or not they conflict", [("if dot < 0:", "if dot != 0:")]),
        ("the inputs changed in place", [("g_i = grads[i].clone()", "g_i = grads[i]")]),
        (
            "a float32 copy whatever the input",
            [("g_i = grads[i].clone()", "g_i = grads[i].float()")],
        ),
        (
            "one order shared by every task",
            [
                ("        order = torch.randperm(num_tasks, generator=generator).tolist()\n", ""),
                (
                    "projected = []\n",
                    "projected = []\n    order = torch.randperm(num_tasks, generator=generator).tolist()\n",
                ),
            ],
        ),
    ],
    "distillation": [
        (
            "the reference not constant",
            [("cos_sim(reference, reference).detach()", "cos_sim(reference, reference)")],
        ),
        (
            "i = j pairs counted",
            [("(gap * off).pow(2).sum() / (N * (N - 1))", "gap.pow(2).mean()")],
        ),
        ("absolute differences", [("(gap * off).pow(2).sum()", "(gap * off).abs().sum()")]),
        (
            "the mask made without device=",
            [("torch.eye(N, dtype=z.dtype, device=z.device)", "torch.eye(N, dtype=z.dtype)")],
        ),
    ],
    "pearson": [
        ("0 for a constant input", [('else float("nan")', "else 0.0")]),
        ("no centering", [("dx, dy = x - x.mean(), y - y.mean()", "dx, dy = x, y")]),
        (
            "n and n - 1 mixed",
            [
                (
                    "denom = np.sqrt(np.sum(dx * dx) * np.sum(dy * dy))",
                    "denom = (len(x) - 1) * x.std() * y.std()",
                )
            ],
        ),
        (
            "|r|",
            [
                (
                    "return float(np.sum(dx * dy) / denom)",
                    "return float(abs(np.sum(dx * dy)) / denom)",
                )
            ],
        ),
        (
            "scipy's pearsonr",
            first(
                "from scipy.stats import pearsonr\nreturn float(pearsonr(x, y).statistic)", CENTRED
            ),
        ),
        (
            "scipy's pearsonr, its refusal caught and the sum written after",
            first(
                "import scipy.stats as st\ntry:\n    return float(st.pearsonr(x, y)[0])\nexcept Exception:\n    pass",
                CENTRED,
            ),
        ),
        ("r as a complex64 tensor", complex_r("torch.tensor(r, dtype=torch.complex64)")),
        ("r as a 0-d complex128 array", complex_r("np.array(r, dtype=np.complex128)")),
    ],
    "auc": [
        (
            "ties ranked in order",
            [
                (
                    "ranks = average_ranks(scores)",
                    "ranks = scores.argsort(kind='stable').argsort() + 1.0",
                )
            ],
        ),
        ("n_pos (n_pos - 1) / 2", [("n_pos * (n_pos + 1) / 2", "n_pos * (n_pos - 1) / 2")]),
        ("over n_pos * n", [("/ (n_pos * n_neg)", "/ (n_pos * len(scores))")]),
        (
            "sklearn's roc_auc_score",
            first(
                "from sklearn.metrics import roc_auc_score\nreturn float(roc_auc_score(labels, scores))",
                "ranks = average_ranks(scores)",
            ),
        ),
    ],
}
