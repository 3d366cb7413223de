"""The one training loop: a plan is a list of stages, run in order, scored after each.

A `Stage` says what it trains (one task, several tasks at once, or the encoder alone on
sentence tuples), for how long and with which settings. `train_step` is one update, the
function bench.py times; `train_stage` repeats it over a stage's batches; `run_plan` runs
every stage of a plan, scores the dev sets after each (a row of the forgetting table),
keeps the best model and a resumable state in the run folder.

Device and precision are decided once, in `make_runtime`.
"""

import copy
import json
import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

import checkpoint
import datasets as data
import evaluation
import simcse
from config import MultitaskConfig, OptimConfig, SimCSEConfig
from evaluation import TASKS
from optimizer import (
    WEIGHTINGS,
    AdamW,
    backward,
    flatten_grads,
    l2_sp,
    loss_weights,
    lr_factor,
    optimizer_step,
    pcgrad_backward,
    write_flat_grads,
)
from smart import EMATeacher, SameDropout, SmartConfig, below_resolution, smart_loss

METRICS = "metrics.jsonl"  # the forgetting table of a run folder: one JSON row per stage
FORGETTING = "forgetting.json"  # evaluation.forgetting of the table, written at the end
STEPS = "steps.jsonl"  # the step log of a run folder: one JSON line per training step
CONTRASTIVE = "contrastive"  # the task_data key of a contrastive stage's sentence tuples
STAGE_KINDS = ("task", "multitask", CONTRASTIVE)
INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # what a model reads of a batch
IN_BATCH_LOSSES = {"mnrl"}  # task losses whose negatives are the batch's other examples


# ---------------------------------------------------------------------------------------
# Device and precision, decided once


@dataclass
class Runtime:
    device: torch.device
    amp_dtype: torch.dtype | None  # autocast dtype, None for float32
    scaler: torch.amp.GradScaler | None  # only for float16
    rank: int = 0  # this process among `world` data-parallel ones (torchrun)
    world: int = 1

    def autocast(self):
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    @property
    def main(self) -> bool:
        """The process that scores, prints and writes files (the only one without torchrun)."""
        return self.rank == 0


def make_runtime(device_arg: str, amp: bool) -> Runtime:
    """The device and precision; under torchrun (WORLD_SIZE > 1) also joins the process
    group: nccl on GPUs (one per process, LOCAL_RANK), gloo on the CPU."""
    if device_arg.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {device_arg}: no CUDA device is available here; use cpu")
    try:
        device = torch.device(
            device_arg if device_arg != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
        )
    except RuntimeError:
        raise SystemExit(f"--device {device_arg}: expected auto, cpu, cuda or cuda:N") from None
    rank, world = 0, int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        rank = dist.get_rank()
    if device.type != "cuda" or not amp:
        return Runtime(device, None, None, rank, world)
    if torch.cuda.is_bf16_supported(including_emulation=False):  # Ampere or newer
        return Runtime(device, torch.bfloat16, None, rank, world)
    return Runtime(device, torch.float16, torch.amp.GradScaler("cuda"), rank, world)


# ---------------------------------------------------------------------------------------
# Data parallel: every process builds the same global batches and trains on its share


def my_parts(batch: dict, rt: Runtime, accumulate: int = 1) -> list[tuple[dict, float]]:
    """This process's micro-batches of a global batch, each with its share of the batch: the
    batch is cut into `world` shards (this process takes shard `rank`, maybe none when the
    batch is smaller than the world), each shard into `accumulate` micro-batches. Losses
    weighted by the shares and gradients summed over processes give the batch's gradient."""
    B = batch["input_ids"].shape[-2]
    shards = data.split_batch(batch, rt.world)
    if rt.rank >= len(shards):
        return []
    micro = data.split_batch(shards[rt.rank], accumulate)
    return [(m, m["input_ids"].shape[-2] / B) for m in micro]


def sum_over_processes(tensor: torch.Tensor, rt: Runtime) -> torch.Tensor:
    """In place: the sum of this tensor over the processes (itself alone without torchrun)."""
    if rt.world > 1:
        dist.all_reduce(tensor)
    return tensor


def sum_gradients(params: list, rt: Runtime) -> None:
    """Sum every gradient over the processes (what DistributedDataParallel does, in one
    flat buffer). A parameter gets one where any process has one; zeros stand in for the
    others, so every process sends the same shapes."""
    if rt.world == 1:
        return
    has = sum_over_processes(
        torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=rt.device),
        rt,
    )  # fmt: skip
    used = [p for p, n in zip(params, has.tolist(), strict=True) if n > 0]
    if used:
        write_flat_grads(used, sum_over_processes(flatten_grads(used), rt))


def from_main(value, rt: Runtime):
    """The main process's value of a Python object, on every process."""
    if rt.world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ---------------------------------------------------------------------------------------
# Stages


