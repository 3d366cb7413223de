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
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from harness import Part, cached, check, part, references

R = references()
f64 = torch.float64
STEP = ("sst", "para", "sts")  # the multitask step's tasks
# dropout's p in the training-mode parts: not 0.5 (a p written into the body instead of the
# one given would pass) and a whole number of 2^-16 (this project's CPU dropout draws 16 bits)
P_DROP = 0.375
KEPT = 1 / (1 - P_DROP)  # each kept value's scale: 1.6


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tiny_config(**overrides):
    """A 2-layer BERT of hidden size 32, small enough to check in milliseconds."""
    from base_bert import BertConfig

    sizes = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    return BertConfig(**sizes, intermediate_size=64, max_position_embeddings=64, **overrides)


def tiny_pair():
    """(our BertModel, Hugging Face's) with the same random weights, in eval mode."""
    import transformers

    from base_bert import hf_to_ours
    from bert import BertModel

    cfg = tiny_config()
    torch.manual_seed(0)
    fields = {k: v for k, v in cfg.to_dict().items() if k != "attention"}
    hf = transformers.BertModel(transformers.BertConfig(**fields, attn_implementation="eager"))
    ours = BertModel(cfg)
    ours.load_state_dict({hf_to_ours(k): v for k, v in hf.state_dict().items() if hf_to_ours(k)})
    return ours.double().eval(), hf.double().eval()


def padded(B=3, T=7, vocab=100, seed=0):
    """(ids, token types, mask) with padding in one row and both token types."""
    ids = torch.randint(1, vocab, (B, T), generator=gen(seed))
    types = (torch.arange(T) >= T // 2).long().expand(B, T).clone()
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, T - 3 :] = 0
    return ids, types, mask


