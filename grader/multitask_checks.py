"""The handout's Part 2 checks: its MultitaskBERT (`multitask`), whose design is the
student's, judged by the handout's interface and by learning; the project's SentenceBERT
heads (`sbert`); and one multitask training step (`multitask_step`), as grader/checks.py
grades Part 1: values and gradients beside an independent reference, stand-ins for the
other exercises.
"""

import copy
import math

import torch
import torch.nn.functional as F

import definitions as D
from harness import cached, check, part, student
from setups import (
    P_DROP,
    STEP,
    ScaleBy8,
    StandInModel,
    as_run,
    f64,
    gen,
    grads,
    handout_multitask,
    logits_in_training,
    padded,
    seeded_heads,
    step_batches,
    stepped,
    tiny_multitask,
)

PREDICT = {"sst": "predict_sentiment", "para": "predict_paraphrase", "sts": "predict_similarity"}


@check(1e-6, stands_in=("attention", "layer", "embeddings"))
def multitask():
    """The handout's MultitaskBERT, built by its own __init__ on a tiny real encoder
    (tiny_bert.StandInEncoder, torch's own modules, standing in for bert.py's BertModel): the three predict_*'s shapes (a pair's one output
    each, (B,) or (B, 1)) and dtypes, in float64, float32 and on another device; outputs
    unchanged by more padding, by the batch around an example and by a second call in
    eval; the gradient reaching BERT, along a random direction of every parameter against
    finite differences; and each task learnt from its handout loss on a tiny task (torch's
    AdamW): SST's classes, the paraphrase logit's sign, STS's Pearson r."""
    sides = sides_of(padded(B=3, T=7, seed=1), padded(B=3, T=4, seed=2))

    def mine():
        model = handout_multitask().double().eval()
        got = {"outs": outputs(model, sides), "again": outputs(model, sides)}
        more = [(F.pad(x, (0, 3)) if x.dim() == 2 else x) for x in sides]  # 3 more pads
        got["padded"] = outputs(model, more)
        got["one"] = outputs(model, [x[:1] for x in sides])
        found = [directional(model, k, sides) for k in range(len(PREDICT))]
        got["bert"], got["directional"] = [x for x, _ in found], [y for _, y in found]
        return got

    got = student(mine)
    outs = got["outs"]
    for o, method, shape in zip(outs, PREDICT.values(), SHAPES, strict=True):
        found = list(o.shape) if torch.is_tensor(o) else type(o).__name__
        yield part(f"{method}'s shape (a pair's (B, 1) read as (B,))", found, list(shape))
    yield part("float64 outputs of a float64 model", dtypes(outs), [True] * 3)
    if not (shaped(outs, SHAPES) and all(numbers(pair) for pair in got["directional"])):
        return  # the shapes' parts failed: nothing else of a hostile record is read
    for k, method in enumerate(PREDICT.values()):
        yield part(f"{method}: finite outputs", bool(outs[k].isfinite().all()), True)
        yield part(f"{method}: the same in eval, called twice", got["again"][k], outs[k], tol=0)
        yield part(f"{method}: unchanged by 3 more pad tokens", got["padded"][k], outs[k])
        yield part(f"{method}: a batch of one, its example's outputs", got["one"][k], outs[k][:1])
        yield part(f"{method}: a gradient reaches BERT's parameters", got["bert"][k], True)
        autograd, finite = (float(x) for x in got["directional"][k])
        yield part(
            f"{method}: a finite difference along a random direction", math.isfinite(finite), True
        )
        what = f"{method}: the gradient along a random direction, against finite differences"
        yield part(
            what, autograd, finite, tol=1e-6 * max(1.0, abs(finite)) if math.isfinite(finite) else 0
        )
    yield from as_run("predict_*", lambda d, dev: run_on(d, dev, sides), flat(outs))
    yield from learnt()


SHAPES = ((3, 5), (3,), (3,))  # predict_*'s on the check's batches of three


def shaped(outs, shapes) -> bool:
    """Whether the record holds floating tensors of these shapes, one each."""
    return len(outs) == len(shapes) and all(
        torch.is_tensor(o) and o.is_floating_point() and tuple(o.shape) == s
        for o, s in zip(outs, shapes, strict=False)
    )


def numbers(pair) -> bool:
    return len(pair) == 2 and all(torch.is_tensor(x) and x.numel() == 1 for x in pair)


