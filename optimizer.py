"""AdamW written by hand, and PCGrad gradient surgery for multitask training.

AdamW: Adam (Kingma & Ba, 2015, "Adam: A Method for Stochastic Optimization") with
decoupled weight decay (Loshchilov & Hutter, 2019, "Decoupled Weight Decay
Regularization"), the four steps of the CS224n handout: update the gradient's first and
second moments, correct their bias (unless correct_bias=False), update the parameter,
decay it with the learning rate. Ours decays first and adds eps as torch.optim.AdamW does,
so the two agree to float rounding; the handout's order (its "efficient version", then the
decay) passes its test too, `python optimizer_test.py` (atol 1e-6, rtol 1e-4).

PCGrad: Yu et al., 2020, "Gradient Surgery for Multi-Task Learning". When two task gradients
conflict (negative dot product), each is projected onto the normal plane of the other before
they are summed. It lives here because it changes the gradient the optimizer sees:

    grads = []
    for task in tasks:
        optimizer.zero_grad()
        task_loss(task).backward()
        grads.append(flatten_grads(params))     # (P,)
    write_flat_grads(params, pcgrad(grads))
    optimizer.step()

The training loop's update combines a step's task losses with equal or random weights
(Lin et al., 2022), or with PCGrad's surgery; the rest of this file is that update's
arithmetic: the learning-rate schedule within a stage, the L2-SP pull toward the
pretrained weights, gradient clipping and the (scaled) backward.
"""

import math
from collections.abc import Callable, Iterable

import torch


def _check_hyperparameters(group: dict, where: str) -> None:
    """Raise a ValueError naming the bad hyperparameter and the group it came from."""
    lr, betas, eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    if not lr >= 0.0:
        raise ValueError(f"AdamW {where}: lr must be >= 0, got {lr}")
    if not isinstance(betas, tuple | list) or len(betas) != 2:
        raise ValueError(f"AdamW {where}: betas must be a pair (beta1, beta2), got {betas}")
    for name, beta in zip(("beta1", "beta2"), betas, strict=True):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"AdamW {where}: {name} must be in [0, 1), got {beta}")
    if not eps >= 0.0:
        raise ValueError(f"AdamW {where}: eps must be >= 0, got {eps}")
    if not weight_decay >= 0.0:
        raise ValueError(f"AdamW {where}: weight_decay must be >= 0, got {weight_decay}")


