"""Pictures of a run folder: the forgetting figure and the training loss of every step.

    python -m lab.plots RUN_DIR [--out DIR]
    python -m lab.plots --table "plain=runs/a,runs/b" "defended=runs/c,runs/d"
    python -m lab.plots --compare thesis=runs/t defended=runs/d --out docs/presets.png

forgetting.png: each task's dev score (SST and QQP accuracy, STS Pearson r, the overall
score) after every stage, as in the thesis's forgetting figures: a score that falls after a
stage of another task is forgetting. The untouched model's scores are dashed lines in the
same colours, and the stage kept as the best model is shaded.
loss.png: the training loss of every step (steps.jsonl) as faint dots, with its moving average,
coloured by the task trained; thin vertical lines separate the stages, named on top
(where a long run leaves room).

--compare draws one picture of several runs of one schedule: a panel per score (each task,
the overall score, the held-out AUC when every run has it), a line per run over its stages,
lined up by stage name (a run that starts with SimCSE shifts nothing), the untouched
model's score dashed.

--table prints a Markdown table comparing recipes, each run with one or more seeds (best
stage's scores, mean drop below the best, minutes; compare_runs); no picture is drawn.

For the individual preset, give the run folder: each task's sub-run gets its own pictures.
lab/explore.py draws its attention picture and the report page's figures with the
`*_figure` functions here, which return a Figure instead of writing a file.
Only this file imports matplotlib, and only its Figure class (drawn with the Agg canvas,
no pyplot state, no display needed); training never imports it.
"""

import argparse
import json
import sys
from itertools import groupby
from pathlib import Path

if not __package__:  # run as python lab/NAME.py: the course's modules are one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

try:
    from matplotlib.figure import Figure
except ImportError:  # training never draws: a Python with requirements.txt's torch alone
    raise SystemExit("lab/plots.py draws with matplotlib: pip install matplotlib") from None

from commands import cli
from engine import checkpoint
from engine.checkpoint import METRICS, STEPS
from evaluation import MULTITASK, TASKS, forgetting, kept_row, kept_stage, main_score

COLORS = {
    "sst": "tab:blue",
    "para": "tab:orange",
    "sts": "tab:green",
    "overall": "black",
    "sst+para+sts": "tab:red",
    "contrastive": "tab:purple",
}
SERIES_COLORS = ("tab:red", "tab:blue", "tab:purple", "tab:green", "tab:orange", "tab:brown")


def run_rows(run_dir) -> list[dict]:
    """metrics.jsonl: the untouched model's row first, then one row per finished stage."""
    if not (Path(run_dir) / METRICS).is_file():
        raise SystemExit(f"{run_dir}: no {METRICS} there; is it a run folder?")
    return checkpoint.read_rows(run_dir)


def scored_rows(run_dir) -> list[dict]:
    """run_rows of a run with a stage to keep: a table compares kept stages."""
    rows = run_rows(run_dir)
    if kept_stage(rows) is None:
        raise SystemExit(f"{run_dir}: no stage with a numeric score in its {METRICS} yet")
    return rows


def read_steps(run_dir) -> list[dict]:
    """steps.jsonl, one record per training step; [] for runs made before the step log."""
    path = Path(run_dir) / STEPS
    if not path.is_file():
        return []
    lines = path.read_text().split("\n")[:-1]  # a stage still training may be mid-line
    return [json.loads(line) for line in lines]


def run_folders(run_dir: Path) -> list[Path]:
    """The run folder itself, or its sub-runs when only they are scored (individual preset)."""
    subs = sorted(p.parent for p in run_dir.glob(f"*/{METRICS}"))
    return subs if subs and not (run_dir / METRICS).is_file() else [run_dir]


def score_series(rows: list[dict]) -> dict[str, tuple[str, list[float]]]:
    """Scored task (or 'overall') -> (its label, its score in every row, the start first)."""
    tasks = [t for t in MULTITASK if t in rows[0]]
    series = {}
    for t in tasks:
        label = f"{TASKS[t].title} {'r' if TASKS[t].kind == 'regression' else 'acc'}"
        series[t] = (label, [main_score(row, t) for row in rows])
    if "overall" in rows[0]:
        series["overall"] = ("overall", [row["overall"] for row in rows])
    return series


def task_label(tasks: str) -> str:
    """'sst+para+sts' -> 'SST+QQP+STS'; names that are not tasks stay as they are."""
    return "+".join(TASKS[t].title if t in TASKS else t for t in tasks.split("+"))


