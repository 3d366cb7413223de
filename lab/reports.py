"""The three CS224n reports' tables: each row one preset, run at a CPU scale, beside theirs.

Each table below lists its rows by preset name: presets.py says what each trains, its
source, the scale `make reports` runs it at and the dev scores the report printed.
`python -m lab.reports TABLE` trains every row that has not finished yet on the embedded model
(a row's run folder is resumed where it stopped), then writes TABLE.md: their SST / QQP /
STS / overall, ours (the model the run kept), and the minutes each row took.

    python -m lab.reports broadhurst                      # its default CPU scale, runs/reports/
    python -m lab.reports all --out runs/reports          # every table, one after another
    python -m lab.reports auslin --scale 1 --bert bert-base-uncased   # their own sizes, on a GPU
    python -m lab.reports sicurello --table_only          # rewrite the table from finished rows

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

if not __package__:  # run as python lab/NAME.py: the course's modules are one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import evaluation
from commands import cli
from engine import checkpoint
from evaluation import MULTITASK
from presets import PRESETS

DONE = "report-row.json"  # written into a row's run folder when its run has finished
SCRIPT = Path(__file__).resolve().parent.parent / "multitask_classifier.py"


@dataclass(frozen=True)
class Table:
    title: str
    source: str  # paper and table
    rows: tuple  # preset names: each row's label, their scores and CPU scale are its preset's


TABLES = {
    "broadhurst": Table(
        "Broadhurst & Maffezzoli: multitask fine-tuning, MNRL and cosine similarity",
        "Broadhurst & Maffezzoli, Table 1 (dev)",
        tuple(f"broadhurst-{i}" for i in range(1, 7)),
    ),
    "auslin": Table(
        "Auslin et al.: siamese vs segments, gradient surgery (ablation)",
        "Auslin et al., section 5.4, ablation table (dev)",
        (
            "auslin-siamese",
            "auslin-siamese-gs",
            "auslin-segments",
            "auslin-segments-gs-mean",
            "auslin-segments-gs-cls",
            "auslin-segments-gs-l1",
            "auslin-segments-rand",
            "auslin-segments-gs-rand",
        ),
    ),
    "auslin-siamese": Table(
        "Auslin et al.: the siamese network with cosine similarity",
        "Auslin et al., section 5.4, siamese table (dev)",
        ("auslin-siamese-cosine-mse", "auslin-siamese-cosine-contrastive"),
    ),
    "sicurello": Table(
        "Sicurello (EquiBERT): SimCSE as a loss term, alignment and uniformity",
        "Sicurello, Tables 1-2 (lost in the text; the submitted BERT_simCSE scored 0.446 / "
        "0.527 / 0.307 on test)",
        tuple(
            f"sicurello-{name}{only}"
            for only in ("", "-sst")
            for name in ("vanilla", "simcse", "unif", "simcsecanon")
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
    best = evaluation.kept_row(rows)
    if best is None:
        return ["nan"] * 4
    return [f"{evaluation.main_score(best, t):.3f}" for t in (*MULTITASK, "overall")]


def report_table(table: Table, results: dict) -> str:
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
    for name in table.rows:
        done, preset = results.get(name), PRESETS[name]
        ours = our_cells(done["rows"]) if done else ["not run"] + [""] * 3
        minutes = f"{done['seconds'] / 60:.1f}" if done else ""
        cells = [preset.label, f"`{name}`", *their_cells(preset.published), *ours, minutes]
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


def run_row(preset: str, run_dir: Path, args, scale: float) -> dict:
    """Train one row to the end (its output in run_dir/log.txt); its DONE record."""
    run_dir.mkdir(parents=True, exist_ok=True)
    command = row_command(preset, run_dir, args, scale)
    print(f"{preset}: {' '.join(command[1:])}", flush=True)
    t0 = time.time()
    with open(run_dir / "log.txt", "a") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = child.wait()
        except KeyboardInterrupt:  # Ctrl-C reached the row too: let it save, then stop
            child.wait()
            raise SystemExit("interrupted; the same command goes on from there") from None
    if code != 0:
        raise SystemExit(f"{preset} stopped with exit code {code}: see {run_dir / 'log.txt'}")
    rows = checkpoint.read_rows(run_dir)
    record = {"preset": preset, "scale": scale, "seconds": time.time() - t0, "rows": rows}
    checkpoint.atomic_write(json.dumps(record) + "\n", run_dir / DONE)
    return record


def finished(run_dir: Path) -> dict | None:
    path = run_dir / DONE
    return json.loads(path.read_text()) if path.exists() else None


def make_table(name: str, args) -> str:
    table = TABLES[name]
    folder = Path(args.out) / name
    results = {}
    for preset in table.rows:
        scale = args.scale or PRESETS[preset].report_scale
        run_dir = folder / preset
        results[preset] = finished(run_dir)
        saved = run_dir / "config.json"  # a finished or a stopped run
        ran_at = json.loads(saved.read_text())["schedule"]["scale"] if saved.exists() else scale
        if ran_at != scale:
            raise SystemExit(
                f"{run_dir} was run at --scale {ran_at}, not {scale}: give another --out, "
                "or that scale"
            )
        if results[preset] is None and not args.table_only:
            results[preset] = run_row(preset, run_dir, args, scale)
    text = report_table(table, results)
    checkpoint.atomic_write(text, folder / f"{name}.md")
    return text


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog=cli.prog(),
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
    cli.run_cli(main)
