"""The grader graded: plausible slips of every exercise fail it, the solution and the
variants the handout allows pass it.

A slip is a small text change of the solution: each (old, new) replaces one text that occurs
once in the exercise's marked bodies. The changed module is imported from a folder of its
own, ahead of this checkout's, and the exercise's check runs in this process.

    PYTHONPATH=.:grader python tests/test_grader.py      prints the table of slips, for the docs
"""

import signal
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

import checks  # noqa: F401  (they register the checks; grader/ is on pytest's path)
import exercises
import extensions  # noqa: F401
import harness

REPO = exercises.HERE

NAN = "float('nan')"
# exercise -> [(what the slip is, [(old, new), ...])]
SLIPS = {
    "attention": [
        ("every output NaN", [("return out, probs", f"return out * {NAN}, probs")]),
        ("no dropout", [("dropout(probs, dropout_p, training) @ v", "probs @ v")]),
        (
            "dropout on the output",
            [
                (
                    "dropout(probs, dropout_p, training) @ v",
                    "dropout(probs @ v, dropout_p, training)",
                )
            ],
        ),
        (
            "dropout without 1 / (1 - p)",
            [
                (
                    "dropout(probs, dropout_p, training) @ v",
                    "dropout(probs, dropout_p, training) * (1 - dropout_p) @ v",
                )
            ],
        ),
        ("no 1 / sqrt(hs)", [(" / math.sqrt(q.size(-1))", "")]),
        ("the mask ignored", [("F.softmax(scores + mask, dim=-1)", "F.softmax(scores, dim=-1)")]),
        (
            "softmax over the queries",
            [("F.softmax(scores + mask, dim=-1)", "F.softmax(scores + mask, dim=-2)")],
        ),
        (
            "heads split without the transpose",
            [("t.view(B, T, self.n_head, hs).transpose(1, 2)", "t.view(B, self.n_head, T, hs)")],
        ),
        (
            "heads merged without the transpose",
            [("out.transpose(1, 2).reshape(B, T, H)", "out.reshape(B, T, H)")],
        ),
        (
            "p written in, 0.5, not the dropout_p given",
            [("dropout(probs, dropout_p, training) @ v", "dropout(probs, 0.5, training) @ v")],
        ),
    ],
    "layer": [
        (
            "no dropout in AddNorm",
            [("residual + self.dropout(self.dense(x))", "residual + self.dense(x)")],
        ),
        (
            "dropout after the LayerNorm",
            [
                (
                    "self.LayerNorm(residual + self.dropout(self.dense(x)))",
                    "self.dropout(self.LayerNorm(residual + self.dense(x)))",
                )
            ],
        ),
        (
            "dropout on the residual",
            [("residual + self.dropout(self.dense(x))", "self.dropout(residual) + self.dense(x)")],
        ),
        (
            "the tanh GELU",
            [
                (
                    'F.gelu(self.intermediate["dense"](a))',
                    'F.gelu(self.intermediate["dense"](a), approximate="tanh")',
                )
            ],
        ),
        (
            "ReLU",
            [('F.gelu(self.intermediate["dense"](a))', 'F.relu(self.intermediate["dense"](a))')],
        ),
        (
            "the layer's input as the second residual",
            [("return self.output(h, a)", "return self.output(h, x)")],
        ),
        (
            "dropout after the GELU",
            [
                (
                    'h = F.gelu(self.intermediate["dense"](a))',
                    'h = self.output.dropout(F.gelu(self.intermediate["dense"](a)))',
                )
            ],
        ),
        (
            "dropout on the attention's output before AddNorm",
            [
                (
                    'self.attention["output"](self.attention["self"](x, mask, probs), x)',
                    'self.attention["output"](self.attention["output"].dropout(self.attention["self"](x, mask, probs)), x)',
                )
            ],
        ),
        (
            "probabilities not passed on",
            [('self.attention["self"](x, mask, probs)', 'self.attention["self"](x, mask)')],
        ),
    ],
    "embeddings": [
        (
            "positions from 1",
            [
                (
                    "torch.arange(T, device=input_ids.device)",
                    "torch.arange(1, T + 1, device=input_ids.device)",
                )
            ],
        ),
        ("no token types", [("+ self.token_type_embeddings(token_type_ids)  # (B, T, H)", "")]),
        ("no dropout", [("return self.dropout(self.LayerNorm(x))", "return self.LayerNorm(x)")]),
        (
            "dropout before the LayerNorm",
            [("return self.dropout(self.LayerNorm(x))", "return self.LayerNorm(self.dropout(x))")],
        ),
        (
            "every output NaN",
            [
                (
                    "return self.dropout(self.LayerNorm(x))",
                    f"return self.dropout(self.LayerNorm(x)) * {NAN}",
                )
            ],
        ),
    ],
    "adamw": [
        (
            "no bias correction",
            [
                (
                    'bias1, bias2 = self._bias_corrections(group, state["step"])',
                    "bias1, bias2 = 1.0, 1.0",
                )
            ],
        ),
        (
            "coupled L2 instead of decoupled decay",
            [
                (
                    "exp_avg.lerp_(grad, 1.0 - beta1)",
                    'grad = grad + group["weight_decay"] * p\n            exp_avg.lerp_(grad, 1.0 - beta1)',
                ),
                ('p.mul_(1.0 - lr * group["weight_decay"])', "pass"),
            ],
        ),
        ("no weight decay", [('p.mul_(1.0 - lr * group["weight_decay"])', "pass")]),
        (
            "beta2 for the first moment",
            [("exp_avg.lerp_(grad, 1.0 - beta1)", "exp_avg.lerp_(grad, 1.0 - beta2)")],
        ),
        (
            "decay without the lr (foreach)",
            [
                (
                    'torch._foreach_mul_(params, 1.0 - lr * group["weight_decay"])',
                    'torch._foreach_mul_(params, 1.0 - group["weight_decay"])',
                )
            ],
        ),
        (
            "no bias correction (foreach)",
            [
                (
                    "roots2 = [math.sqrt(bias2) for _, bias2 in biases]",
                    "roots2 = [1.0 for _ in biases]",
                )
            ],
        ),
        (
            "correct_bias ignored",
            [
                (
                    'bias1, bias2 = self._bias_corrections(group, state["step"])',
                    'bias1, bias2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]',
                )
            ],
        ),
    ],
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
    "mean_pool": [
        (
            "padding counted",
            [("return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)", "return hidden.mean(1)")],
        ),
        (
            "a sum, not a mean",
            [("(hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)", "(hidden * m).sum(1)")],
        ),
        ("divided by T", [("/ m.sum(1).clamp(min=1e-9)", "/ hidden.size(1)")]),
    ],
    "classifier": [
        (
            "no dropout",
            [("self.heads[task](self.dropout(sentences))", "self.heads[task](sentences)")],
        ),
        (
            "dropout on the logits",
            [
                (
                    "self.heads[task](self.dropout(sentences))",
                    "self.dropout(self.heads[task](sentences))",
                )
            ],
        ),
        (
            "dropout twice",
            [
                (
                    "self.heads[task](self.dropout(sentences))",
                    "self.heads[task](self.dropout(self.dropout(sentences)))",
                )
            ],
        ),
        (
            "probabilities, not logits",
            [
                (
                    "self.heads[task](self.dropout(sentences))",
                    "self.heads[task](self.dropout(sentences)).softmax(-1)",
                )
            ],
        ),
        (
            "SST's head for every task",
            [
                (
                    "self.heads[task](self.dropout(sentences))",
                    'self.heads["sst"](self.dropout(sentences))',
                )
            ],
        ),
        (
            "p written in, 0.5, not the model's",
            [
                (
                    "self.heads[task](self.dropout(sentences))",
                    "self.heads[task](F.dropout(sentences, 0.5, self.training))",
                )
            ],
        ),
    ],
    "multitask": [
        (
            "STS as the raw cosine",
            [
                (
                    "cosine_to_score(F.cosine_similarity(u, v, dim=-1))",
                    "F.cosine_similarity(u, v, dim=-1)",
                )
            ],
        ),
        (
            "STS as 5 * cosine",
            [
                (
                    "cosine_to_score(F.cosine_similarity(u, v, dim=-1))",
                    "5 * F.cosine_similarity(u, v, dim=-1)",
                )
            ],
        ),
        (
            "token types of 1",
            [("types = torch.zeros_like(input_ids)", "types = torch.ones_like(input_ids)")],
        ),
        (
            "the first mask for both sides",
            [("F.pad(mask_2, (0, T - mask_2.size(1)))", "F.pad(mask_1, (0, T - mask_1.size(1)))")],
        ),
        (
            "pairs stacked side by side",
            [
                (
                    'return {"input_ids": ids, "attention_mask": mask',
                    'ids, mask = ids.transpose(0, 1).reshape(ids.shape), mask.transpose(0, 1).reshape(ids.shape)\n        return {"input_ids": ids, "attention_mask": mask',
                )
            ],
        ),
        (
            "the shorter side padded on the left",
            [
                (
                    "[F.pad(ids_1, (0, T - ids_1.size(1))), F.pad(ids_2, (0, T - ids_2.size(1)))]",
                    "[F.pad(ids_1, (T - ids_1.size(1), 0)), F.pad(ids_2, (T - ids_2.size(1), 0))]",
                ),
                (
                    "[F.pad(mask_1, (0, T - mask_1.size(1))), F.pad(mask_2, (0, T - mask_2.size(1)))]",
                    "[F.pad(mask_1, (T - mask_1.size(1), 0)), F.pad(mask_2, (T - mask_2.size(1), 0))]",
                ),
            ],
        ),
        (
            "T taken from the first side",
            [("T = max(ids_1.size(1), ids_2.size(1))", "T = ids_1.size(1)")],
        ),
    ],
    "multitask_step": [
        (
            "micro-batch shares left out",
            [("weights[p.task] * p.share * task_loss(", "weights[p.task] * task_loss(")],
        ),
        (
            "task weights left out",
            [("weights[p.task] * p.share * task_loss(", "p.share * task_loss(")],
        ),
        ("L2-SP on every micro-batch", [("if k == 0:  # once per update", "if True:")]),
        (
            "the last micro-batch's loss only",
            [("loss = loss + part.detach()", "loss = part.detach()")],
        ),
        (
            "backward of the last micro-batch only",
            [
                (
                    "backward(part, rt.scaler)",
                    "if k == len(micro) - 1:\n                backward(part, rt.scaler)",
                )
            ],
        ),
        ("the loss scaler bypassed", [("backward(part, rt.scaler)", "part.backward()")]),
        (
            "1 / micro-batches for the share",
            [
                (
                    "weights[p.task] * p.share * task_loss(",
                    "weights[p.task] / len(micro) * task_loss(",
                )
            ],
        ),
        (
            "the returned loss keeps its graph",
            [("loss = loss + part.detach()", "loss = loss + part")],
        ),
    ],
    "pair_head": [
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
    ],
    "smart_ascent": [
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
        ("i = j pairs counted", [(")[off].pow(2).mean()", ").pow(2).mean()")]),
        ("absolute differences", [(")[off].pow(2).mean()", ")[off].abs().mean()")]),
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
    ],
}
HANDOUT_ADAMW = (  # the CS224n handout's AdamW: Kingma & Ba's efficient bias correction,
    # eps on sqrt(v), the decay after the update with the lr
    "            exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)\n"
    "            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)\n"
    '            bias1, bias2 = self._bias_corrections(group, state["step"])  # given\n'
    "            alpha = lr * math.sqrt(bias2) / bias1\n"
    "            p.addcdiv_(exp_avg, exp_avg_sq.sqrt().add_(eps), value=-alpha)\n"
    '            p.mul_(1 - lr * group["weight_decay"])\n'
)
HANDOUT_FOREACH = (
    "        for p, m, v, s in zip(params, exp_avgs, exp_avg_sqs, states, strict=True):\n"
    "            m.mul_(beta1).add_(p.grad, alpha=1 - beta1)\n"
    "            v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)\n"
    '            bias1, bias2 = self._bias_corrections(group, s["step"])\n'
    "            alpha = lr * math.sqrt(bias2) / bias1\n"
    "            p.addcdiv_(m, v.sqrt().add_(eps), value=-alpha)\n"
    '            p.mul_(1 - lr * group["weight_decay"])\n'
)
# exercise -> [(what the variant is, [whole bodies, one per region] or [(old, new), ...])]
VARIANTS = {
    "adamw": [
        ("the handout's algorithm", [HANDOUT_ADAMW, HANDOUT_FOREACH]),
        (
            "the handout's eps, decay first",
            [
                (
                    "denom = torch.sqrt(exp_avg_sq, out=self._scratch(p)).add_(eps * root2)",
                    "denom = torch.sqrt(exp_avg_sq, out=self._scratch(p)).add_(eps)",
                )
            ],
        ),
        (
            "torch's eps, decay after",
            [
                (
                    'if group["weight_decay"]:\n                p.mul_(1.0 - lr * group["weight_decay"])',
                    "pass",
                ),
                (
                    "p.addcdiv_(exp_avg, denom, value=-lr * root2 / bias1)",
                    'p.addcdiv_(exp_avg, denom, value=-lr * root2 / bias1)\n            p.mul_(1.0 - lr * group["weight_decay"])',
                ),
            ],
        ),
    ],
    "attention": [
        (
            "F.dropout",
            [("dropout(probs, dropout_p, training)", "F.dropout(probs, dropout_p, training)")],
        )
    ],
    "classifier": [
        (
            "F.dropout",
            [("self.dropout(sentences)", "F.dropout(sentences, self.dropout.p, self.training)")],
        )
    ],
    "mean_pool": [
        (
            "masked_fill",
            [
                (
                    "return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)",
                    "return hidden.masked_fill(m == 0, 0).sum(1) / m.sum(1)",
                )
            ],
        )
    ],
    "layer": [
        (
            "exact GELU by name",
            [
                (
                    'F.gelu(self.intermediate["dense"](a))',
                    'F.gelu(self.intermediate["dense"](a), approximate="none")',
                )
            ],
        )
    ],
}