class AdamW(torch.optim.Optimizer):
    """Adam with decoupled weight decay; per-parameter state: step, exp_avg, exp_avg_sq.

    Every hyperparameter can be set per parameter group. `foreach=True` runs the same math
    with torch._foreach_* ops over all tensors of a group at once (fewer kernel launches);
    the default loop over parameters is the one to read.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,  # step size
        betas: tuple[float, float] = (0.9, 0.999),  # decay rates of the two moment averages
        eps: float = 1e-6,  # added to sqrt(v_hat) so the step stays finite
        weight_decay: float = 0.0,  # decoupled decay: p <- p - lr * weight_decay * p
        correct_bias: bool = True,  # divide the moments by (1 - beta^t), as Adam does
        foreach: bool = False,  # vectorised update over a group's tensors; same numbers
    ):
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            correct_bias=correct_bias,
            foreach=foreach,
        )
        _check_hyperparameters(defaults, "defaults")
        self._scratch_buffers = {}  # (dtype, device) -> flat tensor; see _scratch
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        # The base class fills a group's missing options from the defaults; check the result.
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        _check_hyperparameters(group, f"parameter group {len(self.param_groups) - 1}")

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """Update every parameter that has a gradient; return closure()'s loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group_index, group in enumerate(self.param_groups):
            params = []
            for param_index, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(
                        f"AdamW: parameter {param_index} of group {group_index} has a sparse "
                        "gradient, which AdamW does not support; use torch.optim.SparseAdam "
                        "or an embedding with sparse=False"
                    )
                params.append(p)
            if group["foreach"]:
                self._foreach_update(group, params)
            else:
                self._loop_update(group, params)
        return loss

    def _bias_corrections(self, group: dict, step: int) -> tuple[float, float]:
        """(1 - beta1^t, 1 - beta2^t), or (1, 1) when bias correction is off."""
        if not group["correct_bias"]:
            return 1.0, 1.0
        beta1, beta2 = group["betas"]
        return 1.0 - beta1**step, 1.0 - beta2**step

    def _loop_update(self, group: dict, params: list[torch.Tensor]) -> None:
        """The step of each parameter of `group` that has a gradient, one at a time."""
        alpha = group["lr"]
        for p in params:
            grad = p.grad
            state = self.state[p]  # this parameter's state, kept from one step to the next
            # BEGIN EXERCISE adamw: on the first step the state (a step count, the two moments); count the step; update the moments; bias corrections (correct_bias); decay p by alpha * weight_decay; p -= alpha * m_hat / (sqrt(v_hat) + eps)
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            (beta1, beta2), eps = group["betas"], group["eps"]
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]

            # m_t = beta1 * m_{t-1} + (1 - beta1) * g, i.e. m moves toward g by (1 - beta1)
            exp_avg.lerp_(grad, 1.0 - beta1)
            # v_t = beta2 * v_{t-1} + (1 - beta2) * g^2
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)

            # m_hat = m_t / bias1 and v_hat = v_t / bias2 (both 1 without correction)
            t = state["step"]
            bias1, bias2 = (1 - beta1**t, 1 - beta2**t) if group["correct_bias"] else (1.0, 1.0)

            # p <- p - alpha * weight_decay * p, before the Adam step (decoupled decay)
            if group["weight_decay"]:
                p.mul_(1.0 - alpha * group["weight_decay"])

            # p <- p - alpha * m_hat / (sqrt(v_hat) + eps), both corrections folded into
            # scalars: m_hat / (sqrt(v_hat) + eps) = sqrt(bias2) / bias1 * m / (sqrt(v) +
            # eps * sqrt(bias2)). sqrt(v) goes to a scratch buffer: one pass over v and no
            # new tensor per parameter (a fresh 47 MB for MiniLM's word embeddings each step
            # costs the kernel's page faults, more than the arithmetic).
            root2 = math.sqrt(bias2)
            denom = torch.sqrt(exp_avg_sq, out=self._scratch(p)).add_(eps * root2)
            p.addcdiv_(exp_avg, denom, value=-alpha * root2 / bias1)
            # END EXERCISE adamw

    def _scratch(self, p: torch.Tensor) -> torch.Tensor:
        """A buffer shaped like p, a view of one flat tensor that every parameter of its
        dtype and device shares (as large as the largest; not state, so not saved)."""
        key = (p.dtype, p.device)
        buffers = self._scratch_buffers
        if key not in buffers or buffers[key].numel() < p.numel():
            buffers[key] = torch.empty(p.numel(), dtype=p.dtype, device=p.device)
        return buffers[key][: p.numel()].view_as(p)  # (numel,) -> p's shape

    def _foreach_update(self, group: dict, params: list[torch.Tensor]) -> None:
        """The same update as _loop_update, one torch._foreach_* call per line of math."""
        if not params:
            return
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        states = [self.state[p] for p in params]
        for p, s in zip(params, states, strict=True):
            if not s:  # the first step: a step count and the two moments
                s["step"] = 0
                s["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                s["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        grads = [p.grad for p in params]
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        for s in states:
            s["step"] += 1
        # Step counts can differ inside a group (a parameter without a gradient is skipped),
        # so the bias corrections are per tensor.
        biases = [self._bias_corrections(group, s["step"]) for s in states]

        # BEGIN EXERCISE adamw_foreach: the same update over the group, one torch._foreach_* call per line of math
        torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)

        if group["weight_decay"]:
            torch._foreach_mul_(params, 1.0 - lr * group["weight_decay"])

        roots2 = [math.sqrt(bias2) for _, bias2 in biases]
        denoms = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_add_(denoms, [eps * root2 for root2 in roots2])
        steps = [-lr * root2 / bias1 for root2, (bias1, _) in zip(roots2, biases, strict=True)]
        torch._foreach_addcdiv_(params, exp_avgs, denoms, steps)
        # END EXERCISE adamw_foreach


