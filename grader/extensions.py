"""The checks of the project's own exercises (beyond the handout's BERT and multitask model):
the tokenizer, pooling, the pair head, SMART, SimCSE, PCGrad, distillation and two metrics
(SentenceBERT's heads: grader/multitask_checks.py).
The same harness and helpers as checks.py; references.py answers what no library does."""

import math

import torch
from torch import nn

import definitions as D
from ascent import (
    ascent_by_hand,
    ascent_properties,
    cfg_of,
    kl_by_hand,
    kl_runs,
    smart_as_run,
    smart_runs,
    stand_in_divergence,
)
from checks import ADAM, R, adamw_parts
from harness import cached, check, judging, part, student
from setups import (
    as_run,
    f64,
    gen,
    grads,
    seeded_heads,
    tiny_multitask,
)


def wordpiece_texts(vocab: list[str], n: int = 400) -> list[str]:
    """Fixed hard cases (the vocabulary's longest pieces among them), and words glued from
    random vocabulary pieces."""
    pieces = [p.removeprefix("##") for p in vocab if p.isalpha() and p.isascii()]
    glued = [
        "".join(pieces[i] for i in torch.randint(len(pieces), (3,), generator=gen(0)).tolist())
        for _ in range(n)
    ]
    longest = sorted((p for p in vocab if p.isalpha() and p.isascii()), key=len)[-8:]
    longest = [p if not p.startswith("##") else "a" + p[2:] for p in longest]  # whole words
    hard = " ".join(longest) + " unaffable tokenization antidisestablishmentarianism "
    hard += "xqzvbnmkj playing replayed re-tokenized Café crème 東京 naïve ##ing snow☃man"
    return [hard, *glued]


@check(0)
def wordpiece():
    """The tokenizer against Hugging Face's BertTokenizer on MiniLM's vocabulary, word by
    word over 421 words (greedy longest match first)."""
    from base_bert import resolve_model_dir

    folder = resolve_model_dir("minilm")
    vocab = (folder / "vocab.txt").read_text(encoding="utf-8").splitlines()  # the file's order
    words = [w for t in wordpiece_texts(vocab) for w in t.split()]

    def mine():
        from tokenizer import BertTokenizer

        ours = BertTokenizer.from_pretrained(str(folder))
        return [ours.encode_text(w) for w in words]

    got = student(mine)
    if not judging():
        return  # Hugging Face's tokenizer is the judge's
    import transformers

    ref = transformers.BertTokenizer.from_pretrained(str(folder))  # the Rust tokenizers
    wrong = [g != ref.encode(w, add_special_tokens=False) for g, w in zip(got, words, strict=True)]
    first = words[wrong.index(True)] if any(wrong) else ""
    label = f"words tokenized otherwise (the first: {first!r})" if first else "words"
    yield part(label, sum(wrong), lambda: 0)


@check(1e-6, answers=ADAM)
def adamw_foreach():
    """optimizer.AdamW(foreach=True), the update over a group by torch._foreach_* calls:
    the handout's optimizer_test.py recipe, and parameters after 20 steps with weight decay,
    with and without correct_bias, against the same references as the adamw exercise's."""
    yield from adamw_parts(" (foreach=True)", foreach=True)


@check(1e-6)
def mean_pool():
    """bert.mean_pool against each sentence's average over the tokens it keeps (a loop),
    values and gradients; what padding holds changes nothing."""
    hidden = torch.randn(3, 6, 5, generator=gen(0), dtype=f64).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    other = hidden.detach() + 100 * (1 - mask[..., None])  # only the padding changed
    w = torch.randn(3, 5, generator=gen(1), dtype=f64)

    def mine():
        from bert import mean_pool as ours

        out = ours(hidden, mask)
        one = list(ours(hidden[:1], mask[:1]).shape)  # a batch of one
        return out, ours(other, mask), grads(out, hidden, w), one

    out, padding, got, one = student(mine)
    yield part("what padding holds", out, lambda: padding)
    yield part("a batch of one: the output's shape", one, [1, 5])
    yield part("output", out, lambda: D.mean_pool(hidden, mask))
    yield part("gradient", got, lambda: grads(D.mean_pool(hidden, mask), hidden, w))

    def run(dtype, device):
        from bert import mean_pool as ours

        return ours(hidden.detach().to(dtype=dtype, device=device), mask.to(device))

    yield from as_run("output", run, out)