def additive(keep, dtype=torch.float32):
    """(B, T) 1/0 -> (B, 1, 1, T): 0 where kept, the dtype's most negative where padded."""
    return (1.0 - keep[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


def grads(y, inputs, w):
    """The gradients of sum(y * w) with respect to each input, stacked flat."""
    return torch.cat([g.flatten() for g in torch.autograd.grad((y * w).sum(), inputs)])


def dropout_parts(what: str, got, clean):
    """Inverted dropout at p = P_DROP: each element of `got` is 0 or KEPT times its `clean`
    value, and about P_DROP of them are 0."""
    kept = clean.abs() > 1e-6
    ratio = got[kept] / clean[kept]
    yield part(
        f"{what}: each value dropped (0) or kept and scaled by 1 / (1 - p) ({KEPT:g}x)",
        torch.minimum(ratio.abs(), (ratio - KEPT).abs()),
        lambda: torch.zeros(len(ratio)),
        tol=1e-5,
    )
    share = (ratio.abs() < 1e-6).double().mean()
    yield part(f"{what}: the share dropped at p = {P_DROP}", share, lambda: P_DROP, tol=0.15)


# ---------------------------------------------------------------- the handout's BERT


def tiny_self_attention(p: float = 0.0):
    """bert.py's BertSelfAttention of the tiny config, attention dropout p, in eval mode."""
    from bert import BertSelfAttention

    return BertSelfAttention(tiny_config(attention_probs_dropout_prob=p)).double().eval()


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


def hf_attention_in(ours, hf, i: int = 0):
    """Layer i's BertSelfAttention of ours answered by Hugging Face's (same weights): the
    attention exercise's stand-in while another is graded. Given a list, it appends one
    tensor, as the real one appends its probabilities."""
    theirs = hf.encoder.layer[i].attention.self

    def forward(x, mask, probs=None):
        if probs is not None:
            probs.append(torch.zeros(()))
        return theirs(x, attention_mask=mask)[0]

    ours.encoder["layer"][i].attention["self"].forward = forward


@contextmanager
def same_masks():
    """Every dropout (F.dropout, nn.Dropout, this project's) draws its mask from the number
    of its call: two forwards that drop the same tensors in the same order drop them alike,
    and a dropout more, less or elsewhere changes what follows. Yields `restart`, which
    numbers the calls from the start again."""
    import bert
    from engine import runtime

    calls = [0]

    def dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return x
        calls[0] += 1
        keep = torch.rand(x.shape, generator=gen(1000 + calls[0]), dtype=f64) >= p
        return x * keep.to(x.dtype) / (1 - p)

    saved = [(m, m.dropout) for m in (F, runtime, bert) if hasattr(m, "dropout")]
    for m, _ in saved:
        m.dropout = dropout
    try:
        yield lambda: calls.__setitem__(0, 0)
    finally:
        for m, fn in saved:
            m.dropout = fn


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
    yield from add_norm_dropout(mine)
    yield from layer_in_training(mine, theirs, x, keep)


def layer_in_training(mine, theirs, x, keep):
    """The layer in training against Hugging Face's, every dropout drawing the same masks
    in the same order (same_masks): a dropout added, left out or moved changes the output."""
    mine.train(), theirs.train()
    with same_masks() as restart:
        out = mine(x, additive(keep, f64))
        restart()
        ref = theirs(x, attention_mask=additive(keep, f64))
    ref = ref[0] if isinstance(ref, tuple) else ref
    rows = keep.bool()
    yield part("output in training (dropout's masks shared)", out[rows], lambda: ref[rows])


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
    ours.embeddings.train().dropout.p = P_DROP
    torch.manual_seed(0)
    yield from dropout_parts("training", ours.embeddings(ids, types), out.detach())


def adamw_runs(opt_class, steps: int = 20, **options) -> torch.Tensor:
    """A small network's parameters, flat, after `steps` steps of opt_class with weight decay."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)).double()
    opt = opt_class(model.parameters(), lr=1e-2, weight_decay=0.1, eps=1e-6, **options)
    g = gen(1)
    for _ in range(steps):
        x = torch.randn(8, 4, generator=g, dtype=f64)
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


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


def tiny_multitask(tasks, dropout=0.1):
    from bert import BertModel
    from multitask_classifier import MultitaskBERT

    torch.manual_seed(0)
    return MultitaskBERT(BertModel(tiny_config()), tasks=tasks, dropout=dropout)


@check(1e-6)
def classifier():
    """The sentiment classifier's readout (MultitaskBERT.readout of a single sentence):
    dropout on the pooled sentence, then the task's linear head; its logits in eval, their
    mean and variance in training (p = P_DROP, 4,000 draws) against dropout's before the head."""
    model = tiny_multitask(("sst", "cfimdb"), dropout=P_DROP).eval()
    z = torch.randn(3, 32, generator=gen(0))
    single = {"input_ids": torch.zeros(3, 7, dtype=torch.long)}  # (B, T): one sentence each
    for task in ("sst", "cfimdb"):
        logits = model.readout(task, single, z)
        yield part(f"{task} logits", logits, lambda t=task: R.sentiment_logits(z, model.heads[t]))
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


def stand_in_sentences(model):
    """model.sentences answered by a sum of fixed vectors per id, position and token type
    over the tokens each mask keeps: the encoder's stand-in while predict_* is graded."""
    table, position = torch.randn(2, 100, 32, generator=gen(7))

    def sentences(batch, embeds=None):
        ids, mask, types = model.flat_inputs(batch)
        T = ids.size(1)
        x = table[ids] + position[:T] + types[..., None] * table[0]  # (N, T, H)
        return (x * mask[..., None]).sum(1)  # (N, H)

    model.sentences = sentences


def stand_in_heads(model):
    """model.readout of one sentence and of a Quora pair answered by fixed functions that
    are not the exercises' (the classifier's and pair_head's stand-ins), the STS score by
    the model's own: predict_* is graded on the batches it builds."""
    readout = model.readout

    def heads(task, batch, z):
        if batch["input_ids"].dim() == 2:  # (B, T): one sentence each
            return model.heads[task](torch.tanh(z))  # (B, C)
        if task == "para":
            u, v = z.view(2, -1, z.size(-1))  # (2B, H) -> (B, H) each
            return model.heads[task](torch.cat([u, v, u * v], -1)).squeeze(-1)  # (B,)
        return readout(task, batch, z)

    model.readout = heads


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
    u, v = torch.randn(2, 4, 32, generator=gen(3))
    pair = {"input_ids": torch.zeros(2, 4, 5, dtype=torch.long)}  # (2, B, T): siamese pairs
    score = model.readout("sts", pair, torch.cat([u, v]))
    yield part("the STS head's score", score, lambda: R.sts_score(u, v))
    same = model.readout("sts", pair, torch.cat([u, u]))
    yield part("the STS score of identical sentences", same, lambda: torch.full((4,), 5.0))


class StandInModel(nn.Module):
    """What a training step calls of MultitaskBERT, answered by an embedding table and one
    linear head per task: the step's check needs none of the other exercises."""

    def __init__(self):
        super().__init__()
        from evaluation import TASKS

        torch.manual_seed(0)
        self.bert = nn.Embedding(50, 8)
        self.heads = nn.ModuleDict(
            {t: nn.Linear(8 * (1 + 2 * TASKS[t].pair), TASKS[t].num_labels or 1) for t in STEP}
        )

    def embed(self, batch):
        return self.bert(batch["input_ids"].flatten(0, -2))  # (N, T, 8)

    def sentences(self, batch, embeds=None):
        return (self.embed(batch) if embeds is None else embeds).mean(1)  # (N, 8)

    def readout(self, task, batch, z):
        if batch["input_ids"].dim() == 3:  # (2B, 8) -> [u, v, u * v]: (B, 24)
            u, v = z.view(2, -1, z.size(-1))
            z = torch.cat([u, v, u * v], -1)
        out = self.heads[task](z)
        return out if out.size(-1) > 1 else out.squeeze(-1)


def step_batches():
    """[(task, batch)] of five examples each for SST, Quora and STS: two micro-batches of
    three and two."""
    ids = torch.randint(0, 50, (2, 5, 6), generator=gen(0))
    ones = torch.ones_like(ids)
    pair = {"input_ids": ids, "attention_mask": ones, "token_type_ids": 0 * ids}
    single = {k: v[0] for k, v in pair.items()}
    return [
        ("sst", single | {"labels": torch.tensor([0, 4, 2, 1, 3])}),
        ("para", pair | {"labels": torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])}),
        ("sts", pair | {"labels": torch.tensor([0.5, 4.0, 2.5, 3.0, 1.0])}),
    ]


class ScaleBy8:
    """A loss scaler's one call a step makes before its backward: times 8."""

    def scale(self, loss):
        return loss * 8


def stepped(model, stage, ctx, generator):
    """(loss, the gradient handed to the optimizer, unscaled) of one trainer.train_step,
    the optimizer's step itself left out."""
    import trainer

    seen = {}

    def capture(optimizer, scaler, max_norm):
        seen["grads"] = torch.cat([p.grad.flatten() for p in model.parameters()]) / 8
        return torch.tensor(0.0)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    saved, trainer.optimizer_step = trainer.optimizer_step, capture
    try:
        loss, _ = trainer.train_step(model, optimizer, stage, step_batches(), ctx, generator)
    finally:
        trainer.optimizer_step = saved
    return loss, seen["grads"]


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
