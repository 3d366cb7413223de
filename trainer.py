"""The one training loop: a plan is a list of stages, run in order, scored after each.

A plan's `Stage`s (config.py; the presets' plans in presets.py) say what each trains (one
task, several tasks at once, or the encoder alone on sentence tuples), for how long and
with which settings. `train_step` is one update, the function bench.py times;
`train_stage` repeats it over a stage's batches; `run_plan` runs every stage of a plan,
scores the dev sets after each (a row of the forgetting table),
keeps the best model and a resumable state in the run folder (checkpoint.py).

The loss of a batch is losses.py's; device, precision and data-parallel processes are
runtime.py's.
"""

import copy
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

import checkpoint
import datasets as data
import evaluation
from config import OptimConfig, Stage
from datasets import CONTRASTIVE
from losses import StepContext, task_loss
from optimizer import (
    AdamW,
    backward,
    l2_sp,
    loss_weights,
    lr_factor,
    optimizer_step,
    pcgrad_backward,
)
from runtime import (
    Runtime,
    any_process,
    even_parts,
    from_main,
    my_parts,
    own_generators,
    sum_gradients,
    sum_over_processes,
)
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


class NonFiniteLoss(RuntimeError):
    pass


def train_step(model, optimizer, stage: Stage, step_batches, ctx: StepContext, generator):
    """One update from `step_batches`, [(task, batch), ...]; returns the step's loss.

    Each batch is the global one: under torchrun each process trains on its share
    (my_parts) and the gradients are summed over the processes before the update. ctx
    carries the update's tools (accumulation, clipping, L2-SP and distillation weights),
    SMART's teacher and the untouched reference model.
    """
    rt, optim = ctx.rt, ctx.optim
    # in-batch objectives compare the whole batch when every process has its share of it
    even = all(even_parts(batch, rt, optim.accumulate) for _, batch in step_batches)
    ctx = replace(ctx, gather=rt.world > 1 and even)
    weights = loss_weights(len(step_batches), stage.weighting, generator)
    parts = [my_parts(batch, rt, optim.accumulate) for _, batch in step_batches]
    tasks = [task for task, _ in step_batches]
    optimizer.zero_grad(set_to_none=True)
    if stage.weighting == "pcgrad" and len(step_batches) > 1:
        loss = pcgrad_losses(model, stage, tasks, parts, weights, ctx, generator)
    else:  # micro-batch i of every task, weighted by its share of the batch
        loss = 0.0
        for i in range(max(map(len, parts))):
            part = sum(
                w * mine[i][1] * task_loss(model, stage, task, mine[i][0], ctx)
                for task, mine, w in zip(tasks, parts, weights, strict=True)
                if i < len(mine)
            )
            if i == 0 and rt.main and optim.l2sp > 0:
                pull = l2_sp(model.bert.parameters(), ctx.reference.bert.parameters())
                part = part + optim.l2sp * pull
            backward(part, rt.scaler)
            loss = loss + part.detach()
        sum_gradients(list(model.parameters()), rt)
    loss = sum_over_processes(torch.as_tensor(loss, dtype=torch.float32, device=rt.device), rt)
    if not torch.isfinite(loss):  # the same verdict on every process
        raise NonFiniteLoss(f"loss is {loss.item()}", "+".join(tasks))
    optimizer_step(optimizer, rt.scaler, optim.max_grad_norm)
    if ctx.teacher:
        ctx.teacher.update(model)
    return loss


def pcgrad_losses(model, stage, tasks, parts, weights, ctx: StepContext, generator):
    """PCGrad's backward: each task's whole-shard loss, the surgery on the shared encoder's
    gradients (each task's summed over processes first); returns the weighted loss."""
    losses = [  # None: this process has no example of the task in this step
        sum(share * task_loss(model, stage, task, m, ctx) for m, share in mine) if mine else None
        for task, mine in zip(tasks, parts, strict=True)
    ]
    shared = [p for p in model.bert.parameters() if p.requires_grad]
    reduce = lambda g: sum_over_processes(g, ctx.rt)  # noqa: E731
    pcgrad_backward(shared, losses, generator, reduce, ctx.rt.scaler)
    in_shared = {id(p) for p in shared}
    sum_gradients([p for p in model.parameters() if id(p) not in in_shared], ctx.rt)  # heads
    return sum(w * x.detach() for w, x in zip(weights, losses, strict=True) if x is not None)


