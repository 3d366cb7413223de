"""The three CS224n reports' tables: each row one preset, run at a CPU scale, beside theirs.

Each table below lists its rows by preset name (presets.py says what each trains, its
source and the scale `make reports` runs it at) with the dev scores the report printed.
`python reports.py TABLE` trains every row that has not finished yet on the embedded model
(a row's run folder is resumed where it stopped), then writes TABLE.md: their SST / QQP /
STS / overall, ours (the model the run kept), and the minutes each row took.

    python reports.py broadhurst                      # its default CPU scale, runs/reports/
    python reports.py all --out runs/reports          # every table, one after another
    python reports.py auslin --scale 1 --bert bert-base-uncased   # their own sizes, on a GPU
    python reports.py sicurello --table_only          # rewrite the table from finished rows

The numbers come from the texts in ../shared/papers (their tables, dev sets). Their runs used
bert-base-uncased, the whole Quora training file and a GPU; docs/reports.md says which of
their conclusions hold here.
"""

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import checkpoint
import config
import evaluation
from evaluation import MULTITASK
from presets import PRESETS

DONE = "report-row.json"  # written into a row's run folder when its run has finished
SCRIPT = Path(__file__).parent / "multitask_classifier.py"


@dataclass(frozen=True)
class Row:
    preset: str  # a preset of presets.py: what it trains, and its CPU scale
    label: str  # the row's name in their table
    theirs: tuple | None  # their dev SST acc, QQP acc, STS r (None: not printed)

    @property
    def scale(self) -> float:
        """The --scale `make reports` runs this row at (the preset's report_scale)."""
        return PRESETS[self.preset].report_scale


@dataclass(frozen=True)
class Table:
    title: str
    source: str  # paper and table
    rows: tuple


TABLES = {
    "broadhurst": Table(
        "Broadhurst & Maffezzoli: multitask fine-tuning, MNRL and cosine similarity",
        "Broadhurst & Maffezzoli, Table 1 (dev)",
        (
            Row("broadhurst-1", "1 baseline: SST only", (0.509, 0.509, 0.031)),
            Row("broadhurst-2", "2 multitask, random weights", (0.471, 0.721, 0.344)),
            Row("broadhurst-3", "3 MNRL for QQP and STS", (0.505, 0.675, 0.272)),
            Row("broadhurst-4", "4 MNRL QQP, cosine STS", (0.490, 0.648, 0.433)),
            Row("broadhurst-5", "5 BCE QQP, cosine STS", (0.505, 0.730, 0.471)),
            Row("broadhurst-6", "6 exp. 5, 50k examples, 10 epochs", (0.488, 0.757, 0.519)),
        ),
    ),
    "auslin": Table(
        "Auslin et al.: siamese vs segments, gradient surgery (ablation)",
        "Auslin et al., section 5.4, ablation table (dev)",
        (
            Row("auslin-siamese", "siamese, no GS", (0.254, 0.375, 0.021)),
            Row("auslin-siamese-gs", "siamese, GS", (0.253, 0.375, -0.105)),
            Row("auslin-segments", "segments, no GS", (0.278, 0.375, 0.743)),
            Row("auslin-segments-gs-mean", "segments, GS, mean pooling", (0.282, 0.375, 0.765)),
            Row("auslin-segments-gs-cls", "segments, GS, CLS pooling", (0.274, 0.375, 0.726)),
            Row("auslin-segments-gs-l1", "segments, GS, L1 loss", (0.280, 0.375, 0.760)),
            Row("auslin-segments-rand", "segments, no GS, random order", (0.278, 0.375, 0.728)),
            Row("auslin-segments-gs-rand", "segments, GS, random order", (0.268, 0.375, 0.751)),
        ),
    ),
    "auslin-siamese": Table(
        "Auslin et al.: the siamese network with cosine similarity",
        "Auslin et al., section 5.4, siamese table (dev)",
        (
            Row("auslin-siamese-cosine-mse", "siamese, GS, cosine, MSE", (0.470, 0.471, 0.042)),
            Row(
                "auslin-siamese-cosine-contrastive",
                "siamese, GS, cosine, contrastive",
                (0.470, 0.375, 0.014),
            ),
        ),
    ),
    "sicurello": Table(
        "Sicurello (EquiBERT): SimCSE as a loss term, alignment and uniformity",
        "Sicurello, Tables 1-2 (lost in the text; the submitted BERT_simCSE scored 0.446 / "
        "0.527 / 0.307 on test)",
        (
            Row("sicurello-vanilla", "all tasks: BERT_vanilla", None),
            Row("sicurello-simcse", "all tasks: BERT_simCSE", None),
            Row("sicurello-unif", "all tasks: BERT_unif", None),
            Row("sicurello-simcsecanon", "all tasks: BERT_simCSEcanon", None),
            Row("sicurello-vanilla-sst", "SST only: BERT_vanilla", None),
            Row("sicurello-simcse-sst", "SST only: BERT_simCSE", None),
            Row("sicurello-unif-sst", "SST only: BERT_unif", None),
            Row("sicurello-simcsecanon-sst", "SST only: BERT_simCSEcanon", None),
        ),
    ),
}


