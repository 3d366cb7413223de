"""The SMART exercises' runs on the student's side and what any right ascent does: the
stand-in divergence (as strict as smart.divergence), R_s and the reference code's ascent
run with it, and the properties that need no answer (an ascent rises, small noise scales
as sigma^2, the epsilon ball holds, examples and tokens apart as they are alone)."""

import types

import torch

import definitions as D
from harness import part, student
from setups import f64, finite_differences, gen, grads

KINDS = ("classification", "binary", "regression")  # smart.KINDS


def outputs_checked(p, q, kind):
    """(p, q) as smart's divergences read them, refused where they refuse (the grader's own
    copy of smart._check_outputs, which a submission may have changed; tests/test_grader.py
    keeps the two the same): an unknown kind, outputs of two shapes, class logits that are
    not (B, C), other outputs that are not (B,) or (B, 1), read as (B,)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if p.shape != q.shape:
        raise ValueError(
            f"divergence: outputs differ in shape, {tuple(p.shape)} vs {tuple(q.shape)}"
        )
    if kind == "classification":
        if p.dim() != 2:
            raise ValueError(f"classification logits must be (B, C), got {tuple(p.shape)}")
        return p, q
    if p.dim() == 2 and p.size(1) == 1:
        p, q = p.squeeze(1), q.squeeze(1)  # (B, 1) -> (B,)
    if p.dim() != 1:
        raise ValueError(f"{kind} outputs must be (B,) or (B, 1), got {tuple(p.shape)}")
    return p, q


def stand_in_divergence(p, q, kind):
    """A squared distance of the two outputs as `kind` reads them (class logits by their
    softmax, a binary logit by its sigmoid, a regression output as it is): the
    symmetric_kl exercise's stand-in while the ascent is graded (any smooth divergence
    tells a right ascent from a wrong one, and a wrong kind from the right one). It refuses
    what smart.divergence refuses (outputs_checked)."""
    p, q = outputs_checked(p, q, kind)
    if kind == "classification":
        return ((p.softmax(-1) - q.softmax(-1)) ** 2).sum(-1).mean()
    if kind == "binary":
        return ((p.sigmoid() - q.sigmoid()) ** 2).mean()
    return (p - q).square().mean()


def stand_in_reference(clean, adv, kind):
    """The perturbed output itself: smart.reference_divergence's stand-in (the ascent's
    R_s is read through it), refusing what it refuses (outputs_checked)."""
    outputs_checked(clean, adv, kind)
    return adv


def smart_runs(heads: dict, embeds, mask, cfg: dict, both):
    """The student's side of smart_ascent: ({kind: [(R_s, its gradients), (the perturbed
    output, its gradients)]}, whether .grad stayed untouched), the divergences stood in."""
    import smart

    config = smart.SmartConfig(**cfg)
    saved = smart.divergence, smart.reference_divergence
    smart.divergence, smart.reference_divergence = stand_in_divergence, stand_in_reference
    got = {}
    try:
        for kind, head in heads.items():
            torch.manual_seed(5)
            out = smart.adversarial_regularizer(head, embeds, head(embeds), kind, mask, config)
            torch.manual_seed(7)
            theirs = smart.reference_regularizer(head, embeds, head(embeds), kind, config)
            got[kind] = [out, theirs]
        untouched = all(x.grad is None for x in both)
        for kind, outs in got.items():
            got[kind] = [(x, grads(x, both, 1.0)) for x in outs]
    finally:
        smart.divergence, smart.reference_divergence = saved
    return got, untouched


def smart_as_run(dtype, device, embeds, w, mask, cfg: dict):
    """R_s of class logits with the inputs in dtype on device (its noise drawn there)."""
    import smart

    e, v = (x.detach().to(dtype=dtype, device=device) for x in (embeds, w))
    keep = mask.to(device)

    def head(x):
        return (x * keep[..., None]).sum(1) @ v

    saved, smart.divergence = smart.divergence, stand_in_divergence
    try:
        config = smart.SmartConfig(**cfg)
        return smart.adversarial_regularizer(head, e, head(e), "classification", keep, config)
    finally:
        smart.divergence = saved


def cfg_of(cfg: dict):
    """The ascent's settings as R.smart_ascent reads them (attributes)."""
    return types.SimpleNamespace(**cfg)