# ---------------------------------------------------------------------------------------
# The stage


@dataclass
class InStage:
    """Resume, stop and save inside a stage. `save(position)` (None: never) is called
    every `minutes` and when Ctrl-C or SIGTERM asks for a stop; `resume`: a position
    saved earlier inside this stage (checkpoint.resume_position), to go on from."""

    save: Callable[[dict], None] | None = None
    minutes: float = 0.0
    resume: dict | None = None
    end: dict | None = None  # the position after the last step (its generators included)
    stop: list = field(default_factory=list)  # the signals caught so far
    last_save: float = field(default_factory=time.monotonic)

    def restore(self, teacher) -> tuple[int, float]:
        """(steps already done, their mean loss); the teacher gets its saved parameters.
        The clock of periodic checkpoints starts here."""
        self.last_save = time.monotonic()
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
        due = self.save is not None and 0 < 60 * self.minutes < time.monotonic() - self.last_save
        halt, due = any_process([bool(self.stop), due], rt)
        if self.save and (halt or due):
            self.save({"step": step, "running": running, "teacher": teacher})
            self.last_save = time.monotonic()
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
    after_epoch: Callable[[int], None] | None = None  # e.g. SimCSE's best-epoch choice
    within: InStage = field(default_factory=InStage)


def train_stage(model, optimizer, stage, steps, ctx: StepContext, hooks=None) -> float:
    """Train one stage; returns the mean training loss. The learning rate follows the
    stage's warmup and decay (ctx.optim); a resumed stage replays its data order up to the
    saved step without training, then goes on as if never stopped (hooks.within)."""
    hooks, rt = hooks or StageHooks(), ctx.rt
    within, total = hooks.within, stage.epochs * len(steps)
    prepare(model, optimizer, stage)
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
                optim = ctx.optim
                set_lr(optimizer, stage, lr_factor(step, total, optim.warmup, optim.decay))
                generator = torch.Generator().manual_seed(hooks.seed * 100_003 + step)
                try:
                    loss = train_step(model, optimizer, stage, step_batches, ctx, generator)
                except NonFiniteLoss as e:
                    where = f"at step {step} of stage '{stage.name}' (task {e.args[1]})"
                    raise NonFiniteLoss(f"{e.args[0]} {where}") from None
                running += (loss.item() - running) / step
                bar.update()
                bar.set_postfix(loss=f"{running:.4f}")
                if hooks.log:
                    hooks.log(step_record(model, optimizer, step_batches, (epoch, step), loss, t0))
                within.after_step(step, total, running, teacher, rt)
            if hooks.after_epoch and step >= done:
                hooks.after_epoch(epoch)
        if within.stop:  # asked during the last epoch's evaluation
            within.save_end()
    model.bert.requires_grad_(True)
    return running


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


def grad_norm(model) -> float:
    """L2 norm of every gradient of the last step, for the step log."""
    norms = [p.grad.norm() for p in model.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)).item() if norms else 0.0


def step_record(model, optimizer, step_batches, where: tuple, loss, t0: float) -> dict:
    """One line of the step log; where: (epoch, step)."""
    examples = sum(batch["input_ids"].shape[-2] for _, batch in step_batches)
    return {
        "epoch": where[0],
        "step": where[1],
        "tasks": "+".join(task for task, _ in step_batches),
        "loss": loss.item(),
        "lr": optimizer.param_groups[0]["lr"],  # the encoder's
        "grad_norm": grad_norm(model),
        "examples_per_s": examples / (time.perf_counter() - t0),
    }


# ---------------------------------------------------------------------------------------
# Scoring


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


def pair_scores(model, pairs, rt: Runtime, batch_size: int, n=None, similarity=cosine):
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


# ---------------------------------------------------------------------------------------
# A plan, run in a folder


def new_optimizer(model, cfg: OptimConfig) -> AdamW:
    """AdamW over two parameter groups: the encoder, then the heads (lr x --head_lr_scale)."""
    encoder = list(model.bert.parameters())
    heads = [p for name, p in model.named_parameters() if not name.startswith("bert.")]
    groups = [
        {"params": encoder, "lr_scale": 1.0},
        {"params": heads, "lr_scale": cfg.head_lr_scale},
    ]
    groups = [g for g in groups if g["params"]]
    return AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=cfg.foreach_adamw)