def project_conflicting(
    grads: list[torch.Tensor], generator: torch.Generator | None = None
) -> list[torch.Tensor]:
    """PCGrad's per-task projection (Yu et al., 2020, Algorithm 1).

    Args:
        grads: T task gradients, each a flat vector of shape (P,).
        generator: source of the random order in which each task visits the others.
    Returns:
        T projected gradients, each (P,): one copy per task, the inputs are left untouched.

    For task i, a copy g_i is projected off each other task's ORIGINAL gradient g_j, in a
    random order (a fresh permutation of range(T) per task, skipping i), whenever they
    conflict: if g_i . g_j < 0, g_i <- g_i - (g_i . g_j) / ||g_j||^2 * g_j.
    """
    if not grads:
        raise ValueError("pcgrad: expected at least one task gradient, got an empty list")
    shape = grads[0].shape
    for t, g in enumerate(grads):
        if g.dim() != 1 or g.shape != shape:
            raise ValueError(
                f"pcgrad: every task gradient must be a flat vector of the same shape (P,); "
                f"task 0 has shape {tuple(shape)}, task {t} has shape {tuple(g.shape)}"
            )
    # BEGIN EXERCISE pcgrad: per task, a copy of g_i projected off each conflicting g_j, j in torch.randperm(T, generator) order
    num_tasks = len(grads)
    projected = []
    for i in range(num_tasks):
        g_i = grads[i].clone()
        order = torch.randperm(num_tasks, generator=generator).tolist()
        for j in order:
            if j == i:
                continue
            g_j = grads[j]
            dot = torch.dot(g_i, g_j)
            # A zero g_j gives dot == 0, so there is never a division by ||g_j||^2 = 0.
            if dot < 0:
                g_i.sub_(g_j, alpha=(dot / torch.dot(g_j, g_j)).item())
        projected.append(g_i)
    return projected
    # END EXERCISE pcgrad


def pcgrad(grads: list[torch.Tensor], generator: torch.Generator | None = None) -> torch.Tensor:
    """Gradient surgery: the sum of the projected task gradients.

    Args:
        grads: T task gradients, each a flat vector of shape (P,).
        generator: source of the random projection order (same seed, same result).
    Returns:
        (P,) the combined gradient to hand to the optimizer.
    """
    projected = project_conflicting(grads, generator)
    total = projected[0]  # sum in place into the first copy: no (T, P) stack
    for g in projected[1:]:
        total.add_(g)
    return total


def flatten_grads(params: Iterable[torch.Tensor]) -> torch.Tensor:
    """Concatenate the .grad of every parameter into one (P,) vector; None counts as zeros."""
    chunks = []
    for index, p in enumerate(params):
        if p.grad is None:
            chunks.append(torch.zeros(p.numel(), dtype=p.dtype, device=p.device))
        elif p.grad.is_sparse:
            raise RuntimeError(f"flatten_grads: parameter {index} has a sparse gradient")
        else:
            chunks.append(p.grad.reshape(-1))
    if not chunks:
        raise ValueError("flatten_grads: got no parameters")
    return torch.cat(chunks)  # (P,)


def write_flat_grads(params: Iterable[torch.Tensor], flat: torch.Tensor) -> None:
    """Write a (P,) vector back into the .grad of each parameter, in flatten_grads' order.

    Every parameter gets a gradient, so one that no task used gets zeros (and AdamW then
    still decays it); pass only the parameters that should take part.
    """
    params = list(params)
    total = sum(p.numel() for p in params)
    if flat.dim() != 1 or flat.numel() != total:
        raise ValueError(
            f"write_flat_grads: expected a flat vector of {total} values (the parameters' "
            f"total size), got shape {tuple(flat.shape)}"
        )
    offset = 0
    for p in params:
        chunk = flat[offset : offset + p.numel()].view_as(p)
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.copy_(chunk)
        offset += p.numel()


