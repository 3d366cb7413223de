"""The checks that grade exercises.py's exercises: one generator per exercise, by its name.

Each runs its exercise's piece on a small input, in eval and, where the piece has it, in
training (dropout by its statistics), and yields parts: its values and its gradients
beside an independent reference's (harness.Part). References come from Hugging Face's
BERT, torch, scipy and sklearn, or from references.py, the definitions written out, which
only the TA's grader holds. A piece that calls another exercise's gets a stand-in while it
is graded, so each exercise passes or fails on its own body. Nothing here imports an
exercise's module before its check runs: an open exercise stops only its own check.
"""

import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn

from harness import Part, cached, check, part, references
from setups import (
    P_DROP,
    STEP,
    ScaleBy8,
    StandInModel,
    additive,
    as_run,
    dropout_parts,
    f64,
    gen,
    grads,
    hf_attention_in,
    padded,
    stand_in_heads,
    stand_in_sentences,
    step_batches,
    stepped,
    tiny_multitask,
    tiny_pair,
    tiny_self_attention,
)

R = references()


# ---------------------------------------------------------------- the handout's BERT


@check(1e-6)
def attention():
    """BertSelfAttention.attention against the definition (a loop over batch, head and
    query) and torch's scaled_dot_product_attention, values and gradients; in training,
    dropout on the probabilities; the head split and merge against Hugging Face's."""
    ours = tiny_self_attention().attention
    B, nh, T, hs = 2, 3, 5, 4
    q, k, v = (torch.randn(B, nh, T, hs, generator=gen(i), dtype=f64) for i in range(3))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    keep = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    mask = additive(keep, f64)
    out, probs = ours(q, k, v, mask)
    w = torch.randn(out.shape, generator=gen(3), dtype=f64)
    got = grads(out, (q, k, v), w)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    yield part("output", out, lambda: sdpa)
    yield part("gradients of q, k, v", got, lambda: grads(sdpa, (q, k, v), w))
    yield part("probabilities", probs, lambda: R.attention(q, k, v, keep)[1])
    yield part("output against the loop", out, lambda: R.attention(q, k, v, keep)[0])

    def run(dtype, device):
        module = tiny_self_attention().to(dtype=dtype, device=device)
        qkv = [x.detach().to(dtype=dtype, device=device) for x in (q, k, v)]
        return module.attention(*qkv, additive(keep, dtype).to(device))[0]

    yield from as_run("output", run, out)
    yield from attention_dropout()
    yield from self_attention()


def attention_dropout():
    """Train mode, p = P_DROP, values [I | V]: the output's first T columns are the dropped
    probabilities themselves, the rest those times V; in eval mode no dropout."""
    module = tiny_self_attention(P_DROP)
    B, nh, T = 2, 3, 5
    q, k = (torch.randn(B, nh, T, T + 3, generator=gen(10 + i), dtype=f64) for i in range(2))
    extra = torch.randn(B, nh, T, 3, generator=gen(12), dtype=f64)
    v = torch.cat([torch.eye(T, dtype=f64).expand(B, nh, T, T), extra], -1)  # (B, nh, T, T + 3)
    mask = additive(torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]), f64)
    _, clean = module.attention(q, k, v, mask)
    torch.manual_seed(0)
    out, _ = module.train().attention(q, k, v, mask)
    dropped = out[..., :T]  # (B, nh, T, T)
    yield from dropout_parts("training", dropped, clean.detach())
    yield part(
        "training: output = dropped probabilities times v", out[..., T:], lambda: dropped @ extra
    )
    not_training, _ = module.eval().attention(q, k, v, mask)
    yield part("eval mode: no dropout", not_training, lambda: clean @ v)