@dataclass
class Stage:
    tasks: tuple  # data sets it trains on: one task, several (multitask), none (contrastive)
    lr: float  # AdamW learning rate during the stage
    batch_size: int  # examples per step (per task, for simultaneous multitask steps)
    kind: str = "task"  # 'task', 'multitask' or 'contrastive' (the encoder, no heads)
    fraction: float = 1.0  # share of the training set, a fresh random subset each stage
    epochs: int = 1  # passes over that share
    name: str = ""  # label of the stage's row in the forgetting table
    smart: SmartConfig = field(default_factory=SmartConfig.off)
    losses: dict = field(default_factory=dict)  # task -> loss name, where not the default
    freeze_encoder: bool = False  # train only the heads (EquiBERT's frozen encoder)
    multitask: MultitaskConfig | None = None  # multitask: mixing, weighting, order, sizes
    contrastive: SimCSEConfig | None = None  # contrastive: objective and temperature;
    # task stages: the weight and temperature of a SimCSE term added to every batch's loss
    select_by_sts: bool = False  # keep the epoch with the best STS dev Pearson (SimCSE)

    def __post_init__(self):
        if self.kind not in STAGE_KINDS:
            raise ValueError(f"unknown stage kind {self.kind!r}; expected one of {STAGE_KINDS}")
        for task in self.tasks:
            if task not in TASKS:
                raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASKS)}")
        for task, loss in self.losses.items():
            if loss not in TASKS[task].losses:
                raise ValueError(
                    f"loss {loss!r} does not fit task {task!r}; expected {TASKS[task].losses}"
                )
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")
        if self.kind == "task" and len(self.tasks) != 1:
            raise ValueError(f"a task stage trains one task, got {self.tasks}")
        if self.kind == "multitask" and (self.multitask is None or len(self.tasks) < 2):
            raise ValueError("a multitask stage needs several tasks and its multitask settings")
        if self.kind == CONTRASTIVE and (self.contrastive is None or self.tasks):
            raise ValueError("a contrastive stage needs its SimCSE settings and no task")
        self.name = self.name or self.default_name()

    def default_name(self) -> str:
        if self.kind == CONTRASTIVE:
            return f"SimCSE ({self.contrastive.simcse_loss})"
        if self.kind == "multitask":
            m = self.multitask
            how = m.weighting if m.mixing == "simultaneous" else f"{m.order} order"
            return f"{m.mixing.replace('_', '-')} ({how})"
        return TASKS[self.tasks[0]].title + (f" {self.fraction:.0%}" if self.fraction < 1 else "")

    @property
    def weighting(self) -> str:
        """How a step combines its task losses (one loss: 'equal', a weight of 1)."""
        return self.multitask.weighting if self.kind == "multitask" else WEIGHTINGS[0]


class SingleTask:
    """A one-task loader seen as steps of [(task, batch)], like a multitask stage's."""

    def __init__(self, loader, task):
        self.loader, self.task = loader, task

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        return ([(self.task, batch)] for batch in self.loader)


def stage_steps(task_data: dict, stage: Stage, generator: torch.Generator):
    """The steps of a stage: each a list of (task, batch) trained together."""
    if stage.kind != "multitask":
        key = stage.tasks[0] if stage.kind == "task" else CONTRASTIVE
        loader = data.fraction_loader(
            task_data[key].train, stage.fraction, stage.batch_size, generator
        )
        return SingleTask(loader, key)
    m, loaders = stage.multitask, {}
    for task in stage.tasks:
        dataset = task_data[task].train
        if m.examples_per_task:
            keep = data.standardized_indices(len(dataset), m.examples_per_task, generator)
        else:
            keep = torch.randperm(len(dataset), generator=generator).tolist()
        loaders[task] = data.subset_loader(dataset, keep, stage.batch_size, generator)
    return data.MultiTaskBatches(loaders, m.mixing, m.order, generator)


# ---------------------------------------------------------------------------------------
# Losses of one batch


def smart_term(model, task, cfg: SmartConfig, batch, embeds, out, teacher, rt, masks):
    """SMART's lambda_s * R_s + mu * D_Breg for this batch, the same code for every task.

    masks: (before the embedding, after it) SameDropout states, so that the perturbed and
    the teacher's passes draw the clean pass's dropout masks; None: masks of their own.
    A perturbation below autocast's resolution is run in float32, the clean pass again too.
    """
    exact = masks is not None and below_resolution(cfg.epsilon, rt.amp_dtype)
    same_embed, same = masks or (None, None)

    def replayed(state):
        return state.replay() if state else nullcontext()

    def from_embeddings(e):  # (N, T, H) embedding output -> the task's output
        precision = torch.autocast(rt.device.type, enabled=False) if exact else nullcontext()
        with replayed(same), precision:
            return model(task, batch, e.float() if exact else e).float()

    clean = from_embeddings(embeds) if exact else out.float()
    teacher_out = None
    if teacher:
        with replayed(same_embed):
            teacher_out = teacher.forward(model, task, batch).float()
    mask = model.flat_inputs(batch)[1]  # (N, T): padding gets no noise
    kind = TASKS[task].kind
    return smart_loss(from_embeddings, embeds, clean, kind, teacher_out, cfg, mask)


