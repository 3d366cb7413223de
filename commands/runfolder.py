"""A run folder: where a plan runs, what is scored and written there, and when.

`Run` holds the folder, the device and the tasks a plan is scored on; `start` begins a
run (the untouched model scored as the first row) or resumes the one in the folder;
after each stage runner.run_plan asks it to score the model, write the row, keep the best
model and save the state; `finish` prints the forgetting table, reloads the best model and
writes its predictions. Only the main process (rt.main) scores and writes: the others
train alongside.

    run_dir/config.json        the run's settings (command.load_run_config: --resume reads them)
    run_dir/metrics.jsonl      one row of dev scores per stage, the untouched model first
    run_dir/steps.jsonl        one line per step: loss, lr, gradient norm (clipped, or skipped by the fp16 scaler), examples/s
    run_dir/best.safetensors   the best model so far; state.safetensors: how to go on
    run_dir/forgetting.json    the forgetting measures; predictions/: the handout's files
    run_dir/tensorboard/       with --tensorboard: live curves (TensorBoard, below)

How each file is written safely (atomically, resumable, locked) is checkpoint.py's.
"""

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import batches
import datasets as data
import evaluation
from commands import outputs
from engine import checkpoint
from engine.resume import Progress
from engine.runtime import Runtime, from_main


class TensorBoard:
    """--tensorboard: live curves in RUN_DIR/tensorboard, every step's loss, lr, gradient
    norm and examples/s and each stage's dev scores, the x axis counting logged steps.
    Opened on a resume at the count the kept step log holds, it purges what a stopped run
    wrote past it, so no step is doubled or lost. Flushed at every write (a kill loses
    nothing the step log keeps). Training imports the tensorboard package only here."""

    RECORD = ("loss", "lr", "grad_norm", "examples_per_s")  # of a steps.jsonl line

    def __init__(self, run_dir: Path, steps_done: int):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=steps_done + 1)
        self.steps = steps_done

    def step(self, record: dict) -> None:
        self.steps += 1
        for key in self.RECORD:
            self.writer.add_scalar(f"train/{key}", record[key], self.steps)
        self.writer.flush()

    def scores(self, scores: dict) -> None:
        """A stage's dev scores, {name: value}, at the step that ended it."""
        for name, value in scores.items():
            self.writer.add_scalar(f"dev/{name}", value, self.steps)
        self.writer.flush()