def self_attention():
    """BertSelfAttention (queries, keys and values split into heads, attended, merged back)
    against Hugging Face's BertSelfAttention with the same weights, padded rows aside."""
    ours, hf = tiny_pair()
    mine, theirs = ours.encoder["layer"][0].attention["self"], hf.encoder.layer[0].attention.self
    mine.kind = "manual"
    _, _, keep = padded()
    x = torch.randn(3, 7, 32, generator=gen(1), dtype=f64).requires_grad_()
    out, ref = mine(x, additive(keep, f64)), theirs(x, attention_mask=additive(keep, f64))[0]
    w = torch.randn(out.shape, generator=gen(2), dtype=f64) * keep[..., None]  # padding unread
    yield part("BertSelfAttention's output", out[keep.bool()], lambda: ref[keep.bool()])
    yield part("BertSelfAttention's input gradient", grads(out, x, w), lambda: grads(ref, x, w))


@check(1e-9, stands_in=("attention",))
def layer():
    """BertLayer (add_norm, forward) against Hugging Face's BertLayer with the same weights,
    values and gradients, its feed-forward's exact GELU at inputs where tanh's differs; in
    training, add_norm's dropout on the dense output before the residual. Hugging Face's
    attention stands in for the attention exercise."""
    ours, hf = tiny_pair()
    hf_attention_in(ours, hf)
    mine, theirs = ours.encoder["layer"][0], hf.encoder.layer[0]
    with torch.no_grad():  # pre-activations of a few units: where the two GELUs differ
        for m in (mine.intermediate["dense"], theirs.intermediate.dense):
            m.weight.mul_(20)
    seen = {}
    mine.output.dense.register_forward_pre_hook(lambda m, a: seen.update(ours=a[0]))
    theirs.output.dense.register_forward_pre_hook(lambda m, a: seen.update(hf=a[0]))
    _, _, keep = padded()
    x = torch.randn(3, 7, 32, generator=gen(1), dtype=f64).requires_grad_()
    out, ref = mine(x, additive(keep, f64)), theirs(x, attention_mask=additive(keep, f64))
    ref = ref[0] if isinstance(ref, tuple) else ref
    rows = keep.bool()
    if "ours" in seen:  # a body calling F.linear on the weights skips the hook: "output" judges
        hf_act = seen["hf"][rows]
        yield part("the feed-forward's activation", seen["ours"][rows], lambda: hf_act, tol=1e-6)
    yield part("output", out[rows], lambda: ref[rows])
    w = torch.randn(out.shape, generator=gen(2), dtype=f64) * keep[..., None]  # padding unread
    ours_p, hf_p = (
        [p for n, p in m.named_parameters() if ".self." not in n] for m in (mine, theirs)
    )
    yield part("gradients", grads(out, [x, *ours_p], w), lambda: grads(ref, [x, *hf_p], w))
    probs = []
    mine(x, additive(keep, f64), probs)
    yield part("attention probabilities asked for: the layer's one", len(probs), 1)

    def run(dtype, device):  # both models moved, the stand-in attention bound anew
        o, h = (copy.deepcopy(m).to(dtype=dtype, device=device) for m in (ours, hf))
        hf_attention_in(o, h)
        inputs = x.detach().to(dtype=dtype, device=device)
        return o.encoder["layer"][0](inputs, additive(keep, dtype).to(device))

    yield from as_run("output", run, out)
    yield from add_norm_dropout(mine)
    yield from layer_in_training(mine, theirs, x, keep)


def layer_in_training(mine, theirs, x, keep, n: int = 1000):
    """The layer in training against Hugging Face's over n draws of their dropout, one
    sublayer's dropout at p = P_DROP and the other's off, then the other way: each output's
    mean (in standard errors) and variance (the mean ratio). Any inverted dropout passes
    (nn.Dropout, F.dropout, torch.dropout, a mask by hand); a dropout added, left out or
    moved does not. The attention's own dropout is off; the sublayers' dense weights are
    scaled up so that what they add is as large as the residual."""
    theirs.attention.self.dropout.p = 0.0  # the stand-in attention both layers share
    pairs = [
        (mine.attention["output"], theirs.attention.output),
        (mine.output, theirs.output),
    ]
    with torch.no_grad():
        for ours, hf in pairs:
            ours["dense"].weight.mul_(25), hf.dense.weight.mul_(25)
    for i, what in enumerate(("the attention's", "the feed-forward's")):
        for k, (ours, hf) in enumerate(pairs):
            ours["dropout"].p = hf.dropout.p = P_DROP if k == i else 0.0
        yield from drawn(mine, theirs, x, keep, n, f"training, {what} dropout only")