def frozen_copy(model):
    """A copy of the model that never learns (no gradients); distillation runs it with the
    step's own dropout masks (losses.distillation)."""
    return copy.deepcopy(model).requires_grad_(False)


@dataclass
class Run:
    """Where and how a plan runs: its folder, device, scored tasks and evaluation batch.
    Only the main process (rt.main) scores and writes; the others train alongside."""

    run_dir: Path
    rt: Runtime
    eval_tasks: tuple
    eval_batch_size: int
    seed: int
    plan_length: int = 0  # stages in the plan, for progress messages
    checkpoint_minutes: float = 0.0  # a checkpoint inside a stage this often (0: never)
    resume: bool = False  # continue the run found in run_dir
    score_train: bool = False  # also score the whole training split after each stage
    tensorboard: bool = False  # live curves in run_dir/tensorboard (checkpoint.TensorBoard)
    board: checkpoint.TensorBoard | None = None

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

    def show(self, row, mark=False):
        print(evaluation.format_row(row["stage"], row, self.eval_tasks) + (" *" if mark else ""))
        if self.board:
            names = [t for t in (*self.eval_tasks, "overall", "heldout") if t in row]
            self.board.scores({t: evaluation.main_score(row, t) for t in names})

    # Only the main process scores and writes; these methods are where that is decided.

    def score(self, model, task_data, train=False) -> dict:
        """The dev row of a trained (or untouched) model, cosine read-outs fit first, with
        the training split's scores under 'train' when asked; {} on the other processes."""
        if not self.rt.main:
            return {}
        fit_thresholds(model, task_data, self.rt, self.eval_batch_size)
        row = self.evaluate(model, task_data)
        if train:
            row["train"] = self.evaluate(model, task_data, "train")
        return row

    def select(self, row: dict) -> float:
        """The score that keeps a stage's model as the best (nan elsewhere: never kept)."""
        return evaluation.selection_score(row, self.eval_tasks) if self.rt.main else math.nan

    def keep_steps(self, progress: dict):
        """The step log of what the checkpoint holds (checkpoint.keep_logged_steps)."""
        if self.rt.main:
            done = checkpoint.keep_logged_steps(self.run_dir / checkpoint.STEPS, progress)
            self.board = checkpoint.TensorBoard(self.run_dir, done) if self.tensorboard else None

    def file(self, name: str) -> Path:
        """A file of the run folder; os.devnull for the other processes."""
        return self.run_dir / name if self.rt.main else Path(os.devnull)

    def write_rows(self, rows: list[dict]):
        if self.rt.main:
            checkpoint.write_rows(self.run_dir, rows)

    def save(self, model, optimizer, progress: dict, position: dict | None = None):
        """The state after a finished stage, or (position) inside the next one."""
        if not self.rt.main:
            return
        path, scaler = self.run_dir / checkpoint.STATE, self.rt.scaler
        if position is None:
            checkpoint.save_state(model, optimizer, scaler, progress, path)
        else:
            checkpoint.save_position(model, optimizer, scaler, progress, position, path)

    def save_best(self, model, row: dict):
        if self.rt.main:
            checkpoint.save_best(model, row, self.run_dir / checkpoint.BEST)


def start(model, optimizer, task_data, run: Run) -> dict:
    """A new run (scored once before training) or the progress of the one in run_dir."""
    state_path, best_path = run.run_dir / checkpoint.STATE, run.run_dir / checkpoint.BEST
    if state_path.exists() and not run.resume:
        raise SystemExit(f"{run.run_dir} already holds a run; give another --run_dir")
    if run.resume and best_path.exists() and not state_path.exists():  # its state was lost
        raise checkpoint.CheckpointError(
            f"{state_path}: missing; nothing to continue from ({best_path} serves --predict)"
        )
    progress = {"best": {"score": -math.inf, "stage": None, "index": None}, "rows": []}
    progress["next_stage"] = 0
    if state_path.exists():
        progress, extra, rng = checkpoint.load_state(model, optimizer, run.rt.scaler, state_path)
        if best_path.exists():  # found broken now, not after the remaining stages
            checkpoint.read_tensors(best_path)
        if "within" in progress:  # inside a stage: the generators are restored there
            within = progress["within"]
            progress["within"] = checkpoint.resume_position(within, extra, rng, run.rt.device)
        else:
            checkpoint.set_rng_state(*rng)
        k, n = progress["next_stage"], run.plan_length
        where = f"at stage {k + 1}/{n}" if k < n else f"after all {n} stages: best rescored"
        print(f"resuming {run.run_dir} {where}")
    run.keep_steps(progress)  # the step log and the table of what the state holds
    run.write_rows(progress["rows"])
    print(evaluation.format_table(progress["rows"], run.eval_tasks))
    if not progress["rows"]:  # the starting point: what training has to beat
        row = {"stage": "start (no training)", "index": -1} | run.score(model, task_data)
        progress["rows"].append(row)
        run.show(row)
    return progress


