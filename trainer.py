"""The one training loop: a stage's steps, and a step's forward, losses and update.

Read it top down: `train_step` is one update, on one screen: for each batch, the forward,
the task's loss (losses.py) and the terms the stage adds to it, backward; then unscale,
clip and step, with the run's GradScaler (float16's; a no-op otherwise). What a stage adds
is decided once, by `added_terms`: SMART's term (smart.py), distillation, the added SimCSE
term, each one named function below; a plain stage adds none. A batch without a head (a
pair loss, a contrastive stage's objective) is `embedding_loss`; PCGrad, `pcgrad_update`. `train_stage` repeats
the step over a stage's batches with its learning-rate schedule. A plan's stages run in
order, scored after each, in a run folder: commands/runner.py's run_plan.

Each batch of a step is the global one: this process trains on its pieces (the engine's
`shares`: its share under torchrun, in pieces with --accumulate), each loss weighted by
its task's weight and its share of the batch, and the gradients are summed over the
processes before the update, as DistributedDataParallel would. Device, precision,
processes and resume are the engine's (engine/), the run folder the commands' (commands/).
"""

import copy
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch
from tqdm.auto import tqdm

import batches
import simcse
from datasets import CONTRASTIVE
from engine import checkpoint
from engine.resume import InStage
from engine.runtime import (
    Runtime,
    gather_rows,
    shares,
    sum_gradients,
    sum_over_processes,
)
from evaluation import TASKS
from losses import loss_of
from optimizer import l2_sp, loss_weights, lr_factor, pcgrad_backward
from presets import Stage
from settings import OptimConfig
from smart import EMATeacher, RngSnapshot, passes_in_float32, smart_loss

# ---------------------------------------------------------------------------------------
# A stage's batches


class SingleTask:
    """A one-task loader seen as steps of [(task, batch)], like a multitask stage's."""

    def __init__(self, loader, task):
        self.loader, self.task = loader, task

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        return ([(self.task, batch)] for batch in self.loader)


def stage_steps(task_data: dict, stage: Stage, generator: torch.Generator, seed: int = 0):
    """The steps of a stage: each a list of (task, batch) trained together, in the order
    `generator` draws. A multitask stage's --examples_per_task are drawn by `seed`, the
    run's: every epoch (stage) of a plan trains the same examples, as the reports do."""
    if stage.kind != "multitask":
        key = stage.tasks[0] if stage.kind == "task" else CONTRASTIVE
        loader = batches.fraction_loader(
            task_data[key].train, stage.fraction, stage.batch_size, generator
        )
        return SingleTask(loader, key)
    m, loaders = stage.multitask, {}
    for task in stage.tasks:
        dataset = task_data[task].train
        if m.examples_per_task:
            subset = torch.Generator().manual_seed(seed)
            keep = batches.standardized_indices(len(dataset), m.examples_per_task, subset)
        else:
            keep = torch.randperm(len(dataset), generator=generator).tolist()
        loaders[task] = batches.subset_loader(dataset, keep, stage.batch_size, generator)
    return batches.MultiTaskBatches(loaders, m.mixing, m.order, generator)


# ---------------------------------------------------------------------------------------
# The step


@dataclass
class StepContext:
    """What a training step carries besides its batches."""

    rt: Runtime
    optim: OptimConfig = field(default_factory=OptimConfig)  # the update's tools and weights
    teacher: EMATeacher | None = None  # SMART's momentum teacher of the current stage
    reference: torch.nn.Module | None = None  # the untouched model: L2-SP and distillation
    gather: bool = False  # in-batch objectives see every process's rows (each step's own)
    terms: dict | None = None  # {task: AddedTerms} of the current stage (added_terms)


class NonFiniteLoss(RuntimeError):
    pass


