"""A plan run in a folder: every stage trained (trainer.train_stage), scored after it (a row
of the forgetting table), the best model and a resumable state kept (runfolder.Run).

`run_plan` is what the commands call (multitask_classifier.py, classifier.py); `BestEpoch`
keeps a stage's best epoch where the stage scores every epoch (SimCSE's by STS,
--patience's by the run's score). It builds a run from the lesson's pieces (trainer.py).
"""

import json
import math
import time
from dataclasses import replace

import torch
from tqdm.auto import tqdm

import trainer
from commands import runfolder
from commands.runfolder import Run, evaluate_split
from engine import checkpoint
from engine.resume import InStage, Progress
from engine.runtime import from_main, own_generators, same_start
from presets import Stage
from settings import OptimConfig


class BestEpoch:
    """Score dev after each epoch of a stage and keep the best epoch's weights: by STS for
    SimCSE (select_by_sts), else by the run's selection score, and then the stage stops
    after run.patience epochs without a new best (--patience)."""

    def __init__(self, model, task_data, run: Run, by_sts: bool):
        self.model, self.task_data, self.run, self.by_sts = model, task_data, run, by_sts
        self.r, self.state, self.epoch = -math.inf, None, -1
        self.row = self.dev = None  # the kept epoch's dev row (by the run's score) and results

    def score(self) -> tuple[float, dict | None, dict | None]:
        if self.by_sts:
            results = evaluate_split(self.model, self.task_data, "dev", ("sts",), self.run)
            return results["sts"].metrics["pearson"], None, None
        row, dev = self.run.scored(self.model, self.task_data)
        return self.run.select(row), row, dev

    def after_epoch(self, epoch: int) -> bool:
        """Keep this epoch if it is the best so far; whether the stage stops here."""
        r = row = dev = None
        if self.run.rt.main:  # scores once; every process keeps the same epoch
            r, row, dev = self.score()
            what = "STS dev Pearson of the cosine" if self.by_sts else "dev score"
            tqdm.write(f"  epoch {epoch + 1}: {what} {r:.4f}")
        r = from_main(r, self.run.rt)
        if r > self.r:
            self.r, self.epoch, self.row, self.dev = r, epoch, row, dev
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


def run_stage(model, optimizer, stage: Stage, task_data, run: Run, ctx, progress: Progress):
    """Train stage k = progress.next_stage; returns its row of the forgetting table and
    the dev results it was scored from.
    progress: the run's before the stage (what a checkpoint inside it keeps), with the
    position of such a checkpoint as `within` when the stage resumes from one."""
    k, resume = progress.next_stage, progress.within
    progress = replace(progress, within=None)  # a checkpoint inside the stage adds its own
    order = torch.Generator().manual_seed(run.seed * 1000 + k)
    steps = trainer.stage_steps(task_data, stage, order, run.seed)
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
        hooks = trainer.StageHooks(desc, run.seed * 1000 + k, log, after_epoch, within)
        train_loss = trainer.train_stage(model, optimizer, stage, steps, ctx, hooks)
        if per_epoch:
            best_epoch.restore()
        row = {"stage": stage.name, "index": k, "kind": stage.kind, "tasks": list(stage.tasks)}
        row |= {"train_loss": train_loss, "seconds": time.time() - t0}
        with checkpoint.signals_caught() as stop:  # a stop here keeps the trained stage
            if best_epoch.row and not run.score_train:  # scored when it was kept
                scored, dev = best_epoch.row, best_epoch.dev
            else:
                scored, dev = run.scored(model, task_data, train=run.score_train)
            row |= scored
        if stop:
            within.save_end()
    return row, dev


def run_plan(plan: list[Stage], model, task_data, optim: OptimConfig, run: Run):
    """Run every stage of `plan`, scoring `run.eval_tasks` after each; resumable.

    Files in run_dir: metrics.jsonl (one row per stage), steps.jsonl (one line per step:
    stage, epoch, step, tasks, loss, lr, grad_norm, examples_per_s), best.safetensors (the
    best model so far) and state.safetensors (everything needed to continue after the last
    finished stage, or from inside a stage; commands/runfolder.py). A stage whose score is not a
    number (e.g. the Pearson r of a constant prediction) is never the best.
    """
    run.plan_length = len(plan)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    model = model.to(run.rt.device)
    optimizer = model.configure_optimizers(optim)
    # what L2-SP and distillation pull toward: the model as loaded, before a resumed run's
    # checkpoint replaces it
    reference = trainer.reference_of(model, optim)
    ctx = trainer.StepContext(run.rt, optim, reference=reference)
    progress = runfolder.start(model, optimizer, task_data, run)
    same_start(model, run.rt)  # the main process's weights on every process
    own_generators(run.rt)  # each process its own dropout masks from here on
    for k in range(progress.next_stage, len(plan)):
        at_start = progress.at_stage(k)  # with a resumed run's place inside its first stage
        try:
            row, dev = run_stage(model, optimizer, plan[k], task_data, run, ctx, at_start)
        except trainer.NonFiniteLoss as e:
            raise SystemExit(f"stopped: {e}{runfolder.kept_best(run)}") from None
        progress = run.record(model, optimizer, row, k, progress, plan[k].candidate)
        if progress.best["index"] == k:  # finish writes its dev predictions from these
            run.kept_dev = dev
        if progress.stopped:
            break
    return model, progress.rows, progress.best