@check(1e-6)
def pair_head():
    """SentenceBERT's paraphrase logit against its head on [u, v, |u - v|] and on
    [v, u, |u - v|], averaged (a loop), values and gradients; the same for (v, u)."""
    head = seeded_heads(("para",))["para"]
    u, v = torch.randn(2, 4, 32, generator=gen(0)).requires_grad_().unbind(0)
    batch = {"input_ids": torch.zeros(2, 4, 3, dtype=torch.long)}  # (2, B, T): siamese pairs
    one = {"input_ids": torch.zeros(2, 1, 3, dtype=torch.long)}
    w = torch.randn(4, generator=gen(1))

    def mine():
        model = tiny_multitask(("para",), heads={"para": head}).eval()
        out = model.readout("para", batch, torch.cat([u, v]))
        got = grads(out, [u, v, model.heads["para"].weight], w)
        swapped = model.readout("para", batch, torch.cat([v, u]))
        return out, swapped, got, list(model.readout("para", one, torch.cat([u[:1], v[:1]])).shape)

    out, swapped, got, shape = student(mine)
    yield part("the logit of (v, u)", swapped, lambda: out)
    yield part("logits", out, lambda: D.pair_logit(u, v, head))
    ins = [u, v, head.weight]
    yield part("gradients", got, lambda: grads(D.pair_logit(u, v, head), ins, w))
    yield part("a batch of one: the logits' shape", shape, [1])

    def run(dtype, device):
        model = tiny_multitask(("para",), heads={"para": head}).eval()
        model = model.to(dtype=dtype, device=device)
        return model.readout(
            "para", batch, torch.cat([u, v]).detach().to(dtype=dtype, device=device)
        )

    yield from as_run("logits", run, out)


@check(1e-9)
def symmetric_kl():
    """smart.divergence against KL(P||Q) + KL(Q||P) summed class by class in a loop (softmax
    classes; a binary logit's two classes) and the squared error for regression; the
    reference code's (reference_divergence), each KL's first side constant; values and the
    gradients of both sides; each on inputs whose value is worked by hand."""
    by_hand = student(kl_by_hand)
    for (kind, *_, value), (ours, theirs) in zip(D.KL_BY_HAND, by_hand, strict=True):
        yield part(f"{kind}: worked by hand (definitions.KL_BY_HAND)", ours, value)
        yield part(f"mt-dnn's, {kind}: worked by hand", theirs, value)
    shapes = {"classification": (4, 5), "binary": (6,), "regression": (6,)}
    for i, (kind, shape) in enumerate(shapes.items()):
        p, q = (torch.randn(shape, generator=gen(2 * i + j), dtype=f64) for j in range(2))
        p, q = p.requires_grad_(), q.requires_grad_()

        got = student(kl_runs, p, q, kind)
        yield part(
            f"{kind}: gradients against finite differences of its values",
            got["ours"][1],
            got["fd"],
            tol=FD_TOL,
        )
        if kind != "regression":  # each side learns from one KL only: half, to first order
            fd = got["near fd"]
            ratio = (got["near"] * fd).sum() / (fd * fd).sum()  # the gradient along the full one
            what = f"mt-dnn's, {kind}, outputs close: gradients / the finite differences"
            yield part(what, ratio, 0.5, tol=0.1)
        yield from kl_parts(got["ours"], R.symmetric_kl, p, q, kind, kind)
        yield from kl_parts(got["theirs"], R.reference_kl, p, q, kind, f"mt-dnn's, {kind}")
        yield part(f"{kind}: symmetric", got["ours"][0], got["same"])
        yield part(f"{kind}: 0 between equal outputs", got["zero"], 0.0)
        yield part(f"mt-dnn's value, {kind}", got["theirs"][0], got["same"])

        def run(dtype, device, p=p, q=q, kind=kind):
            from smart import divergence

            return divergence(*(x.detach().to(dtype=dtype, device=device) for x in (p, q)), kind)

        yield from as_run(kind, run, got["same"])


