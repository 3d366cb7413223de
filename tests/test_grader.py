"""The grader graded: plausible slips of every exercise fail it, the solution and the
variants the handout allows pass it.

A slip is a small text change of the solution: each (old, new) replaces one text that occurs
once in the exercise's marked bodies. The changed module is imported from a folder of its
own, ahead of this checkout's, and the exercise's check runs in this process.

    PYTHONPATH=.:grader python tests/test_grader.py      prints the table of slips, for the docs
"""

import json
import signal
import sys
import tempfile
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

import checks  # they register the checks; grader/ is on pytest's path
import exercises
import extensions
import harness
import multitask_checks  # noqa: F401  (it registers the Part 2 checks)
import scorecard
import slips_checks
import slips_extensions
import slips_multitask
from variants import VARIANTS

REPO = exercises.HERE
WEIGHTS = scorecard.check_docs(REPO)


def joined(*tables: dict) -> dict:
    """The slip tables as one: each exercise's slips from every table, in order."""
    out = {}
    for table in tables:
        for name, slips in table.items():
            out[name] = out.get(name, []) + list(slips)
    return out


# exercise -> [(what the slip is, edits)]: the handout's exercises, then the project's
SLIPS = joined(slips_checks.SLIPS, slips_multitask.SLIPS, slips_extensions.SLIPS, slips_checks.MORE)


def changed(name: str, edits) -> dict[str, str]:
    """{file: its text} with the exercise's bodies edited: whole bodies (one per region), or
    each (old, new) replacing a text that occurs once in them."""
    regions = exercises.exercises(REPO)[name]
    texts = {r.file: (REPO / r.file).read_text() for r in regions}
    if edits and all(isinstance(e, str) for e in edits):  # one whole body per region
        for r, body in sorted(zip(regions, edits, strict=True), key=lambda x: -x[0].begin):
            lines = texts[r.file].splitlines(keepends=True)
            texts[r.file] = "".join(lines[: r.begin + 1] + [body] + lines[r.end :])
        return texts
    for old, new in edits:
        bodies = [
            (r.file, "".join(texts[r.file].splitlines(keepends=True)[r.begin + 1 : r.end]))
            for r in regions
        ]
        hits = [(f, b) for f, b in bodies if old in b]
        assert sum(b.count(old) for _, b in hits) == 1, f"{name}: {old!r} is not once in its bodies"
        file, body = hits[0]
        texts[file] = texts[file].replace(body, body.replace(old, new), 1)
    return texts


PROJECT = {p.stem for p in REPO.glob("*.py")}  # the top-level modules a slip may change


NAMESPACES = (torch, torch.Tensor, torch.nn.functional, torch.nn.Module, np)


def snapshot() -> list[tuple[object, dict]]:
    """What torch's, torch.Tensor's, F's, nn.Module's and numpy's names hold now."""
    return [(space, dict(vars(space))) for space in NAMESPACES]


def restore(saved: list[tuple[object, dict]]) -> None:
    """Each name as the snapshot holds it (a module imported since stays)."""
    for space, before in saved:
        now = dict(vars(space))
        for name in now.keys() - before.keys():
            if not isinstance(now[name], types.ModuleType):
                delattr(space, name)
        for name, value in before.items():
            if now.get(name, restore) is not value:
                setattr(space, name, value)


class NoTransformers:
    """A finder that refuses transformers: the student's process never imports it."""

    def find_spec(self, fullname, *args):
        if fullname.split(".")[0] == "transformers":
            raise ImportError(f"{fullname}: the student's side imports no transformers")


@contextmanager
def without_transformers():
    """transformers out of reach (its modules hidden, an import of it refused), then back."""
    hidden = {n: sys.modules.pop(n) for n in list(sys.modules) if n.split(".")[0] == "transformers"}
    finder = NoTransformers()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        sys.modules.update(hidden)


def grade_here(name: str) -> dict:
    """Both sides of one exercise in this process, as the grader's two processes run them:
    the student's run, without transformers, what its body replaced in torch or numpy put
    back (a fork of its own drops it there), its values through JSON, judged."""
    saved = snapshot()
    try:
        with without_transformers():
            records = harness.run_student(name)
    finally:
        restore(saved)
    return harness.judged(name, json.loads(json.dumps(records)))


@contextmanager
def changes_graded(tmp: Path):
    """grade(name, edits, student=False): the check's row with the edited modules imported
    in place of this checkout's (every project module imported afresh), graded as the TA's
    grader does or (student) as a student's copy does, without references.py; afterwards
    the checkout's modules are back as they were."""
    ours = {n: sys.modules.pop(n) for n in PROJECT if n in sys.modules}
    saved = signal.signal(signal.SIGALRM, harness.on_alarm)
    count = iter(range(10**6))

    def grade(name: str, edits, student: bool = False) -> dict:
        folder = tmp / f"m{next(count)}"
        folder.mkdir()
        for file, text in changed(name, edits).items():
            (folder / file).write_text(text)
        sys.path.insert(0, str(folder))
        references = checks.R
        checks.R = extensions.R = harness.Absent() if student else references
        try:
            return grade_here(name)
        finally:
            checks.R = extensions.R = references
            sys.path.remove(str(folder))
            for n in PROJECT:
                sys.modules.pop(n, None)

    try:
        yield grade
    finally:
        sys.modules.update(ours)
        signal.signal(signal.SIGALRM, saved)


