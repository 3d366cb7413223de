"""A student's copy's own tests (`make test` there): each exercise it assigns is graded as
`python exercises.py check NAME` grades it, and one still open is skipped, so the given
code passes and a body written wrong fails; the given code runs around the open ones.

In this repository, where nothing is assigned, tests/test_exercises.py grades the solution.
"""

import subprocess
import sys

import pytest

import exercises

HERE = exercises.HERE
ASSIGNED = HERE / exercises.ASSIGNED
NAMES = ASSIGNED.read_text().split() if ASSIGNED.is_file() else []
IN_A_COPY = pytest.mark.skipif(not NAMES, reason="no exercise is assigned: not a student's copy")


@pytest.fixture(scope="module")
def graded() -> dict[str, dict]:
    """Every assigned exercise graded once, in one grader process."""
    return exercises.run_checks(HERE, HERE, NAMES)


@IN_A_COPY
@pytest.mark.parametrize("name", NAMES or ["none"])
def test_an_assigned_exercise_passes_once_written(name, graded):
    """pass, or provisional: the parts only the TA's grader judges wait for it."""
    row = graded[name]
    if row["result"] == "open":
        pytest.skip(f"exercise {name} is open: {row['detail']}")
    assert row["result"] in ("pass", "provisional", "hidden"), f"{name}: {row.get('detail')}"


@IN_A_COPY
def test_the_given_code_runs_around_the_open_exercises():
    """The multitask script imports every module and prints its plan without training."""
    done = subprocess.run(
        [sys.executable, "multitask_classifier.py", "--preset", "demo", "--show"],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