def batch_loss(
    model, task, batch, smart: SmartConfig, teacher, rt: Runtime, loss_name=None,
    reference=None, distill: float = 0.0,
) -> torch.Tensor:  # fmt: skip
    """The training loss of one batch: the task's loss, plus SMART's terms when on, plus
    `distill` times the gap between the cosines of the examples' first sentences and those
    the `reference` model gives them (a pair's own cosine stays free for its task)."""
    name = loss_name or TASKS[task].losses[0]
    shared = smart.active and smart.dropout == "shared"
    same_embed = SameDropout(rt.device) if shared else None
    with rt.autocast():
        if name in simcse.PAIR_LOSSES:  # a loss of the two sentence embeddings, no head
            z = model.sentences(batch)  # (2B, H)
            u, v = z.float().view(2, -1, z.size(-1)).unbind(0)  # (B, H) each
            loss = simcse.PAIR_LOSSES[name](u, v, batch["labels"], TASKS[task].kind)
        else:
            embeds = model.embed(batch)  # (N, T, H), kept so SMART can perturb it
            masks = (same_embed, SameDropout(rt.device)) if shared else None
            z = model.sentences(batch, embeds)  # (N, H)
            out = model.readout(task, batch, z)
            loss = simcse.OUTPUT_LOSSES[name](out.float(), batch["labels"])
            if smart.active:
                loss = loss + smart_term(
                    model, task, smart, batch, embeds, out, teacher, rt, masks
                )  # fmt: skip
        if distill > 0:
            first = {k: batch[k][0] if batch[k].dim() == 3 else batch[k] for k in INPUTS}
            with torch.no_grad():
                z0 = reference.sentences(first)  # (B, H)
            B = z0.size(0)  # z's first B rows: the examples' first sentences
            loss = loss + distill * simcse.similarity_distillation(z[:B].float(), z0.float())
    return loss


def contrastive_loss(model, cfg: SimCSEConfig, batch, rt: Runtime):
    """A contrastive stage's loss on a (K, B, T) batch of sentence tuples (no heads)."""
    if batch["input_ids"].size(0) == 1:  # the same sentences twice: dropout is the only noise
        batch = {k: v.repeat(2, 1, 1) if k != "ids" else v for k, v in batch.items()}  # (2, B, T)
    K = batch["input_ids"].size(0)
    with rt.autocast():
        z = model.sentences(batch).float()  # (K * B, H)
    z = z.view(K, -1, z.size(-1))  # (K, B, H)
    return simcse.OBJECTIVES[cfg.simcse_loss][1](z, cfg.temperature)


# ---------------------------------------------------------------------------------------
# The step and the stage


class NonFiniteLoss(RuntimeError):
    pass


def train_step(
    model, optimizer, stage: Stage, step_batches, rt: Runtime, teacher, generator,
    optim: OptimConfig | None = None, reference=None,
) -> torch.Tensor:  # fmt: skip
    """One update from `step_batches`, [(task, batch), ...]; returns the step's loss.

    Each batch is the global one: under torchrun each process trains on its share
    (my_parts) and the gradients are summed over the processes before the update.
    optim: the update's tools (accumulation, clipping, L2-SP and distillation weights);
    reference: the model as loaded (`frozen_copy`), what L2-SP and distillation pull toward.
    """
    optim = optim or OptimConfig()
    weights = loss_weights(len(step_batches), stage.weighting, generator)
    parts = [my_parts(batch, rt, optim.accumulate) for _, batch in step_batches]
    tasks = [task for task, _ in step_batches]
    params = list(model.parameters())
    optimizer.zero_grad(set_to_none=True)
    if stage.weighting == "pcgrad" and len(step_batches) > 1:  # whole shards, one per task
        losses = [
            sum(share * task_loss(model, stage, task, m, rt, teacher, optim, reference)
                for m, share in mine)
            if mine
            else None  # this process has no example of the task in this step
            for task, mine in zip(tasks, parts, strict=True)
        ]  # fmt: skip
        loss = sum(w * x.detach() for w, x in zip(weights, losses, strict=True) if x is not None)
        # the surgery acts on the shared encoder, on each task's gradient summed over processes
        shared = [p for p in model.bert.parameters() if p.requires_grad]
        pcgrad_backward(shared, losses, generator, lambda g: sum_over_processes(g, rt))
        in_shared = {id(p) for p in shared}
        sum_gradients([p for p in params if id(p) not in in_shared], rt)  # the heads'
    else:  # micro-batch i of every task, weighted by its share of the batch
        loss = 0.0
        for i in range(max(map(len, parts))):
            part = sum(
                w * mine[i][1]
                * task_loss(model, stage, task, mine[i][0], rt, teacher, optim, reference)
                for task, mine, w in zip(tasks, parts, weights, strict=True)
                if i < len(mine)
            )  # fmt: skip
            if i == 0 and rt.main and optim.l2sp > 0:
                part = part + optim.l2sp * l2_sp(
                    model.bert.parameters(), reference.bert.parameters()
                )  # fmt: skip
            backward(part, rt.scaler)
            loss = loss + part.detach()
        sum_gradients(params, rt)
    loss = sum_over_processes(torch.as_tensor(loss, dtype=torch.float32, device=rt.device), rt)
    check_finite(loss, tasks)  # the same verdict on every process
    optimizer_step(optimizer, rt.scaler, optim.max_grad_norm)
    if teacher:
        teacher.update(model)
    return loss