def sides_of(one, two):
    """[ids1, mask1, ids2, mask2] of two padded batches (setups.padded: ids, types, mask)."""
    return [one[0], one[2], two[0], two[2]]


def outputs(model, sides):
    """The three predict_*'s outputs on `sides`, a pair's flattened from (B, 1)."""
    ids1, m1, ids2, m2 = sides
    outs = [model.predict_sentiment(ids1, m1)]
    outs += [model.predict_paraphrase(*sides), model.predict_similarity(*sides)]
    return [pairwise(o) for o in outs[:1]] + [pairwise(o, pair=True) for o in outs[1:]]


def pairwise(out, pair=False):
    """A pair task's (B, 1) output as (B,), as the handout's evaluation flattens it."""
    if pair and torch.is_tensor(out) and out.dim() == 2 and out.size(1) == 1:
        return out.squeeze(1)
    return out


def dtypes(outs):
    return [torch.is_tensor(o) and o.dtype == f64 for o in outs]


def flat(outs):
    return torch.cat([o.detach().flatten() for o in outs])


def directional(model, k: int, sides, h: float = 1e-6):
    """(whether a gradient of the k-th predict_*'s weighted outputs reaches BERT's parameters, (the
    derivative along a random direction of every parameter by autograd, by central
    differences)); float64, eval."""
    params = [p for p in model.parameters() if p.requires_grad]
    bert = {id(p) for p in model.bert.parameters()}
    g = gen(11)
    d = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in params]

    def f():
        out = outputs(model, sides)[k]
        return (out * torch.randn(out.shape, generator=gen(12), dtype=out.dtype)).sum()

    grads_ = torch.autograd.grad(f(), params, allow_unused=True)
    reached = any(
        x is not None and x.abs().sum() > 0
        for p, x in zip(params, grads_, strict=True)
        if id(p) in bert
    )
    along = sum((x * v).sum() for x, v in zip(grads_, d, strict=True) if x is not None)
    with torch.no_grad():
        ends = []
        for sign in (1, -1):
            for p, v in zip(params, d, strict=True):
                p.add_(sign * h * v)
            ends.append(f())
            for p, v in zip(params, d, strict=True):
                p.sub_(sign * h * v)
    return reached, (torch.as_tensor(along, dtype=f64), (ends[0] - ends[1]) / (2 * h))


def run_on(dtype, device, sides):
    """predict_*'s outputs, flat, of the model and its inputs in dtype on device."""
    model = handout_multitask().eval().to(dtype=dtype, device=device)
    return flat(outputs(model, [x.to(device) for x in sides]))


# Tiny tasks each head learns, as the handout trains them: ten sentences of SST's five
# classes; four pairs of sentences a or b then c or d, the paraphrase (a, c) alone, STS's
# scores the sum of each side's (a: 2.5, c: 2.5). Neither side alone tells them apart.
LEARN_STEPS, LEARN_LR = 30, 2e-3  # tests/variants.py's worst: r 0.944, cross-entropy 0.43
# softmax probabilities taken as logits reach at best log(1 + 4 / e) = 0.9 on five classes
CE_AT_MOST, R_AT_LEAST = 0.7, 0.9


def learnt():
    """Each predict_* trained alone from the fresh model on its tiny task, its outputs then
    in eval: SST's predicted classes, the paraphrase logit's sign, STS's Pearson r."""
    ids, _, mask = padded(B=10, T=6, seed=20)
    a_b, _, m_ab = padded(B=2, T=5, seed=21)
    c_d, _, m_cd = padded(B=2, T=5, seed=22)
    left, right = [0, 0, 1, 1], [0, 1, 0, 1]
    pairs = [a_b[left], m_ab[left], c_d[right], m_cd[right]]
    labels = {
        "sst": torch.arange(10) % 5,
        "para": torch.tensor([1.0, 0.0, 0.0, 0.0]),
        "sts": torch.tensor([5.0, 2.5, 2.5, 0.0]),
    }
    inputs = {"sst": [ids, mask], "para": pairs, "sts": pairs}
    got = student(lambda: {t: trained(t, inputs[t], labels[t]) for t in labels})
    sst, para, sts = (got.get(t) for t in labels)
    shapes = ((10, 5), (4,), (4,))
    yield part(
        "predict_* after training: floating outputs of their shapes",
        shaped([sst, para, sts], shapes),
        True,
    )
    if not shaped([sst, para, sts], shapes):
        return
    yield part("predict_sentiment learns 10 sentences' classes", sst.argmax(-1), labels["sst"])
    ce = float(F.cross_entropy(sst.double(), labels["sst"]))
    label = "predict_sentiment learns 10 sentences: their cross-entropy as logits (at most 0.7)"
    yield part(label, max(ce, CE_AT_MOST) if ce == ce else math.inf, CE_AT_MOST, tol=0)
    yield part(
        "predict_paraphrase learns 4 pairs: its logits' sign", (para > 0).float(), labels["para"]
    )
    r = torch.corrcoef(torch.stack([sts.double(), labels["sts"].double()]))[0, 1]
    label = "predict_similarity learns 4 pairs: the Pearson r of its outputs (at least 0.9)"
    yield part(label, min(float(r), R_AT_LEAST) if r == r else 0.0, R_AT_LEAST, tol=0)


