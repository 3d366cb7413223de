"""The one training loop: a plan is a list of stages, run in order, scored after each.

Read it top down: `train_step` is one update (forward, loss, backward, clip, step: the
function lab/bench.py times); `train_stage` repeats it over a stage's batches with its
learning-rate schedule; `run_plan` runs every stage of a plan (plans.py), scores the dev
sets after each (a row of the forgetting table) and keeps the best model and a resumable
state in the run folder (runfolder.Run).

A batch's loss is losses.py's; device, precision and data-parallel processes are
runtime.py's.
"""

import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

import datasets as data
from datasets import CONTRASTIVE
from engine import checkpoint, runfolder
from engine.flags import OptimConfig
from engine.runfolder import Run, evaluate_split
from engine.runtime import (
    Runtime,
    any_process,
    from_main,
    gather_rows,
    micro_batches,
    own_generators,
    sum_gradients,
    sum_over_processes,
)
from losses import task_loss
from optimizer import backward, l2_sp, loss_weights, lr_factor, optimizer_step, pcgrad_backward
from presets import Stage
from smart import EMATeacher

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
        loader = data.fraction_loader(
            task_data[key].train, stage.fraction, stage.batch_size, generator
        )
        return SingleTask(loader, key)
    m, loaders = stage.multitask, {}
    for task in stage.tasks:
        dataset = task_data[task].train
        if m.examples_per_task:
            subset = torch.Generator().manual_seed(seed)
            keep = data.standardized_indices(len(dataset), m.examples_per_task, subset)
        else:
            keep = torch.randperm(len(dataset), generator=generator).tolist()
        loaders[task] = data.subset_loader(dataset, keep, stage.batch_size, generator)
    return data.MultiTaskBatches(loaders, m.mixing, m.order, generator)


# ---------------------------------------------------------------------------------------
# The step


@dataclass
class StepContext:
    """What a training step carries besides its batches."""

    rt: Runtime
    optim: OptimConfig = field(default_factory=OptimConfig)  # the update's tools and weights
    teacher: EMATeacher | None = None  # SMART's momentum teacher of the current stage
    reference: torch.nn.Module | None = None  # the untouched model: L2-SP and distillation
    gather: bool = False  # in-batch objectives see every process's rows (train_step decides)

    def in_batch(self, *tensors: torch.Tensor) -> tuple[list[torch.Tensor], float]:
        """The rows an in-batch objective compares, and its loss's weight: this process's
        own, or under torchrun the whole batch's (runtime.gather_rows)."""
        return gather_rows(list(tensors), self.rt) if self.gather else (list(tensors), 1.0)


class NonFiniteLoss(RuntimeError):
    pass


def train_step(model, optimizer, stage: Stage, step_batches, ctx, generator, schedule=1.0):
    """One update from `step_batches`, [(task, batch), ...]; returns the step's loss and
    the gradient's global L2 norm before clipping.

    The learning rate is the stage's times `schedule` (optimizer.lr_factor at this step). Each
    batch is the global one: this process trains on its micro-batches (several with
    --accumulate, its share under torchrun), each task's loss weighted by its share, and
    the gradients are summed over the processes before the update. ctx (StepContext)
    carries the update's settings, SMART's teacher and the untouched reference model.
    """
    rt, optim = ctx.rt, ctx.optim
    set_lr(optimizer, stage, schedule)
    micro, gather = micro_batches(step_batches, rt, optim.accumulate)
    ctx = replace(ctx, gather=gather)
    tasks = [task for task, _ in step_batches]
    weights = dict(zip(tasks, loss_weights(len(tasks), stage.weighting, generator), strict=True))
    optimizer.zero_grad(set_to_none=True)
    if stage.weighting == "pcgrad" and len(tasks) > 1:
        loss = pcgrad_losses(model, stage, micro, weights, ctx, generator)
    else:
        # BEGIN EXERCISE multitask_step: per micro-batch: sum over its tasks of weight * share * task_loss, + l2sp_pull once; backward each; loss sums them, detached
        loss = 0.0
        for k, parts in enumerate(micro):  # micro-batch k of every task
            part = sum(
                weights[p.task] * p.share * task_loss(model, stage, p.task, p.batch, ctx)
                for p in parts
            )
            if k == 0:  # once per update
                part = part + l2sp_pull(model, ctx)
            backward(part, rt.scaler)
            loss = loss + part.detach()
        # END EXERCISE multitask_step
        sum_gradients(list(model.parameters()), rt)
    loss = sum_over_processes(torch.as_tensor(loss, dtype=torch.float32, device=rt.device), rt)
    if not torch.isfinite(loss):  # the same verdict on every process
        raise NonFiniteLoss(f"loss is {loss.item()}", "+".join(tasks))
    norm = optimizer_step(optimizer, rt.scaler, optim.max_grad_norm)  # clipped, when asked
    if ctx.teacher:
        ctx.teacher.update(model)
    return loss, norm