def task_loss(
    model, stage: Stage, task, batch, rt: Runtime, teacher, optim: OptimConfig | None = None,
    reference=None,
) -> torch.Tensor:  # fmt: skip
    """One batch's loss in this stage: a contrastive objective or the task's loss (with the
    distillation term of `optim` when the encoder trains), plus a weighted SimCSE term when
    the stage has one."""
    batch = evaluation.to_device(batch, rt.device)
    if stage.kind == CONTRASTIVE:
        return contrastive_loss(model, stage.contrastive, batch, rt)
    distill = optim.distill if optim and not stage.freeze_encoder else 0.0
    loss = batch_loss(
        model, task, batch, stage.smart, teacher, rt, stage.losses.get(task), reference, distill
    )  # fmt: skip
    if stage.contrastive and stage.contrastive.simcse_weight > 0:
        loss = loss + stage.contrastive.simcse_weight * simcse_term(model, stage, batch, rt)
    return loss


def simcse_term(model, stage: Stage, batch, rt: Runtime) -> torch.Tensor:
    """Unsupervised SimCSE of the batch's sentences (both sides of pairs): two passes, two
    dropout masks (Sicurello adds it to the task losses)."""
    with rt.autocast():
        z1, z2 = (model.sentences(batch).float() for _ in range(2))  # (N, H) each
    return simcse.unsup_simcse_loss(z1, z2, stage.contrastive.temperature)


def check_finite(loss: torch.Tensor, tasks):
    if not torch.isfinite(loss):
        raise NonFiniteLoss(f"loss is {loss.item()}", "+".join(tasks))


def grad_norm(model) -> float:
    """L2 norm of every gradient of the last step, for the step log."""
    norms = [p.grad.norm() for p in model.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)).item() if norms else 0.0


@dataclass
class InStage:
    """Checkpoints inside a stage: `save(position)` every `minutes` and when Ctrl-C or
    SIGTERM asks for a stop; `resume`: a position saved earlier inside this stage."""

    save: Callable[[dict], None]
    minutes: float
    resume: dict | None = None  # trainer.resume_position of a checkpoint inside this stage
    end: dict | None = None  # the position after the last step (its generators included)

    def save_end(self):
        """A stop after the last step (during an evaluation): save the stage's end, stop."""
        if self.end:
            self.save(self.end | {"teacher": None})  # no step left for the teacher to serve
        raise KeyboardInterrupt


def check_runtime(stages: list[Stage], rt: Runtime, optim: OptimConfig | None = None):
    """What the device's precision or the update's tools cannot do, refused before any
    training."""
    optim = optim or OptimConfig()
    pcgrad = any(s.weighting == "pcgrad" for s in stages)
    if rt.scaler and pcgrad:
        raise SystemExit("PCGrad needs unscaled gradients: use bf16 or --no_amp, not fp16")
    if pcgrad and (optim.accumulate > 1 or optim.l2sp > 0):
        raise SystemExit(
            "--weighting pcgrad takes each task's whole-batch gradient and would project the "
            "L2-SP pull: use it without --accumulate and --l2sp"
        )
    in_batch = [
        s.name for s in stages
        if s.kind == CONTRASTIVE or set(s.losses.values()) & IN_BATCH_LOSSES
        or (s.contrastive and s.contrastive.simcse_weight > 0)  # a SimCSE term's negatives
        or optim.distill > 0  # a task batch's cosines, distilled
    ]  # fmt: skip
    if optim.accumulate > 1 and in_batch:
        raise SystemExit(
            f"--accumulate {optim.accumulate}: stage '{in_batch[0]}' compares each example "
            "with the others of its batch, so micro-batches would change its loss; use 1"
        )
    if rt.world > 1 and in_batch and rt.main:  # my_parts cuts the batch as micro-batches do
        print(
            f"note: under torchrun stage '{in_batch[0]}' takes its in-batch negatives from "
            f"each process's share of the batch (1/{rt.world} of it), not from the whole batch"
        )


