"""The checks of the project's own exercises (beyond the handout's BERT and multitask model):
the tokenizer, pooling, the pair head, SMART, SimCSE, PCGrad, distillation and two metrics.
The same harness and helpers as checks.py; references.py answers what no library does."""

import copy
import math

import torch
from torch import nn

from checks import ADAMW_REFERENCES, UNBIASED_REFERENCES, R, adamw_runs, handout_test
from harness import Part, cached, check, part
from setups import as_run, f64, gen, grads, tiny_multitask


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
    import transformers

    from base_bert import resolve_model_dir
    from tokenizer import BertTokenizer

    folder = resolve_model_dir("minilm")
    ours = BertTokenizer.from_pretrained(str(folder))
    ref = transformers.BertTokenizer.from_pretrained(str(folder))  # the Rust tokenizers
    words = [w for t in wordpiece_texts(list(ours.vocab)) for w in t.split()]
    wrong = [ours.encode_text(w) != ref.encode(w, add_special_tokens=False) for w in words]
    first = words[wrong.index(True)] if any(wrong) else ""
    label = f"words tokenized otherwise (the first: {first!r})" if first else "words"
    yield part(label, torch.tensor(wrong).sum(), lambda: 0)


@check(1e-6)
def adamw_foreach():
    """optimizer.AdamW(foreach=True), the update over a group by torch._foreach_* calls:
    the handout's optimizer_test.py recipe, and parameters after 20 steps with weight decay,
    with and without correct_bias, against the same references as the adamw exercise's."""
    from optimizer import AdamW

    yield handout_test(AdamW, foreach=True)
    got = adamw_runs(AdamW, foreach=True)
    yield Part("parameters after 20 steps (foreach=True)", got, ADAMW_REFERENCES)
    unbiased = adamw_runs(AdamW, foreach=True, correct_bias=False)
    yield Part("correct_bias=False (foreach=True)", unbiased, UNBIASED_REFERENCES)


@check(1e-6)
def mean_pool():
    """bert.mean_pool against each sentence's average over the tokens it keeps (a loop),
    values and gradients; what padding holds changes nothing."""
    from bert import mean_pool as ours

    hidden = torch.randn(3, 6, 5, generator=gen(0), dtype=f64).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    out = ours(hidden, mask)
    other = hidden.detach() + 100 * (1 - mask[..., None])  # only the padding changed
    yield part("what padding holds", out, lambda: ours(other, mask))
    yield part("output", out, lambda: R.mean_pool(hidden, mask))
    w = torch.randn(out.shape, generator=gen(1), dtype=f64)
    yield part(
        "gradient", grads(out, hidden, w), lambda: grads(R.mean_pool(hidden, mask), hidden, w)
    )

    def run(dtype, device):
        return ours(hidden.detach().to(dtype=dtype, device=device), mask.to(device))

    yield from as_run("output", run, out)


@check(1e-6)
def pair_head():
    """MultitaskBERT's paraphrase logit against its head on [u, v, |u - v|] and on
    [v, u, |u - v|], averaged (a loop), values and gradients; the same for (v, u)."""
    model = tiny_multitask(("para",)).eval()
    u, v = torch.randn(2, 4, 32, generator=gen(0)).requires_grad_().unbind(0)
    batch = {"input_ids": torch.zeros(2, 4, 3, dtype=torch.long)}  # (2, B, T): siamese pairs
    out = model.readout("para", batch, torch.cat([u, v]))
    yield part("the logit of (v, u)", model.readout("para", batch, torch.cat([v, u])), lambda: out)
    head = model.heads["para"]
    yield part("logits", out, lambda: R.pair_logit(u, v, head))
    w = torch.randn(4, generator=gen(1))
    ins = [u, v, head.weight]
    yield part("gradients", grads(out, ins, w), lambda: grads(R.pair_logit(u, v, head), ins, w))
    one = model.readout(
        "para", {"input_ids": torch.zeros(2, 1, 3, dtype=torch.long)}, torch.cat([u[:1], v[:1]])
    )
    yield part("a batch of one: the logits' shape", list(one.shape), [1])

    def run(dtype, device):
        moved = copy.deepcopy(model).to(dtype=dtype, device=device)
        return moved.readout(
            "para", batch, torch.cat([u, v]).detach().to(dtype=dtype, device=device)
        )

    yield from as_run("logits", run, out)


