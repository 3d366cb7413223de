"""What a run reports: the forgetting table's printed lines and its measures' table, the
selection gap of a run scored on both halves of dev (--split_dev), and the handout's
prediction files (a header line, then "id , prediction" rows). The numbers themselves are
evaluation.py's."""

import math
from pathlib import Path

import numpy as np

from evaluation import MULTITASK, TASKS, kept_stage, selection_score

# ---------------------------------------------------------------------------------------
# The forgetting table, printed


def format_row(name: str, row: dict, tasks) -> str:
    cells = [f"{name:<20s}"]
    for t in tasks:
        m = row.get(t)
        if TASKS[t].kind == "regression":  # a row saved before Spearman was scored: blank
            rho = f"{m['spearman']:>6.3f}" if m and "spearman" in m else f"{'':>6s}"
            cells.append(f"{m['pearson']:>7.3f} {rho}" if m else f"{'':>14s}")
        else:
            cells.append(f"{m['accuracy']:>7.3f} {m['weighted_f1']:>6.3f}" if m else f"{'':>14s}")
    if "overall" in row:
        cells.append(f"{row['overall']:>8.4f}")
    if "heldout" in row:
        cells.append(f"held-out AUC {row['heldout']:.4f}")
    if "train" in row:
        cells.append("train " + format_row("", row["train"], tasks).strip(" |"))
    return " | ".join(cells)


def format_table(rows: list[dict], tasks, best_index=None) -> str:
    """The header and one line per row; `*` marks the row of stage `best_index`."""
    lines = [table_header(tasks)]
    for row in rows:
        mark = " *" if best_index is not None and row.get("index") == best_index else ""
        lines.append(format_row(row["stage"], row, tasks) + mark)
    return "\n".join(lines)


def table_header(tasks) -> str:
    cells = [f"{'stage':<20s}"]
    for t in tasks:
        metric, second = ("r", "rho") if TASKS[t].kind == "regression" else ("acc", "F1w")
        cells.append(f"{TASKS[t].title + ' ' + metric:>7s} {second:>6s}")
    if set(MULTITASK) <= set(tasks):
        cells.append(f"{'overall':>8s}")
    line = " | ".join(cells)
    return f"{line}\n{'-' * len(line)}"


def format_forgetting(measures: dict) -> str:
    """The measures of `forgetting` as a small table, one column per task."""
    names = list(measures)
    titles = [TASKS[t].title if t in TASKS else t for t in names]
    lines = [f"{'forgetting (dev)':<20s} | " + " | ".join(f"{t:>8s}" for t in titles)]
    for key in ("forgetting", "backward_transfer", "final_minus_start", "mean_drop_below_best"):
        cells = [measures[t][key] for t in names]
        text = [f"{'':>8s}" if c is None else f"{c:>+8.4f}" for c in cells]
        lines.append(f"{key.replace('_', ' '):<20s} | " + " | ".join(text))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Choosing on dev: what it flatters


def selection_gap(rows: list[dict]) -> dict[str, float]:
    """How much choosing the kept stage on dev flatters it, from rows scored on both halves
    of dev ('halves', --split_dev): the stage chosen by one half's selection score, scored
    on the other half ('held'), against the other half's own best ('chosen'), the mean of
    the two ways round; 'gap' = chosen - held, what picking on the reported data adds."""
    tasks = [t for t in TASKS if t in rows[0]]
    held, chosen = [], []
    for pick, report in ((0, 1), (1, 0)):
        on = [selection_score(r["halves"][report], tasks) for r in rows[1:]]
        best = kept_stage([r["halves"][pick] for r in rows])
        held.append(on[best] if best is not None else math.nan)
        chosen.append(np.max(on))  # NaN when a stage's score is: the rule above
    held, chosen = float(np.mean(held)), float(np.mean(chosen))
    return {"held": held, "chosen": chosen, "gap": chosen - held}


# ---------------------------------------------------------------------------------------
# Prediction files (the handout's format: a header line, then "id , prediction" rows)


def prediction_path(out_dir: str | Path, task: str, split: str) -> Path:
    """predictions/<task>-<split>-output.csv, the handout's file names."""
    return Path(out_dir) / f"{task}-{split}-output.csv"


def write_predictions(path: str | Path, task: str, ids: list[str], preds: list) -> None:
    if len(ids) != len(preds):
        raise ValueError(f"{len(ids)} ids but {len(preds)} predictions; expected one each")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        f.write(f"id \t {TASKS[task].column} \n")
        binary = TASKS[task].kind == "binary"  # QQP's 0/1 as the handout writes them: 0.0/1.0
        for id_, pred in zip(ids, preds, strict=True):
            f.write(f"{id_} , {float(pred) if binary else pred} \n")


def read_predictions(path: str | Path) -> tuple[list[str], list]:
    """(ids, preds) from a prediction file; preds are int where written as integers."""
    ids, preds = [], []
    lines = Path(path).read_text().splitlines()
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        id_, sep, value = line.partition(",")
        if not sep:
            raise ValueError(f"{path}:{lineno}: {line!r} has no ','; expected 'id , prediction'")
        value = value.strip()
        try:
            pred = int(value)
        except ValueError:
            try:
                pred = float(value)
            except ValueError:
                raise ValueError(f"{path}:{lineno}: prediction {value!r} is not a number") from None
        ids.append(id_.strip())
        preds.append(pred)
    return ids, preds