def set_lr(optimizer, stage: Stage, factor: float = 1.0):
    """The stage's learning rate times `factor` (its schedule), times each parameter group's
    lr_scale (the heads' --head_lr_scale) unless the encoder is frozen: then the stage's lr
    is the heads' own."""
    for group in optimizer.param_groups:
        scale = 1.0 if stage.freeze_encoder else group.get("lr_scale", 1.0)
        group["lr"] = stage.lr * factor * scale


def l2sp_pull(model, ctx) -> torch.Tensor | float:
    """--l2sp alpha times L2-SP's pull of the encoder toward the loaded weights; added by
    one process only, since the gradients are summed over the processes."""
    if ctx.optim.l2sp == 0 or not ctx.rt.main:
        return 0.0
    return ctx.optim.l2sp * l2_sp(model.bert.parameters(), ctx.reference.bert.parameters())


def pcgrad_losses(model, stage, micro, weights: dict, ctx, generator):
    """PCGrad's backward: each task's whole-shard loss, the surgery on the shared encoder's
    gradients (each task's summed over processes first); returns the weighted loss."""
    losses = {task: None for task in weights}  # None: no example of the task here
    for p in (p for parts in micro for p in parts):
        part = p.share * task_loss(model, stage, p.task, p.batch, ctx)
        losses[p.task] = part if losses[p.task] is None else losses[p.task] + part
    shared = [p for p in model.bert.parameters() if p.requires_grad]
    reduce = lambda g: sum_over_processes(g, ctx.rt)  # noqa: E731
    pcgrad_backward(shared, list(losses.values()), generator, reduce, ctx.rt.scaler)
    in_shared = {id(p) for p in shared}
    sum_gradients([p for p in model.parameters() if id(p) not in in_shared], ctx.rt)  # heads
    return sum(weights[t] * x.detach() for t, x in losses.items() if x is not None)


# ---------------------------------------------------------------------------------------
# The stage


@dataclass
class InStage:
    """Resume, stop and save inside a stage. `save(position)` (None: never) is called
    when `due()` says a checkpoint is due and when Ctrl-C or SIGTERM asks for a stop;
    `resume`: a position saved earlier inside this stage (checkpoint.resume_position)."""

    save: Callable[[dict], None] | None = None
    due: Callable[[], bool] = lambda: False
    resume: dict | None = None
    end: dict | None = None  # the position after the last step (its generators included)
    stop: list = field(default_factory=list)  # the signals caught so far

    def restore(self, teacher) -> tuple[int, float]:
        """(steps already done, their mean loss); the teacher gets its saved parameters."""
        if not self.resume:
            return 0, 0.0
        if teacher and self.resume["teacher"]:
            teacher.params, teacher.step = self.resume["teacher"]
        return self.resume["step"], self.resume["running"]

    def replaying(self, step: int, rt: Runtime) -> bool:
        """True for steps the checkpoint holds: their batches are drawn, not trained on,
        so the data order goes on as it was; at the saved step the generators come back
        (the main process's; the others then draw their own from them)."""
        done = self.resume["step"] if self.resume else 0
        if step == done and self.resume:
            checkpoint.set_rng_state(*self.resume["rng"])
            own_generators(rt)
        return step <= done

    def after_step(self, step: int, total: int, running: float, teacher, rt: Runtime):
        """Keep the stage's end position; save when due or asked to stop, then stop. Under
        torchrun every process stops (and saves) at the same step."""
        if step == total:
            self.end = {"step": step, "running": running, "rng": checkpoint.rng_state()}
        halt, due = any_process([bool(self.stop), self.save is not None and self.due()], rt)
        if self.save and (halt or due):
            self.save({"step": step, "running": running, "teacher": teacher})
        if halt:
            raise KeyboardInterrupt

    def save_end(self):
        """A stop after the last step (e.g. during an evaluation): save the stage's end
        (no step left for a teacher to serve), then stop."""
        if self.save and self.end:
            self.save(self.end | {"teacher": None})
        raise KeyboardInterrupt


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
    ctx = replace(ctx, teacher=teacher)
    done, running = within.restore(teacher)
    bar = tqdm(
        total=total,
        initial=done,
        desc=hooks.desc,
        leave=False,
        dynamic_ncols=True,
        disable=not rt.main,
    )
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
    clipping; cut: (--max_grad_norm, 0 for never; the fp16 loss scaler or None). A step
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
        "skipped": scaler is not None and not math.isfinite(norm),
        "examples_per_s": examples / (time.perf_counter() - t0),
    }