# Central differences at h = 1e-3 of values a body may compute in float32: their rounding
# (1e-7 / h) is 1e-4 at most, where a slip moves a gradient by 0.1 or more. The reference
# code's gradient is half the full one to first order: outputs 3e-2 apart keep the second
# order within a few percent of that half, where a slip gives the whole.
FD_TOL = 1e-3


def kl_parts(got, ref, p, q, kind: str, what: str):
    """[value, gradients of both sides] that the student's side gave, against ref's."""
    value, gradients = got
    yield part(what, value, lambda: ref(p, q, kind))
    expected = lambda: grads(ref(p, q, kind), (p, q), 1.0)  # noqa: E731
    yield part(f"{what}: gradients of both sides", gradients, expected)


KINDS = ("classification", "binary", "regression")  # the outputs SMART serves


@check(1e-9, stands_in=("symmetric_kl",))
def smart_ascent():
    """SMART's R_s (adversarial_regularizer) against Algorithm 1 written from the paper (its
    first noise projected into the ball, as the hint says), two ascent steps, its value and
    gradient; the reference code's ascent (reference_regularizer) against mt-dnn's
    SmartPerturbation transcribed, the perturbed output and its gradient; each for class
    logits, a binary logit and a regression output. A stand-in divergence serves for the
    symmetric_kl exercise."""
    w = torch.randn(5, 3, dtype=f64, generator=gen(0), requires_grad=True)
    embeds = torch.randn(3, 4, 5, dtype=f64, generator=gen(1), requires_grad=True)
    mask = torch.ones(3, 4)
    mask[1, 2:] = 0

    def f(e):  # (B, T, H) -> (B, 3) logits of a tiny classification head
        return (e * mask[..., None]).sum(1) @ w

    def g(e):  # (B,): one output
        return f(e)[:, 0]

    heads, both = {"classification": f, "binary": g, "regression": g}, (w, embeds)
    cfg = {"sigma": 0.1, "eta": 0.05, "epsilon": 0.12, "steps": 2}

    paper, theirs = student(ascent_by_hand)
    yield part("R_s worked by hand (definitions.ASCENT_BY_HAND)", paper, D.ASCENT_BY_HAND["R_s"])
    perturbed = torch.tensor(D.ASCENT_BY_HAND["perturbed"], dtype=f64)
    yield part("the reference code's perturbed output worked by hand", theirs, perturbed, tol=1e-5)
    got, untouched = student(smart_runs, heads, embeds, mask, cfg, both)
    yield part("the ascent leaves .grad alone", untouched, True)
    for kind, ((out, out_grads), _) in got.items():

        @cached  # one reference graph: its value, then its gradients
        def ref(head=heads[kind], kind=kind):
            torch.manual_seed(5)
            return R.smart_ascent(head, embeds, mask, cfg_of(cfg), stand_in_divergence, kind)

        yield part(f"R_s ({kind})", out, ref)
        expected = lambda r=ref: grads(r(), both, 1.0)  # noqa: E731
        yield part(f"R_s's gradients ({kind})", out_grads, expected)
    perturbed = {kind: (heads[kind], outs[1]) for kind, outs in got.items()}
    yield from mtdnn_parts(perturbed, embeds, both, cfg)
    yield from ascent_properties(g, w, embeds, mask, both)

    run = lambda dtype, device: smart_as_run(dtype, device, embeds, w, mask, cfg)  # noqa: E731
    yield from as_run("R_s (classification)", run, None)