LOSSES = {
    "sst": F.cross_entropy,
    "para": F.binary_cross_entropy_with_logits,
    "sts": F.mse_loss,
}


def trained(task: str, inputs, labels):
    """The task's outputs in eval after LEARN_STEPS of torch's AdamW on its handout loss."""
    model = handout_multitask().train()
    method = PREDICT[task]
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARN_LR, foreach=True)
    for _ in range(LEARN_STEPS):
        optimizer.zero_grad()
        out = pairwise(getattr(model, method)(*inputs), pair=task != "sst")
        LOSSES[task](out.float(), labels).backward()
        optimizer.step()
    with torch.no_grad():
        return pairwise(getattr(model.eval(), method)(*inputs), pair=task != "sst").detach()


@check(
    1e-6,
    stands_in=(
        "attention",
        "layer",
        "embeddings",
        "mean_pool",
        "pair_head",
        "sbert",
    ),
)
def multitask_step():
    """One update of trainer.train_step over SST, Quora and STS together (random loss
    weights, two micro-batches of unequal size, an L2-SP pull, a loss scaler as float16's,
    then the no-op one of float32 and bfloat16): its loss, detached, and the gradient it hands
    the optimizer, against the weighted sum of the tasks' losses, differentiated once."""
    model = StandInModel()
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen(1)))

    def mine():
        from presets import Stage
        from settings import MultitaskConfig

        multitask = MultitaskConfig(weighting="random")
        stage = Stage(STEP, 1e-3, 5, kind="multitask", multitask=multitask)
        loss, got, calls = stepped(model, stage, step_context(reference), gen(5))
        heads = [model.heads[t].weight.grad is not None for t in STEP]
        model.zero_grad(set_to_none=True)  # again, as float32 and bfloat16 runs: a no-op scaler
        plain = stepped(model, stage, step_context(reference, scaled=False), gen(5))
        return loss, got, heads, plain, [calls, plain[2]]

    loss, got, heads, (plain_loss, plain, _), calls = student(mine)
    what = "the optimizer's step() and zero_grad() calls in one step (the given code's, once each)"
    yield part(what, calls, [[1, 1], [1, 1]], tol=0)
    yield part("every task's head has a gradient", heads, [True] * 3)
    yield part("the step's loss keeps no graph", loss.requires_grad, False)

    def task_loss(task, batch):  # the task's default loss of the stand-in's output
        from losses import loss_of

        out = model.readout(task, batch, model.sentences(batch))
        return loss_of(task, None).fn(out.float(), batch["labels"])

    @cached  # one reference graph: its value, then its gradient
    def expected():
        from optimizer import loss_weights

        weights = loss_weights(3, "random", gen(5))
        total = D.multitask_loss(model, step_batches(), weights, task_loss)
        pairs = zip(model.bert.parameters(), reference.bert.parameters(), strict=True)
        return total + L2SP * sum((p - p0).pow(2).sum() for p, p0 in pairs) / 2  # L2-SP

    gradient = cached(lambda: grads(expected(), list(model.parameters()), 1.0))
    yield part("the step's loss", loss, expected)
    yield part("the gradient", got, gradient)
    yield part("the step's loss with a no-op scaler (float32, bfloat16)", plain_loss, expected)
    yield part("the gradient with a no-op scaler (float32, bfloat16)", plain, gradient)


L2SP = 0.5  # the step's --l2sp: its pull toward the reference encoder


