"""SMART: smoothness-inducing adversarial regularization and a momentum Bregman proximal point.

Jiang et al., 2020, "SMART: Robust and Efficient Fine-Tuning for Pre-trained Natural Language
Models through Principled Regularized Optimization" (ACL). The fine-tuning objective is

    task_loss + lambda_s * R_s + mu * D_Breg

- R_s (smoothness): the largest change of the output when the embedding output is moved
  inside a small infinity-norm ball, found by a few projected gradient-ascent steps.
- D_Breg (Bregman proximal point): the change of the output with respect to a teacher whose
  parameters are an exponential moving average of the model's (the "momentum" variant).

Everything here is a small function of embeddings and outputs; the training loop decides
which head `f` to run, so one code path serves classification, binary and regression tasks.
"""

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from base_bert import rename_hf_keys

KINDS = ("classification", "binary", "regression")
DROPOUT = ("shared", "independent")  # dropout masks of SMART's passes (SmartConfig.dropout)
VARIANTS = ("paper", "reference")  # R_s's ascent as the paper states it, or as its code runs it
REFERENCE_GUARD = 1e-6  # the reference code's adv_epsilon: keeps its per-token division finite


@dataclass
class SmartConfig:
    lambda_s: float = 5.0  # weight of R_s; thesis: 10 for SST, 5 for STS and QQP; 0 turns it off
    mu: float = 1.0  # weight of the Bregman proximal term (thesis and paper: 1); 0 turns it off
    sigma: float = 1e-5  # std of the initial noise on the embedding output
    eta: float = 1e-3  # ascent step size: the reference's SmartPerturbation default (its
    # train.py's --adv_step_size default is 1e-5; the paper does not give one)
    epsilon: float = 1e-5  # radius of the infinity-norm ball the noise is projected onto
    steps: int = 1  # ascent steps (the paper uses 1)
    beta_start: float = 0.99  # teacher momentum during the first warmup_frac of a stage
    beta_end: float = 0.999  # teacher momentum after that
    # the thesis's listings switch after 54, 38 and 1,769 batches of 8: 5% of an epoch of
    # SST (1,068 batches), STS (755) and its QQP (35,376)
    warmup_frac: float = 0.05  # share of a stage's steps that use beta_start
    dropout: str = "shared"  # 'shared': every pass of a step draws the clean pass's dropout
    # masks (the paper's R_s); 'independent': each pass its own (the thesis's code: R-Drop)
    variant: str = "paper"  # 'paper': adversarial_regularizer; 'reference': the reference
    # code's ascent (reference_regularizer), whose passes draw their own masks

    def __post_init__(self):
        if self.lambda_s < 0 or self.mu < 0:
            raise ValueError(f"lambda_s and mu must be >= 0, got {self.lambda_s} and {self.mu}")
        if self.sigma < 0 or self.eta < 0 or self.epsilon <= 0 or self.steps < 0:
            raise ValueError(
                f"need sigma >= 0, eta >= 0, epsilon > 0, steps >= 0; got sigma={self.sigma}, "
                f"eta={self.eta}, epsilon={self.epsilon}, steps={self.steps}"
            )
        if self.dropout not in DROPOUT:
            raise ValueError(f"dropout must be one of {DROPOUT}, got {self.dropout!r}")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.variant == "reference" and self.dropout == "shared":
            raise ValueError("the reference variant's passes draw their own dropout masks")
        for name in ("beta_start", "beta_end"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {getattr(self, name)}")

    @classmethod
    def off(cls) -> "SmartConfig":
        """Both weights 0: the loss is the task's alone."""
        return cls(lambda_s=0.0, mu=0.0)

    @classmethod
    def at_radius(cls, epsilon: float, variant: str = "paper", **settings) -> "SmartConfig":
        """The settings a run's flags give (--smart_epsilon and the rest): the paper's noise
        and step scaled to the ball's radius, sigma = epsilon and eta = 100 x epsilon (its
        1e-5 and 1e-3); the reference variant's passes always draw their own masks."""
        if variant == "reference":
            settings["dropout"] = "independent"
        return cls(sigma=epsilon, eta=100 * epsilon, epsilon=epsilon, variant=variant, **settings)

    @property
    def active(self) -> bool:
        """True when SMART changes the loss (the loop can skip the teacher pass otherwise)."""
        return self.lambda_s > 0 or self.mu > 0


def _log_probs(logits: torch.Tensor, kind: str) -> torch.Tensor:
    """Log-probabilities over classes: (B, C) -> (B, C); a binary logit (B,) -> (B, 2)."""
    if kind == "classification":
        return F.log_softmax(logits, dim=-1)
    # one logit x means P(1) = sigmoid(x), P(0) = sigmoid(-x); softmax over it would be 1
    return torch.stack([F.logsigmoid(-logits), F.logsigmoid(logits)], dim=-1)  # (B, 2)


def _check_outputs(
    p: torch.Tensor, q: torch.Tensor, kind: str
) -> tuple[torch.Tensor, torch.Tensor]:
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
    if p.dim() == 2 and p.size(1) == 1:  # a head that keeps its last dimension: (B, 1) -> (B,)
        p, q = p.squeeze(1), q.squeeze(1)
    if p.dim() != 1:
        raise ValueError(f"{kind} outputs must be (B,) or (B, 1), got {tuple(p.shape)}")
    return p, q


def divergence(p: torch.Tensor, q: torch.Tensor, kind: str) -> torch.Tensor:
    """Symmetric divergence between two outputs of the same head, averaged over the batch.

    classification: p, q logits (B, C); KL(P||Q) + KL(Q||P) of their softmax distributions.
    binary: p, q single logits (B,); the same on the two-class distributions [1 - s, s],
        s = sigmoid(logit).
    regression: p, q predictions (B,); squared error.
    Returns a scalar: the mean over the B examples.
    """
    p, q = _check_outputs(p, q, kind)
    if kind == "regression":
        return (p - q).pow(2).mean()
    # BEGIN EXERCISE symmetric_kl: KL(P||Q) + KL(Q||P) of the distributions _log_probs gives, summed over classes, batch mean
    lp, lq = _log_probs(p, kind), _log_probs(q, kind)  # (B, C)
    # KL(P||Q) + KL(Q||P) = sum_c (P_c - Q_c)(log P_c - log Q_c), one term per class
    return ((lp.exp() - lq.exp()) * (lp - lq)).sum(-1).mean()
    # END EXERCISE symmetric_kl


def _token_mask(embeds: torch.Tensor, attention_mask: torch.Tensor | None):
    """(B, T, 1) of 1 for tokens and 0 for padding, in embeds' dtype; None: no mask."""
    if embeds.dim() < 2:
        raise ValueError(f"embeds must be (B, ...), got {tuple(embeds.shape)}")
    if attention_mask is None:
        return None
    if attention_mask.shape != embeds.shape[:2]:
        raise ValueError(
            f"attention_mask {tuple(attention_mask.shape)} does not match embeds "
            f"{tuple(embeds.shape)}; expected (B, T)"
        )
    return attention_mask[..., None].to(embeds.dtype)  # (B, T, 1)


def adversarial_regularizer(
    f: Callable[[torch.Tensor], torch.Tensor],
    embeds: torch.Tensor,
    clean: torch.Tensor,
    kind: str,
    attention_mask: torch.Tensor | None = None,
    cfg: SmartConfig | None = None,
) -> torch.Tensor:
    """Smoothness-inducing regularizer R_s (SMART, Eq. 3, Algorithm 1 lines 4-8).

    f: embedding output (B, T, H) -> task output, the same head that produced `clean`.
    embeds: (B, T, H) embedding output; clean: f(embeds), logits (B, C) or (B,).
    attention_mask: (B, T), 1 for tokens, 0 for padding (padding gets no noise).
    cfg: the noise's sigma, the ascent's eta and steps, the ball's epsilon (SmartConfig's).
    Returns divergence(f(embeds + noise), clean): a scalar whose gradient reaches the
    parameters through both outputs; the noise itself is a constant for that gradient.
    """
    cfg = cfg or SmartConfig()
    sigma, eta, epsilon = cfg.sigma, cfg.eta, cfg.epsilon
    keep = _token_mask(embeds, attention_mask)  # (B, T, 1) or None
    per_example = tuple(range(1, embeds.dim()))  # every dim but the batch

    def project(noise):  # back into the epsilon ball; padding stays untouched
        noise = noise.clamp(-epsilon, epsilon)
        return noise if keep is None else noise * keep

    # BEGIN EXERCISE smart_ascent: noise = project(randn_like(embeds) * sigma); steps: noise += eta * grad / max|grad| per example
    noise = project(torch.randn_like(embeds) * sigma)
    # the ascent needs the gradient w.r.t. the noise only: detached inputs keep the graph
    # out of the embedding layer, and autograd.grad leaves every parameter's .grad alone
    base, target = embeds.detach(), clean.detach()
    for _ in range(cfg.steps):
        noise.requires_grad_(True)
        adv = divergence(f(base + noise), target, kind)
        # only the gradient's direction is used (the step is normalized below), so adv is
        # divided by its own value: the backward carries numbers near 1 whether adv is
        # ~epsilon^2 (shared masks) or ~1 (R-Drop): float16 neither underflows nor overflows
        (grad,) = torch.autograd.grad(
            adv / adv.detach().clamp(min=1e-30),
            noise,
            allow_unused=True,
            materialize_grads=True,
        )
        # per-example infinity norm: every example moves by eta in its largest coordinate
        scale = grad.abs().amax(dim=per_example, keepdim=True)  # (B, 1, 1)
        noise = project(noise.detach() + eta * grad / scale.clamp(min=1e-12))
    return divergence(f(embeds + noise.detach()), clean, kind)
    # END EXERCISE smart_ascent


def stable_kl(logits: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """The reference code's "stable" KL, what its ascent climbs (mt_dnn/loss.py, stable_kl,
    summed over the batch): sum_c 2 P_c (r(P_c) - r(Y_c)) with r(x) = -log(1/(x + 1e-6) - 1
    + 1e-6), a log-odds whose value is held constant, so that the gradient flows through
    P = softmax(logits) alone; target gives Y and no gradient. Shapes as in `divergence`."""
    p, y = (_log_probs(x, kind).exp() for x in _check_outputs(logits, target.detach(), kind))

    def log_odds(x):
        return -(1.0 / (x + REFERENCE_GUARD) - 1 + REFERENCE_GUARD).detach().log()

    return (2 * p * (log_odds(p) - log_odds(y))).sum()


def reference_divergence(clean: torch.Tensor, adv: torch.Tensor, kind: str) -> torch.Tensor:
    """R_s's loss as the reference code takes it (mt_dnn/loss.py: SymKlCriterion, for
    regression MseCriterion): KL(Q || P) + KL(P || Q) for P the clean output's distribution
    and Q the perturbed one's, each KL with its first distribution a constant. The value is
    `divergence`'s; its gradient is half of divergence's to first order, since each side
    learns from one KL only. Regression: the squared error, both sides learning, the mean
    taken element-wise; mt-dnn's MseCriterion broadcasts its (B,) input against the (B, 1)
    target into a B x B mean, which this does not copy (docs/forgetting.md)."""
    p, q = _check_outputs(clean, adv, kind)
    if kind == "regression":
        return (p - q).pow(2).mean()
    # BEGIN EXERCISE symmetric_kl: the reference code's: KL(Q||P) + KL(P||Q), each KL's first distribution a constant (detached), batch mean
    lp, lq = _log_probs(p, kind), _log_probs(q, kind)  # (B, C)
    kl_q_p = (lq.detach().exp() * (lq.detach() - lp)).sum(-1)  # P learns
    kl_p_q = (lp.detach().exp() * (lp.detach() - lq)).sum(-1)  # Q learns
    return (kl_q_p + kl_p_q).mean()
    # END EXERCISE symmetric_kl


def reference_regularizer(
    f: Callable[[torch.Tensor], torch.Tensor],
    embeds: torch.Tensor,
    clean: torch.Tensor,
    kind: str,
    cfg: SmartConfig | None = None,
) -> torch.Tensor:
    """R_s as SMART's reference code runs it (namisan/mt-dnn, mt_dnn/perturbation.py,
    SmartPerturbation.forward), beside the paper's text above.

    Noise N(0, sigma^2) on every position (padding too), then `steps` times: g, the gradient
    of `stable_kl` (for regression the squared error summed over the batch), and noise <-
    s / (max_h |s| + 1e-6) for the step s = noise + eta * g, the maximum taken per token.
    There is no ball: the division sets every token's largest coordinate to m / (m + 1e-6)
    for m = max_h |s|, near 1 (0.97 at sigma = 1e-5) whatever sigma and eta are, the scale
    of the embedding output itself. The loss is `reference_divergence`. As there, the noise
    is added to the embedding output, which goes on into the encoder (mt_dnn/matcher.py's
    embed_forward as the paper's code had it; docs/forgetting.md). The caller gives an
    embedding output of its own (mt-dnn runs the embedding again, its own dropout mask:
    trainer.smart_term) and runs the passes with their own masks (the network in train mode).
    Shapes as in adversarial_regularizer.
    """
    cfg = cfg or SmartConfig()
    # BEGIN EXERCISE smart_ascent: the reference code's: noise = randn * sigma; steps: s = noise + eta * grad of stable_kl (regression: squared error, summed); noise = s / (max over H of |s| + REFERENCE_GUARD)
    base, target = embeds.detach(), clean.detach()
    noise = torch.randn_like(base) * cfg.sigma  # (B, T, H)
    for _ in range(cfg.steps):
        noise.requires_grad_(True)
        adv = f(base + noise)
        if kind == "regression":
            adv, y = _check_outputs(adv, target, kind)  # (B,) each
            climb = (adv - y).pow(2).sum()
        else:
            climb = stable_kl(adv, target, kind)
        # the gradient's size counts here (it is added to the noise): under float16 it could
        # overflow, so passes_in_float32 runs this variant's passes in float32 there
        (grad,) = torch.autograd.grad(climb, noise, allow_unused=True, materialize_grads=True)
        step = noise.detach() + cfg.eta * grad  # (B, T, H)
        per_token = step.abs().amax(dim=-1, keepdim=True)  # (B, T, 1)
        noise = step / (per_token + REFERENCE_GUARD)
    return reference_divergence(clean, f(embeds + noise), kind)
    # END EXERCISE smart_ascent


def below_resolution(epsilon: float, dtype: torch.dtype | None) -> bool:
    """True when a perturbation of size epsilon on embeddings of size ~1 is rounded away by
    autocast to `dtype` (bf16 resolves ~8e-3, fp16 ~1e-3; the paper's epsilon is 1e-5)."""
    return dtype in (torch.bfloat16, torch.float16) and epsilon < torch.finfo(dtype).eps


def passes_in_float32(cfg: SmartConfig, dtype: torch.dtype | None) -> bool:
    """Whether a SMART step under autocast to `dtype` runs its passes (clean, ascent,
    perturbed, teacher) in float32 rather than in `dtype`; None: no autocast, nothing to do.

    Where R_s measures the perturbation and dtype cannot resolve it: the paper's ascent with
    shared masks, whose R_s (~1e-9 at epsilon 1e-5) autocast would round to nothing. And
    where float16 can overflow: the reference ascent adds its gradient itself to the noise,
    unnormalized (the paper's normalizes adv by its own value first), and float16's backward
    runs in the forward's dtype. Otherwise, with own masks R_s is dropout's difference
    (~4e-3; the perturbation's share ~1e-9), and the reference ascent's perturbation is near
    1 per token: both keep bf16 (docs/precision.md measures what bf16 changes in them).
    """
    shared = cfg.active and cfg.variant == "paper" and cfg.dropout == "shared"
    overflow = cfg.active and cfg.variant == "reference" and dtype == torch.float16
    return overflow or (shared and below_resolution(min(cfg.sigma, cfg.epsilon), dtype))


class RngSnapshot:
    """The random generators as they are now, to be replayed: every forward run under
    `replay()` draws the dropout masks of the first forward made after this was created
    (same shapes, same order of draws); the global generators then go on as if untouched.

    SMART's R_s compares the output on perturbed embeddings with the clean output; with
    masks of their own the passes would mostly differ by dropout (R-Drop, Liang et al. 2021).
    """

    def __init__(self, device: torch.device):
        self.devices = [device] if device.type == "cuda" else []
        self.cpu = torch.get_rng_state()
        self.cuda = [torch.cuda.get_rng_state(d) for d in self.devices]

    @contextmanager
    def replay(self):
        with torch.random.fork_rng(devices=self.devices, device_type="cuda"):
            torch.set_rng_state(self.cpu)
            for d, state in zip(self.devices, self.cuda, strict=True):
                torch.cuda.set_rng_state(state, d)
            yield


def beta_schedule(
    step: int,
    total_steps: int,
    beta_start: float = SmartConfig.beta_start,
    beta_end: float = SmartConfig.beta_end,
    warmup_frac: float = SmartConfig.warmup_frac,
) -> float:
    """Teacher momentum at `step` (0-based): beta_start during the first warmup_frac of the
    stage's steps, then beta_end (the thesis: 0.99, then 0.999 after the first 5%). The
    teacher follows quickly while the model leaves the pretrained point, then slowly."""
    if total_steps <= 0 or step < 0:
        raise ValueError(f"need total_steps > 0 and step >= 0, got {step} of {total_steps}")
    if not 0.0 <= warmup_frac <= 1.0:
        raise ValueError(f"warmup_frac must lie in [0, 1], got {warmup_frac}")
    return beta_start if step < warmup_frac * total_steps else beta_end


class EMATeacher:
    """Exponential moving average of a model's parameters (the momentum teacher).

    The copy is made once, here; `update` then moves it in place after every optimizer
    step, and `forward` runs the model's own modules with these parameters, so no second
    model is ever built. Build it after the model has been moved to its device.
    """

    def __init__(self, model: nn.Module, cfg: SmartConfig | None = None, total_steps: int = 1):
        self.params = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.cfg, self.total_steps, self.step = cfg or SmartConfig(), total_steps, 0

    def restore(self, params: dict, step: int) -> None:
        """Parameters and a step saved by a checkpoint; a run saved while bert.py had
        Hugging Face's names has its encoder's renamed to ours."""
        rename_hf_keys(params, "bert.")
        self.params, self.step = params, step

    @torch.no_grad()
    def update(self, model: nn.Module, beta: float | None = None) -> None:
        """theta_teacher <- beta * theta_teacher + (1 - beta) * theta_model, in place.

        beta: by default the momentum schedule's (`beta_schedule`) at this teacher's own
        count of updates out of `total_steps`, the steps of the stage it was made for.
        """
        if beta is None:
            c = self.cfg
            beta = beta_schedule(
                self.step, self.total_steps, c.beta_start, c.beta_end, c.warmup_frac
            )
        self.step += 1
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must lie in [0, 1], got {beta}")
        student = dict(model.named_parameters())
        if student.keys() != self.params.keys():
            missing = sorted(self.params.keys() ^ student.keys())[:5]
            raise ValueError(f"model parameters differ from the teacher's, e.g. {missing}")
        # BEGIN EXERCISE momentum_teacher: every teacher tensor <- beta * itself + (1 - beta) * the model's, in place
        names = list(self.params)
        # lerp_(end, w) computes self + w * (end - self) = (1 - w) * self + w * end
        torch._foreach_lerp_(
            [self.params[n] for n in names], [student[n].detach() for n in names], 1.0 - beta
        )
        # END EXERCISE momentum_teacher

    @torch.no_grad()
    def forward(self, model: nn.Module, *args, **kwargs):
        """model(*args, **kwargs) computed with the teacher's parameters (buffers: the model's).

        Dropout follows the model's train/eval mode, as in the rest of the step.
        """
        return functional_call(model, self.params, args, kwargs)


def bregman_divergence(
    student_out: torch.Tensor, teacher_out: torch.Tensor, kind: str
) -> torch.Tensor:
    """D_Breg (SMART, Eq. 5): divergence of the model's output from the teacher's, with the
    teacher side a constant. Shapes as in `divergence`."""
    return divergence(student_out, teacher_out.detach(), kind)


def smart_loss(
    f: Callable[[torch.Tensor], torch.Tensor],
    embeds: torch.Tensor,
    clean: torch.Tensor,
    kind: str,
    teacher_out: torch.Tensor | None,
    cfg: SmartConfig,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """lambda_s * R_s + mu * D_Breg, to be added to the task loss.

    f, embeds, clean, attention_mask: as in `adversarial_regularizer`; teacher_out: the
    teacher's output on the same batch (EMATeacher.forward), may be None when mu == 0.
    With both weights 0 it returns a zero that touches nothing (no noise drawn, no forward
    pass), so the training step is then exactly a plain step.
    """
    loss = clean.new_zeros(())
    if cfg.lambda_s > 0:
        if cfg.variant == "reference":
            r_s = reference_regularizer(f, embeds, clean, kind, cfg)
        else:
            r_s = adversarial_regularizer(f, embeds, clean, kind, attention_mask, cfg)
        loss = loss + cfg.lambda_s * r_s
    if cfg.mu > 0:
        if teacher_out is None:
            raise ValueError(
                "smart_loss: mu > 0 needs teacher_out (EMATeacher.forward on the batch)"
            )
        loss = loss + cfg.mu * bregman_divergence(clean, teacher_out, kind)
    return loss