def ascent_properties(g, w, embeds, mask, both):
    """What the ascent must do whatever its noise draws (regression, one output): rise
    above its first noise's R_s; an R_s of small noise growing as sigma^2; stay within
    what the epsilon ball allows after long steps; reach the embeddings through the final
    pass (the reference code's too)."""
    got = student(smart_properties, g, embeds, mask, both)
    yield part("two ascent steps raise R_s above its first noise's", got["raised"], True)
    yield part("R_s of small noise, sigma doubled: 4 times", got["ratio"], 4.0, tol=0.05)
    kept = mask.sum(1) * 0.1 * w[:, 0].detach().abs().sum()  # (B,): the most |f| can move
    yield part(
        "R_s after long steps, within the epsilon ball's most",
        got["long"] <= (kept**2).mean() + 1e-12,
        True,
    )
    for what in ("R_s", "the reference code's perturbed output"):
        yield part(f"{what}: the gradient reaches the embeddings", got[what], True)
    pair, alone = got["batch"]
    yield part("R_s of two examples, no first noise: the mean of each one's alone", pair, alone)
    pair, alone = got["reference batch"]
    yield part("the reference code's, no first noise: each row as its example's alone", pair, alone)
    whole, tokens = got["tokens"]
    yield part(
        "the reference code's, a head summed over tokens: the sum of each token's alone",
        whole,
        tokens,
    )


def smart_properties(g, embeds, mask, both) -> dict:
    """The student's side of ascent_properties, the divergences stood in."""
    import smart

    def r_s(seed, clean=None, **cfg):  # clean: the clean output (default: g's, attached)
        torch.manual_seed(seed)
        config = smart.SmartConfig(**{"sigma": 0.1, "eta": 0.05, "epsilon": 0.12, "steps": 2} | cfg)
        clean = g(embeds) if clean is None else clean
        return smart.adversarial_regularizer(g, embeds, clean, "regression", mask, config)

    saved = smart.divergence, smart.reference_divergence
    smart.divergence, smart.reference_divergence = stand_in_divergence, stand_in_reference
    try:
        out = {"raised": bool(r_s(3) > r_s(3, steps=0))}
        small = [r_s(4, sigma=s, epsilon=1.0, steps=0).item() for s in (1e-3, 2e-3)]
        out["ratio"] = small[1] / small[0]
        out["long"] = r_s(5, sigma=0.1, eta=1e3, epsilon=0.1, steps=3).detach()
        final = r_s(6, clean=g(embeds).detach())  # the embeddings reached by the final pass only
        out["R_s"] = bool(grads(final, both, 1.0)[-embeds.numel() :].abs().sum() > 0)
        torch.manual_seed(7)
        config = smart.SmartConfig(sigma=0.1, eta=0.05, epsilon=0.12, steps=2)
        theirs = smart.reference_regularizer(g, embeds, g(embeds), "regression", config)
        reached = grads(theirs, both, 1.0)[-embeds.numel() :].abs().sum() > 0
        out["the reference code's perturbed output"] = bool(reached)
        out |= independence(smart, embeds, mask)
    finally:
        smart.divergence, smart.reference_divergence = saved
    return out