def drawn(mine, theirs, x, keep, n: int, what: str):
    """Both layers in training on n copies of x: the outputs' means and variances."""
    X = x.detach().repeat(n, 1, 1)  # (n * B, T, H)
    mask = additive(keep.repeat(n, 1), f64)
    with torch.no_grad():
        torch.manual_seed(0)
        out = mine.train()(X, mask).view(n, *x.shape)  # (n * B, T, H) -> (n, B, T, H)
        torch.manual_seed(1)
        ref = theirs.train()(X, attention_mask=mask)
        ref = (ref[0] if isinstance(ref, tuple) else ref).view(n, *x.shape)
    rows = keep.bool()
    out, ref = out[:, rows], ref[:, rows]  # (n, kept tokens, H)
    se = ((out.var(0) + ref.var(0)) / n).sqrt().clamp(min=1e-12)
    z = (out.mean(0) - ref.mean(0)) / se
    yield part(f"{what}: each output's mean, in standard errors", z, torch.zeros_like(z), tol=6.0)
    ratio = out.var(0).mean() / ref.var(0).mean()
    yield part(f"{what}: the outputs' variance / Hugging Face's", ratio, 1.0, tol=0.1)


def add_norm_dropout(layer):
    """add_norm in training at p = P_DROP with an identity dense layer and a real LayerNorm
    that only centres each row (eps 1e12, weight 1e6: y - mean(y), to 1e-11), so a body may
    call the modules or F.linear / F.layer_norm with their parameters. The input's first
    column is 0, so the row's mean comes back from it: what is left minus the centred
    residual must be the input, dropped or scaled by 1 / (1 - p)."""
    layer = copy.deepcopy(layer).train()
    dense, norm = nn.Linear(32, 32).double(), nn.LayerNorm(32, eps=1e12).double()
    with torch.no_grad():
        dense.weight.copy_(torch.eye(32))
        dense.bias.zero_()
        norm.weight.fill_(1e6)
    x, residual = (torch.randn(2, 6, 32, generator=gen(i), dtype=f64) for i in (4, 5))
    x[..., 0] = 0.0
    torch.manual_seed(0)
    out = layer.add_norm(residual, x, dense, nn.Dropout(P_DROP), norm)
    dropped = out - (residual - residual.mean(-1, keepdim=True))  # dropout(x) - its row mean
    dropped = dropped - dropped[..., :1]  # (2, 6, 32): the mean comes back from column 0
    yield from dropout_parts("add_norm in training", dropped[..., 1:], x[..., 1:])


@check(1e-9)
def embeddings():
    """BertEmbeddings (word + position + token type, LayerNorm) against Hugging Face's with
    the same weights, values and gradients; in training, dropout after the LayerNorm."""
    ours, hf = tiny_pair()
    ids, types, _ = padded()
    out, ref = ours.embeddings(ids, types), hf.embeddings(ids, token_type_ids=types)
    yield part("output", out, lambda: ref)
    w = torch.randn(out.shape, generator=gen(1), dtype=f64)
    yield part(
        "gradients of the tables and LayerNorm",
        grads(out, list(ours.embeddings.parameters()), w),
        lambda: grads(ref, list(hf.embeddings.parameters()), w),
    )

    def run(dtype, device):
        module = copy.deepcopy(ours.embeddings).to(dtype=dtype, device=device)
        return module(ids.to(device), types.to(device))

    yield from as_run("output", run, out)
    ours.embeddings.train().dropout.p = P_DROP
    torch.manual_seed(0)
    yield from dropout_parts("training", ours.embeddings(ids, types), out.detach())