def mtdnn_parts(perturbed: dict, embeds, both, cfg: dict):
    """reference_regularizer's perturbed output of each kind, and its gradients in `both`,
    against mt-dnn's SmartPerturbation transcribed (the TA's references)."""
    for kind, (head, (out, out_grads)) in perturbed.items():

        @cached  # one reference graph: its value, then its gradients
        def theirs(head=head, kind=kind):
            torch.manual_seed(7)
            return R.mtdnn_perturbed(head, embeds, kind, cfg["sigma"], cfg["eta"], cfg["steps"])

        # mt-dnn's stable_kl runs in float32: 1e-5 is its rounding, a wrong ascent is 1e-2
        what = f"mt-dnn's ascent: the perturbed output ({kind})"
        yield part(what, out, theirs, tol=1e-5)
        expected = lambda t=theirs: grads(t(), both, 1.0)  # noqa: E731
        yield part(f"{what}: its gradients", out_grads, expected, tol=1e-5)


@check(1e-12)
def momentum_teacher():
    """EMATeacher.update against beta * teacher + (1 - beta) * model, parameter by
    parameter, over three updates; then beta = 1 and 0; in float32 and on another device."""
    betas = (0.9, 0.5, 0.99)

    def mine():
        teacher, model = updated_teacher(betas, f64, "cpu")
        names = [n for n, _ in model.named_parameters()]
        got = [torch.cat([teacher.params[n].flatten() for n in names])]
        for beta in (1.0, 0.0):
            teacher.update(model, beta=beta)
            got.append(torch.cat([teacher.params[n].flatten() for n in names]))
        return got

    got, kept, copied = student(mine)
    yield from teacher_midpoint()
    model = teacher_model(f64, "cpu")
    start, updates = {n: p.detach().clone() for n, p in model.named_parameters()}, []
    for beta in betas:  # (beta, the model's parameters it was given)
        moved(model)
        updates.append((beta, {n: p.detach().clone() for n, p in model.named_parameters()}))

    def expected():
        ema = start
        for beta, params in updates:
            ema = R.ema(ema, params, beta)
        return torch.cat([t.flatten() for t in ema.values()])

    yield part("the teacher after three updates", got, expected)
    yield part("beta = 1 keeps the teacher", kept, lambda: got)
    last = torch.cat([p.detach().flatten() for p in model.parameters()])
    yield part("beta = 0 copies the model", copied, lambda: last)

    def run(dtype, device):
        teacher, model = updated_teacher(betas, dtype, device)
        return torch.cat([teacher.params[n].flatten() for n, _ in model.named_parameters()])

    yield from as_run("the teacher after three updates", run, got)


def updated_teacher(betas, dtype, device):
    """The student's EMATeacher of teacher_model after one update per beta, each after the
    model moved; and the model."""
    from smart import EMATeacher

    model = teacher_model(dtype, device)
    teacher = EMATeacher(model)
    for beta in betas:
        moved(model)
        teacher.update(model, beta=beta)
    return teacher, model


def teacher_midpoint():
    """One update at beta 0.5 of a teacher that starts as the model's copy: the midpoint
    of the model before and after its step."""

    def mine():
        from smart import EMATeacher

        model = teacher_model(f64, "cpu")
        teacher = EMATeacher(model)  # a copy of the model at its start
        moved(model)
        teacher.update(model, beta=0.5)
        return torch.cat([teacher.params[n].flatten() for n, _ in model.named_parameters()])

    midpoint = student(mine)
    start = torch.cat([p.detach().flatten() for p in teacher_model(f64, "cpu").parameters()])
    model = teacher_model(f64, "cpu")
    moved(model)
    end = torch.cat([p.detach().flatten() for p in model.parameters()])
    what = "one update at beta = 0.5: the midpoint of teacher and model"
    yield part(what, midpoint, (start + end) / 2)


