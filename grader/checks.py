"""The checks that grade exercises.py's exercises: one generator per exercise, by its name.

Each runs its exercise's piece on a small input, in eval and, where the piece has it, in
training (dropout by its statistics), and yields parts: its values and its gradients
beside an independent reference's (harness.Part). References come from Hugging Face's
BERT, torch, scipy and sklearn, or from references.py, the definitions written out, which
only the TA's grader holds. A piece that calls another exercise's gets a stand-in while it
is graded, so each exercise passes or fails on its own body. Nothing here imports an
exercise's module before its check runs: an open exercise stops only its own check.
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn

import definitions as D
from harness import Part, cached, check, judging, part, references, student
from setups import (
    P_DROP,
    additive,
    as_run,
    classifier_head,
    dropout_parts,
    f64,
    first_steps,
    gen,
    grads,
    logits_in_training,
    padded,
    second_tensor_first_step,
    seeded_heads,
    stand_in_classifier,
    stand_in_table,
    tiny_self_attention,
)
from tiny_bert import attention_in, ours_like, tiny_hf, tiny_weights

R = references()


# ---------------------------------------------------------------- the handout's BERT


def heads(out, nh: int):
    """The attention's merged output (B, T, H) seen per head: (B, nh, T, hs); any other
    shape as it is (its part then fails in shape)."""
    if not torch.is_tensor(out) or out.dim() != 3 or out.size(-1) % nh:
        return out
    B, T, H = out.shape
    return out.view(B, T, nh, H // nh).transpose(1, 2)  # (B, T, nh, hs) -> (B, nh, T, hs)


NH, HS = 4, 8  # the tiny config's heads and head size (hidden 32)


@check(1e-6)
def attention():
    """BertSelfAttention.attention(key, query, value, attention_mask), the heads merged back
    (B, T, H), against the definition (a loop over batch, head and query) and torch's
    scaled_dot_product_attention, values and gradients; its probabilities, read through a
    value that is the identity; in training, dropout on the probabilities; the whole
    BertSelfAttention against Hugging Face's."""
    B, T = 2, 5
    q, k, v = (torch.randn(B, NH, T, HS, generator=gen(i), dtype=f64) for i in range(3))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    keep = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    mask = additive(keep, f64)
    w = torch.randn(B, T, NH * HS, generator=gen(3), dtype=f64)
    eye = torch.eye(T, HS, dtype=f64).expand(B, NH, T, HS)  # value = [I | 0]: out = probs

    def mine():
        module = tiny_self_attention()
        out = module.attention(k, q, v, mask)
        probs = heads(module.attention(k.detach(), q.detach(), eye, mask), NH)
        one = module.attention(k[:1], q[:1], v[:1], mask[:1]).detach()
        shaped = torch.is_tensor(out) and out.shape == w.shape  # else the output's part fails
        return out, probs, grads(out, (q, k, v), w) if shaped else None, one

    out, probs, got, one = student(mine)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, nh, T, hs)
    merged = sdpa.transpose(1, 2).flatten(2)  # (B, T, H)
    yield part("output (B, T, H), the heads merged", out, lambda: merged)
    yield part("a batch of one: (1, T, H)", one, lambda: merged[:1].detach())
    yield part("gradients of query, key, value", got, lambda: grads(merged, (q, k, v), w))
    probs = probs[..., :T] if torch.is_tensor(probs) and probs.dim() == 4 else probs
    yield part("probabilities (value = identity)", probs, lambda: R.attention(q, k, v, keep)[1])
    loop = lambda: R.attention(q, k, v, keep)[0].transpose(1, 2).flatten(2)  # noqa: E731
    yield part("output against the loop", out, loop)

    def run(dtype, device):
        module = tiny_self_attention().to(dtype=dtype, device=device)
        qkv = [x.detach().to(dtype=dtype, device=device) for x in (k, q, v)]
        return module.attention(*qkv, additive(keep, dtype).to(device))

    yield from as_run("output", run, out)
    yield from attention_dropout()
    yield from self_attention()