@dataclass
class Run:
    """Where and how a plan runs: its folder, device, scored tasks and evaluation batch.
    Only the main process (rt.main) scores and writes; the others train alongside."""

    run_dir: Path
    rt: Runtime
    eval_tasks: tuple
    eval_batch_size: int
    seed: int
    plan_length: int = 0  # stages in the plan: progress messages, the last stage's save
    checkpoint_minutes: float = 0.0  # a checkpoint inside a stage this often (0: never)
    stage_checkpoints: bool = True  # also one after every stage (off: see `due`)
    resume: bool = False  # continue the run found in run_dir
    score_train: bool = False  # also score the whole training split after each stage
    split_dev: bool = False  # also score each half of dev (outputs.selection_gap)
    patience: int = 0  # stop after this many stages (or a stage's epochs) without a new best
    tensorboard: bool = False  # live curves in run_dir/tensorboard (TensorBoard below)
    board: TensorBoard | None = None
    # (folder, task, split) -> a prediction file: the handout's multitask names, unless the
    # command has others (classifier.py: Part 1's)
    prediction_file: Callable[[Path, str, str], Path] = outputs.prediction_path
    copy_to: Path | None = None  # a copy of each prediction file here (--predictions_dir)
    select_by: str = ""  # a task whose dev metric keeps the best model ("": the overall score)
    last_save: float = field(default_factory=time.monotonic)  # when the state was written
    unsaved_best: tuple | None = None  # (CPU weights, config, row) not yet on disk
    kept_dev: dict | None = None  # the kept model's dev results, where this process scored it

    def evaluate(self, model, task_data, split="dev"):
        return self.evaluated(model, task_data, split)[0]

    def evaluated(self, model, task_data, split="dev"):
        """(the split's row, evaluate_split's results it was scored from)."""
        results = evaluate_split(model, task_data, split, self.eval_tasks, self)
        row = evaluation.score_row(results, self.eval_tasks)
        if self.split_dev and split == "dev":  # what choosing on dev adds: selection_gap
            halves = (evaluation.half_of(results, k) for k in (0, 1))
            row["halves"] = [evaluation.score_row(h, self.eval_tasks) for h in halves]
        if data.HELDOUT in task_data and split == "dev":  # what the encoder brought along
            pairs = task_data[data.HELDOUT].dev
            row["heldout"] = evaluation.roc_auc(
                *evaluation.pair_scores(model, pairs, self.rt, self.eval_batch_size)
            )
        return row, results

    def show(self, row, mark=False):
        print(outputs.format_row(row["stage"], row, self.eval_tasks) + (" *" if mark else ""))
        if self.board:
            names = [t for t in (*self.eval_tasks, "overall", "heldout") if t in row]
            self.board.scores({t: evaluation.main_score(row, t) for t in names})

    # Only the main process scores and writes; these methods are where that is decided.

    def score(self, model, task_data, train=False) -> dict:
        return self.scored(model, task_data, train)[0]

    def scored(self, model, task_data, train=False) -> tuple[dict, dict | None]:
        """(the dev row of a trained (or untouched) model, cosine read-outs fit first, with
        the training split's scores under 'train' when asked; the dev results it was scored
        from), ({}, None) on the other processes."""
        if not self.rt.main:
            return {}, None
        evaluation.fit_thresholds(model, task_data, self.rt, self.eval_batch_size)
        row, dev = self.evaluated(model, task_data)
        if train:
            row["train"] = self.evaluate(model, task_data, "train")
        return row, dev

    def select(self, row: dict) -> float:
        """The score that keeps a stage's model as the best (nan elsewhere: never kept)."""
        if not self.rt.main:
            return math.nan
        if self.select_by:
            return evaluation.main_score(row, self.select_by)
        return evaluation.selection_score(row, self.eval_tasks)

    def keep_steps(self, progress: Progress):
        """The step log of what the checkpoint holds (checkpoint.keep_logged_steps)."""
        if self.rt.main:
            steps = self.run_dir / checkpoint.STEPS
            done = checkpoint.keep_logged_steps(steps, progress.to_json())
            self.board = TensorBoard(self.run_dir, done) if self.tensorboard else None

    def file(self, name: str) -> Path:
        """A file of the run folder; os.devnull for the other processes."""
        return self.run_dir / name if self.rt.main else Path(os.devnull)

    def write_rows(self, rows: list[dict]):
        if self.rt.main:
            checkpoint.write_rows(self.run_dir, rows)

    def due(self) -> bool:
        """Whether checkpoint_minutes have passed since the state was last written."""
        return 0 < 60 * self.checkpoint_minutes < time.monotonic() - self.last_save

    def save(self, model, optimizer, progress: Progress, position: dict | None = None):
        """The state after a finished stage, or (position) inside the next one; a best
        model kept back is written first, so the state never names a best not on disk."""
        self.last_save = time.monotonic()
        if not self.rt.main:
            return
        self.write_best()
        path, scaler = self.run_dir / checkpoint.STATE, self.rt.scaler
        if position is None:
            checkpoint.save_state(model, optimizer, scaler, progress.to_json(), path)
        else:
            saved = progress.to_json()
            checkpoint.save_position(model, optimizer, scaler, saved, position, path)

    def save_best(self, model, row: dict):
        """A new best model: written now, or without stage checkpoints kept on the CPU
        until the next checkpoint (a best replaced before it never reaches the disk)."""
        if not self.rt.main:
            return
        if self.stage_checkpoints:
            return checkpoint.save_best(model, row, self.run_dir / checkpoint.BEST)
        weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        self.unsaved_best = weights, model.checkpoint_config(), row

    def record(self, model, optimizer, row, k, progress: Progress, candidate=True) -> Progress:
        """After stage k: its row written to the table, its model kept if it is the new
        best (and a candidate: Stage.candidate), the row shown, the state saved when due;
        returns the progress after it, `stopped` when --patience ends the run here."""
        best, rows, score = progress.best, [*progress.rows, row], self.select(row)
        self.write_rows(rows)
        if candidate and score > best["score"]:  # False for nan
            best = {"score": score, "stage": row["stage"], "index": k}
            self.save_best(model, row)
        self.show(row, mark=best["index"] == k)
        progress, last = Progress(rows, best, k + 1), self.plan_length
        # the main process decides (only it scores), every process stops with it
        if from_main(patience_ran_out(self.patience, k, best["index"]), self.rt) and k + 1 < last:
            since = best["stage"] or "the start"
            print(f"--patience {self.patience}: no new best since {since}; the run stops")
            progress.next_stage, progress.stopped = last, k + 1
        if self.stage_checkpoints or self.due() or progress.next_stage == last:
            self.save(model, optimizer, progress)
        return progress

    def write_best(self):
        if self.unsaved_best:
            checkpoint.write_best(*self.unsaved_best, self.run_dir / checkpoint.BEST)
            self.unsaved_best = None


def patience_ran_out(patience: int, k: int, best_index: int | None) -> bool:
    """Whether stage k is the patience-th in a row without a new best (never at 0)."""
    return patience > 0 and k - (-1 if best_index is None else best_index) >= patience