def teacher_model(dtype, device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)).to(dtype=dtype, device=device)


def moved(model):
    """The model's step between two teacher updates: fixed noise on every parameter."""
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=gen(1), dtype=f64)
            p.add_(noise.to(dtype=p.dtype, device=p.device))


@check(1e-9)
def simcse():
    """Supervised SimCSE with hard negatives (and the unsupervised loss) against a loop:
    anchor i's cross-entropy over cos / temperature to every positive and negative of the
    batch, its own positive the answer; values and gradients."""
    a, p, n = (x.requires_grad_() for x in torch.randn(3, 4, 6, dtype=f64, generator=gen(0)))

    def mine():
        from simcse import sup_simcse_loss, unsup_simcse_loss

        sup = sup_simcse_loss(a, p, n, 0.05)
        e = torch.eye(4, dtype=f64)  # anchors e0, e1; positives 3 e0, 3 e1; negatives e2, e3
        by_hand = [
            sup_simcse_loss(e[:2], 3 * e[:2], e[2:], 0.5),
            unsup_simcse_loss(e[:2], 3 * e[:2], 0.5),
        ]
        return sup, unsup_simcse_loss(a, p, 0.1), grads(sup, (a, p, n), 1.0), by_hand

    sup, unsup, got, (sup_hand, unsup_hand) = student(mine)
    what = "each anchor's own positive at cosine 1, the rest at 0"
    yield part(f"supervised, {what}", sup_hand, D.orthogonal_simcse(2, 3, 0.5))
    yield part(f"unsupervised, {what}", unsup_hand, D.orthogonal_simcse(2, 2, 0.5))
    yield part("supervised", sup, lambda: R.in_batch(a, torch.cat([p, n]), 0.05))
    yield part("unsupervised", unsup, lambda: R.in_batch(a, p, 0.1))
    ref = lambda: R.in_batch(a, torch.cat([p, n]), 0.05)  # noqa: E731
    yield part("supervised: gradients", got, lambda: grads(ref(), (a, p, n), 1.0))

    def run(dtype, device):
        from simcse import sup_simcse_loss

        return sup_simcse_loss(
            *(x.detach().to(dtype=dtype, device=device) for x in (a, p, n)), 0.05
        )

    yield from as_run("supervised", run, sup)


@check(1e-5)
def pcgrad():
    """PCGrad's projection against Algorithm 1 of Yu et al. in plain Python floats, with
    the same random order of the other tasks (the generator's), for inputs where the order
    changes the result; the inputs are left untouched; in float64 as well."""
    vectors = torch.randn(4, 3, generator=gen(1))  # (T, P): the order matters here
    seeds = (7, 8, 9, 10)  # each task's own order: one shared order differs in some

    def mine():
        from optimizer import pcgrad as ours

        given = vectors.clone()
        got = [ours(list(given), generator=gen(seed)) for seed in seeds]
        hand = [ours(list(torch.tensor(g)), generator=gen(0)) for g, _ in D.PCGRAD_BY_HAND]
        drawn = gen(7)
        ours(list(given), generator=drawn)
        return got, given, ours(list(given.double()), generator=gen(7)), hand, drawn.get_state()

    got, after, in_float64, hand, state = student(mine)
    drawn = gen(7)
    for _ in range(len(vectors)):  # the hint's draws: torch.randperm(T, generator) per task
        torch.randperm(len(vectors), generator=drawn)
    label = "the generator after the call: one torch.randperm(T) per task drawn from it"
    yield part(label, state, drawn.get_state(), tol=0.0)
    for what, out, (_, total) in zip(
        ("conflicting", "agreeing"), hand, D.PCGRAD_BY_HAND, strict=True
    ):
        yield part(f"two tasks by hand, {what}", out, torch.tensor(total))
    distinct = len({tuple(torch.as_tensor(g).tolist()) for g in got})
    yield part(
        "the order follows the generator: the seeds' sums are not all one", distinct > 1, True
    )
    for seed, out in zip(seeds, got, strict=True):
        expected = lambda k=seed: torch.tensor(R.pcgrad(vectors.tolist(), gen(k)))  # noqa: E731
        yield part(f"the projected sum (generator seed {seed})", out, expected)
    yield part("the task gradients after the call", after, lambda: vectors, tol=0.0)
    yield part("in float64: a float64 sum", in_float64.dtype == f64, True)
    yield part("in float64", in_float64, lambda: got[0], tol=1e-5, dtype=f64)