def attention_dropout():
    """Train mode, p = P_DROP, value [I | V]: each head's first T columns are the dropped
    probabilities themselves, the rest those times V; in eval mode no dropout."""
    B, T = 2, 5
    q, k = (torch.randn(B, NH, T, HS, generator=gen(10 + i), dtype=f64) for i in range(2))
    extra = torch.randn(B, NH, T, HS - T, generator=gen(12), dtype=f64)
    v = torch.cat([torch.eye(T, dtype=f64).expand(B, NH, T, T), extra], -1)  # (B, nh, T, hs)
    keep = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    mask = additive(keep, f64)

    def mine():
        module = tiny_self_attention(P_DROP)
        clean = heads(module.attention(k, q, v, mask), NH)
        torch.manual_seed(0)
        out = heads(module.train().attention(k, q, v, mask), NH)
        return clean, out, heads(module.eval().attention(k, q, v, mask), NH)

    clean, out, not_training = student(mine)
    if not all(torch.is_tensor(x) and x.shape == v.shape for x in (clean, out)):
        yield part("training: output (B, T, H), the heads merged", out, lambda: v)
        return
    dropped = out[..., :T]  # (B, nh, T, T)
    yield from dropout_parts("training", dropped, clean[..., :T].detach())
    yield part(
        "training: output = dropped probabilities times value",
        out[..., T:],
        lambda: dropped.to(extra.dtype) @ extra,
    )
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
    yield part("eval mode: no dropout", not_training, sdpa)


def self_attention():
    """BertSelfAttention (queries, keys and values projected and split into heads by the
    given transform, attended, merged back) against Hugging Face's BertSelfAttention with
    the same weights, padded rows aside."""
    weights = tiny_weights()
    _, _, keep = padded()
    x = torch.randn(3, 7, 32, generator=gen(1), dtype=f64).requires_grad_()
    w = torch.randn(3, 7, 32, generator=gen(2), dtype=f64) * keep[..., None]  # padding unread

    def mine():
        ours = ours_like(weights).bert_layers[0].self_attention
        ours.kind = "manual"
        out = ours(x, additive(keep, f64))
        shaped = torch.is_tensor(out) and out.shape == w.shape  # else the output's part fails
        return out, grads(out, x, w) if shaped else None

    out, got = student(mine)
    theirs = cached(  # the judge's: Hugging Face's attention of the same weights
        lambda: tiny_hf(weights).encoder.layer[0].attention.self(x, additive(keep, f64))[0]
    )
    rows = keep.bool()
    if torch.is_tensor(out) and out.shape == w.shape:
        yield part("BertSelfAttention's output", out[rows], lambda: theirs()[rows])
    else:
        yield part("BertSelfAttention's output (B, T, H)", out, theirs)
    yield part("BertSelfAttention's input gradient", got, lambda: grads(theirs(), x, w))


def tiny_layer(weights):
    """bert.py's BertLayer 0 holding `weights` (the student's side), StandInAttention
    answering for the attention exercise."""
    ours = ours_like(weights)
    attention_in(ours, weights)
    return ours.bert_layers[0]


def hooked_reference(weights, x, keep):
    """Hugging Face's layer 0 of `weights` (the judge's side), its output on x, and what its
    sublayers handed on: `a`, the attention's close (the feed-forward's input), `hf`, the
    feed-forward's activation."""
    theirs, seen = tiny_hf(weights).encoder.layer[0], {}
    theirs.output.dense.register_forward_pre_hook(lambda m, a: seen.update(hf=a[0]))
    theirs.intermediate.dense.register_forward_pre_hook(lambda m, a: seen.update(a=a[0]))
    ref = theirs(x, attention_mask=additive(keep, f64))
    return theirs, (ref[0] if isinstance(ref, tuple) else ref), seen


