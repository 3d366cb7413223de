"""The scorecard's arithmetic: each exercise's check as `list` shows it, its weight
(grader/points.py, the file a TA edits) and the points a graded row earns. Read without
importing the checks or the points: nothing of a student's code runs here.
"""

import ast
from dataclasses import dataclass
from pathlib import Path

# the handout's Part 1 and Part 2, then the project's: the order exercises are done in
CHECKS = (
    Path("grader/checks.py"),
    Path("grader/multitask_checks.py"),
    Path("grader/extensions.py"),
)
POINTS = Path("grader/points.py")  # each exercise's points: the TA edits them there


@dataclass(frozen=True)
class Check:
    """An exercise's check as `list` and the scorecard show it: the first paragraph of its
    docstring, the exercises its stand-ins answer for, and its weight (grader/points.py):
    points, of which `held` for the parts judged by the TA's references; partial credit."""

    doc: str
    stands_in: tuple[str, ...]
    points: int
    held: int
    partial: bool


def weights(grader: Path) -> dict[str, dict]:
    """grader/points.py's POINTS, read without importing: {exercise: {points, held,
    partial}}, each checked."""
    path = grader / POINTS
    try:
        found = {
            t.id: ast.literal_eval(node.value)
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
    except (OSError, SyntaxError, ValueError) as e:
        raise SystemExit(f"{path}: {e}") from None
    partial, out = found.get("PARTIAL", False), {}
    if not isinstance(partial, bool):
        raise SystemExit(f"{path}: PARTIAL = {partial!r}; expected True or False")
    for name, w in found.get("POINTS", {}).items():
        w = {"held": 0, "partial": partial} | (w if isinstance(w, dict) else {})
        points, held = w.get("points"), w["held"]
        if (
            set(w) != {"points", "held", "partial"}
            or not all(type(x) is int and x >= 0 for x in (points, held))
            or held > points
            or not isinstance(w["partial"], bool)
        ):
            raise SystemExit(
                f'{path}: "{name}": expected {{"points": N, "held": M}} (0 <= M <= N) '
                'and maybe "partial": True or False'
            )
        out[name] = w
    return out


def check_docs(grader: Path) -> dict[str, Check]:
    """{exercise: its Check}, in the checks' order, read without importing; a check with
    no points in grader/points.py, or points with no check, stops with the file."""
    found, table = {}, weights(grader)
    for f in (f for checks in CHECKS for f in ast.parse((grader / checks).read_text()).body):
        decorator = next((d for d in getattr(f, "decorator_list", ()) if is_check(d)), None)
        if decorator:
            stands = next((k.value for k in decorator.keywords if k.arg == "stands_in"), None)
            names = (
                tuple(e.value for e in stands.elts if isinstance(e, ast.Constant)) if stands else ()
            )
            doc = " ".join((ast.get_docstring(f) or "").split("\n\n")[0].split())
            found[f.name] = (doc, names)
    if unweighed := [n for n in found if n not in table] + [n for n in table if n not in found]:
        raise SystemExit(
            f"{grader / POINTS}: {', '.join(unweighed)}: a check needs points, points need a check"
        )
    return {n: Check(doc, names, **table[n]) for n, (doc, names) in found.items()}


def is_check(decorator: ast.expr) -> bool:
    """Whether a decorator is the harness's @check(tolerance, ...)."""
    return isinstance(decorator, ast.Call) and getattr(decorator.func, "id", "") == "check"


@dataclass(frozen=True)
class Score:
    """An exercise's points: `here` of `here_max` from the parts graded where it ran;
    `held` of `held_max` from the parts judged by the TA's references, None where those
    are absent (a student's copy): provisional, never counted."""

    here: float
    here_max: int
    held: float | None
    held_max: int


def score(row: dict, c: Check) -> Score:
    """What a graded row earns under its Check's weight (grader/points.py): each side all
    or nothing, or (partial) each part its share; an exercise whose parts are all the TA's,
    or none, puts all its points on that side."""
    parts, held = row.get("parts", 0), row.get("held", 0)
    held_max = c.points if parts and held == parts else c.held if held else 0
    here_max = c.points - held_max
    if row["result"] not in ("pass", "fail", "provisional", "hidden") or "failed" not in row:
        return Score(0, here_max, 0 if row.get("unknown", 0) == 0 else None, held_max)

    def share(worth, passed, ran):
        return worth * passed / ran if c.partial and ran else worth * (passed == ran)

    here = share(here_max, parts - held - row["failed"], parts - held)
    unknown = row["unknown"] > 0
    return Score(
        here,
        here_max,
        None if unknown else share(held_max, held - row["held_failed"], held),
        held_max,
    )


def shown(s: Score) -> str:
    """`3 / 4`, or `3 +1? / 4` where the TA's parts are provisional."""
    if s.held is None:
        return f"{round(s.here, 2):g} +{s.held_max}? / {s.here_max + s.held_max}"
    return f"{round(s.here + s.held, 2):g} / {s.here_max + s.held_max}"


def scorecard_total(rows: dict, scores: dict, names: list[str]) -> str:
    """The scorecard's last lines: how many exercises end how; the points counted, and
    apart, those the TA's grader alone can give."""
    ends = [rows[n]["result"] for n in names]
    counts = ", ".join(f"{ends.count(e)} {e}" for e in dict.fromkeys(ends))
    here = sum(s.here + (s.held or 0) for s in scores.values())
    total = sum(s.here_max + s.held_max for s in scores.values())
    pending = sum(s.held_max for s in scores.values() if s.held is None)
    line = f"\n{len(names)} exercise(s): {counts}\n{here:g} / {total} points"
    if pending:
        line += f" counted here; {pending} more are the TA's grader's to give (+N?: provisional)"
    return line