def train_step(model, optimizer, stage: Stage, step_batches, ctx, generator, schedule=1.0):
    """One update from [(task, global batch), ...]: each piece's forward, loss, added terms
    and backward, then clip and step; returns the loss and the gradient's norm before clipping."""
    rt, by_task, loss = ctx.rt, {}, 0.0
    set_lr(optimizer, stage, schedule)  # the stage's lr times its schedule at this step
    optimizer.zero_grad(set_to_none=True)
    weights = task_weights(stage, step_batches, generator)  # {task: its weight in the sum}
    pcgrad = stage.weighting == "pcgrad" and len(weights) > 1  # each task's loss taken whole
    pieces, gather = shares(step_batches, rt, ctx.optim.accumulate)  # this process's batches
    ctx = replace(ctx, gather=gather)  # in-batch objectives: every process's rows, or these
    for k, (task, batch, share) in enumerate(pieces):
        loss_fn = loss_of(task, stage.losses.get(task)) if task in TASKS else None
        added = (ctx.terms or added_terms(stage, ctx.optim, rt))[task]  # a plain stage: none
        with rt.autocast(float32=added.float32):
            if loss_fn is None or loss_fn.pair:  # no head: SimCSE's objectives, pair losses
                part, clean = embedding_loss(model, stage, task, batch, ctx, added.replay)
            else:
                rng = RngSnapshot(rt.device) if added.replay else None  # a term replays it
                embeds = model.embed(batch)  # (N, T, H) embedding output, kept for SMART
                z = model.sentences(batch, embeds)  # (N, H) pooled sentences
                out = model.readout(task, batch, z)  # the task's output
                part = loss_fn.fn(out.float(), batch["labels"])  # the task's loss
                clean = Clean(task, batch, z, embeds, out, rng)
            for term in added.terms:  # SMART's, distillation's: in the batch's precision
                part = part + term(model, stage, clean, ctx)
        for term in added.after:  # the added SimCSE's: passes of its own, their own autocast
            part = part + term(model, stage, clean, ctx)
        if pcgrad:  # PCGrad's backward, below, takes each task's loss whole
            by_task[task] = by_task.get(task, 0.0) + share * part
            continue
        # BEGIN EXERCISE multitask_step: weight * share * part, + l2sp_pull on the first part only; backward each part, scaled by rt.scaler; loss sums them, detached
        part = weights[task] * share * part + (l2sp_pull(model, ctx) if k == 0 else 0.0)
        rt.scaler.scale(part).backward()  # float16: scaled so small gradients survive
        loss = loss + part.detach()
        # END EXERCISE multitask_step
    if pcgrad:  # every process, with or without a piece of its own
        loss = pcgrad_update(model, by_task, weights, ctx, generator)  # PCGrad's backward
    else:
        sum_gradients(list(model.parameters()), rt)  # over the processes, as DDP does
    loss = step_loss(loss, step_batches, rt)  # summed over the processes; stops if not finite
    rt.scaler.unscale_(optimizer)  # float16: the true gradient, before its norm is taken
    clip = ctx.optim.max_grad_norm or math.inf  # 0: never clipped
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)  # the norm before clipping
    rt.scaler.step(optimizer)  # float16: skipped when a gradient overflowed
    rt.scaler.update()
    if ctx.teacher:
        ctx.teacher.update(model)
    return loss, norm


def task_weights(stage: Stage, step_batches, generator) -> dict:
    """Each task's weight in the step's loss: 1 alone, else the stage's weighting."""
    tasks = [task for task, _ in step_batches]
    if len(tasks) == 1:  # one task: its loss taken whole
        return {tasks[0]: 1.0}
    return dict(zip(tasks, loss_weights(len(tasks), stage.weighting, generator), strict=True))


def step_loss(loss, step_batches, rt) -> torch.Tensor:
    """The step's loss summed over the processes; NonFiniteLoss (the same verdict on every
    process) when it is not a number."""
    loss = sum_over_processes(torch.as_tensor(loss, dtype=torch.float32, device=rt.device), rt)
    if not torch.isfinite(loss):
        raise NonFiniteLoss(f"loss is {loss.item()}", "+".join(task for task, _ in step_batches))
    return loss


def set_lr(optimizer, stage: Stage, factor: float = 1.0):
    """The stage's learning rate times `factor` (its schedule), times each parameter group's
    lr_scale (the heads' --head_lr_scale) unless the encoder is frozen: then the stage's lr
    is the heads' own."""
    for group in optimizer.param_groups:
        scale = 1.0 if stage.freeze_encoder else group.get("lr_scale", 1.0)
        group["lr"] = stage.lr * factor * scale


@dataclass
class Clean:
    """A batch's clean pass: what a stage's added terms start from."""

    task: str
    batch: dict
    z: torch.Tensor  # (N, H) pooled sentences
    embeds: torch.Tensor | None = None  # (N, T, H) embedding output, where the task has a head
    out: torch.Tensor | None = None  # the task's output, where it has a head
    rng: RngSnapshot | None = None  # the generators before the pass, where a term replays it