@check(1e-9, stands_in=("attention",))
def layer():
    """BertLayer (add_norm, forward) against Hugging Face's BertLayer with the same weights,
    values and gradients, its feed-forward's exact GELU at inputs where tanh's differs; in
    training, add_norm's dropout on the dense output before the residual. The attention
    exercise's stand-in (StandInAttention) answers for it."""
    weights = tiny_weights()  # pre-activations of a few units: where the two GELUs differ
    weights["encoder.layer.0.intermediate.dense.weight"].mul_(20)
    _, _, keep = padded()
    x = torch.randn(3, 7, 32, generator=gen(1), dtype=f64).requires_grad_()
    w = torch.randn(3, 7, 32, generator=gen(2), dtype=f64) * keep[..., None]  # padding unread

    def mine():
        layer, seen = tiny_layer(weights), {}
        layer.attention_layer_norm.register_forward_hook(lambda m, a, o: seen.update(ln=o))
        layer.interm_dense.register_forward_pre_hook(lambda m, a: seen.update(a=a[0]))
        layer.out_dense.register_forward_pre_hook(lambda m, a: seen.update(ours=a[0]))
        out = layer(x, additive(keep, f64))
        params = [p for n, p in layer.named_parameters() if not n.startswith("self_attention.")]
        hooked = (seen.get("ln"), seen.get("a"), seen.get("ours"))
        return out, hooked, grads(out, [x, *params], w)

    out, (normed, closed, activation), got = student(mine)
    found = cached(lambda: hooked_reference(weights, x, keep))  # (layer, output, seen)
    rows = keep.bool()
    hf_closed = lambda: found()[2]["a"][rows]  # noqa: E731  (the attention's close: first)
    if normed is not None:  # a body calling F.layer_norm on the weights skips the hook
        yield part("the attention sublayer's add_norm", normed[rows], hf_closed)
    if closed is not None:
        yield part("the feed-forward's input (interm_dense's)", closed[rows], hf_closed)
    if activation is not None:  # a body calling F.linear on the weights skips the hook
        hf_act = lambda: found()[2]["hf"][rows]  # noqa: E731
        yield part("the feed-forward's activation", activation[rows], hf_act, tol=1e-6)
    yield part("output", out[rows], lambda: found()[1][rows])

    def expected():
        theirs, ref, _ = found()
        return grads(ref, [x, *(p for n, p in theirs.named_parameters() if ".self." not in n)], w)

    yield part("gradients", got, expected)

    def run(dtype, device):  # the model and its stand-in attention moved together
        o = ours_like(weights).to(dtype=dtype, device=device)
        attention_in(o, weights)
        inputs = x.detach().to(dtype=dtype, device=device)
        return o.bert_layers[0](inputs, additive(keep, dtype).to(device))

    yield from as_run("output", run, out)
    yield from add_norm_dropout(weights)
    yield from layer_in_training(weights, x, keep)


def layer_in_training(weights, x, keep, n: int = 1000):
    """The layer in training against Hugging Face's over n draws of their dropout, one
    sublayer's dropout at p = P_DROP and the other's off, then the other way: each output's
    mean (in standard errors) and variance (the mean ratio). Any inverted dropout passes
    (nn.Dropout, F.dropout, torch.dropout, a mask by hand); a dropout added, left out or
    moved does not. The attention's own dropout is off (the stand-in's, Hugging Face's);
    the sublayers' dense weights are scaled up so that what they add is as large as the
    residual."""
    weights = {k: v.clone() for k, v in weights.items()}
    at = "encoder.layer.0."
    for name in ("attention.output.dense.weight", "output.dense.weight"):
        weights[at + name].mul_(25)
    X = x.detach().repeat(n, 1, 1)  # (n * B, T, H)
    mask, rows = additive(keep.repeat(n, 1), f64), keep.bool()
    for i, what in enumerate(("the attention's", "the feed-forward's")):
        p = [P_DROP if k == i else 0.0 for k in range(2)]

        def mine(p=p):
            layer = tiny_layer(weights)
            layer.attention_dropout.p, layer.out_dropout.p = p
            torch.manual_seed(0)
            with torch.no_grad():
                return layer.train()(X, mask).view(n, *x.shape)[:, rows]  # (n, kept, H)

        def theirs(p=p):  # the judge's: Hugging Face's layer, the same dropouts
            layer = tiny_hf(weights).encoder.layer[0].train()
            layer.attention.self.dropout.p = 0.0
            layer.attention.output.dropout.p, layer.output.dropout.p = p
            torch.manual_seed(1)
            with torch.no_grad():
                ref = layer(X, attention_mask=mask)
            return (ref[0] if isinstance(ref, tuple) else ref).view(n, *x.shape)[:, rows]

        yield from drawn(student(mine), cached(theirs), n, f"training, {what} dropout only")


