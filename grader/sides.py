"""The entry of a grade's two processes (grader/processes.py starts them):

    python grader/sides.py --student NAME ...   the student's: runs the student's code
    python grader/sides.py --judge NAME ...     the judge's: judges what it handed back

The checks register here, by being imported (checks.py, multitask_checks.py and
extensions.py import harness.py, which imports none of them); harness.py runs a side.
"""

import sys

import checks  # noqa: F401  (they register; none imports an exercise's module)
import extensions  # noqa: F401
import harness
import multitask_checks  # noqa: F401

if __name__ == "__main__":
    side, *names = sys.argv[1:]
    {"--student": harness.student_main, "--judge": harness.judge_main}[side](names)