class BestEpoch:
    """Score dev after each epoch of a stage and keep the best epoch's weights: by STS for
    SimCSE (select_by_sts), else by the run's selection score, and then the stage stops
    after run.patience epochs without a new best (--patience)."""

    def __init__(self, model, task_data, run: Run, by_sts: bool):
        self.model, self.task_data, self.run, self.by_sts = model, task_data, run, by_sts
        self.r, self.state, self.epoch = -math.inf, None, -1
        self.row = None  # the kept epoch's dev row (by the run's score): the stage's row

    def score(self) -> tuple[float, dict | None]:
        if self.by_sts:
            results = evaluate_split(self.model, self.task_data, "dev", ("sts",), self.run)
            return results["sts"].metrics["pearson"], None
        row = self.run.score(self.model, self.task_data)
        return self.run.select(row), row

    def after_epoch(self, epoch: int) -> bool:
        """Keep this epoch if it is the best so far; whether the stage stops here."""
        r = row = None
        if self.run.rt.main:  # scores once; every process keeps the same epoch
            r, row = self.score()
            what = "STS dev Pearson of the cosine" if self.by_sts else "dev score"
            tqdm.write(f"  epoch {epoch + 1}: {what} {r:.4f}")
        r = from_main(r, self.run.rt)
        if r > self.r:
            self.r, self.epoch, self.row = r, epoch, row
            self.state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        stop = not self.by_sts and runfolder.patience_ran_out(self.run.patience, epoch, self.epoch)
        if stop and self.run.rt.main:
            tqdm.write(
                f"  --patience {self.run.patience}: no new best since epoch {self.epoch + 1}"
            )
        return stop

    def restore(self):
        if self.state is not None:
            self.model.load_state_dict(self.state)


# ---------------------------------------------------------------------------------------
# A plan, run in a folder


def frozen_copy(model):
    """A copy of the model that never learns (no gradients); distillation runs it with the
    step's own dropout masks (losses.distillation)."""
    return copy.deepcopy(model).requires_grad_(False)


def run_stage(model, optimizer, stage: Stage, task_data, run: Run, ctx, progress: dict) -> dict:
    """Train stage k = progress['next_stage']; returns its row of the forgetting table.
    progress: the run's before the stage (what a checkpoint inside it keeps), with the
    position of such a checkpoint under 'within' when the stage resumes from one."""
    k, resume = progress["next_stage"], progress.pop("within", None)
    order = torch.Generator().manual_seed(run.seed * 1000 + k)
    steps = stage_steps(task_data, stage, order, run.seed)
    t0 = time.time() - (resume or {}).get("seconds", 0.0)
    per_epoch = stage.select_by_sts or (run.patience > 0 and stage.epochs > 1)
    best_epoch = BestEpoch(model, task_data, run, by_sts=stage.select_by_sts)
    if resume:
        best_epoch.r, best_epoch.state = resume["best_epoch"]
        best_epoch.epoch = resume.get("best_epoch_at", -1)
    with open(run.file(checkpoint.STEPS), "a") as steps_log:

        def log(record):
            steps_log.write(json.dumps({"stage": k, "name": stage.name} | record) + "\n")
            if run.board:
                run.board.step(record)

        def save(position):  # a checkpoint inside the stage, its step log on disk first
            steps_log.flush()
            position |= {
                "seconds": time.time() - t0,
                "best_epoch": (best_epoch.r, best_epoch.state),
                "best_epoch_at": best_epoch.epoch,
            }
            run.save(model, optimizer, progress, position)

        within = InStage(save, run.due, resume)
        after_epoch = best_epoch.after_epoch if per_epoch else None
        desc = f"[{k + 1}/{run.plan_length}] {stage.name}"
        hooks = StageHooks(desc, run.seed * 1000 + k, log, after_epoch, within)
        train_loss = train_stage(model, optimizer, stage, steps, ctx, hooks)
        if per_epoch:
            best_epoch.restore()
        row = {"stage": stage.name, "index": k, "kind": stage.kind, "tasks": list(stage.tasks)}
        row |= {"train_loss": train_loss, "seconds": time.time() - t0}
        with checkpoint.signals_caught() as stop:  # a stop here keeps the trained stage
            kept = None if run.score_train else best_epoch.row  # scored when it was kept
            row |= kept or run.score(model, task_data, train=run.score_train)
        if stop:
            within.save_end()
    return row


