"""The picture of the house in the README: the engine, the lesson, the commands, the lab,
and the files of each, drawn as one SVG (plain text, no package needed).

    python -m lab.house                 # writes docs/house.svg
    python -m lab.house --out FILE

HOUSE is the one list of which file belongs where: `make lint` (.ci/lint.py) checks that it
names every module once, tests/test_house.py that docs/house.svg is what this draws.
"""

import argparse
import sys
from html import escape
from pathlib import Path

if not __package__:  # run as python lab/NAME.py: the course's modules are one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from commands import cli
from engine.checkpoint import atomic_write

# part: (what it is, [(file, what it holds)]), left to right: each part uses the one on
# its left (make lint checks that engine/ imports no lesson module and no command, and that
# no lesson module imports a command)
HOUSE = {
    "the engine": (
        "below the lesson: engine/",
        [
            ("engine/runtime.py", "device, precision, processes"),
            ("engine/checkpoint.py", "safe files, resume"),
            ("engine/resume.py", "a stage stopped and resumed"),
            ("engine/tsv.py", "data files read tolerantly"),
        ],
    ),
    "the lesson": (
        "what a student reads and writes",
        [
            ("tokenizer.py", "WordPiece from scratch"),
            ("base_bert.py", "config; weights by HF names"),
            ("bert.py", "attention, layers, BERT"),
            ("classifier.py", "Part 1: sentiment model"),
            ("multitask_classifier.py", "Part 2: your multitask model"),
            ("sbert.py", "Sentence-BERT's heads"),
            ("losses.py", "each task's losses"),
            ("smart.py", "SMART's smoothness term"),
            ("simcse.py", "contrastive objectives"),
            ("optimizer.py", "AdamW, PCGrad, schedules"),
            ("trainer.py", "one step; one stage"),
            ("presets.py", "stages; named plans"),
            ("settings.py", "every setting, once"),
            ("datasets.py", "readers, tokenized sets"),
            ("batches.py", "length buckets, task mixing"),
            ("evaluation.py", "metrics, forgetting table"),
            ("sanity_check.py", "the handout's check"),
            ("optimizer_test.py", "the handout's AdamW test"),
            ("exercises.py", "make and grade a handout"),
            ("prepare_submit.py", "the leaderboard's zip"),
        ],
    ),
    "the commands": (
        "what the scripts run: commands/",
        [
            ("commands/command.py", "the multitask command"),
            ("commands/classify.py", "the Part 1 command"),
            ("commands/cli.py", "one line for a user's slip"),
            ("commands/flags.py", "each setting's flag, JSON"),
            ("commands/checks.py", "what cannot work, refused"),
            ("commands/show.py", "--show: a preset resolved"),
            ("commands/handout.py", "the handout's flags"),
            ("commands/runner.py", "a plan run in a folder"),
            ("commands/runfolder.py", "what a run writes"),
            ("commands/outputs.py", "printed tables, predictions"),
            ("commands/submission.py", "a submission's checks, zip"),
            ("commands/estimate.py", "--estimate: minutes ahead"),
        ],
    ),
    "the lab": (
        "experiments: python -m lab.NAME",
        [
            ("lab/fetch.py", "the data files"),
            ("lab/sample.py", "a small copy of them"),
            ("lab/explore.py", "report page, labels"),
            ("lab/plots.py", "a run's figures"),
            ("lab/export.py", "HF folder, card, Hub"),
            ("lab/ensemble.py", "averaged runs"),
            ("lab/sweep.py", "Optuna searches"),
            ("lab/reports.py", "the reports' tables"),
            ("lab/bench.py", "speed and memory"),
            ("lab/timing.py", "bench's timings and table"),
            ("lab/measures.py", "bench's FLOPs, padding"),
            ("lab/grade_bench.py", "a grade's time, memory"),
            ("lab/gpu_check.py", "what a GPU runs"),
            ("lab/house.py", "this picture"),
        ],
    ),
}
COLORS = {
    "the engine": "#dcfce7",
    "the lesson": "#dbeafe",
    "the commands": "#fce7f3",
    "the lab": "#fef3c7",
}
ROOT = Path(__file__).resolve().parent.parent  # the repository
WIDTH, ROW, TOP, GAP = 360, 21, 74, 50  # a part's width, a file's line, where files start


def svg() -> str:
    """The four parts side by side, each pointing at the part on its left, which it uses."""
    rows = max(len(files) for _, files in HOUSE.values())
    height = TOP + rows * ROW + 24
    total = len(HOUSE) * WIDTH + (len(HOUSE) - 1) * GAP + 20
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="{height}" '
        f'font-family="Helvetica, Arial, sans-serif" font-size="13">',
        '<defs><marker id="a" markerWidth="10" markerHeight="8" refX="9" refY="4" '
        'orient="auto"><path d="M0,0 L10,4 L0,8 z" fill="#555"/></marker></defs>',
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    for k, (part, (what, files)) in enumerate(HOUSE.items()):
        x = 10 + k * (WIDTH + GAP)
        out.append(
            f'<rect x="{x}" y="10" width="{WIDTH}" height="{height - 20}" rx="10" '
            f'fill="{COLORS[part]}" stroke="#555"/>'
        )
        out.append(f'<text x="{x + 14}" y="36" font-size="17" font-weight="bold">{part}</text>')
        out.append(f'<text x="{x + 14}" y="56" fill="#444">{escape(what)}</text>')
        for i, (name, holds) in enumerate(files):
            y = TOP + 14 + i * ROW
            out.append(
                f'<text x="{x + 14}" y="{y}"><tspan font-family="monospace" '
                f'font-weight="bold">{name}</tspan><tspan fill="#333"> {escape(holds)}</tspan></text>'
            )
        if k:  # an arrow to the part on the left: "uses"
            y = 26 + height // 2
            out.append(
                f'<line x1="{x - 4}" y1="{y}" x2="{x - GAP + 6}" y2="{y}" stroke="#555" '
                'stroke-width="2" marker-end="url(#a)"/>'
            )
            out.append(f'<text x="{x - GAP + 10}" y="{y - 8}" font-size="12">uses</text>')
    return "\n".join([*out, "</svg>", ""])


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(prog=cli.prog(), description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "house.svg", help="the SVG")
    args = parser.parse_args(argv)
    atomic_write(svg(), args.out)
    print(args.out)
    return args.out


if __name__ == "__main__":
    cli.run_cli(main)