def random_loss_weights(num_tasks: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random loss weighting (Lin et al., 2022, "Reasonable Effectiveness of Random Weighting"):
    weights drawn from N(0, 1) each step and normalized with a softmax, so they are positive
    and sum to 1. Returns (num_tasks,)."""
    if num_tasks < 1:
        raise ValueError(f"need at least one task, got {num_tasks}")
    return torch.softmax(torch.randn(num_tasks, generator=generator), dim=0)


# ---------------------------------------------------------------------------------------
# The training step's update from several task losses

WEIGHTINGS = ("equal", "random", "pcgrad")  # how a step combines its task losses
DECAYS = ("constant", "linear")  # the learning rate after a stage's warmup


def loss_weights(
    num_tasks: int, weighting: str, generator: torch.Generator | None = None
) -> list[float]:
    """The weights of a step's task losses: random ones, or equal (also PCGrad's report)."""
    if weighting == "random":
        return random_loss_weights(num_tasks, generator).tolist()
    return [1 / num_tasks] * num_tasks


def lr_factor(step: int, total: int, warmup: float = 0.0, decay: str = "constant") -> float:
    """Multiplier of a stage's learning rate at its update `step` (1-based) of `total`.

    Linear warmup from 0 over the first round(warmup * total) updates (BERT's recipe,
    Devlin et al. 2019), then constant, or a linear decay whose last update still moves
    (1 / (remaining + 1) of the peak).
    """
    if decay not in DECAYS:
        raise ValueError(f"decay must be one of {DECAYS}, got {decay!r}")
    if not 1 <= step <= total:
        raise ValueError(f"step must lie in [1, {total}], got {step}")
    w = round(warmup * total)
    if step <= w:
        return step / w
    if decay == "linear":
        return 1 - (step - w) / (total - w + 1)
    return 1.0


def l2_sp(params: Iterable[torch.Tensor], anchors: Iterable[torch.Tensor]) -> torch.Tensor:
    """L2-SP (Li, Grandvalet & Davoine, 2018): 1/2 * sum ||w - w0||^2 over the parameters,
    w0 their starting point (the pretrained weights), so fine-tuning is pulled back toward
    what the encoder knew instead of toward 0 as weight decay does."""
    pairs = list(zip(params, anchors, strict=True))
    if not pairs:
        raise ValueError("l2_sp: got no parameters")
    return sum((p - a.detach()).pow(2).sum() for p, a in pairs) / 2


def pcgrad_backward(shared: list, losses: list, scaler, generator=None, reduce=None):
    """Gradients of several task losses with gradient surgery (PCGrad), not yet applied.

    Each task's gradient on the `shared` parameters (the encoder) is taken alone (one flat
    copy per task), projected off the others where they conflict, and summed; parameters
    outside `shared` (the per-task heads) just accumulate their own task's gradient.
    reduce(flat) -> flat: applied to each task's gradient before the surgery (data parallel:
    the sum over processes); a loss of None contributes zeros (no example of that task here).
    scaler: the run's GradScaler (float16's scales; elsewhere a no-op). Every task's loss is
    scaled by the same factor s, and the surgery is homogeneous (pcgrad(s * g) =
    s * pcgrad(g)), so the step unscales the result as it would a plain gradient; an
    overflow in any task skips the step.
    """
    grads = []
    for loss in losses:
        for p in shared:
            p.grad = None
        if loss is not None:
            scaler.scale(loss).backward()
        flat = flatten_grads(shared)  # (P,)
        grads.append(reduce(flat) if reduce else flat)
    write_flat_grads(shared, pcgrad(grads, generator))