@dataclass(frozen=True)
class AddedTerms:
    """What a stage adds to one task's batches, decided once a stage (added_terms)."""

    terms: tuple = ()  # each (model, stage, clean, ctx) -> a term of the batch's loss
    after: tuple = ()  # the same, added after the batch's autocast (their own passes)
    replay: bool = False  # a term replays the clean pass's dropout masks (Clean.rng)
    float32: bool = False  # the batch's passes leave the run's autocast


def added_terms(stage: Stage, optim: OptimConfig, rt) -> dict[str, AddedTerms]:
    """Each task's AddedTerms of this stage, in the order they add up: SMART's where the task
    has a head, distillation's where the encoder trains on tasks; after them, the added
    SimCSE's where the stage weighs it. Float32 passes where SMART's need them (smart.passes_in_float32),
    the clean pass too, whose graph R_s and D_Breg share with the task loss; a contrastive
    stage's objective sets its own (contrastive_loss). Its generators are kept where SMART's
    shared dropout or distillation's reference pass replays the clean pass's masks."""
    distill = stage.trains_encoder_on_tasks and optim.distill != 0
    added = stage.contrastive if stage.kind != CONTRASTIVE else None
    simcse = added is not None and added.simcse_weight != 0
    out = {CONTRASTIVE: AddedTerms(float32=True)}
    for task in TASKS:  # every task's, whichever the stage's batches come from
        smart = stage.smart.active and not loss_of(task, stage.losses.get(task)).pair
        terms, after = (
            (smart_term,) * smart + (distillation_term,) * distill,
            (simcse_term,) * simcse,
        )
        shared = smart and stage.smart.dropout == "shared"
        float32 = smart and passes_in_float32(stage.smart, rt.amp_dtype)
        out[task] = AddedTerms(terms, after, shared or distill, float32)
    return out


def embedding_loss(model, stage: Stage, task, batch, ctx, replay: bool):
    """The loss of a batch with no head and its clean pass: a contrastive stage's objective
    on (K, B, T) sentence tuples (nothing is added to it), or a pair loss of the two
    sentence embeddings u, v (2, B, T)."""
    if stage.kind == CONTRASTIVE:
        return contrastive_loss(model, stage.contrastive, batch, ctx), None
    rng = RngSnapshot(ctx.rt.device) if replay else None  # a term replays the pass's masks
    z = model.sentences(batch)  # (2B, H)
    u, v = z.float().view(2, -1, z.size(-1)).unbind(0)  # (B, H) each
    loss_fn, labels, weight = loss_of(task, stage.losses.get(task)), batch["labels"], 1.0
    if loss_fn.in_batch:  # the other examples are the negatives: the whole batch's
        (u, v, labels), weight = in_batch(ctx, u, v, labels)
    return weight * loss_fn.fn(u, v, labels, TASKS[task].kind), Clean(task, batch, z, rng=rng)


def in_batch(ctx, *tensors: torch.Tensor) -> tuple[list[torch.Tensor], float]:
    """The rows an in-batch objective compares, and its loss's weight: this process's own,
    or under torchrun the whole batch's (runtime.gather_rows)."""
    return gather_rows(list(tensors), ctx.rt) if ctx.gather else (list(tensors), 1.0)


def smart_term(model, stage: Stage, clean: Clean, ctx):
    """SMART's lambda_s * R_s + mu * D_Breg for this batch (Jiang et al., 2020), the same code
    for every task with a head."""
    smart, task, batch, rng = stage.smart, clean.task, clean.batch, clean.rng
    embeds, out = clean.embeds, clean.out
    # clean: the clean pass's embedding output and task output, whose graphs R_s and D_Breg
    # share with the task loss. rng: the generators' state before that pass: with
    # --smart_dropout shared the perturbed and the teacher's passes replay its masks (the
    # state after the embedding is found by replaying the embedding); else masks of their
    # own. The reference variant perturbs an embedding output of its own, as mt-dnn's
    # SmartPerturbation runs the embedding again. Every pass runs in the caller's precision
    # (added_terms).
    same_embed = same = None
    if smart.dropout == "shared":
        with torch.no_grad(), rng.replay():
            model.embed(batch)  # the clean pass's embedding draws: the encoder's come next
            same = RngSnapshot(ctx.rt.device)
        same_embed = rng

    def replayed(state):
        return state.replay() if state else nullcontext()

    def from_embeddings(e):  # (N, T, H) embedding output -> the task's output
        with replayed(same):
            return model(task, batch, e).float()

    teacher_out = None
    if ctx.teacher:
        with replayed(same_embed):
            teacher_out = ctx.teacher.forward(model, task, batch).float()
    mask = model.flat_inputs(batch)[1]  # (N, T): padding gets no noise
    if smart.variant == "reference":  # as SmartPerturbation: a fresh embedding forward,
        embeds = model.embed(batch)  # its own dropout mask in training
    kind = TASKS[task].kind
    return smart_loss(from_embeddings, embeds, out.float(), kind, teacher_out, smart, mask)