def run_stage(model, optimizer, stage: Stage, task_data, run: Run, ctx, progress: dict) -> dict:
    """Train stage k = progress['next_stage']; returns its row of the forgetting table.
    progress: the run's before the stage (what a checkpoint inside it keeps), with the
    position of such a checkpoint under 'within' when the stage resumes from one."""
    k, resume = progress["next_stage"], progress.pop("within", None)
    order = torch.Generator().manual_seed(run.seed * 1000 + k)
    steps = stage_steps(task_data, stage, order, run.seed)
    t0 = time.time() - (resume or {}).get("seconds", 0.0)
    best_epoch = BestEpoch(model, task_data, run.rt, run.eval_batch_size)
    if resume:
        best_epoch.r, best_epoch.state = resume["best_epoch"]
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
            }
            run.save(model, optimizer, progress, position)

        within = InStage(save, run.checkpoint_minutes, resume)
        after_epoch = best_epoch.after_epoch if stage.select_by_sts else None
        desc = f"[{k + 1}/{run.plan_length}] {stage.name}"
        hooks = StageHooks(desc, run.seed * 1000 + k, log, after_epoch, within)
        train_loss = train_stage(model, optimizer, stage, steps, ctx, hooks)
        if stage.select_by_sts:
            best_epoch.restore()
        row = {"stage": stage.name, "index": k, "kind": stage.kind, "tasks": list(stage.tasks)}
        row |= {"train_loss": train_loss, "seconds": time.time() - t0}
        with checkpoint.signals_caught() as stop:  # a stop here keeps the trained stage
            row |= run.score(model, task_data, train=run.score_train)
        if stop:
            within.save_end()
    return row


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
    ctx = StepContext(run.rt, optim, reference=reference)
    progress = start(model, optimizer, task_data, run)
    if run.rt.world > 1:  # the same starting weights everywhere, as DDP makes sure too
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)
    own_generators(run.rt)  # each process its own dropout masks from here on
    best, rows = progress["best"], progress["rows"]
    for k in range(progress["next_stage"], len(plan)):
        at_start = {"best": best, "rows": rows, "next_stage": k} | _within(progress)
        try:
            row = run_stage(model, optimizer, plan[k], task_data, run, ctx, at_start)
        except NonFiniteLoss as e:
            raise SystemExit(f"stopped: {e}{kept_best(run)}") from None
        score = run.select(row)
        rows.append(row)
        run.write_rows(rows)
        if score > best["score"]:  # False for nan
            best = {"score": score, "stage": row["stage"], "index": k}
            run.save_best(model, row)
        run.show(row, mark=best["index"] == k)
        progress = {"best": best, "rows": rows, "next_stage": k + 1}
        run.save(model, optimizer, progress)
    return model, rows, best


def _within(progress: dict) -> dict:
    """The in-stage position of a resumed run's first stage, once."""
    return {"within": progress.pop("within")} if "within" in progress else {}


def kept_best(run: Run) -> str:
    """Where the best model so far lies, for a run stopped by a non-finite loss."""
    best_path = run.run_dir / checkpoint.BEST
    if not best_path.exists():
        return ""
    return (
        f"; the best model so far is in {best_path} (predictions from it: --predict {run.run_dir})"
    )


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
        text = json.dumps(measures, indent=1) + "\n"
        checkpoint.atomic_write(text, run.run_dir / checkpoint.FORGETTING)
    if best["index"] is None:
        print("no stage had a numeric score (a constant dev set?): predicting with the last model")
    else:
        best_path = run.run_dir / checkpoint.BEST
        print(f"best stage: {best['stage']} (score {best['score']:.4f}), kept in {best_path}")
        checkpoint.load_model(model, best_path)
    out_dir = write_predictions(model, task_data, run, test)
    print(f"predictions of the best model: {out_dir}")