@check(1e-9)
def distillation():
    """similarity_distillation against a loop over every pair i != j: the squared
    difference of the two encoders' cosines, averaged; values and gradients, none of them
    into the reference encoder's embeddings."""
    z, ref = (x.requires_grad_() for x in torch.randn(2, 5, 4, dtype=f64, generator=gen(0)))

    def mine():
        from simcse import similarity_distillation

        got = similarity_distillation(z, ref)
        gz, gref = torch.autograd.grad(got, (z, ref), allow_unused=True, materialize_grads=True)
        return got, gz, gref, similarity_distillation(z[:2], ref[:2])

    got, gz, gref, two = student(mine)
    expected = lambda: D.two_sentence_distillation(z[:2], ref[:2])  # noqa: E731
    yield part("two sentences: the squared change of their one cosine", two, expected)
    yield part("value", got, lambda: R.distillation(z, ref))
    yield part("gradient", gz, lambda: torch.autograd.grad(R.distillation(z, ref), z)[0])
    yield part("gradient into the reference", gref, lambda: torch.zeros_like(ref), tol=0.0)

    def run(dtype, device):
        from simcse import similarity_distillation

        return similarity_distillation(
            *(x.detach().to(dtype=dtype, device=device) for x in (z, ref))
        )

    yield from as_run("value", run, got)


# the library functions that compute the metrics' answers: out of the student's code's reach
PEARSON = ("scipy.stats:pearsonr", "scipy.stats:spearmanr", "scipy.stats:linregress")
AUC = ("sklearn.metrics:roc_auc_score", "sklearn.metrics:roc_curve", "sklearn.metrics:auc")


@check(1e-6, answers=(*PEARSON, "scipy.stats.mstats:pearsonr"))
def pearson():
    """evaluation.pearson_r against scipy.stats.pearsonr, and nan for a constant input; to
    float32's rounding (a metric: torch.corrcoef in float32 is as good)."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    y = 0.6 * x + rng.normal(size=50)
    inputs = [(x, y), (x, -y), (np.full(50, 3.0), y), (x, 2 * x + 1)]

    def mine():
        from evaluation import pearson_r

        return [pearson_r(a.copy(), b.copy()) for a, b in inputs]

    r, negative, constant, shifted = student(mine)
    from scipy.stats import pearsonr  # the reference: read once a value is there to judge

    yield part("r", r, lambda: pearsonr(x, y).statistic)
    yield part("r of a negative correlation", negative, lambda: pearsonr(x, -y).statistic)
    yield part("r of a constant input (nan)", constant, lambda: math.nan)
    yield part("r of a shifted, scaled copy", shifted, lambda: 1.0)


@check(1e-12, answers=(*AUC, "scipy.stats:mannwhitneyu"))
def auc():
    """evaluation.roc_auc against sklearn's roc_auc_score, on scores with ties."""
    import numpy as np

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=80)
    scores = np.round(labels * 0.5 + rng.normal(size=80), 1)  # rounded: many ties

    def mine():
        from evaluation import roc_auc

        return roc_auc(scores.copy(), labels.copy()), roc_auc(np.ones(80), labels.copy())

    got, tied = student(mine)
    from sklearn.metrics import roc_auc_score  # the reference: read once a value is there

    yield part("AUC", got, lambda: roc_auc_score(labels, scores))
    yield part("AUC of all-tied scores", tied, lambda: 0.5)