def start(model, optimizer, task_data, run: Run) -> Progress:
    """A new run (scored once before training) or the progress of the one in run_dir."""
    state_path, best_path = run.run_dir / checkpoint.STATE, run.run_dir / checkpoint.BEST
    if state_path.exists() and not run.resume:
        raise SystemExit(f"{run.run_dir} already holds a run; give another --run_dir")
    if run.resume and best_path.exists() and not state_path.exists():  # its state was lost
        raise checkpoint.CheckpointError(
            f"{state_path}: missing; nothing to continue from ({best_path} serves --predict)"
        )
    progress = Progress()
    if state_path.exists():
        saved, extra, rng = checkpoint.load_state(model, optimizer, run.rt.scaler, state_path)
        progress = Progress.from_json(saved)
        if best_path.exists():  # found broken now, not after the remaining stages
            checkpoint.read_tensors(best_path)
        if progress.within:  # inside a stage: the generators are restored there
            within = progress.within
            progress.within = checkpoint.resume_position(within, extra, rng, run.rt.device)
        else:
            checkpoint.set_rng_state(*rng)
        k, n = progress.next_stage, run.plan_length
        where = f"at stage {k + 1}/{n}" if k < n else f"after all {n} stages: best rescored"
        if progress.stopped:  # --patience ended it: a finished run
            where = f"stopped after stage {progress.stopped}/{n} (--patience): best rescored"
        print(f"resuming {run.run_dir} {where}")
    run.keep_steps(progress)  # the step log and the table of what the state holds
    run.write_rows(progress.rows)
    print(outputs.format_table(progress.rows, run.eval_tasks))
    if not progress.rows:  # the starting point: what training has to beat
        row = {"stage": "start (no training)", "index": -1} | run.score(model, task_data)
        progress.rows.append(row)
        run.show(row)
    return progress


def evaluate_split(model, task_data: dict, split: str, tasks, run: Run):
    """evaluation.evaluate on one split of these tasks, in the run's precision."""
    loaders = {
        t: batches.make_loader(getattr(task_data[t], split), run.eval_batch_size, shuffle=False)
        for t in tasks
    }
    with run.rt.autocast():
        return evaluation.evaluate(model, loaders, run.rt.device)


def kept_best(run: Run) -> str:
    """Where the best model so far lies, for a run stopped by a non-finite loss."""
    run.write_best()
    best_path = run.run_dir / checkpoint.BEST
    if not best_path.exists():
        return ""
    return (
        f"; the best model so far is in {best_path} (predictions from it: --predict {run.run_dir})"
    )


def write_prediction_files(model, task_data, run: Run, test: bool, dev=None) -> Path:
    """Dev (and test) predictions of the model in the CS224n output format, dev's from
    `dev` where given (evaluate_split's results); with run.copy_to, a copy of each there
    too."""
    out_dir = run.run_dir / "predictions"
    for split in ("dev", "test") if test else ("dev",):
        if split == "dev" and dev is not None:
            results = dev
        else:
            results = evaluate_split(model, task_data, split, run.eval_tasks, run)
        for task, res in results.items():
            path = run.prediction_file(out_dir, task, split)
            outputs.write_predictions(path, task, res.ids, res.preds)
            if run.copy_to is not None:  # where the handout's commands write it
                copy_prediction(path, Path(run.copy_to), run.run_dir)
    if run.copy_to is not None:
        print(f"copied into {run.copy_to}/ (prepare_submit.py with no argument zips them)")
    return out_dir


SOURCES = ".predictions.json"  # beside a --predictions_dir: which run wrote each file


def copy_prediction(path: Path, folder: Path, run_dir: Path) -> None:
    """A copy of a prediction file in `folder`, and in folder/../.predictions.json the run
    that wrote it: prepare_submit.py with no argument checks that run's model."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, folder / path.name)
    record = folder.parent / SOURCES
    sources = json.loads(record.read_text()) if record.is_file() else {}
    sources[path.name] = str(Path(run_dir).resolve())
    checkpoint.atomic_write(json.dumps(sources, indent=1) + "\n", record)


def finish(model, rows, best, task_data, run: Run, test: bool, wall: float):
    """Print the forgetting table, reload the best model and write its predictions."""
    if not run.rt.main:
        return
    several = len(run.eval_tasks) > 1  # one task (classifier.py): nothing else to forget
    print(f"\n{'forgetting table' if several else 'scores'} ({run.run_dir}, {wall / 60:.1f} min):")
    print(outputs.format_table(rows, run.eval_tasks, best["index"]))
    if len(rows) > 1 and several:
        measures = evaluation.forgetting(rows, run.eval_tasks)
        print(outputs.format_forgetting(measures))
        if "halves" in rows[0]:
            gap = measures["selection"] = outputs.selection_gap(rows)
            print(
                f"the kept stage chosen on one half of dev scores {gap['held']:.4f} on the "
                f"other; the best stage of a half scores {gap['chosen']:.4f} on it: choosing "
                f"on dev adds {gap['gap']:+.4f}"
            )
        text = json.dumps(measures, indent=1) + "\n"
        checkpoint.atomic_write(text, run.run_dir / checkpoint.FORGETTING)
    if best["index"] is None:
        print("no stage had a numeric score (a constant dev set?): predicting with the last model")
    else:
        best_path = run.run_dir / checkpoint.BEST
        print(f"best stage: {best['stage']} (score {best['score']:.4f}), kept in {best_path}")
        checkpoint.load_model(model, best_path)
    dev = None if best["index"] is None else run.kept_dev  # None: scored again (a resumed run)
    out_dir = write_prediction_files(model, task_data, run, test, dev)
    print(f"predictions of the best model: {out_dir}")