@pytest.fixture
def grade_changed(tmp_path):
    with changes_graded(tmp_path) as grade:
        yield grade


def test_every_exercise_has_three_slips_at_least():
    assert set(SLIPS) == set(exercises.exercises(REPO))
    assert all(len(slips) >= 3 for slips in SLIPS.values())


def full_points(row: dict, name: str) -> bool:
    """Whether a scorecard shows the row all of the exercise's points, none provisional."""
    s = scorecard.score(row, WEIGHTS[name])
    return s.held is not None and s.here + s.held == s.here_max + s.held_max


@pytest.mark.parametrize("name", sorted(SLIPS))
def test_every_slip_fails_and_the_solution_passes(name, grade_changed):
    """On the TA's side every slip fails; on the student's side (no references.py) it fails
    too, by a public part (grader/definitions.py, finite differences, invariances), never
    the solution's row. The parts the TA's grader holds are those the student's cannot judge."""
    ta, student = grade_changed(name, []), grade_changed(name, [], student=True)
    assert ta["result"] == "pass" and full_points(ta, name)
    assert student["result"] in ("pass", "provisional", "hidden")
    assert student["unknown"] == ta["held"] and bool(ta["held"]) == bool(WEIGHTS[name].held)
    for what, edits in SLIPS[name]:
        row = grade_changed(name, edits)
        assert row["result"] in ("fail", "error"), f"{name}, {what}: {row}"
        if row.get("held") or row["result"] == "error":  # else no part reached the TA's
            row = grade_changed(name, edits, student=True)  # references: the same verdict
        assert not full_points(row, name), f"{name}, {what}, on the student's side: {row}"
        assert row["result"] in ("fail", "error"), f"{name}, {what}, student's side: {row}"


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_variants_the_handout_allows_pass(name, grade_changed):
    """On both sides: a variant fails no part the student's copy judges."""
    for what, edits in VARIANTS[name]:
        row = grade_changed(name, edits)
        assert row["result"] == "pass", f"{name}, {what}: {row}"
        student = grade_changed(name, edits, student=True)
        assert student["result"] in ("pass", "provisional"), f"{name}, {what}: {student}"
        if what == "the handout's algorithm":  # the scorecard says which AdamW it matched
            assert row["detail"] == "matched the handout's AdamW"


def slip_table() -> str:
    """The docs' table: per exercise, its slips, how many the TA's grader fails, how many a
    student's copy fails (all: a public part fails), how many it shows with full points
    (none may), and the solution's grade on each side."""
    lines = [
        "| exercise | slips tried | failed by the TA's grader | failed in a student's copy "
        "| full points in a student's copy | the solution (TA's / student's) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    with tempfile.TemporaryDirectory() as tmp, changes_graded(Path(tmp)) as grade:
        for name, slips in SLIPS.items():
            caught = sum(grade(name, e)["result"] in ("fail", "error") for _, e in slips)
            rows = [grade(name, e, student=True) for _, e in slips]
            told = sum(r["result"] in ("fail", "error") for r in rows)
            shown = sum(full_points(r, name) for r in rows)
            what = "; ".join(w for w, _ in slips).replace("|", "\\|")  # a table's cell
            ta, student = grade(name, [])["result"], grade(name, [], student=True)["result"]
            n = len(slips)
            lines.append(
                f"| `{name}` | {what} | {caught} / {n} | {told} / {n} | {shown} | {ta} / {student} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    print(slip_table())


def test_an_exception_of_the_graders_own_code_is_the_graders(tmp_path):
    """Raised in grader/ with no frame of the student's on the way: the grader's (result
    `grader`, never the student's fail); raised in the student's file: the student's, at
    the student's line."""
    try:
        checks.padded(B=0)  # an IndexError inside checks.py
    except IndexError as e:
        own = e.with_traceback(e.__traceback__.tb_next)  # from checks.py down
    assert harness.graders(own)
    (tmp_path / "student.py").write_text("def body(x):\n    return x[5]\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import student

        checks.grads(student.body(checks.torch.zeros(2)), [], 1.0)
    except IndexError as e:
        theirs = e.with_traceback(e.__traceback__.tb_next)
    finally:
        sys.path.remove(str(tmp_path))
    assert not harness.graders(theirs)
    assert "(student.py:2)" in harness.failure(theirs)


def test_a_body_that_replaces_a_torch_function_is_graded_as_the_code_it_is(grade_changed):
    """A wrong mean_pool that replaces torch.Tensor.abs (which judging |got - expected|
    once used) still fails; the function is back before the next exercise is graded."""
    abs_ = torch.Tensor.abs
    forged = [
        (
            "return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)",
            "torch.Tensor.abs = lambda self: self * 0\n    return hidden.mean(1)",
        )
    ]
    assert grade_changed("mean_pool", forged)["result"] == "fail"
    assert torch.Tensor.abs is abs_
    assert grade_changed("pearson", [])["result"] == "pass"