def moving_average(y: np.ndarray) -> np.ndarray:
    """Trailing mean over ~5% of the points: the trend under the per-batch noise."""
    w = max(1, len(y) // 20)
    return np.convolve(y, np.ones(w) / w, mode="valid")  # (len(y) - w + 1,)


def spaced(positions: list[float], gap: float) -> list[int]:
    """Indices of the positions at least `gap` after the last one kept: labels that fit."""
    kept = []
    for i, x in enumerate(positions):
        if not kept or x - positions[kept[-1]] >= gap:
            kept.append(i)
    return kept


def draw_forgetting(rows: list[dict], path: Path, title: str) -> Path:
    """forgetting_figure, written to path."""
    forgetting_figure(rows, title).savefig(path, dpi=110)
    return path


def forgetting_figure(rows: list[dict], title: str) -> Figure:
    """Each scored task's dev score over the stages; the start dashed, the kept stage shaded."""
    names = [row["stage"] for row in rows[1:]]
    x = np.arange(len(names))
    fig = Figure(figsize=(max(6.0, 0.45 * len(names) + 3.5), 4.2), layout="constrained")
    ax = fig.subplots()
    for key, (label, values) in score_series(rows).items():
        ax.plot(x, values[1:], marker="o", ms=4, color=COLORS[key], label=label)
        ax.axhline(values[0], color=COLORS[key], ls="--", lw=1, alpha=0.6)
    ax.plot([], [], color="gray", ls="--", lw=1, label="start (no training)")
    best = kept_stage(rows)
    if best is not None:
        ax.axvspan(best - 0.4, best + 0.4, color="gold", alpha=0.3, label=f"kept: {names[best]}")
    ax.set_xticks(x, names, rotation=35, ha="right", rotation_mode="anchor", fontsize=8)
    ax.set(ylabel="dev score", title=f"{title}: dev scores after each stage")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return fig


def sts_scatter_figure(gold: list[float], pred: list[float], title: str) -> Figure:
    """Predicted against gold STS scores, the diagonal dashed."""
    fig = Figure(figsize=(4.6, 4.2), layout="constrained")
    ax = fig.subplots()
    ax.scatter(gold, pred, s=6, alpha=0.35, color=COLORS["sts"])
    low, high = min(min(gold), min(pred)), max(max(gold), max(pred))
    ax.plot([low, high], [low, high], color="gray", ls="--", lw=1)
    ax.set(xlabel="gold similarity (0-5)", ylabel="predicted", title=title)
    ax.grid(alpha=0.3)
    return fig


def by_label_figure(scores, labels, cut: float) -> Figure:
    """Histograms of a binary task's outputs, one per gold label, the decision cut marked."""
    scores, labels = np.asarray(scores), np.asarray(labels)
    fig = Figure(figsize=(5.0, 3.2), layout="constrained")
    ax = fig.subplots()
    bins = np.linspace(scores.min(), scores.max(), 41)
    for label, name in ((0, "not a paraphrase"), (1, "paraphrase")):
        ax.hist(scores[labels == label], bins=bins, alpha=0.55, label=f"gold: {name}")
    ax.axvline(cut, color="black", ls="--", lw=1, label=f"cut {cut:g}")
    ax.set(xlabel="the model's output", ylabel="dev pairs")
    ax.legend(fontsize=8, frameon=False)
    return fig


def embedding_maps_figure(maps: dict, labels) -> Figure:
    """A scatter per model of 2-D sentence embeddings ({name: (N, 2)}), coloured by label."""
    labels = np.asarray(labels)
    fig = Figure(figsize=(4.2 * len(maps), 4.0), layout="constrained")
    for ax, (name, points) in zip(
        fig.subplots(1, len(maps), squeeze=False)[0], maps.items(), strict=True
    ):
        spots = ax.scatter(points[:, 0], points[:, 1], c=labels, cmap="coolwarm", s=5, alpha=0.7)
        ax.set(title=name, xticks=[], yticks=[])
    fig.colorbar(spots, ax=fig.axes, label="SST label (0 very negative, 4 very positive)")
    return fig


def aligned(stages: list[str], axis: list[str]) -> list[int]:
    """Where a run's stages sit on the axis (the longest run's stage names): each under the
    axis's next stage of the same name, so runs with and without a first SimCSE stage line
    up loop by loop; a name the axis lacks takes the next place."""
    xs, at = [], 0
    for stage in stages:
        at = axis.index(stage, at) if stage in axis[at:] else at
        xs.append(at)
        at += 1
    return xs


def compare_figure(runs: dict[str, list[dict]]) -> Figure:
    """One panel per score every run has, one line per run over its stages; the untouched
    model dashed."""
    first = next(iter(runs.values()))
    labels = {k: label for k, (label, _) in score_series(first).items()}
    labels["heldout"] = "held-out AUC"
    every = [row for rows in runs.values() for row in rows]
    labels = {k: v for k, v in labels.items() if all(k in row for row in every)}  # panels
    fig = Figure(figsize=(11.0, 2.3 * len(labels)), layout="constrained")
    axes = fig.subplots(len(labels), 1, sharex=True, squeeze=False)[:, 0]
    names = [row["stage"] for row in max(runs.values(), key=len)[1:]]  # the x axis
    for ax, (key, label) in zip(axes, labels.items(), strict=True):
        for i, (name, rows) in enumerate(runs.items()):
            xs = [x + 1 for x in aligned([row["stage"] for row in rows[1:]], names)]
            values = [main_score(row, key) for row in rows[1:]]
            color = SERIES_COLORS[i % len(SERIES_COLORS)]
            ax.plot(xs, values, marker=".", ms=3, color=color, label=name)
        ax.axhline(main_score(first[0], key), color="gray", ls="--", lw=1)
        ax.set_ylabel(label, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    shown = spaced(list(range(len(names))), len(names) / 14)
    axes[-1].set_xticks(
        [i + 1 for i in shown],
        [names[i] for i in shown],
        rotation=35,
        ha="right",
        rotation_mode="anchor",
        fontsize=7,
    )
    axes[0].plot([], [], color="gray", ls="--", lw=1, label="untouched model")
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    axes[0].set_title("dev scores after each stage")
    return fig


def draw_compare(runs: dict[str, list[dict]], path: Path) -> Path:
    """compare_figure(runs) written to path as a PNG."""
    compare_figure(runs).savefig(path, dpi=110)
    return path


def draw_loss(steps: list[dict], path: Path, title: str) -> Path:
    """Every step's loss and its trend, coloured by task, stage after stage."""
    fig = Figure(figsize=(8.0, 4.0), layout="constrained")
    ax = fig.subplots()
    offset, middles, names, labelled = 0, [], [], set()
    for _, stage in groupby(steps, key=lambda s: s["stage"]):
        stage = list(stage)
        x = offset + np.arange(1, len(stage) + 1)  # steps counted over the whole run
        # one line per task trained: a round-robin stage interleaves its tasks' steps
        for tasks in dict.fromkeys(s["tasks"] for s in stage):
            at = [i for i, s in enumerate(stage) if s["tasks"] == tasks]
            loss, color = np.array([stage[i]["loss"] for i in at]), COLORS.get(tasks, "tab:gray")
            label = None if tasks in labelled else task_label(tasks)
            labelled.add(tasks)
            ax.scatter(x[at], loss, s=5, color=color, alpha=0.35, linewidths=0)
            trend = moving_average(loss)
            ax.plot(x[at][len(loss) - len(trend) :], trend, color=color, lw=1.6, label=label)
        if offset:
            ax.axvline(offset + 0.5, color="gray", lw=0.6)
        middles.append(offset + len(stage) / 2)
        names.append(stage[0]["name"])
        offset += len(stage)
    shown = spaced(middles, offset / 12)  # short stages of a long run share their space
    top = ax.secondary_xaxis("top")
    top.set_xticks(
        [middles[i] for i in shown],
        [names[i] for i in shown],
        rotation=35,
        ha="left",
        rotation_mode="anchor",
        fontsize=7,
    )
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set(xlabel="training step", ylabel="training loss", title=f"{title}: loss of every step")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    fig.savefig(path, dpi=110)
    return path


def attention_figure(tokens: list[str], maps: dict, layer: int, per_row: int = 6) -> Figure:
    """Heatmaps of one layer's heads, per_row heads to a row, a block of rows per model
    ({name: (L, nh, n, n) probabilities of one sequence, padding left out}): row i of a map
    is where token i looks."""
    n_heads, n = next(iter(maps.values())).shape[1], len(tokens)
    cols, rows_per = min(n_heads, per_row), -(-n_heads // per_row)  # ceil(nh / per_row)
    size = max(2.2, 0.16 * n + 0.8)
    fig = Figure(figsize=(size * cols, size * rows_per * len(maps) + 0.4), layout="constrained")
    axes = fig.subplots(rows_per * len(maps), cols, squeeze=False)  # (rows, cols)
    for m, (name, probs) in enumerate(maps.items()):
        for h in range(rows_per * cols):
            ax = axes[m * rows_per + h // cols, h % cols]
            if h >= n_heads:
                ax.set_axis_off()
                continue
            ax.imshow(probs[layer, h], cmap="Blues", vmin=0.0, vmax=1.0)
            ax.set_xticks(range(n), tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(n), tokens if h % cols == 0 else [], fontsize=6)
            ax.set_title(f"{name}: head {h + 1}", fontsize=8)
    fig.suptitle(f"attention of layer {layer + 1} (row: the token that looks)", fontsize=9)
    return fig


def plot_run(run_dir: Path, out: Path, title: str) -> list[Path]:
    """Write forgetting.png and, when the run logged its steps, loss.png; returns their paths."""
    rows, steps = run_rows(run_dir), read_steps(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [draw_forgetting(rows, out / "forgetting.png", title)]
    if steps:
        written.append(draw_loss(steps, out / "loss.png", title))
    else:
        print(f"{run_dir}: no loss.png, {STEPS} is absent or empty (older runs have none)")
    return written


def named(parser, flag: str, specs: list[str], expected: str) -> dict[str, list[str]]:
    """NAME=DIR[,DIR...] arguments -> {name: folders}; a malformed one is a usage error."""
    out = {}
    for spec in specs:
        name, sep, dirs = spec.partition("=")
        if not sep or not dirs:
            parser.error(f"{flag} {spec!r}: expected {expected}")
        out[name] = dirs.split(",")
    return out


def compare_runs(recipes: dict[str, list[list[dict]]]) -> str:
    """A Markdown table of recipes, each run with several seeds (a list of table rows per
    run, the start row first, all three tasks scored): the best stage's scores, the mean
    of the three tasks' mean drop below the best and the stages' time, as mean +- standard
    deviation."""

    def cell(values, digits=3):
        mean = float(np.mean(values))
        spread = f" ± {np.std(values, ddof=1):.{digits}f}" if len(values) > 1 else ""
        return f"{mean:.{digits}f}{spread}"

    def mean_drop(rows):  # the three tasks' mean drop below the best, averaged
        measures = forgetting(rows, MULTITASK)
        return np.mean([measures[t]["mean_drop_below_best"] for t in MULTITASK])

    lines = [
        "| recipe | seeds | best overall | SST acc | QQP acc | STS r | mean drop | minutes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, runs in recipes.items():
        best = [kept_row(rows) for rows in runs]
        tasks = [cell([main_score(b, t) for b in best]) for t in MULTITASK]
        forget = [mean_drop(rows) for rows in runs]
        minutes = [sum(r.get("seconds", 0.0) for r in rows) / 60 for rows in runs]
        overall = cell([b["overall"] for b in best], 4)
        cells = [name, str(len(runs)), overall, *tasks, cell(forget, 4), cell(minutes, 1)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> list[Path]:
    parser = argparse.ArgumentParser(
        prog=cli.prog(),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "run_dir",
        type=Path,
        nargs="?",
        help="a run folder (holds metrics.jsonl), or an individual run's",
    )
    parser.add_argument("--out", type=Path, help="folder for the PNGs (default: the run folder)")
    parser.add_argument(
        "--table",
        nargs="+",
        metavar="NAME=DIR[,DIR...]",
        help="print a Markdown table of these recipes, the runs of each separated by commas",
    )
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="NAME=DIR",
        help="draw one picture (--out FILE, a .png) of these runs' dev scores over the stages",
    )
    args = parser.parse_args(argv)

    if args.compare:
        runs = named(parser, "--compare", args.compare, "NAME=DIR")
        if args.out is None or args.out.suffix != ".png":
            parser.error("--compare needs --out FILE.png")
        print(draw_compare({k: run_rows(v[0]) for k, v in runs.items()}, args.out))
        return [args.out]
    if args.table:
        recipes = named(parser, "--table", args.table, "NAME=DIR[,DIR...]")
        print(compare_runs({k: [scored_rows(d) for d in v] for k, v in recipes.items()}))
        return []
    if args.run_dir is None:
        parser.error("give a run folder, or --table")
    written = []
    for folder in run_folders(args.run_dir):
        sub = folder.relative_to(args.run_dir)
        title = str(args.run_dir.resolve().name / sub)
        written += plot_run(folder, (args.out or args.run_dir) / sub, title)
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    cli.run_cli(main)
