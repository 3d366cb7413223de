"""What the checks run each piece on, and how they run it as real runs use it: tiny
models and inputs, gradients, dropout's statistics, float32 and another device, and the
stand-ins that answer for the other exercises while one is graded. Nothing here imports
an exercise's module before a check calls it.
"""

from contextlib import contextmanager
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

import definitions as D
from harness import part, student
from tiny_bert import TinyLoader, f64, tiny_config

STEP = ("sst", "para", "sts")  # the multitask step's tasks

# dropout's p in the training-mode parts: not 0.5 (a p written into the body instead of the
# one given would pass) and a whole number of 2^-16 (this project's CPU dropout draws 16 bits)
P_DROP = 0.375

KEPT = 1 / (1 - P_DROP)  # each kept value's scale: 1.6


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def padded(B=3, T=7, vocab=100, seed=0):
    """(ids, token types, mask) with padding in one row and both token types."""
    ids = torch.randint(1, vocab, (B, T), generator=gen(seed))
    types = (torch.arange(T) >= T // 2).long().expand(B, T).clone()
    mask = torch.ones(B, T, dtype=torch.long)
    mask[min(1, B - 1), T - 3 :] = 0
    return ids, types, mask


def additive(keep, dtype=torch.float32):
    """(B, T) 1/0 -> (B, 1, 1, T): 0 where kept, the dtype's most negative where padded."""
    return (1.0 - keep[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


def grads(y, inputs, w):
    """The gradients of sum(y * w) with respect to each input (one tensor, or several),
    stacked flat; zeros for an input y does not reach (a graph cut there fails its part,
    not the grader)."""
    inputs = [inputs] if torch.is_tensor(inputs) else list(inputs)
    if not y.requires_grad:
        return torch.cat([torch.zeros_like(x).flatten() for x in inputs])
    found = torch.autograd.grad((y * w).sum(), inputs, allow_unused=True)
    low = y.is_floating_point() and y.dtype != torch.float64  # their rounding is y's
    flat = torch.cat(
        [
            (g if g is not None else torch.zeros_like(x)).flatten()
            for g, x in zip(found, inputs, strict=True)
        ]
    )
    return flat.to(y.dtype) if low else flat


def dropout_parts(what: str, got, clean, run=torch.float64):
    """Inverted dropout at p = P_DROP: each element of `got` is 0 or KEPT times its `clean`
    value, and about P_DROP of them are 0 (`run`: the dtype the run computes in)."""
    kept = clean.abs() > 1e-6
    ratio = got[kept] / clean[kept]
    yield part(
        f"{what}: each value dropped (0) or kept and scaled by 1 / (1 - p) ({KEPT:g}x)",
        torch.minimum(ratio.abs(), (ratio - KEPT).abs()),
        lambda: torch.zeros(len(ratio), dtype=run),
        tol=1e-5,
    )
    share = (ratio.abs() < 1e-6).double().mean()
    yield part(f"{what}: the share dropped at p = {P_DROP}", share, lambda: P_DROP, tol=0.15)


EMBEDDING = F.embedding


def strict_embedding(input, weight, *args, **kwargs):
    """F.embedding as CUDA runs it: the indices on the table's device (meta lets a CPU
    index through)."""
    if input.device != weight.device:
        raise RuntimeError(f"embedding indices on {input.device}, the table on {weight.device}")
    return EMBEDDING(input, weight, *args, **kwargs)


# what torch says when one op meets tensors of two devices (and strict_embedding's words)
TWO_DEVICES = ("same device", "expected device", "embedding indices on")


def as_run(what: str, run, reference):
    """The piece as real runs use it: in float32 (`run(float32, "cpu")`), its output float32
    and within float32's rounding of `reference` (the float64 output); then on another
    device (meta: no values, only shapes and devices), where a tensor the body makes
    without device= lands on the CPU and the run fails, as it would on a GPU. An op the
    meta device cannot run (one whose shape depends on values) leaves that part out; a
    reference of None, the float32 values."""
    out, device = student(on_devices, run)
    yield part(f"{what} in float32: a float32 output", out.dtype == torch.float32, True)
    if reference is not None:  # None: float32 draws other random numbers than float64
        yield part(
            f"{what} in float32", out, lambda: reference.detach(), tol=1e-4, dtype=torch.float32
        )
    if device is not None:
        yield part(f"{what} with its inputs on another device: {device}", device == "meta", True)


def on_devices(run):
    """(run's float32 output on the CPU, the device of its meta run's output or what that
    run raised; None where the meta device cannot run it)."""
    out = run(torch.float32, "cpu")
    F.embedding = strict_embedding
    try:
        return out, run(torch.float32, "meta").device.type
    except (RuntimeError, NotImplementedError) as e:
        if str(e).startswith("exercise "):
            raise  # an open exercise
        if not any(words in str(e) for words in TWO_DEVICES):
            return out, None  # the meta device cannot run it: no verdict on devices
        return out, str(e).splitlines()[0][:120]
    finally:
        F.embedding = EMBEDDING


def tiny_self_attention(p: float = 0.0):
    """bert.py's BertSelfAttention of the tiny config, attention dropout p, in eval mode."""
    from bert import BertSelfAttention

    return BertSelfAttention(tiny_config(attention_probs_dropout_prob=p)).double().eval()


def tiny_multitask(tasks, dropout=0.1, heads=None):
    """sbert.py's SentenceBERT on a tiny BertModel; `heads` ({task: a Linear}) loaded into
    its heads (the student's side only)."""
    from bert import BertModel
    from sbert import SentenceBERT

    torch.manual_seed(0)
    model = SentenceBERT(BertModel(tiny_config()), tasks=tasks, dropout=dropout)
    for task, head in (heads or {}).items():
        model.heads[task].load_state_dict(head.state_dict())
    return model


def handout_multitask():
    """multitask_classifier.py's MultitaskBERT built by its own __init__ from the handout's
    config (hidden_dropout_prob = P_DROP, fine-tuned) on StandInEncoder, all of it seeded; the
    handout's BERT_HIDDEN_SIZE set to the tiny width, as a run sets it (the student's side
    only)."""
    import multitask_classifier as handout

    hidden = tiny_config().hidden_size
    config = handout_config(5, hidden)
    loader, handout.BertModel = handout.BertModel, TinyLoader()
    handout.BERT_HIDDEN_SIZE = hidden
    try:
        torch.manual_seed(0)  # the heads' weights (the stand-in seeds its own)
        return handout.MultitaskBERT(config)
    finally:
        handout.BertModel = loader


class StandInBert(nn.Module):
    """What a sentiment classifier calls of BertModel (forward, or embed then encode),
    answered by `table`: the hidden states are the ids' rows (0 where padded) but at [CLS],
    which holds the sum of the rows the mask keeps; the pooled output is that [CLS] vector,
    so a [CLS] read from either is the same, and a mask left out changes it. It refuses
    what BertModel refuses (ids_checked, encode's shapes)."""

    def __init__(self, table):
        super().__init__()
        self.table = table  # the grader's leaf itself (gradients reach it), no parameter
        self.config = SimpleNamespace(hidden_size=table.size(1))  # BertModel's, what is read

    @contextmanager
    def token_types(self, token_type_ids):
        """BertModel's: the stand-in adds no token types, but refuses what a table would."""
        if token_type_ids is not None:
            F.embedding(token_type_ids, self.table.new_zeros(2, self.table.size(1)))
        yield

    def embed(self, input_ids):
        ids_checked(input_ids, len(self.table))
        return F.embedding(input_ids, self.table)  # (B, T, H)

    def encode(self, embeds, attention_mask, output_attentions=False):
        if attention_mask.dim() != 2 or embeds.shape[:2] != attention_mask.shape:
            shapes = f"{tuple(embeds.shape)} and {tuple(attention_mask.shape)}"
            raise ValueError(f"encode: embeddings (B, T, H) and a mask (B, T), got {shapes}")
        h = embeds * attention_mask[..., None].to(embeds.dtype)  # (B, T, H): padding zeroed
        cls = h.sum(1, keepdim=True)  # (B, 1, H): [CLS] sees what the mask keeps
        h = torch.cat([cls, h[:, 1:]], 1)  # (B, T, H)
        return {"last_hidden_state": h, "pooler_output": h[:, 0]}

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        with self.token_types(token_type_ids):
            return self.encode(self.embed(input_ids), attention_mask)


def ids_checked(ids, rows: int) -> None:
    """BertModel's refusals of token ids (bert.py: BertModel._check_ids, the tiny config's
    sizes): not (B, T), longer than its 64 positions, outside [0, rows) on the CPU."""
    if ids.dim() != 2:
        raise ValueError(f"token ids must be (B, T), got {tuple(ids.shape)}")
    if ids.size(1) > tiny_config().max_position_embeddings:
        raise ValueError(f"sequence length {ids.size(1)} is longer than the position table")
    if ids.device.type == "cpu" and ids.numel() and (ids.min() < 0 or ids.max() >= rows):
        raise ValueError(f"token ids must lie in [0, {rows})")


def handout_config(num_labels: int, hidden: int) -> SimpleNamespace:
    """The handout's model config, fine-tuned (both years' words), dropout's p = P_DROP; a
    BERT the check's loader stands in for."""
    return SimpleNamespace(
        num_labels=num_labels,
        hidden_size=hidden,
        hidden_dropout_prob=P_DROP,
        option="finetune",
        fine_tune_mode="full-model",
        bert="stand-in",
        attention="manual",
        data_dir=".",
    )


class StandInLoader:
    """classifier.py's BertModel while its __init__ runs: from_pretrained gives StandInBert."""

    def __init__(self, table):
        self.table = table

    def from_pretrained(self, *args, **kwargs):
        return StandInBert(self.table)


def stand_in_classifier(head, table):
    """classifier.py's BertSentimentClassifier built by its own __init__ from the handout's
    config (num_labels, hidden_size, hidden_dropout_prob = P_DROP), BERT stood in for by
    StandInBert(table), `head`'s weights in its linear layer (the student's side only)."""
    import classifier

    config = handout_config(head.out_features, table.size(1))
    loader, classifier.BertModel = classifier.BertModel, StandInLoader(table)
    try:
        torch.manual_seed(0)
        model = classifier.BertSentimentClassifier(config)
    finally:
        classifier.BertModel = loader
    linear = classifier_head(model)
    linear.load_state_dict(head.state_dict())
    linear.to(dtype=table.dtype, device=table.device)
    return model


def classifier_head(model) -> nn.Linear:
    """The one nn.Linear a sentiment classifier adds to BERT (the student's, by any name)."""
    bert = set(model.bert.modules())
    found = [m for m in model.modules() if isinstance(m, nn.Linear) and m not in bert]
    if len(found) != 1:
        raise ValueError(
            "BertSentimentClassifier: expected one nn.Linear(hidden_size, num_labels) beside "
            f"BERT, found {len(found)}"
        )
    return found[0]


HEADS = {"sst": (32, 5), "cfimdb": (32, 2), "para": (96, 1)}  # the tiny model's: (in, out)


def seeded_heads(tasks) -> dict:
    """{task: a Linear of the tiny model's head shape}, its weights drawn from a seed: the
    same on both sides, loaded into the student's model."""
    heads = {}
    for i, task in enumerate(tasks):
        n_in, n_out = HEADS[task]
        head = heads[task] = nn.Linear(n_in, n_out)
        with torch.no_grad():
            head.weight.copy_(torch.randn(n_out, n_in, generator=gen(30 + i)) / n_in**0.5)
            head.bias.copy_(torch.randn(n_out, generator=gen(40 + i)))
    return heads


def stand_in_table():
    """The stand-in encoder's vectors per id, (100, 32), a leaf (gradients reach it), and
    per position."""
    table, position = torch.randn(2, 100, 32, generator=gen(7))
    return table.requires_grad_(), position


class StandInModel(nn.Module):
    """What a training step calls of SentenceBERT, answered by an embedding table and one
    linear head per task: the step's check needs none of the other exercises."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.bert = nn.Embedding(50, 8)
        sizes = {"sst": (8, 5), "para": (24, 1), "sts": (24, 1)}  # a pair's head on [u, v, u * v]
        self.heads = nn.ModuleDict({t: nn.Linear(*sizes[t]) for t in STEP})

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
    """float16's GradScaler at a fixed scale of 8, as a step calls it: scale a loss (a
    tensor only), unscale the optimizer's gradients once per step, step, update."""

    def __init__(self):
        self.unscaled = False

    def is_enabled(self):
        return True

    def scale(self, loss):
        if not torch.is_tensor(loss):
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")
        return loss * 8

    def unscale_(self, optimizer):
        if self.unscaled:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        self.unscaled = True
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.div_(8)

    def step(self, optimizer):
        optimizer.step()

    def update(self):
        self.unscaled = False


class Recording(torch.optim.SGD):
    """An optimizer that changes nothing: it counts its step() and zero_grad() calls and
    keeps the gradient each step is handed, flat (a parameter without one: zeros)."""

    def __init__(self, params):
        super().__init__(params, lr=0.0)
        self.seen, self.zero_grads = [], 0

    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"]]
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        self.seen.append(torch.cat([g.detach().flatten() for g in grads]))

    def zero_grad(self, set_to_none: bool = True):
        self.zero_grads += 1
        super().zero_grad(set_to_none)


def stepped(model, stage, ctx, generator):
    """(loss, the gradient handed to the optimizer's last step, unscaled, [its step()
    calls, its zero_grad() calls]) of one trainer.train_step, watched through its
    optimizer (no clipping: ctx's max_grad_norm is 0)."""
    import trainer

    optimizer = Recording(model.parameters())
    loss, _ = trainer.train_step(model, optimizer, stage, step_batches(), ctx, generator)
    last = optimizer.seen[-1] if optimizer.seen else None
    return loss, last, [len(optimizer.seen), optimizer.zero_grads]


def first_steps(opt_class, **options) -> list[torch.Tensor]:
    """Each of definitions.FIRST_STEPS run for one step by opt_class: its parameters, flat
    (the student's side)."""
    out = []
    for case in D.FIRST_STEPS:
        params = [nn.Parameter(torch.tensor(p, dtype=f64)) for p, *_ in case["groups"]]
        for param, (_, g, *_) in zip(params, case["groups"], strict=True):
            param.grad = torch.tensor(g, dtype=f64)
        groups = [
            {"params": [q], "lr": lr, "weight_decay": wd}
            for q, (_, _, lr, wd) in zip(params, case["groups"], strict=True)
        ]
        opt = opt_class(
            groups,
            lr=1.0,
            betas=D.BETAS,
            eps=case["eps"],
            weight_decay=0.0,
            correct_bias=case["correct_bias"],
            **options,
        )
        opt.step()
        out.append(torch.cat([q.detach().flatten() for q in params]))
    return out


def finite_differences(f, inputs, h: float = 1e-6) -> torch.Tensor:
    """The gradient of the scalar f() with respect to each input, by central differences,
    stacked flat (the student's side: f is the student's code, run on the inputs as they
    are nudged in place, then put back)."""
    out = []
    with torch.no_grad():
        for x in inputs:
            flat = x.view(-1)
            for i in range(flat.numel()):
                keep = flat[i].item()
                flat[i] = keep + h
                up = float(f())
                flat[i] = keep - h
                down = float(f())
                flat[i] = keep
                out.append((up - down) / (2 * h))
    return torch.tensor(out, dtype=torch.float64)


def second_tensor_first_step(opt_class, **options) -> torch.Tensor:
    """A group of two tensors, the second with no gradient at the first step: the second
    tensor after the second step, its own first (the student's side)."""
    first, second = (nn.Parameter(torch.tensor(v, dtype=f64)) for v in ([1.0, 2.0], D.LATE[0]))
    opt = opt_class([first, second], lr=D.LATE[2], eps=1e-6, betas=D.BETAS, **options)
    first.grad = torch.tensor([0.3, -0.2], dtype=f64)
    opt.step()
    first.grad, second.grad = (
        torch.tensor([0.1, 0.4], dtype=f64),
        torch.tensor(D.LATE[1], dtype=f64),
    )
    opt.step()
    return second.detach().clone()


def logits_in_training(draws, head, z, n: int, what: str = "training"):
    """The mean and variance of n draws of the logits in training against dropout's before
    the head: E[W dropout(z) + b] = W z + b, and its variance."""
    draws = draws.double().view(n, 3, -1)  # (n * B, C) -> (n, B, C)
    expected = head(z).detach().double()  # (B, C)
    var = P_DROP / (1 - P_DROP) * (head.weight.double() ** 2) @ (z.double() ** 2).T  # (C, B)
    se = (var.T / n).sqrt()
    yield part(
        f"{what}: the mean of the logits, in standard errors",
        (draws.mean(0) - expected) / se,
        lambda: torch.zeros_like(expected),
        tol=5.0,
    )
    yield part(
        f"{what}: the logits' variance / dropout's before the head",
        draws.var(0) / var.T,
        lambda: torch.ones_like(expected),
        tol=0.15,
    )