def adamw_runs(opt_class, steps: int = 20, **options) -> torch.Tensor:
    """A small network's parameters, flat, after `steps` steps of opt_class: two parameter
    groups (the defaults, weight decay 0.1 and lr 1e-2; decay 0.02 at lr 3e-3), the first
    holding a parameter with a gradient every other step only, so step counts differ."""
    torch.manual_seed(0)
    first, second = nn.Linear(4, 3).double(), nn.Linear(3, 2).double()
    extra = nn.Parameter(torch.randn(2, dtype=f64))
    groups = [
        {"params": [*first.parameters(), extra]},
        {"params": second.parameters(), "weight_decay": 0.02, "lr": 3e-3},
    ]
    opt = opt_class(groups, lr=1e-2, weight_decay=0.1, eps=1e-6, **options)
    g = gen(1)
    for step in range(steps):
        x = torch.randn(8, 4, generator=g, dtype=f64)
        opt.zero_grad(set_to_none=True)
        y = second(torch.tanh(first(x)))  # (8, 2)
        loss = y.pow(2).sum() + ((extra * y).sum() if step % 2 == 0 else 0.0)
        loss.backward()  # extra: no gradient (None) at odd steps
        opt.step()
    return torch.cat(
        [p.detach().flatten() for p in (*first.parameters(), *second.parameters(), extra)]
    )


def handout(**how):
    """The handout's AdamW run, with its choices `how` (references.HandoutAdamW)."""
    return lambda: adamw_runs(R.HandoutAdamW, **how)


ADAMW_REFERENCES = {
    "torch.optim.AdamW": lambda: adamw_runs(torch.optim.AdamW),
    "the handout's AdamW": handout(),
    "the handout's AdamW, decay first": handout(decay_first=True),
    "the handout's AdamW, torch's eps": handout(eps_on_v_hat=True),
}
UNBIASED_REFERENCES = {  # without the correction, torch's arithmetic is the handout's, decay first
    "torch.optim.AdamW": handout(correct_bias=False, decay_first=True),
    "the handout's AdamW": handout(correct_bias=False),
}


@check(1e-6)
def adamw():
    """optimizer.AdamW.step, as the handout asks: the handout's optimizer_test.py recipe
    against its optimizer_test.npy, under its tolerance; parameters after 20 steps with
    weight decay against torch.optim.AdamW or the handout's AdamW (Kingma & Ba's efficient
    bias correction, decay after the update) or either's mix of the two choices; and with
    correct_bias=False."""
    from optimizer import AdamW

    yield handout_test(AdamW)
    got = adamw_runs(AdamW)
    yield Part("parameters after 20 steps", got, ADAMW_REFERENCES)
    unbiased = adamw_runs(AdamW, correct_bias=False)
    yield Part("correct_bias=False", unbiased, UNBIASED_REFERENCES)


@functools.cache
def handout_weight() -> tuple[torch.Tensor, str]:
    """optimizer_test.reference(), read (or fitted) once per grader process."""
    import optimizer_test as ot

    return ot.reference()


def handout_test(opt_class, **options) -> Part:
    """optimizer_test.py's recipe (1000 steps of a Linear(3, 2)): the weight's distance to
    the handout's optimizer_test.npy (torch.optim.AdamW's where there is none) in units of
    its tolerance, atol + rtol * |weight|: at most 1 passes, as its allclose does."""
    import optimizer_test as ot

    expected, source = handout_weight()
    got = ot.fit(opt_class, **options).double()
    units = (got - torch.as_tensor(expected).double()).abs() / (ot.ATOL + ot.RTOL * got.abs())
    against = ot.NPY if source.endswith(ot.NPY) else f"torch.optim.AdamW: no {ot.NPY} here"
    label = f"the handout's optimizer_test.py, in units of its tolerance, against {against}"
    return part(label, units, lambda: torch.zeros_like(units), tol=1.0)