def changed(name: str, edits) -> dict[str, str]:
    """{file: its text} with the exercise's bodies edited: whole bodies (one per region), or
    each (old, new) replacing a text that occurs once in them."""
    regions = exercises.exercises(REPO)[name]
    texts = {r.file: (REPO / r.file).read_text() for r in regions}
    if edits and all(isinstance(e, str) for e in edits):  # one whole body per region
        for r, body in sorted(zip(regions, edits, strict=True), key=lambda x: -x[0].begin):
            lines = texts[r.file].splitlines(keepends=True)
            texts[r.file] = "".join(lines[: r.begin + 1] + [body] + lines[r.end :])
        return texts
    for old, new in edits:
        bodies = [
            (r.file, "".join(texts[r.file].splitlines(keepends=True)[r.begin + 1 : r.end]))
            for r in regions
        ]
        hits = [(f, b) for f, b in bodies if old in b]
        assert sum(b.count(old) for _, b in hits) == 1, f"{name}: {old!r} is not once in its bodies"
        file, body = hits[0]
        texts[file] = texts[file].replace(body, body.replace(old, new), 1)
    return texts


PROJECT = {p.stem for p in REPO.glob("*.py")}  # the top-level modules a slip may change


@contextmanager
def changes_graded(tmp: Path):
    """grade(name, edits): the check's row with the edited modules imported in place of
    this checkout's (every project module imported afresh); afterwards the checkout's
    modules are back as they were."""
    ours = {n: sys.modules.pop(n) for n in PROJECT if n in sys.modules}
    saved = signal.signal(signal.SIGALRM, harness.on_alarm)
    count = iter(range(10**6))

    def grade(name: str, edits) -> dict:
        folder = tmp / f"m{next(count)}"
        folder.mkdir()
        for file, text in changed(name, edits).items():
            (folder / file).write_text(text)
        sys.path.insert(0, str(folder))
        try:
            return harness.grade(name)
        finally:
            sys.path.remove(str(folder))
            for n in PROJECT:
                sys.modules.pop(n, None)

    try:
        yield grade
    finally:
        sys.modules.update(ours)
        signal.signal(signal.SIGALRM, saved)