@check(1e-9)
def symmetric_kl():
    """smart.divergence against KL(P||Q) + KL(Q||P) summed class by class in a loop (softmax
    classes; a binary logit's two classes) and the squared error for regression; the
    reference code's (reference_divergence), each KL's first side constant; values and the
    gradients of both sides."""
    from smart import divergence, reference_divergence

    shapes = {"classification": (4, 5), "binary": (6,), "regression": (6,)}
    for i, (kind, shape) in enumerate(shapes.items()):
        p, q = (torch.randn(shape, generator=gen(2 * i + j), dtype=f64) for j in range(2))
        p, q = p.requires_grad_(), q.requires_grad_()
        yield from kl_parts(divergence, R.symmetric_kl, p, q, kind, kind)
        yield from kl_parts(reference_divergence, R.reference_kl, p, q, kind, f"mt-dnn's, {kind}")
        same = divergence(q, p, kind)
        yield part(f"{kind}: symmetric", divergence(p, q, kind), same)
        yield part(f"{kind}: 0 between equal outputs", divergence(p, p, kind), 0.0)
        yield part(f"mt-dnn's value, {kind}", reference_divergence(p, q, kind), same)

        def run(dtype, device, p=p, q=q, kind=kind):
            return divergence(*(x.detach().to(dtype=dtype, device=device) for x in (p, q)), kind)

        yield from as_run(kind, run, same)


def kl_parts(fn, ref, p, q, kind: str, what: str):
    """fn(p, q, kind) against ref's: the value, and the gradients of both sides."""
    got = fn(p, q, kind)
    yield part(what, got, lambda: ref(p, q, kind))
    both = (p, q)
    expected = lambda: grads(ref(p, q, kind), both, 1.0)  # noqa: E731
    yield part(f"{what}: gradients of both sides", grads(got, both, 1.0), expected)


KINDS = ("classification", "binary", "regression")  # the outputs SMART serves


def stand_in_divergence(p, q, kind):
    """A squared distance of the two outputs as `kind` reads them (class logits by their
    softmax, a binary logit by its sigmoid, a regression output as it is): the
    symmetric_kl exercise's stand-in while the ascent is graded (any smooth divergence
    tells a right ascent from a wrong one, and a wrong kind from the right one)."""
    if kind == "classification":
        return ((p.softmax(-1) - q.softmax(-1)) ** 2).sum(-1).mean()
    if kind == "binary":
        return ((p.sigmoid() - q.sigmoid()) ** 2).mean()
    return (p - q).square().mean()