# ---------------------------------------------------------------- the handout's multitask model


@check(1e-6)
def classifier():
    """The sentiment classifier's readout (MultitaskBERT.readout of a single sentence):
    dropout on the pooled sentence, then the task's linear head; its logits in eval, their
    mean and variance in training (p = P_DROP, 4,000 draws) against dropout's before the head."""
    model = tiny_multitask(("sst", "cfimdb"), dropout=P_DROP).eval()
    z = torch.randn(3, 32, generator=gen(0)).requires_grad_()
    single = {"input_ids": torch.zeros(3, 7, dtype=torch.long)}  # (B, T): one sentence each
    for task in ("sst", "cfimdb"):
        logits, head = model.readout(task, single, z), model.heads[task]
        yield part(f"{task} logits", logits, lambda t=task: R.sentiment_logits(z, model.heads[t]))
        if logits.shape != (3, head.out_features):
            continue  # its logits' part fails
        ins, w = [z, *head.parameters()], torch.randn(logits.shape, generator=gen(4))
        expected = lambda h=head, ins=ins, w=w: grads(R.sentiment_logits(z, h), ins, w)  # noqa: E731
        yield part(
            f"{task}: gradients of the sentences and the head", grads(logits, ins, w), expected
        )
    one = model.readout("sst", {"input_ids": torch.zeros(1, 7, dtype=torch.long)}, z[:1])
    yield part(
        "a batch of one: (1, C) logits", one, lambda: R.sentiment_logits(z[:1], model.heads["sst"])
    )
    z = z.detach()

    def run(dtype, device):
        moved = copy.deepcopy(model).to(dtype=dtype, device=device)
        return moved.readout("sst", single, z.to(dtype=dtype, device=device))

    yield from as_run("sst logits", run, model.readout("sst", single, z))
    head, n = model.heads["sst"], 4000
    model.train()
    torch.manual_seed(0)
    draws = model.readout("sst", {"input_ids": torch.zeros(3 * n, 7)}, z.repeat(n, 1))
    draws = draws.detach().double().view(n, 3, -1)  # (n * B, C) -> (n, B, C)
    expected = head(z).detach().double()  # (B, C): E[W dropout(z) + b] = W z + b
    var = P_DROP / (1 - P_DROP) * (head.weight.double() ** 2) @ (z.double() ** 2).T  # (C, B)
    se = (var.T / n).sqrt()
    yield part(
        "training: the mean of the logits, in standard errors",
        (draws.mean(0) - expected) / se,
        lambda: torch.zeros_like(expected),
        tol=5.0,
    )
    yield part(
        "training: the logits' variance / dropout's before the head",
        draws.var(0) / var.T,
        lambda: torch.ones_like(expected),
        tol=0.15,
    )