def drawn(out, ref, n: int, what: str):
    """Two layers' outputs over n draws, (n, kept tokens, H), the reference's computed by
    `ref()` (the judge's: the student's side yields nothing here): their means and
    variances."""
    if not judging():
        return
    ref = ref()
    se = ((out.var(0) + ref.var(0)) / n).sqrt().clamp(min=1e-12)
    z = (out.mean(0) - ref.mean(0)) / se
    yield part(f"{what}: each output's mean, in standard errors", z, torch.zeros_like(z), tol=6.0)
    ratio = out.var(0).mean() / ref.var(0).mean()
    yield part(f"{what}: the outputs' variance / Hugging Face's", ratio, 1.0, tol=0.1)


def add_norm_dropout(weights):
    """add_norm in training at p = P_DROP with an identity dense layer and a real LayerNorm
    that only centres each row (eps 1e12, weight 1e6: y - mean(y), to 1e-11), so a body may
    call the modules or F.linear / F.layer_norm with their parameters. The input's first
    column is 0, so the row's mean comes back from it: what is left minus the centred
    residual must be the input, dropped or scaled by 1 / (1 - p)."""
    dense, norm = nn.Linear(32, 32).double(), nn.LayerNorm(32, eps=1e12).double()
    with torch.no_grad():
        dense.weight.copy_(torch.eye(32))
        dense.bias.zero_()
        norm.weight.fill_(1e6)
    x, residual = (torch.randn(2, 6, 32, generator=gen(i), dtype=f64) for i in (4, 5))
    x[..., 0] = 0.0

    def mine():
        layer = tiny_layer(weights).train()
        torch.manual_seed(0)
        return layer.add_norm(residual, x, dense, nn.Dropout(P_DROP), norm)

    out = student(mine)
    dropped = out - (residual - residual.mean(-1, keepdim=True))  # dropout(x) - its row mean
    dropped = dropped - dropped[..., :1]  # (2, 6, 32): the mean comes back from column 0
    yield from dropout_parts("add_norm in training", dropped[..., 1:], x[..., 1:])


@check(1e-9)
def embeddings():
    """BertModel.embed(input_ids) (word + position + token type embeddings, LayerNorm)
    against Hugging Face's embeddings with the same weights: token types all 0, as the
    handout's, then a pair's, which the given tk_type_embeds holds while `token_types` does;
    values and gradients; in training, dropout after the LayerNorm."""
    weights = tiny_weights()
    ids, types, _ = padded()
    w = torch.randn(3, 7, 32, generator=gen(1), dtype=f64)
    tables = ("word_embedding", "pos_embedding", "tk_type_embedding", "embed_layer_norm")

    def mine():
        ours = ours_like(weights)
        out = ours.embed(ids)
        with ours.token_types(types):
            pair = ours.embed(ids)
        got = grads(pair, [p for t in tables for p in getattr(ours, t).parameters()], w)
        ours.train().embed_dropout.p = P_DROP
        torch.manual_seed(0)
        return out, pair, got, ours.embed(ids), ours.eval().embed(ids[:1]).detach()

    out, pair, got, dropped, one = student(mine)
    hf = cached(lambda: tiny_hf(weights).embeddings)  # the judge's
    ref = cached(lambda: hf()(ids, token_type_ids=torch.zeros_like(ids)))
    yield part("output, token types 0", out, ref)
    yield part("a batch of one: (1, T, H)", one, lambda: ref()[:1].detach())
    ref_pair = cached(lambda: hf()(ids, token_type_ids=types))
    yield part("output, a pair's token types (tk_type_embeds)", pair, ref_pair)
    yield part(
        "gradients of the tables and LayerNorm",
        got,
        lambda: grads(ref_pair(), list(hf().parameters()), w),
    )

    def run(dtype, device):
        model = ours_like(weights).to(dtype=dtype, device=device)
        return model.embed(ids.to(device))

    yield from as_run("output", run, out)
    yield from dropout_parts("training", dropped, out.detach())