def set_lr(optimizer, stage: Stage, factor: float = 1.0):
    """The stage's learning rate times `factor` (its schedule), times each parameter group's
    lr_scale (the heads' --head_lr_scale) unless the encoder is frozen: then the stage's lr
    is the heads' own."""
    for group in optimizer.param_groups:
        scale = 1.0 if stage.freeze_encoder else group.get("lr_scale", 1.0)
        group["lr"] = stage.lr * factor * scale


def prepare(model, optimizer, stage: Stage):
    """The stage's learning rate, and which parameters it trains."""
    set_lr(optimizer, stage)
    model.bert.requires_grad_(not stage.freeze_encoder)  # frozen: AdamW skips grad-less params


def resumed(within: "InStage | None", teacher) -> tuple[dict | None, int, float]:
    """(saved position, steps done, their mean loss) of a stage resumed from inside it; the
    teacher gets its saved parameters."""
    resume = within.resume if within else None
    if not resume:
        return None, 0, 0.0
    if teacher and resume["teacher"]:
        teacher.params, teacher.step = resume["teacher"]
    return resume, resume["step"], resume["running"]


def train_stage(
    model, optimizer, stage, steps, rt: Runtime, desc: str, after_epoch=None, seed=0,
    log=None, within: InStage | None = None, optim: OptimConfig | None = None, reference=None,
) -> float:  # fmt: skip
    """Train one stage; returns the mean training loss.

    after_epoch(epoch) runs after each epoch; log(record) gets one dict per step (loss, lr,
    gradient norm, examples/s). Random draws of a step (loss weights, PCGrad's order) come
    from a generator seeded by (seed, step), so the data order can be rebuilt by replaying
    it: `within.resume` (model and optimizer are already loaded) iterates the batches up to
    the saved step without training on them, restores the global generators, the teacher
    and the running loss there, and goes on as if never stopped. optim: the learning-rate
    schedule within the stage and the update's tools (train_step); reference: for L2-SP and
    distillation.
    """
    optim = optim or OptimConfig()
    prepare(model, optimizer, stage)
    total_steps = stage.epochs * len(steps)
    teacher = EMATeacher(model, stage.smart, total_steps) if stage.smart.mu > 0 else None
    resume, done, running = resumed(within, teacher)
    model.train()
    step, last_save = 0, time.monotonic()
    with (
        checkpoint.signals_caught() as stop,
        tqdm(
            total=total_steps,
            initial=done,
            desc=desc,
            leave=False,
            dynamic_ncols=True,
            disable=not rt.main,
        ) as bar,
    ):
        for epoch in range(stage.epochs):
            for step_batches in steps:
                step += 1
                if step <= done:  # replaying the data order up to the checkpoint
                    if step == done:
                        checkpoint.set_rng_state(*resume["rng"])
                    continue
                t0 = time.perf_counter()
                generator = torch.Generator().manual_seed(seed * 100_003 + step)
                set_lr(optimizer, stage, lr_factor(step, total_steps, optim.warmup, optim.decay))
                try:
                    loss = train_step(
                        model, optimizer, stage, step_batches, rt, teacher, generator, optim,
                        reference,
                    )  # fmt: skip
                except NonFiniteLoss as e:
                    where = f"at step {step} of stage '{stage.name}' (task {e.args[1]})"
                    raise NonFiniteLoss(f"{e.args[0]} {where}") from None
                loss = loss.item()
                running += (loss - running) / step
                bar.update()
                bar.set_postfix(loss=f"{running:.4f}")
                if log:
                    log(step_record(model, optimizer, step_batches, epoch, step, loss, t0))
                if within and step == total_steps:  # the stage's end, as a position to resume
                    within.end = {"step": step, "running": running, "rng": checkpoint.rng_state()}
                halt = bool(stop)
                due = bool(within) and 0 < 60 * within.minutes < time.monotonic() - last_save
                if rt.world > 1:  # every process stops (and saves) at the same step
                    flags = torch.tensor([halt, due], dtype=torch.float32, device=rt.device)
                    halt, due = (x > 0 for x in sum_over_processes(flags, rt).tolist())
                if within and (halt or due):
                    within.save({"step": step, "running": running, "teacher": teacher})
                    last_save = time.monotonic()
                if halt:
                    raise KeyboardInterrupt
            if after_epoch and step >= done:
                after_epoch(epoch)
        if stop:  # asked during the last epoch's evaluation
            if not within:
                raise KeyboardInterrupt
            within.save_end()
    model.bert.requires_grad_(True)
    return running


def step_record(model, optimizer, step_batches, epoch, step, loss, t0) -> dict:
    """One line of the step log."""
    examples = sum(batch["input_ids"].shape[-2] for _, batch in step_batches)
    return {
        "epoch": epoch,
        "step": step,
        "tasks": "+".join(task for task, _ in step_batches),
        "loss": loss,
        "lr": optimizer.param_groups[0]["lr"],  # the encoder's
        "grad_norm": grad_norm(model),
        "examples_per_s": examples / (time.perf_counter() - t0),
    }