def step_context(reference, scaled: bool = True):
    """trainer.StepContext of the step's check: fp32 on the CPU, a loss scaler of 8 (not
    scaled: the disabled GradScaler of float32 and bfloat16 runs), two micro-batches, an L2-SP pull of
    0.5 toward `reference`."""
    from dataclasses import replace

    import trainer
    from engine.runtime import make_runtime
    from settings import OptimConfig

    scaler = ScaleBy8() if scaled else torch.amp.GradScaler("cpu", enabled=False)
    rt = replace(make_runtime("cpu", "fp32"), scaler=scaler)
    optim = OptimConfig(accumulate=2, l2sp=L2SP, max_grad_norm=0.0)  # the gradient unclipped
    return trainer.StepContext(rt, optim, reference=reference)


@check(1e-6)
def sbert():
    """SentenceBERT's SST and STS heads (`readout`): the STS score, the cosine of u and v
    stretched onto 0-5, and its gradients; identical sentences score 5; the SST head's
    logits (dropout, then the head) and their gradients in eval, their statistics over 4,000
    draws in training; the STS head in training (the cosine after the given dropout)."""
    u, v = torch.randn(2, 4, 32, generator=gen(3)).requires_grad_().unbind(0)
    pair = {"input_ids": torch.zeros(2, 4, 5, dtype=torch.long)}  # (2, B, T): siamese pairs
    w = torch.randn(4, generator=gen(4))

    def mine():
        model = tiny_multitask(("sst", "para", "sts")).eval()
        score = model.readout("sts", pair, torch.cat([u, v]))
        return score, grads(score, (u, v), w), model.readout("sts", pair, torch.cat([u, u]))

    score, score_grads, same = student(mine)
    yield part("the STS head's score", score, lambda: D.sts_score(u, v))
    expected = lambda: grads(D.sts_score(u, v), (u, v), w)  # noqa: E731
    yield part("the STS score's gradients of u and v", score_grads, expected)
    yield part("the STS score of identical sentences", same, lambda: torch.full((4,), 5.0))

    def run(dtype, device):
        model = tiny_multitask(("sst", "para", "sts")).eval().to(dtype=dtype, device=device)
        return model.readout("sts", pair, torch.cat([u, v]).detach().to(dtype=dtype, device=device))

    yield from as_run("the STS score", run, score)
    yield from sst_readout()
    yield from sts_in_training()


def sts_in_training():
    """SentenceBERT.readout of siamese STS pairs in training: the cosine of u and v after
    the given dropout, so two draws differ (of the sentences before it, they would not)."""
    u, v = torch.randn(2, 4, 32, generator=gen(3)).unbind(0)
    pair = {"input_ids": torch.zeros(2, 4, 5, dtype=torch.long)}  # (2, B, T): siamese pairs

    def mine():
        model = tiny_multitask(("sst", "para", "sts")).train()
        draws = []
        for seed in (1, 2):
            torch.manual_seed(seed)
            draws.append(model.readout("sts", pair, torch.cat([u, v])).detach())
        return draws

    a, b = student(mine)
    same_shape = torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape
    differ = float(same_shape and not torch.equal(a, b))
    label = "the STS head in training: the cosine of u and v after dropout (two draws differ)"
    yield part(label, differ, 1.0)


def sst_readout():
    """SentenceBERT.readout of one sentence: dropout on the pooled sentences, then SST's
    head; its logits and gradients in eval, their statistics in training."""
    head, n = seeded_heads(("sst",))["sst"], 4000
    z = torch.randn(3, 32, generator=gen(0)).requires_grad_()
    single = {"input_ids": torch.zeros(3, 7, dtype=torch.long)}  # (B, T): one sentence each
    w = torch.randn(3, 5, generator=gen(4))

    def mine():
        model = tiny_multitask(("sst",), P_DROP, {"sst": head}).eval()
        logits = model.readout("sst", single, z)
        got = {"logits": logits}
        if logits.shape == w.shape:  # else its logits' part fails
            got["gradients"] = grads(logits, [z, *model.heads["sst"].parameters()], w)
        torch.manual_seed(0)
        many = {"input_ids": torch.zeros(3 * n, 7)}
        got["draws"] = model.train().readout("sst", many, z.detach().repeat(n, 1)).detach()
        return got

    got = student(mine)
    yield part("the SST head's logits", got["logits"], lambda: D.sentiment_logits(z, head))
    if "gradients" in got:
        ins = [z, *head.parameters()]
        expected = lambda: grads(D.sentiment_logits(z, head), ins, w)  # noqa: E731
        yield part(
            "the SST head: gradients of the sentences and the head", got["gradients"], expected
        )
    yield from logits_in_training(got["draws"], head, z.detach(), n, "the SST head in training")