def adamw_runs(opt_class, steps: int = 20, dtype=f64, device="cpu", **options) -> torch.Tensor:
    """A small network's parameters, flat, after `steps` steps of opt_class: two parameter
    groups (the defaults, weight decay 0.1 and lr 1e-2; decay 0.02 at lr 3e-3), the first
    holding a parameter with a gradient every other step only, so step counts differ."""
    torch.manual_seed(0)
    first, second = (nn.Linear(*n).to(dtype=dtype, device=device) for n in ((4, 3), (3, 2)))
    extra = nn.Parameter(torch.randn(2, dtype=f64).to(dtype=dtype, device=device))
    groups = [
        {"params": [*first.parameters(), extra]},
        {"params": second.parameters(), "weight_decay": 0.02, "lr": 3e-3},
    ]
    opt = opt_class(groups, lr=1e-2, weight_decay=0.1, eps=1e-6, **options)
    g = gen(1)
    for step in range(steps):
        x = torch.randn(8, 4, generator=g, dtype=f64).to(dtype=dtype, device=device)
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


CONVENTIONS = (
    "the handout's AdamW adds eps to sqrt(v) and decays after the step, torch's adds it to "
    "sqrt(v_hat) and decays first: about 1e-4 apart here, and the first steps above hold either"
)
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


# torch's Adam and AdamW update, whichever way it runs: what the adamw exercises write
ADAM = tuple(
    f"torch.optim.adam:{f}" for f in ("_single_tensor_adam", "_multi_tensor_adam", "_fused_adam")
)


@check(1e-6, answers=ADAM)
def adamw():
    """optimizer.AdamW.step, as the handout asks: the handout's optimizer_test.py recipe
    against its optimizer_test.npy, under its tolerance; parameters after 20 steps with
    weight decay against torch.optim.AdamW or the handout's AdamW (Kingma & Ba's efficient
    bias correction, decay after the update) or either's mix of the two choices; and with
    correct_bias=False."""
    yield from adamw_parts("")


def adamw_parts(what: str, **options):
    """The adamw exercises' parts: optimizer.AdamW with `options` (the student's side)."""

    def mine():
        import optimizer_test as ot
        from optimizer import AdamW

        fitted = ot.fit(AdamW, **options)
        got = adamw_runs(AdamW, **options)
        return (
            fitted,
            got,
            adamw_runs(AdamW, correct_bias=False, **options),
            first_steps(AdamW, **options),
            second_tensor_first_step(AdamW, **options),
        )

    fitted, got, unbiased, firsts, late = student(mine)
    yield handout_test(fitted)
    label = f"the first step by AdamW's definition, a tensor's own after its group's{what}"
    yield part(label, late, D.late_first_step, tol=D.FIRST_STEP_TOL)
    names = ("two groups, each its lr and decay", "|g| near sqrt(eps)", "correct_bias=False")
    for name, case, step in zip(names, D.FIRST_STEPS, firsts, strict=True):
        expected = lambda case=case: D.adamw_first_step(case)  # noqa: E731
        yield part(
            f"the first step by AdamW's definition, {name}{what}",
            step,
            expected,
            tol=D.FIRST_STEP_TOL,
        )
    yield Part(f"parameters after 20 steps{what}", got, ADAMW_REFERENCES, note=CONVENTIONS)
    yield Part(f"correct_bias=False{what}", unbiased, UNBIASED_REFERENCES)

    def run(dtype, device):
        from optimizer import AdamW

        return adamw_runs(AdamW, dtype=dtype, device=device, **options)

    yield from as_run(f"parameters after 20 steps{what}", run, got)