@pytest.fixture
def grade_changed(tmp_path):
    with changes_graded(tmp_path) as grade:
        yield grade


def test_every_exercise_has_three_slips_at_least():
    assert set(SLIPS) == set(exercises.exercises(REPO))
    assert all(len(slips) >= 3 for slips in SLIPS.values())


@pytest.mark.parametrize("name", sorted(SLIPS))
def test_every_slip_fails_and_the_solution_passes(name, grade_changed):
    assert grade_changed(name, [])["result"] == "pass"
    for what, edits in SLIPS[name]:
        row = grade_changed(name, edits)
        assert row["result"] in ("fail", "error"), f"{name}, {what}: {row}"


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_variants_the_handout_allows_pass(name, grade_changed):
    for what, edits in VARIANTS[name]:
        row = grade_changed(name, edits)
        assert row["result"] == "pass", f"{name}, {what}: {row}"
        if what == "the handout's algorithm":  # the scorecard says which AdamW it matched
            assert row["detail"] == "matched the handout's AdamW"


def slip_table() -> str:
    """The docs' table: per exercise, its slips and how many fail, and the solution's grade."""
    lines = ["| exercise | slips tried | failed | the solution |", "| --- | --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as tmp, changes_graded(Path(tmp)) as grade:
        for name, slips in SLIPS.items():
            caught = sum(grade(name, e)["result"] in ("fail", "error") for _, e in slips)
            what = "; ".join(w for w, _ in slips).replace("|", "\\|")  # a table's cell
            lines.append(
                f"| `{name}` | {what} | {caught} / {len(slips)} | {grade(name, [])['result']} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    print(slip_table())