@check(1e-5, stands_in=("attention", "layer", "embeddings", "mean_pool", "classifier", "pair_head"))
def multitask():
    """The handout's predict_sentiment, predict_paraphrase and predict_similarity against
    the model's own forward on the batches they stand for (pairs of different lengths; a
    stand-in encoder), and the STS head's 0-5 score of the cosine."""
    model = tiny_multitask(("sst", "para", "sts")).eval()
    stand_in_sentences(model)
    stand_in_heads(model)
    ids1, _, m1 = padded(B=3, T=7, seed=1)
    ids2, _, m2 = padded(B=3, T=4, seed=2)
    m2[0, 3:] = 0
    zeros = torch.zeros_like(ids1)
    single = {"input_ids": ids1, "attention_mask": m1, "token_type_ids": zeros}
    yield part("predict_sentiment", model.predict_sentiment(ids1, m1), lambda: model("sst", single))
    for task, method in (("para", model.predict_paraphrase), ("sts", model.predict_similarity)):
        for sides in ((ids1, m1, ids2, m2), (ids2, m2, ids1, m1)):  # the longer first, then second
            got = method(*sides)
            expected = lambda t=task, s=sides: model(t, R.pair_batch(*s))  # noqa: E731
            yield part(
                f"{method.__name__}, sides of {sides[0].size(1)} and {sides[2].size(1)}",
                got,
                expected,
            )
    u, v = torch.randn(2, 4, 32, generator=gen(3)).requires_grad_().unbind(0)
    pair = {"input_ids": torch.zeros(2, 4, 5, dtype=torch.long)}  # (2, B, T): siamese pairs
    score = model.readout("sts", pair, torch.cat([u, v]))
    yield part("the STS head's score", score, lambda: R.sts_score(u, v))
    w = torch.randn(4, generator=gen(4))
    expected = lambda: grads(R.sts_score(u, v), (u, v), w)  # noqa: E731
    yield part("the STS score's gradients of u and v", grads(score, (u, v), w), expected)
    yield from batch_of_one(model)
    same = model.readout("sts", pair, torch.cat([u, u]))
    yield part("the STS score of identical sentences", same, lambda: torch.full((4,), 5.0))


def batch_of_one(model):
    """predict_* on one example of sides of 5 and 3 tokens: (1, 5) logits, (1,) scores."""
    ids1, _, m1 = padded(B=1, T=5, seed=5)
    ids2, _, m2 = padded(B=1, T=3, seed=6)
    yield part(
        "a batch of one: predict_sentiment's shape",
        list(model.predict_sentiment(ids1, m1).shape),
        [1, 5],
    )
    for method in (model.predict_paraphrase, model.predict_similarity):
        got = list(method(ids1, m1, ids2, m2).shape)
        yield part(f"a batch of one: {method.__name__}'s shape", got, [1])


@check(
    1e-6,
    stands_in=(
        "attention",
        "layer",
        "embeddings",
        "mean_pool",
        "classifier",
        "pair_head",
        "multitask",
    ),
)
def multitask_step():
    """One update of trainer.train_step over SST, Quora and STS together (random loss
    weights, two micro-batches of unequal size, an L2-SP pull, a loss scaler): its loss,
    detached, and the gradient it hands the optimizer, against the weighted sum of the
    tasks' losses, differentiated once."""
    from dataclasses import replace

    import trainer
    from engine.flags import MultitaskConfig, OptimConfig
    from engine.runtime import make_runtime
    from losses import loss_of
    from optimizer import loss_weights
    from presets import Stage

    model = StandInModel()
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen(1)))
    stage = Stage(STEP, 1e-3, 5, kind="multitask", multitask=MultitaskConfig(weighting="random"))
    rt = replace(make_runtime("cpu", "fp32"), scaler=ScaleBy8())
    ctx = trainer.StepContext(rt, OptimConfig(accumulate=2, l2sp=0.5), reference=reference)
    loss, got = stepped(model, stage, ctx, gen(5))
    heads = torch.tensor([model.heads[t].weight.grad is not None for t in STEP])
    yield part("every task's head has a gradient", heads, torch.ones(3, dtype=torch.bool))
    yield part("the step's loss keeps no graph", loss.requires_grad, False)

    def task_loss(task, batch):  # the task's default loss of the stand-in's output
        out = model.readout(task, batch, model.sentences(batch))
        return loss_of(task, None).fn(out.float(), batch["labels"])

    @cached  # one reference graph: its value, then its gradient
    def expected():
        weights = loss_weights(3, "random", gen(5))
        total = R.multitask_loss(model, step_batches(), weights, task_loss)
        return total + trainer.l2sp_pull(model, ctx)

    yield part("the step's loss", loss, expected)
    yield part("the gradient", got, lambda: grads(expected(), list(model.parameters()), 1.0))
