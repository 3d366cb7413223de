"""A grade's time and peak memory, as Gradescope's limits see them: `python exercises.py
check` over every exercise, the solution's and a flood's (each exercise's code handing back
two 80 MB arrays), with the memory of every process of the grade summed (proportional set
size, so a fork's pages shared with its parent count once), sampled every 20 ms.

    python -m lab.grade_bench                 # about a minute on 2 cores
    python -m lab.grade_bench --only solution

Targets: a grade's peak at most Gradescope's default memory (768 MB), its time at most the
whole grade's deadline (grader/processes.py DEADLINE).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if not __package__:  # run as python lab/NAME.py: the course's modules are one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import exercises
from commands.cli import prog
from grader.processes import DEADLINE

MEMORY_MB = 768  # Gradescope's default memory for an autograder
FLOOD = "    import torch\n    return [torch.zeros(10_000_000, dtype=torch.float64)] * 2\n"


def tree(root: int) -> list[int]:
    """root and every process below it (parents read from /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += [p for p, parent in parents.items() if parent == pid]
    return found


def pss_mb(pid: int) -> float:
    """A process's proportional set size, MB; 0 once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0
    return next(int(x.split()[1]) for x in text.splitlines() if x.startswith("Pss:")) / 1024


def measured(command: list[str], cwd: Path) -> tuple[float, float, int]:
    """(seconds, peak MB summed over the command's processes, its exit code)."""
    started = time.monotonic()
    env = os.environ | {"MINBERT_GRADE_MB": str(MEMORY_MB)}  # as Gradescope: one at a time
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL)
    peak, done = [0.0], threading.Event()

    def sample():
        while not done.wait(0.02):
            peak[0] = max(peak[0], sum(pss_mb(p) for p in tree(proc.pid)))

    sampler = threading.Thread(target=sample)
    sampler.start()
    code = proc.wait()
    done.set()
    sampler.join()
    return time.monotonic() - started, peak[0], code


def flooded(copy: Path) -> None:
    """Every exercise of the copy, its last region handing back two 80 MB arrays."""
    for name in exercises.exercises(copy):
        region = exercises.exercises(copy)[name][-1]  # read again: lines moved
        lines = (copy / region.file).read_text().splitlines(keepends=True)
        indent = lines[region.begin][: len(lines[region.begin]) - len(lines[region.begin].lstrip())]
        lines[region.begin + 1 : region.end] = [indent + x[4:] + "\n" for x in FLOOD.splitlines()]
        (copy / region.file).write_text("".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=prog(), description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("solution", "flood"), help="one grade of the two")
    args = parser.parse_args(argv)
    check = [sys.executable, "exercises.py", "check"]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        grades = {"solution": exercises.HERE}
        if args.only != "solution":
            grades["flood"] = Path(tmp) / "copy"
            exercises.make(grades["flood"], [], Path(tmp) / "ta", quiet=True, every=True)
            flooded(grades["flood"])
        for name, root in grades.items():
            if args.only and name != args.only:
                continue
            ta = [] if root == exercises.HERE else ["--grader", str(Path(tmp) / "ta")]
            seconds, peak, code = measured(check + ta, root)
            fits = peak <= MEMORY_MB and seconds <= DEADLINE
            ok &= fits
            print(
                f"{name}: a full grade in {seconds:.0f} s (deadline {DEADLINE} s), peak "
                f"{peak:.0f} MB over its processes (target <= {MEMORY_MB} MB), exit code "
                f"{code}: {'met' if fits else 'MISSED'}"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