def distillation_term(model, stage: Stage, clean: Clean, ctx):
    """--distill times the gap between the cosines of the examples' first sentences, the
    clean pass's first B rows, and those the untouched model (ctx.reference) gives them."""
    batch, z, rng = clean.batch, clean.z, clean.rng
    # A pair's own cosine stays free. The reference runs the whole batch in the model's mode
    # with the dropout masks of the pass that made z (`rng` replays them), in the same
    # precision: at the loaded weights both passes are one computation, so the gap and its
    # gradient are exactly 0 and the term pulls only once the encoder has moved. (An
    # eval-mode reference differs from the dropped-out model at step 0 and pushes the
    # encoder from its first step.)
    B = batch["input_ids"].size(-2)  # (B, T) or (2, B, T): the examples, first sentences first
    with torch.no_grad(), rng.replay():
        z0 = ctx.reference.train(model.training).sentences(batch)[:B]  # (B, H)
    (z, z0), share = in_batch(ctx, z[:B].float(), z0.float())
    return ctx.optim.distill * share * simcse.similarity_distillation(z, z0)


def frozen_copy(model):
    """A copy of the model that never learns (no gradients); distillation runs it with the
    step's own dropout masks (trainer.distillation_term)."""
    return copy.deepcopy(model).requires_grad_(False)


def reference_of(model, optim: OptimConfig):
    """What L2-SP and distillation pull toward: a frozen_copy of the model as it is now,
    or None when neither is on."""
    return frozen_copy(model) if optim.l2sp or optim.distill else None


def contrastive_loss(model, cfg, batch, ctx) -> torch.Tensor:
    """A contrastive stage's loss on a (K, B, T) batch of sentence tuples (no heads);
    cfg: the stage's SimCSE settings (objective and temperature)."""
    if batch["input_ids"].size(0) == 1:  # the same sentences twice: dropout is the only noise
        batch = {k: v.repeat(2, 1, 1) if k != "ids" else v for k, v in batch.items()}  # (2, B, T)
    K = batch["input_ids"].size(0)
    with ctx.rt.autocast():
        z = model.sentences(batch).float()  # (K * B, H)
    (z,), weight = in_batch(ctx, z.view(K, -1, z.size(-1)).transpose(0, 1))  # (B, K, H)
    return weight * simcse.OBJECTIVES[cfg.simcse_loss][1](z.transpose(0, 1), cfg.temperature)


def simcse_term(model, stage: Stage, clean: Clean, ctx):
    """The stage's weight times unsupervised SimCSE of the batch's sentences (both sides of
    pairs): two passes of their own, two dropout masks (Sicurello adds it to the task
    losses), in the run's precision."""
    term, batch = stage.contrastive, clean.batch
    with ctx.rt.autocast():
        z1, z2 = (model.sentences(batch).float() for _ in range(2))  # (N, H) each
    ids = batch["input_ids"]
    S = ids.size(0) if ids.dim() == 3 else 1  # sentences per example
    # (S * B, H) -> (B, S, H): gathered by example, as the processes' shares are cut
    by_example = (z.view(S, -1, z.size(-1)).transpose(0, 1) for z in (z1, z2))
    (z1, z2), weight = in_batch(ctx, *by_example)
    z1, z2 = (z.transpose(0, 1).reshape(-1, z.size(-1)) for z in (z1, z2))  # (S * N, H)
    return term.simcse_weight * weight * simcse.unsup_simcse_loss(z1, z2, term.temperature)


def l2sp_pull(model, ctx) -> torch.Tensor | float:
    """--l2sp alpha times L2-SP's pull of the encoder toward the loaded weights; added by
    one process only, since the gradients are summed over the processes."""
    if ctx.optim.l2sp == 0 or not ctx.rt.main:
        return 0.0
    return ctx.optim.l2sp * l2_sp(model.bert.parameters(), ctx.reference.bert.parameters())