@check(1e-9, stands_in=("symmetric_kl",))
def smart_ascent():
    """SMART's R_s (adversarial_regularizer) against Algorithm 1 written from the paper (its
    first noise projected into the ball, as the hint says), two ascent steps, its value and
    gradient; the reference code's ascent (reference_regularizer) against mt-dnn's
    SmartPerturbation transcribed, the perturbed output and its gradient; each for class
    logits, a binary logit and a regression output. A stand-in divergence serves for the
    symmetric_kl exercise."""
    import smart

    w = torch.randn(5, 3, dtype=f64, generator=gen(0), requires_grad=True)
    embeds = torch.randn(3, 4, 5, dtype=f64, generator=gen(1), requires_grad=True)
    mask = torch.ones(3, 4)
    mask[1, 2:] = 0

    def f(e):  # (B, T, H) -> (B, 3) logits of a tiny classification head
        return (e * mask[..., None]).sum(1) @ w

    cfg = smart.SmartConfig(sigma=0.1, eta=0.05, epsilon=0.12, steps=2)
    saved = smart.divergence, smart.reference_divergence
    smart.divergence, smart.reference_divergence = stand_in_divergence, lambda c, adv, k: adv
    ours, perturbed = {}, {}
    try:
        for kind in KINDS:
            g = f if kind == "classification" else (lambda e: f(e)[:, 0])  # (B,): one output
            torch.manual_seed(5)
            ours[kind] = (g, smart.adversarial_regularizer(g, embeds, g(embeds), kind, mask, cfg))
            torch.manual_seed(7)
            perturbed[kind] = (g, smart.reference_regularizer(g, embeds, g(embeds), kind, cfg))
    finally:
        smart.divergence, smart.reference_divergence = saved
    yield part("the ascent leaves .grad alone", w.grad is None and embeds.grad is None, True)
    both = (w, embeds)
    for kind, (g, out) in ours.items():

        @cached  # one reference graph: its value, then its gradients
        def ref(g=g, kind=kind):
            torch.manual_seed(5)
            return R.smart_ascent(g, embeds, mask, cfg, stand_in_divergence, kind)

        yield part(f"R_s ({kind})", out, ref)
        expected = lambda r=ref: grads(r(), both, 1.0)  # noqa: E731
        yield part(f"R_s's gradients ({kind})", grads(out, both, 1.0), expected)
    yield from mtdnn_parts(perturbed, embeds, both, cfg)


def mtdnn_parts(perturbed: dict, embeds, both, cfg):
    """reference_regularizer's perturbed output of each kind, and its gradients in `both`,
    against mt-dnn's SmartPerturbation transcribed (the TA's references)."""
    for kind, (g, out) in perturbed.items():

        @cached  # one reference graph: its value, then its gradients
        def theirs(g=g, kind=kind):
            torch.manual_seed(7)
            return R.mtdnn_perturbed(g, embeds, kind, cfg.sigma, cfg.eta, cfg.steps)

        # mt-dnn's stable_kl runs in float32: 1e-5 is its rounding, a wrong ascent is 1e-2
        what = f"mt-dnn's ascent: the perturbed output ({kind})"
        yield part(what, out, theirs, tol=1e-5)
        expected = lambda t=theirs: grads(t(), both, 1.0)  # noqa: E731
        yield part(f"{what}: its gradients", grads(out, both, 1.0), expected, tol=1e-5)


@check(1e-12)
def momentum_teacher():
    """EMATeacher.update against beta * teacher + (1 - beta) * model, parameter by
    parameter, over three updates."""
    from smart import EMATeacher

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)).double()
    teacher = EMATeacher(model)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    updates = []  # (beta, the model's parameters it was given)
    for beta in (0.9, 0.5, 0.99):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen(1), dtype=f64))
        teacher.update(model, beta=beta)
        updates.append((beta, {n: p.detach().clone() for n, p in model.named_parameters()}))

    def expected():
        ema = start
        for beta, params in updates:
            ema = R.ema(ema, params, beta)
        return torch.cat([t.flatten() for t in ema.values()])

    got = torch.cat([teacher.params[n].flatten() for n in start])
    yield part("the teacher after three updates", got, expected)
    last = torch.cat([p.detach().flatten() for p in model.parameters()])
    teacher.update(model, beta=1.0)
    yield part(
        "beta = 1 keeps the teacher",
        torch.cat([t.flatten() for t in teacher.params.values()]),
        lambda: got,
    )
    teacher.update(model, beta=0.0)
    yield part(
        "beta = 0 copies the model",
        torch.cat([t.flatten() for t in teacher.params.values()]),
        lambda: last,
    )