def their_cells(theirs: tuple | None) -> list[str]:
    """Their SST, QQP, STS and the overall score computed from them ('-' where lost)."""
    if theirs is None:
        return ["-"] * 4
    return [f"{x:.3f}" for x in theirs] + [f"{evaluation.overall_score(*theirs):.3f}"]


def our_cells(rows: list[dict]) -> list[str]:
    """The kept stage's SST, QQP, STS and overall, as the run chose it."""
    kept = evaluation.kept_stage(rows)
    if kept is None:
        return ["nan"] * 4
    best = rows[1 + kept]
    return [f"{evaluation.main_score(best, t):.3f}" for t in (*MULTITASK, "overall")]


def format_table(table: Table, results: dict) -> str:
    """Markdown: a line per row, theirs then ours; results: preset -> DONE record or None."""
    lines = [
        f"### {table.title}",
        "",
        f"Theirs: {table.source}. Ours: the model each run kept, full dev sets.",
        "",
        "| row | preset | their SST | QQP | STS | overall | our SST | QQP | STS | overall "
        "| minutes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in table.rows:
        done = results.get(row.preset)
        ours = our_cells(done["rows"]) if done else ["not run"] + [""] * 3
        minutes = f"{done['seconds'] / 60:.1f}" if done else ""
        cells = [row.label, f"`{row.preset}`", *their_cells(row.theirs), *ours, minutes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def row_command(preset: str, run_dir: Path, args, scale: float) -> list[str]:
    """The command that trains one row (resuming its folder when it holds a stopped run)."""
    if (run_dir / checkpoint.STATE).exists():
        return [sys.executable, str(SCRIPT), "--resume", str(run_dir)]
    return [
        sys.executable,
        str(SCRIPT),
        "--preset",
        preset,
        "--scale",
        str(scale),
        "--bert",
        args.bert,
        "--max_length",
        str(args.max_length),
        "--seed",
        str(args.seed),
        "--no_test_predictions",
        "--run_dir",
        str(run_dir),
    ]


def run_row(row: Row, run_dir: Path, args, scale: float) -> dict:
    """Train one row to the end (its output in run_dir/log.txt); its DONE record."""
    run_dir.mkdir(parents=True, exist_ok=True)
    command = row_command(row.preset, run_dir, args, scale)
    print(f"{row.preset}: {' '.join(command[1:])}", flush=True)
    t0 = time.time()
    with open(run_dir / "log.txt", "a") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = child.wait()
        except KeyboardInterrupt:  # Ctrl-C reached the row too: let it save, then stop
            child.wait()
            raise SystemExit("interrupted; the same command goes on from there") from None
    if code != 0:
        raise SystemExit(f"{row.preset} stopped with exit code {code}: see {run_dir / 'log.txt'}")
    rows = checkpoint.read_rows(run_dir)
    record = {"preset": row.preset, "scale": scale, "seconds": time.time() - t0, "rows": rows}
    checkpoint.atomic_write(json.dumps(record) + "\n", run_dir / DONE)
    return record


def finished(run_dir: Path) -> dict | None:
    path = run_dir / DONE
    return json.loads(path.read_text()) if path.exists() else None


def make_table(name: str, args) -> str:
    table = TABLES[name]
    folder = Path(args.out) / name
    results = {}
    for row in table.rows:
        scale = args.scale or row.scale
        run_dir = folder / row.preset
        results[row.preset] = finished(run_dir)
        saved = run_dir / "config.json"  # a finished or a stopped run
        ran_at = json.loads(saved.read_text())["schedule"]["scale"] if saved.exists() else scale
        if ran_at != scale:
            raise SystemExit(
                f"{run_dir} was run at --scale {ran_at}, not {scale}: give another --out, "
                "or that scale"
            )
        if results[row.preset] is None and not args.table_only:
            results[row.preset] = run_row(row, run_dir, args, scale)
    text = format_table(table, results)
    checkpoint.atomic_write(text, folder / f"{name}.md")
    return text


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="tables:\n" + "\n".join(f"  {k:<16} {t.source}" for k, t in TABLES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("table", choices=[*TABLES, "all"], help="which table to make")
    parser.add_argument(
        "--scale",
        type=float,
        default=None,
        help="share of the rows' data and epochs (default: each preset's CPU scale)",
    )
    parser.add_argument("--out", default="runs/reports", help="folder of the tables and runs")
    parser.add_argument("--bert", default="minilm", help="encoder of every row")
    parser.add_argument("--max_length", type=int, default=64, help="tokens per sentence")
    parser.add_argument("--seed", type=int, default=11711, help="seed of every row")
    parser.add_argument(
        "--table_only", action="store_true", help="write the table from finished rows only"
    )
    args = parser.parse_args(argv)
    if args.scale is not None and not 0 < args.scale <= 1:
        parser.error(f"--scale must be in (0, 1], got {args.scale}")
    return args


def main(argv=None):
    args = parse_args(argv)
    for name in TABLES if args.table == "all" else [args.table]:
        print(make_table(name, args))


if __name__ == "__main__":
    config.run_cli(main)
