"""The handout's Part 2 checks: predict_* and the SST head of MultitaskBERT (`multitask`),
and one multitask training step (`multitask_step`), as grader/checks.py grades Part 1:
values and gradients beside an independent reference, stand-ins for the other exercises.
"""

import copy

import torch

import definitions as D
from harness import cached, check, part, references, student
from setups import (
    P_DROP,
    STEP,
    ScaleBy8,
    StandInModel,
    as_run,
    gen,
    grads,
    logits_in_training,
    padded,
    seeded_heads,
    stand_in_readout,
    stand_in_sentences,
    stand_in_table,
    stand_ins,
    step_batches,
    stepped,
    tiny_multitask,
)

R = references()


@check(1e-5, stands_in=("attention", "layer", "embeddings", "mean_pool", "pair_head"))
def multitask():
    """The handout's predict_sentiment, predict_paraphrase and predict_similarity against
    the model's forward on the batches they stand for (pairs of different lengths; a
    stand-in encoder and heads), the STS head's 0-5 score of the cosine, and the SST
    head's logits (dropout, then the head)."""
    heads, (table, position) = seeded_heads(("sst", "para")), stand_in_table()
    leaves = [table, *heads["sst"].parameters(), *heads["para"].parameters()]
    ids1, _, m1 = padded(B=3, T=7, seed=1)
    ids2, _, m2 = padded(B=3, T=4, seed=2)
    m2[0, 3:] = 0
    both = [(ids1, m1, ids2, m2), (ids2, m2, ids1, m1)]  # the longer first, then second
    u, v = torch.randn(2, 4, 32, generator=gen(3)).requires_grad_().unbind(0)
    pair = {"input_ids": torch.zeros(2, 4, 5, dtype=torch.long)}  # (2, B, T): siamese pairs
    w = {"sst": torch.randn(3, 5, generator=gen(8)), "pair": torch.randn(3, generator=gen(9))}
    w["sts"] = torch.randn(4, generator=gen(4))
    ones = [padded(B=1, T=5, seed=5), padded(B=1, T=3, seed=6)]  # a batch of one

    def mine():
        model = tiny_multitask(("sst", "para", "sts")).eval()
        score = model.readout("sts", pair, torch.cat([u, v]))
        got = {"score": [score, grads(score, (u, v), w["sts"])]}
        got["same"] = model.readout("sts", pair, torch.cat([u, u]))
        stand_ins(model, heads, table, position)
        out = model.predict_sentiment(ids1, m1)
        got["sst"] = [out, grads(out, leaves, w["sst"])]
        for task, method in (("para", model.predict_paraphrase), ("sts", model.predict_similarity)):
            got[task] = [[out := method(*s), grads(out, leaves, w["pair"])] for s in both]
        (i1, _, o1), (i2, _, o2) = ones
        got["one"] = [
            list(model.predict_sentiment(i1, o1).shape),
            list(model.predict_paraphrase(i1, o1, i2, o2).shape),
            list(model.predict_similarity(i1, o1, i2, o2).shape),
        ]
        return got

    got = student(mine)
    yield from predicted(got, heads, (table, position), leaves, w, both)

    run = lambda dtype, device: predict_on(dtype, device, heads, (table, position), both[0])  # noqa: E731
    values = torch.cat([got["sst"][0].flatten(), got["para"][0][0], got["sts"][0][0]])
    yield from as_run("predict_*", run, values)
    yield part("the STS head's score", got["score"][0], lambda: D.sts_score(u, v))
    expected = lambda: grads(D.sts_score(u, v), (u, v), w["sts"])  # noqa: E731
    yield part("the STS score's gradients of u and v", got["score"][1], expected)
    shapes = ([1, 5], [1], [1])
    for method, shape, want in zip(PREDICT, got["one"], shapes, strict=True):
        yield part(f"a batch of one: {method}'s shape", shape, want)
    yield part("the STS score of identical sentences", got["same"], lambda: torch.full((4,), 5.0))
    yield from sst_readout()
    yield from sts_in_training()


def sts_in_training():
    """MultitaskBERT.readout of siamese STS pairs in training: the cosine of u and v after
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
    """MultitaskBERT.readout of one sentence: dropout on the pooled sentences, then SST's
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


def predict_on(dtype, device, heads, encoder, sides):
    """predict_*'s three outputs, flat, their inputs and the stand-ins in dtype on device
    (the student's side)."""
    model = tiny_multitask(("sst", "para", "sts")).eval()
    moved = {t: copy.deepcopy(h).to(dtype=dtype, device=device) for t, h in heads.items()}
    stand_ins(model, moved, *(x.detach().to(dtype=dtype, device=device) for x in encoder))
    i1, o1, i2, o2 = (x.to(device) for x in sides)
    outs = [model.predict_sentiment(i1, o1), model.predict_paraphrase(i1, o1, i2, o2)]
    outs.append(model.predict_similarity(i1, o1, i2, o2))
    return torch.cat([x.flatten() for x in outs])


def predicted(got, heads, encoder, leaves, w, both):
    """predict_*'s outputs and their gradients (the stand-in encoder's table and the heads')
    against the grader's forward on the batches they stand for."""
    ids1, m1 = both[0][:2]
    single = {"input_ids": ids1, "attention_mask": m1, "token_type_ids": torch.zeros_like(ids1)}

    def forward(task, batch):  # the model's forward, its encoder and heads stood in for
        return stand_in_readout(task, batch, stand_in_sentences(batch, *encoder), heads)

    def against(task, batch, w):  # (the output's reference, its gradients' reference)
        value = cached(lambda: forward(task, batch()))
        return value, lambda: grads(value(), leaves, w)

    value, gradients = against("sst", lambda: single, w["sst"])
    yield part("predict_sentiment", got["sst"][0], value)
    yield part("predict_sentiment: gradients of the encoder and the head", got["sst"][1], gradients)
    for task, method in (("para", "predict_paraphrase"), ("sts", "predict_similarity")):
        for sides, (out, out_grads) in zip(both, got[task], strict=True):
            value, gradients = against(task, lambda s=sides: D.pair_batch(*s), w["pair"])
            what = f"{method}, sides of {sides[0].size(1)} and {sides[2].size(1)}"
            yield part(what, out, value)
            yield part(f"{what}: gradients", out_grads, gradients)


PREDICT = ("predict_sentiment", "predict_paraphrase", "predict_similarity")


@check(
    1e-6,
    stands_in=(
        "attention",
        "layer",
        "embeddings",
        "mean_pool",
        "pair_head",
        "multitask",
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
        from engine.flags import MultitaskConfig
        from presets import Stage

        multitask = MultitaskConfig(weighting="random")
        stage = Stage(STEP, 1e-3, 5, kind="multitask", multitask=multitask)
        loss, got = stepped(model, stage, step_context(reference), gen(5))
        heads = [model.heads[t].weight.grad is not None for t in STEP]
        model.zero_grad(set_to_none=True)  # again, as float32 and bfloat16 runs: a no-op scaler
        plain = stepped(model, stage, step_context(reference, scaled=False), gen(5))
        return loss, got, heads, plain

    loss, got, heads, (plain_loss, plain) = student(mine)
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
    from engine.flags import OptimConfig
    from engine.runtime import make_runtime

    scaler = ScaleBy8() if scaled else torch.amp.GradScaler("cpu", enabled=False)
    rt = replace(make_runtime("cpu", "fp32"), scaler=scaler)
    optim = OptimConfig(accumulate=2, l2sp=L2SP, max_grad_norm=0.0)  # the gradient unclipped
    return trainer.StepContext(rt, optim, reference=reference)