def independence(smart, embeds, mask) -> dict:
    """With no first noise (sigma 0) every draw is gone, so what each example (each token,
    where the reference code normalises per token) does alone is what it does in a batch:
    R_s of a pair is the mean of each one's; the reference code's perturbed rows are each
    example's alone, in the regime where its guard counts (eta 1e-7); with a head summed
    over tokens, its output is the sum of each one-token sentence's (the student's side)."""
    e, keep = embeds.detach()[:2], mask[:2]
    v = torch.linspace(-1.0, 1.0, e.size(-1), dtype=f64)

    def summed(x):  # (B, T, H) -> (B,): a sum over tokens of tanh(x_t . v)
        return torch.tanh(x @ v).sum(1)

    def run(variant, x, clean, cfg, *keep_rows):
        if variant == "paper":
            return smart.adversarial_regularizer(summed, x, clean, "regression", *keep_rows, cfg)
        return smart.reference_regularizer(summed, x, clean, "regression", cfg)

    clean = (summed(e) + torch.tensor([0.1, 10.0], dtype=f64)).detach()  # unequal pulls
    quiet = smart.SmartConfig(sigma=0.0, eta=0.05, epsilon=0.5, steps=2)
    pair = run("paper", e, clean, quiet, keep).detach()
    alone = [run("paper", e[i : i + 1], clean[i : i + 1], quiet, keep[i : i + 1]) for i in (0, 1)]
    out = {"batch": (pair, (alone[0] + alone[1]).detach() / 2)}
    tiny = smart.SmartConfig(sigma=0.0, eta=1e-7, steps=1)
    rows = run("reference", e, clean, tiny).detach()
    each = [run("reference", e[i : i + 1], clean[i : i + 1], tiny) for i in (0, 1)]
    out["reference batch"] = (rows, torch.cat(each).detach())
    one, steady = e[:1], smart.SmartConfig(sigma=0.0, eta=0.05, steps=1)  # (1, T, H)
    whole = run("reference", one, (summed(one) - 1).detach(), steady)
    tokens = [one[:, t : t + 1] for t in range(one.size(1))]  # one-token sentences
    parts = [run("reference", x, (summed(x) - 1).detach(), steady) for x in tokens]
    out["tokens"] = (whole.detach(), sum(parts).detach())
    return out


def kl_runs(p, q, kind: str) -> dict:
    """The student's side of symmetric_kl: both divergences and their gradients, and
    finite differences of their values (the reference code's at outputs close together)."""
    from smart import divergence, reference_divergence

    ours, theirs = divergence(p, q, kind), reference_divergence(p, q, kind)
    near = (p + 3e-2 * torch.randn(p.shape, generator=gen(9), dtype=f64)).detach()
    nudged = [p.detach().clone(), q.detach().clone(), near.clone()]
    return {
        "ours": [ours, grads(ours, (p, q), 1.0)],
        "theirs": [theirs, grads(theirs, (p, q), 1.0)],
        "same": divergence(q, p, kind),
        "zero": divergence(p, p, kind),
        "fd": finite_differences(lambda: divergence(*nudged[:2], kind), nudged[:2], h=1e-3),
        "near": grads(reference_divergence(p, near.requires_grad_(), kind), (p, near), 1.0),
        "near fd": finite_differences(
            lambda: reference_divergence(nudged[0], nudged[2], kind), (nudged[0], nudged[2]), h=1e-3
        ),
    }


def kl_by_hand() -> list:
    """The student's side of definitions.KL_BY_HAND: [divergence, reference_divergence] of
    each case."""
    from smart import divergence, reference_divergence

    out = []
    for kind, p, q, _ in D.KL_BY_HAND:
        p, q = (torch.tensor(x, dtype=f64, requires_grad=True) for x in (p, q))
        out.append([divergence(p, q, kind).detach(), reference_divergence(p, q, kind).detach()])
    return out


def ascent_by_hand() -> list:
    """The student's side of definitions.ASCENT_BY_HAND: R_s and the reference code's
    perturbed output, the divergences stood in."""
    import smart

    case = D.ASCENT_BY_HAND
    c, v = (torch.tensor(case[k], dtype=f64) for k in ("c", "v"))

    def f(e):  # (B, T, H) -> (B,): sum over tokens of c_t (e_t . v)
        return (e @ v) @ c

    embeds = torch.zeros(2, 2, 2, dtype=f64, requires_grad=True)
    clean, config = torch.tensor(case["clean"], dtype=f64), smart.SmartConfig(**case["cfg"])
    saved = smart.divergence, smart.reference_divergence
    smart.divergence, smart.reference_divergence = stand_in_divergence, stand_in_reference
    try:
        torch.manual_seed(0)
        paper = smart.adversarial_regularizer(
            f, embeds, clean, "regression", torch.ones(2, 2), config
        )
        theirs = smart.reference_regularizer(f, embeds, clean, "regression", config)
    finally:
        smart.divergence, smart.reference_divergence = saved
    return [paper.detach(), theirs.detach()]