class BestEpoch:
    """Score STS dev after each epoch and keep the best epoch's weights (SimCSE's choice)."""

    def __init__(self, model, task_data, rt: Runtime, batch_size: int):
        self.model, self.task_data, self.rt, self.batch_size = model, task_data, rt, batch_size
        self.r, self.state = -math.inf, None

    def after_epoch(self, epoch: int):
        r = None
        if self.rt.main:  # scores once; every process keeps the same epoch
            results = evaluate_split(
                self.model, self.task_data, "dev", ("sts",), self.rt, self.batch_size
            )
            r = results["sts"].metrics["pearson"]
            tqdm.write(f"  epoch {epoch + 1}: STS dev Pearson of the cosine {r:.4f}")
        r = from_main(r, self.rt)
        if r > self.r:
            self.r = r
            self.state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def restore(self):
        if self.state is not None:
            self.model.load_state_dict(self.state)


def evaluate_split(model, task_data: dict, split: str, tasks, rt: Runtime, batch_size: int):
    loaders = {
        t: data.make_loader(getattr(task_data[t], split), batch_size, shuffle=False) for t in tasks
    }
    with rt.autocast():
        return evaluation.evaluate(model, loaders, rt.device)


def cosine(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(u, v, dim=-1)  # (B,)


def pair_scores(
    model, pairs, rt: Runtime, batch_size: int, n: int | None = None, similarity=cosine
):
    """(scores, labels) of the first n siamese pairs of a PairDataset (all by default):
    similarity(u, v) of the two sentence embeddings in eval mode, as numpy arrays (n,). The
    batches are collated directly, so scoring draws nothing from the random generators."""
    n = len(pairs) if n is None else min(n, len(pairs))
    was_training = model.training
    model.eval()
    scores, labels = [], []
    with torch.no_grad(), rt.autocast():
        for i in range(0, n, batch_size):
            batch = pairs.collate(list(range(i, min(i + batch_size, n))))
            z = model.sentences(evaluation.to_device(batch, rt.device)).float()  # (2b, H)
            u, v = z.view(2, -1, z.size(-1)).unbind(0)  # (b, H) each
            scores.append(similarity(u, v).cpu())
            labels.append(batch["labels"])
    model.train(was_training)
    return torch.cat(scores).numpy(), torch.cat(labels).numpy()


THRESHOLD_PAIRS = 2000  # training pairs a cosine read-out's threshold is fit on


def fit_thresholds(model, task_data, rt: Runtime, batch_size: int):
    """The threshold of every task the model reads out by its siamese similarity
    (model.cosine): the most accurate cut on its first THRESHOLD_PAIRS training pairs, fit
    again before each scoring since every stage moves the embeddings."""
    for task in model.cosine:
        scores, labels = pair_scores(
            model, task_data[task].train, rt, batch_size, THRESHOLD_PAIRS, model.similarity
        )
        getattr(model, f"{task}_threshold").fill_(evaluation.best_threshold(scores, labels))


def new_optimizer(model, cfg: OptimConfig) -> AdamW:
    """AdamW over two parameter groups: the encoder, then the heads (lr x --head_lr_scale)."""
    encoder = list(model.bert.parameters())
    heads = [p for name, p in model.named_parameters() if not name.startswith("bert.")]
    groups = [
        {"params": encoder, "lr_scale": 1.0},
        {"params": heads, "lr_scale": cfg.head_lr_scale},
    ]
    return AdamW(
        [g for g in groups if g["params"]], lr=cfg.lr, weight_decay=cfg.weight_decay,
        foreach=cfg.foreach_adamw,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------
# A plan, run in a folder


@dataclass
class Run:
    """Where and how a plan runs: its folder, device, scored tasks and evaluation batch."""

    run_dir: Path
    rt: Runtime
    eval_tasks: tuple
    eval_batch_size: int
    seed: int
    plan_length: int = 0  # stages in the plan, for progress messages
    checkpoint_minutes: float = 0.0  # a checkpoint inside a stage this often (0: never)
    resume: bool = False  # continue the run found in run_dir
    score_train: bool = False  # also score the whole training split after each stage

    def evaluate(self, model, task_data, split="dev"):
        results = evaluate_split(
            model, task_data, split, self.eval_tasks, self.rt, self.eval_batch_size
        )
        row = evaluation.score_row(results, self.eval_tasks)
        if data.HELDOUT in task_data and split == "dev":  # what the encoder brought along
            pairs = task_data[data.HELDOUT].dev
            row["heldout"] = evaluation.roc_auc(
                *pair_scores(model, pairs, self.rt, self.eval_batch_size)
            )
        return row

    def score(self, model, task_data) -> dict:
        """The dev row of a trained (or untouched) model: cosine read-outs fit first."""
        fit_thresholds(model, task_data, self.rt, self.eval_batch_size)
        return self.evaluate(model, task_data)

    def show(self, row, mark=False):
        print(evaluation.format_row(row["stage"], row, self.eval_tasks) + (" *" if mark else ""))


def start(model, optimizer, task_data, run: Run) -> dict:
    """A new run (scored once before training) or the progress of the one in run_dir."""
    state_path, best_path = run.run_dir / checkpoint.STATE, run.run_dir / checkpoint.BEST
    if state_path.exists() and not run.resume:
        raise SystemExit(f"{run.run_dir} already holds a run; give another --run_dir")
    progress = {"best": {"score": -math.inf, "stage": None, "index": None}, "rows": []}
    progress["next_stage"] = 0
    if state_path.exists():
        progress, extra, rng = checkpoint.load_state(model, optimizer, run.rt.scaler, state_path)
        if best_path.exists():  # found broken now, not after the remaining stages
            checkpoint.read_tensors(best_path)
        if "within" in progress:  # inside a stage: the generators are restored there
            progress["within"] = resume_position(progress["within"], extra, rng, run.rt.device)
        else:
            checkpoint.set_rng_state(*rng)
        print(f"resuming {run.run_dir} at stage {progress['next_stage'] + 1}/{run.plan_length}")
    if not run.rt.main:  # the main process scores and writes
        return progress
    keep_logged_steps(run.run_dir / STEPS, progress)
    write_rows(run.run_dir, progress["rows"])  # what the state holds
    print(evaluation.format_table(progress["rows"], run.eval_tasks))
    if not progress["rows"]:  # the starting point: what training has to beat
        row = {"stage": "start (no training)", "index": -1} | run.score(model, task_data)
        progress["rows"].append(row)
        run.show(row)
    return progress


def write_rows(run_dir: Path, rows: list[dict]):
    checkpoint.atomic_write("".join(json.dumps(r) + "\n" for r in rows), run_dir / METRICS)


def keep_logged_steps(path: Path, progress: dict):
    """The step log of what the checkpoint holds: a resumed run logs the rest again."""
    done = (progress["next_stage"], progress.get("within", {}).get("step", 0))
    kept = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the last line of a killed run may be cut short
            continue
        if (record["stage"], record["step"]) <= done:
            kept.append(line + "\n")
    checkpoint.atomic_write("".join(kept), path)


def resume_position(within: dict, extra: dict, rng, device) -> dict:
    """What train_stage needs to continue inside a stage, from a checkpoint's parts."""
    teacher = {k: v.to(device) for k, v in checkpoint.split(extra, "teacher.").items()}
    state = {k: v.to(device) for k, v in checkpoint.split(extra, "best_epoch.").items()}
    return within | {
        "teacher": (teacher, within["teacher_step"]) if teacher else None,
        "best_epoch": (within["best_epoch_r"], state or None),
        "rng": rng,
    }


def save_position(model, optimizer, progress: dict, position: dict, run: Run):
    """A checkpoint inside stage progress['next_stage'] (called by train_stage)."""
    if not run.rt.main:
        return
    teacher, (r, state) = position.pop("teacher"), position.pop("best_epoch")
    rng = position.pop("rng", None)  # the stage's end: the generators as they were then
    extra = {f"best_epoch.{k}": v for k, v in (state or {}).items()}
    if teacher:
        extra |= {f"teacher.{k}": v for k, v in teacher.params.items()}
        position["teacher_step"] = teacher.step
    within = position | {"best_epoch_r": r}
    checkpoint.save_state(
        model, optimizer, run.rt.scaler, progress | {"within": within},
        run.run_dir / checkpoint.STATE, extra, rng,
    )  # fmt: skip


def run_stage(
    model, optimizer, stage: Stage, k: int, task_data, run: Run, at_start, resume, optim,
    reference,
) -> dict:  # fmt: skip
    """Train stage k; returns its row of the forgetting table.

    at_start: the run's progress before the stage (what a checkpoint inside it keeps);
    resume: the position of such a checkpoint, to continue from (None: from the start);
    optim, reference: as in train_stage.
    """
    generator = torch.Generator().manual_seed(run.seed * 1000 + k)
    steps = stage_steps(task_data, stage, generator)
    t0 = time.time() - (resume or {}).get("seconds", 0.0)
    best_epoch = BestEpoch(model, task_data, run.rt, run.eval_batch_size)
    if resume:
        best_epoch.r, best_epoch.state = resume["best_epoch"]
    after_epoch = best_epoch.after_epoch if stage.select_by_sts else None
    desc = f"[{k + 1}/{run.plan_length}] {stage.name}"
    with open(run.run_dir / STEPS if run.rt.main else os.devnull, "a") as steps_log:

        def log(record):
            steps_log.write(json.dumps({"stage": k, "name": stage.name} | record) + "\n")

        def save(position):  # a checkpoint inside the stage, its step log on disk first
            steps_log.flush()
            position |= {
                "seconds": time.time() - t0,
                "best_epoch": (best_epoch.r, best_epoch.state),
            }
            save_position(model, optimizer, at_start, position, run)

        within = InStage(save, run.checkpoint_minutes, resume)
        seed = run.seed * 1000 + k
        train_loss = train_stage(
            model, optimizer, stage, steps, run.rt, desc, after_epoch, seed, log, within, optim,
            reference,
        )  # fmt: skip
        if stage.select_by_sts:
            best_epoch.restore()
        row = {"stage": stage.name, "index": k, "kind": stage.kind, "tasks": list(stage.tasks)}
        row |= {"train_loss": train_loss, "seconds": time.time() - t0}
        if not run.rt.main:  # the main process scores the stage
            return row
        with checkpoint.signals_caught() as stop:  # a stop here keeps the trained stage
            row |= run.score(model, task_data)
            if run.score_train:
                row["train"] = run.evaluate(model, task_data, "train")
        if stop:
            within.save_end()
    return row


def frozen_copy(model):
    """A copy of the model that never learns: eval mode (no dropout), no gradients."""
    return copy.deepcopy(model).eval().requires_grad_(False)


def run_plan(plan: list[Stage], model, task_data, optim: OptimConfig, run: Run):
    """Run every stage of `plan`, scoring `run.eval_tasks` after each; resumable.

    Files in run_dir: metrics.jsonl (one row per stage), steps.jsonl (one line per step:
    stage, epoch, step, tasks, loss, lr, grad_norm, examples_per_s), best.safetensors (the
    best model so far) and state.safetensors (everything needed to continue after the last
    finished stage, or from inside a stage; checkpoint.py). A stage whose score is not a
    number (e.g. the Pearson r of a constant prediction) is never the best.
    """
    run.plan_length = len(plan)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    model = model.to(run.rt.device)
    optimizer = new_optimizer(model, optim)
    # what L2-SP and distillation pull toward: the model as loaded, before a resumed run's
    # checkpoint replaces it
    reference = frozen_copy(model) if optim.l2sp or optim.distill else None
    progress = start(model, optimizer, task_data, run)
    if run.rt.world > 1:  # the same starting weights everywhere, as DDP makes sure too
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)
    best, rows = progress["best"], progress["rows"]
    best_path = run.run_dir / checkpoint.BEST
    for k in range(progress["next_stage"], len(plan)):
        at_start = {"best": best, "rows": rows, "next_stage": k}
        try:
            resume = progress.pop("within", None)
            row = run_stage(
                model, optimizer, plan[k], k, task_data, run, at_start, resume, optim, reference
            )
        except NonFiniteLoss as e:
            kept = f"; the best model so far is in {best_path}" if best_path.exists() else ""
            kept += f" (predictions from it: --predict {run.run_dir})" if kept else ""
            raise SystemExit(f"stopped: {e}{kept}") from None
        if not run.rt.main:  # the main process keeps the table, the best model and the state
            continue
        score = evaluation.selection_score(row, run.eval_tasks)
        rows.append(row)
        write_rows(run.run_dir, rows)
        if score > best["score"]:  # False for nan
            best = {"score": score, "stage": row["stage"], "index": k}
            checkpoint.save_best(model, row, best_path)
        run.show(row, mark=best["index"] == k)
        progress = {"best": best, "rows": rows, "next_stage": k + 1}
        checkpoint.save_state(
            model, optimizer, run.rt.scaler, progress, run.run_dir / checkpoint.STATE
        )
    return model, rows, best


def write_predictions(model, task_data, run: Run, test: bool) -> Path:
    """Dev (and test) predictions of the model in the CS224n output format."""
    out_dir = run.run_dir / "predictions"
    for split in ("dev", "test") if test else ("dev",):
        results = evaluate_split(
            model, task_data, split, run.eval_tasks, run.rt, run.eval_batch_size
        )
        for task, res in results.items():
            evaluation.write_predictions(
                evaluation.prediction_path(out_dir, task, split), task, res.ids, res.preds
            )
    return out_dir


def finish(model, rows, best, task_data, run: Run, test: bool, wall: float):
    """Print the forgetting table, reload the best model and write its predictions."""
    if not run.rt.main:
        return
    print(f"\nforgetting table ({run.run_dir}, {wall / 60:.1f} min):")
    print(evaluation.format_table(rows, run.eval_tasks, best["index"]))
    if len(rows) > 1:
        measures = evaluation.forgetting(rows, run.eval_tasks)
        print(evaluation.format_forgetting(measures))
        checkpoint.atomic_write(json.dumps(measures, indent=1) + "\n", run.run_dir / FORGETTING)
    if best["index"] is None:
        print("no stage had a numeric score (a constant dev set?): predicting with the last model")
    else:
        best_path = run.run_dir / checkpoint.BEST
        print(f"best stage: {best['stage']} (score {best['score']:.4f}), kept in {best_path}")
        checkpoint.load_model(model, best_path)
    out_dir = write_predictions(model, task_data, run, test)
    print(f"predictions of the best model: {out_dir}")