@check(1e-9)
def simcse():
    """Supervised SimCSE with hard negatives (and the unsupervised loss) against a loop:
    anchor i's cross-entropy over cos / temperature to every positive and negative of the
    batch, its own positive the answer; values and gradients."""
    from simcse import sup_simcse_loss, unsup_simcse_loss

    a, p, n = (x.requires_grad_() for x in torch.randn(3, 4, 6, dtype=f64, generator=gen(0)))
    sup, unsup = sup_simcse_loss(a, p, n, 0.05), unsup_simcse_loss(a, p, 0.1)
    yield part("supervised", sup, lambda: R.in_batch(a, torch.cat([p, n]), 0.05))
    yield part("unsupervised", unsup, lambda: R.in_batch(a, p, 0.1))
    ref = lambda: R.in_batch(a, torch.cat([p, n]), 0.05)  # noqa: E731
    yield part(
        "supervised: gradients", grads(sup, (a, p, n), 1.0), lambda: grads(ref(), (a, p, n), 1.0)
    )

    def run(dtype, device):
        return sup_simcse_loss(
            *(x.detach().to(dtype=dtype, device=device) for x in (a, p, n)), 0.05
        )

    yield from as_run("supervised", run, sup)


@check(1e-5)
def pcgrad():
    """PCGrad's projection against Algorithm 1 of Yu et al. in plain Python floats, with
    the same random order of the other tasks (the generator's), for inputs where the order
    changes the result; the inputs are left untouched."""
    from optimizer import pcgrad as ours

    vectors = torch.randn(4, 3, generator=gen(1))  # (T, P): the order matters here
    before = vectors.clone()
    for seed in (7, 8, 9, 10):  # each task's own order: one shared order differs in some
        got = ours(list(vectors), generator=gen(seed))
        expected = lambda k=seed: torch.tensor(R.pcgrad(vectors.tolist(), gen(k)))  # noqa: E731
        yield part(f"the projected sum (generator seed {seed})", got, expected)
    yield part("the task gradients after the call", vectors, lambda: before, tol=0.0)


@check(1e-9)
def distillation():
    """similarity_distillation against a loop over every pair i != j: the squared
    difference of the two encoders' cosines, averaged; values and gradients, none of them
    into the reference encoder's embeddings."""
    from simcse import similarity_distillation

    z, ref = (x.requires_grad_() for x in torch.randn(2, 5, 4, dtype=f64, generator=gen(0)))
    got = similarity_distillation(z, ref)
    yield part("value", got, lambda: R.distillation(z, ref))
    (gz, gref) = torch.autograd.grad(got, (z, ref), allow_unused=True, materialize_grads=True)
    yield part("gradient", gz, lambda: torch.autograd.grad(R.distillation(z, ref), z)[0])
    yield part("gradient into the reference", gref, lambda: torch.zeros_like(ref), tol=0.0)

    def run(dtype, device):
        return similarity_distillation(
            *(x.detach().to(dtype=dtype, device=device) for x in (z, ref))
        )

    yield from as_run("value", run, got)


@check(1e-6)
def pearson():
    """evaluation.pearson_r against scipy.stats.pearsonr, and nan for a constant input; to
    float32's rounding (a metric: torch.corrcoef in float32 is as good)."""
    import numpy as np
    from scipy.stats import pearsonr

    from evaluation import pearson_r

    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    y = 0.6 * x + rng.normal(size=50)
    yield part("r", pearson_r(x, y), lambda: pearsonr(x, y).statistic)
    yield part("r of a negative correlation", pearson_r(x, -y), lambda: pearsonr(x, -y).statistic)
    yield part("r of a constant input (nan)", pearson_r(np.full(50, 3.0), y), lambda: math.nan)
    yield part("r of a shifted, scaled copy", pearson_r(x, 2 * x + 1), lambda: 1.0)


@check(1e-12)
def auc():
    """evaluation.roc_auc against sklearn's roc_auc_score, on scores with ties."""
    import numpy as np
    from sklearn.metrics import roc_auc_score

    from evaluation import roc_auc

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, size=80)
    scores = np.round(labels * 0.5 + rng.normal(size=80), 1)  # rounded: many ties
    yield part("AUC", roc_auc(scores, labels), lambda: roc_auc_score(labels, scores))
    yield part("AUC of all-tied scores", roc_auc(np.ones(80), labels), lambda: 0.5)
