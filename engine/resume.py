"""Where a run stands, and resume, stop and save inside a stage: the run's progress (its
rows, its best stage, the next stage), what a checkpoint inside a stage keeps, and how a
resumed stage replays its data order up to the saved step."""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from engine import checkpoint
from engine.runtime import Runtime, any_process, own_generators


def no_best() -> dict:
    return {"score": -math.inf, "stage": None, "index": None}


@dataclass
class Progress:
    """A run's place: the forgetting table's rows so far, the best stage (its selection
    score, name, index), the next stage to train; `within`: the saved position inside that
    stage (InStage.resume), or None; `stopped`: the stage after which --patience ended the
    run, or None. A checkpoint keeps it as JSON (to_json, from_json)."""

    rows: list = field(default_factory=list)
    best: dict = field(default_factory=no_best)
    next_stage: int = 0
    within: dict | None = None
    stopped: int | None = None

    def to_json(self) -> dict:
        out = {"best": self.best, "rows": self.rows, "next_stage": self.next_stage}
        extra = {"within": self.within, "stopped": self.stopped}
        return out | {k: v for k, v in extra.items() if v is not None}

    @classmethod
    def from_json(cls, saved: dict) -> "Progress":
        return cls(
            saved["rows"],
            saved["best"],
            saved["next_stage"],
            saved.get("within"),
            saved.get("stopped"),
        )

    def at_stage(self, k: int) -> "Progress":
        """The progress before stage k, the in-stage position handed over once (a resumed
        run's place inside its first stage)."""
        within, self.within = self.within, None
        return Progress(self.rows, self.best, k, within)


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
            teacher.restore(*self.resume["teacher"])
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