@functools.cache
def handout_weight() -> tuple[torch.Tensor, str]:
    """optimizer_test.reference(), read (or fitted) once per grader process."""
    import optimizer_test as ot

    return ot.reference()


def handout_test(fitted) -> Part:
    """optimizer_test.py's recipe (1000 steps of a Linear(3, 2)), the weight it `fitted`
    against the handout's optimizer_test.npy (torch.optim.AdamW's where there is none),
    each element within its own tolerance, atol + rtol * |weight|, as its allclose."""
    import optimizer_test as ot

    expected, source = handout_weight()
    want = torch.as_tensor(expected).double()
    got = fitted.double() if torch.is_tensor(fitted) else fitted
    against = ot.NPY if source.endswith(ot.NPY) else f"torch.optim.AdamW: no {ot.NPY} here"
    label = f"the handout's optimizer_test.py weights (its allclose), against {against}"
    per = ot.ATOL + ot.RTOL * got.abs() if torch.is_tensor(got) else None
    return Part(label, got, {"": lambda: want}, tol=1.0, per=per)


# ---------------------------------------------------------------- the handout's Part 1 classifier


@check(1e-6)
def classifier():
    """classifier.py's BertSentimentClassifier.forward, on a stand-in BERT (setups.StandInBert:
    its [CLS] vector the sum of the kept rows of a table): dropout on the pooled [CLS], then the
    linear layer; its logits and their gradients in eval, their mean and variance in
    training (p = P_DROP, 4,000 draws) against dropout's before the layer."""
    heads, n = seeded_heads(("sst", "cfimdb")), 4000
    table = stand_in_table()[0]
    ids, _, mask = padded()
    w = {task: torch.randn(3, head.out_features, generator=gen(4)) for task, head in heads.items()}

    def mine():
        got = {}
        for task, head in heads.items():
            model = stand_in_classifier(head, table).eval()
            logits = got[task] = model(ids, mask)
            if logits.shape == w[task].shape:  # else its logits' part fails
                leaves = [table, *classifier_head(model).parameters()]
                got[f"{task} gradients"] = grads(logits, leaves, w[task])
        model = stand_in_classifier(heads["sst"], table).eval()
        got["one"] = model(ids[:1], mask[:1])
        torch.manual_seed(0)
        got["draws"] = model.train()(ids.repeat(n, 1), mask.repeat(n, 1)).detach()
        return got

    got = student(mine)
    cls = lambda: (table[ids] * mask[..., None]).sum(1)  # noqa: E731  (B, H): the stand-in's [CLS]
    for task, head in heads.items():
        yield part(f"{task} logits", got[task], lambda h=head: D.sentiment_logits(cls(), h))
        if f"{task} gradients" in got:
            ins = [table, *head.parameters()]

            def expected(h=head, ins=ins, w=w[task]):
                return grads(D.sentiment_logits(cls(), h), ins, w)

            name = f"{task}: gradients of BERT's output and the layer"
            yield part(name, got[f"{task} gradients"], expected)
    head = heads["sst"]
    one = lambda: D.sentiment_logits(cls()[:1], head)  # noqa: E731
    yield part("a batch of one: (1, C) logits", got["one"], one)

    def run(dtype, device):
        moved = table.detach().to(dtype=dtype, device=device)
        model = stand_in_classifier(head, moved).eval().to(dtype=dtype, device=device)
        return model(ids.to(device), mask.to(device))

    yield from as_run("sst logits", run, got["sst"])
    yield from logits_in_training(got["draws"], head, cls().detach(), n)