def run_plan(plan: list[Stage], model, task_data, optim: OptimConfig, run: Run):
    """Run every stage of `plan`, scoring `run.eval_tasks` after each; resumable.

    Files in run_dir: metrics.jsonl (one row per stage), steps.jsonl (one line per step:
    stage, epoch, step, tasks, loss, lr, grad_norm, examples_per_s), best.safetensors (the
    best model so far) and state.safetensors (everything needed to continue after the last
    finished stage, or from inside a stage; runfolder.py). A stage whose score is not a
    number (e.g. the Pearson r of a constant prediction) is never the best.
    """
    run.plan_length = len(plan)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    model = model.to(run.rt.device)
    optimizer = model.configure_optimizers(optim)
    # what L2-SP and distillation pull toward: the model as loaded, before a resumed run's
    # checkpoint replaces it
    reference = frozen_copy(model) if optim.l2sp or optim.distill else None
    ctx = StepContext(run.rt, optim, reference=reference)
    progress = runfolder.start(model, optimizer, task_data, run)
    if run.rt.world > 1:  # the same starting weights everywhere, as DDP makes sure too
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)
    own_generators(run.rt)  # each process its own dropout masks from here on
    for k in range(progress["next_stage"], len(plan)):
        at_start = {"best": progress["best"], "rows": progress["rows"], "next_stage": k}
        at_start |= _within(progress)  # a resumed run's place inside its first stage
        try:
            row = run_stage(model, optimizer, plan[k], task_data, run, ctx, at_start)
        except NonFiniteLoss as e:
            raise SystemExit(f"stopped: {e}{runfolder.kept_best(run)}") from None
        progress = run.record(model, optimizer, row, k, progress)  # its row, best, state
        if "stopped" in progress:
            break
    return model, progress["rows"], progress["best"]


def _within(progress: dict) -> dict:
    """The in-stage position of a resumed run's first stage, once."""
    return {"within": progress.pop("within")} if "within" in progress else {}


def time_steps(model, optim: OptimConfig, stage: Stage, steps, reference, rt) -> float:
    """Seconds per padded token of train_step on `steps` (--estimate), timed on a second
    pass: the first use of a shape builds its kernels."""
    teacher = EMATeacher(model, stage.smart) if stage.smart.mu > 0 else None
    ctx = StepContext(rt, optim, teacher, reference)
    optimizer = model.configure_optimizers(optim)
    prepare(model, stage)
    model.train()
    for step in steps:
        train_step(model, optimizer, stage, step, ctx, torch.Generator())
    t0 = time.perf_counter()
    for step in steps:
        train_step(model, optimizer, stage, step, ctx, torch.Generator())
    seconds = time.perf_counter() - t0
    model.bert.requires_grad_(True)
    return seconds / sum(b["input_ids"].numel() for step in steps for _, b in step)


def estimate_plans(plans: dict, model, task_data, cfg, reference, rt, scoring: float, probe=4):
    """Print each stage's expected minutes and return the whole run's: `probe` real steps
    of each kind of stage on this device and precision, each run twice and timed the second
    time (kernels for a new shape are built on first use), give seconds per padded token,
    times the stage's tokens; plus `scoring` seconds of dev scoring after each epoch."""
    rates, total = {}, 0.0
    print(f"{'stage':28s} {'steps':>6s} {'examples':>9s} {'s/step':>7s} {'minutes':>8s}")
    for name, plan in plans.items():
        for k, stage in enumerate(plan):
            order = torch.Generator().manual_seed(cfg.seed * 1000 + k)
            steps = list(stage_steps(task_data, stage, order, cfg.seed))
            tokens = sum(b["input_ids"].numel() for step in steps for _, b in step)
            kind = repr(replace(stage, name="", fraction=1.0, epochs=1))
            if kind not in rates:  # seconds per token of this kind of stage
                rates[kind] = time_steps(model, cfg.optim, stage, steps[:probe], reference, rt)
            n, seconds = len(steps) * stage.epochs, rates[kind] * tokens * stage.epochs
            examples = sum(b["input_ids"].shape[-2] for step in steps for _, b in step)
            label = f"{name}: {stage.name}" if name else stage.name
            print(f"{label[:28]:28s} {n:6d} {examples:9d} {seconds / n:7.2f} {seconds / 60:8.1f}")
            total += seconds + scoring * stage.epochs
    print(f"dev scoring: {scoring:.0f} s, after the start and after each epoch of a stage")
    minutes = (total + scoring) / 60
    print(f"whole run: about {minutes:.1f} minutes ({rt.device}, {rt.precision})")
    return minutes