def pcgrad_update(model, by_task: dict, weights: dict, ctx, generator):
    """PCGrad's backward: each task's whole loss, the surgery on the shared encoder's
    gradients (each task's summed over processes first); returns the weighted loss. The
    heads' gradients are summed over the processes after it."""
    losses = [by_task.get(task) for task in weights]  # None: no example of the task here
    shared = [p for p in model.bert.parameters() if p.requires_grad]
    reduce = lambda g: sum_over_processes(g, ctx.rt)  # noqa: E731
    pcgrad_backward(shared, losses, ctx.rt.scaler, generator, reduce)
    in_shared = {id(p) for p in shared}
    sum_gradients([p for p in model.parameters() if id(p) not in in_shared], ctx.rt)  # heads
    return sum(weights[t] * x.detach() for t, x in by_task.items())


# ---------------------------------------------------------------------------------------
# The stage


@dataclass
class StageHooks:
    """What run_stage hangs on a stage's loop; train_stage runs without any."""

    desc: str = ""  # the progress bar's label
    seed: int = 0  # a step's own draws (loss weights, PCGrad's order) come from (seed, step)
    log: Callable[[dict], None] | None = None  # gets one record per step
    after_epoch: Callable[[int], bool] | None = None  # best epoch; True: stop the stage
    within: InStage = field(default_factory=InStage)


def train_stage(model, optimizer, stage, steps, ctx: StepContext, hooks=None) -> float:
    """Train one stage; returns the mean training loss. The learning rate follows the
    stage's warmup and decay (ctx.optim); a resumed stage replays its data order up to the
    saved step without training, then goes on as if never stopped (hooks.within)."""
    hooks, rt = hooks or StageHooks(), ctx.rt
    within, total = hooks.within, stage.epochs * len(steps)
    prepare(model, stage)
    teacher = EMATeacher(model, stage.smart, total) if stage.smart.mu > 0 else None
    ctx = replace(ctx, teacher=teacher, terms=added_terms(stage, ctx.optim, rt))
    done, running = within.restore(teacher)
    bar = tqdm(total=total, initial=done, desc=hooks.desc, leave=False, disable=not rt.main)
    model.train()
    step = 0
    with checkpoint.signals_caught() as within.stop, bar:
        for epoch in range(stage.epochs):
            for step_batches in steps:
                step += 1
                if within.replaying(step, rt):
                    continue
                t0 = time.perf_counter()
                schedule = lr_factor(step, total, ctx.optim.warmup, ctx.optim.decay)
                generator = torch.Generator().manual_seed(hooks.seed * 100_003 + step)
                try:
                    loss, norm = train_step(
                        model, optimizer, stage, step_batches, ctx, generator, schedule
                    )
                except NonFiniteLoss as e:
                    where = f"at step {step} of stage '{stage.name}' (task {e.args[1]})"
                    raise NonFiniteLoss(f"{e.args[0]} {where}") from None
                running += (loss.item() - running) / step
                bar.update()
                bar.set_postfix(loss=f"{running:.4f}")
                if hooks.log:
                    cut, where = (ctx.optim.max_grad_norm, rt.scaler), (epoch, step)
                    hooks.log(step_record(optimizer, step_batches, where, loss, norm, cut, t0))
                within.after_step(step, total, running, teacher, rt)
            if hooks.after_epoch and step >= done and hooks.after_epoch(epoch):
                within.end = {"step": step, "running": running, "rng": checkpoint.rng_state()}
                break  # --patience ended the stage; a stop asked now saves where it ended
        if within.stop:  # asked during the last scored epoch's evaluation
            within.save_end()
    model.bert.requires_grad_(True)
    return running


def prepare(model, stage: Stage):
    """Which parameters the stage trains (train_step sets its learning rate each step)."""
    model.bert.requires_grad_(not stage.freeze_encoder)  # frozen: AdamW skips grad-less params


def step_record(optimizer, step_batches, where: tuple, loss, norm, cut: tuple, t0: float) -> dict:
    """One line of the step log; where: (epoch, step); norm: the gradient's before
    clipping; cut: (--max_grad_norm, 0 for never; the run's loss scaler). A step
    whose norm is not finite was not clipped: the scaler skipped it."""
    (cut, scaler), norm = cut, norm.item()
    examples = sum(batch["input_ids"].shape[-2] for _, batch in step_batches)
    return {
        "epoch": where[0],
        "step": where[1],
        "tasks": "+".join(task for task, _ in step_batches),
        "loss": loss.item(),
        "lr": optimizer.param_groups[0]["lr"],  # the encoder's
        "grad_norm": norm,
        "clipped": 0 < cut < norm < math.inf,
        "skipped": scaler.is_enabled() and not math.isfinite(norm),
        "examples_per_s": examples / (time.perf_counter() - t0),
    }
