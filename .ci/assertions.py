"""Count the test suite's checks, so that a move or a split of the tests shows that none was
lost: each `assert` statement, each `pytest.raises` / `pytest.warns` / `pytest.fail`, and each
call of a function named assert* (torch.testing.assert_close, np.testing.assert_allclose,
the helpers' assert_same_run), per test file and in all; and each test function.

    python .ci/assertions.py                 # this checkout's tests/
    python .ci/assertions.py --at COMMIT     # the tests/ of a commit (git show), to compare
"""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTEST_CHECKS = {"raises", "warns", "fail"}


def count(source: str) -> tuple[int, int]:
    """(checks, test functions) in one file's source."""
    checks = tests = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assert):
            checks += 1
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            owner = getattr(f.value, "id", "") if isinstance(f, ast.Attribute) else ""
            checks += name.startswith("assert") or (owner == "pytest" and name in PYTEST_CHECKS)
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            tests += 1
    return checks, tests


def sources(at: str | None) -> dict[str, str]:
    """{path: text} of every tests/*.py, in the work tree or at a commit."""
    if at is None:
        return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(ROOT.glob("tests/*.py"))}
    listed = ["git", "ls-tree", "--name-only", at, "tests/"]
    names = subprocess.run(listed, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    show = ["git", "show"]
    return {
        n: subprocess.run([*show, f"{at}:{n}"], cwd=ROOT, capture_output=True, text=True).stdout
        for n in names.split()
        if n.endswith(".py")
    }


def main(argv: list[str]) -> int:
    """Print each test file's counts, then the totals."""
    at = argv[argv.index("--at") + 1] if "--at" in argv else None
    total = [0, 0]
    for name, text in sources(at).items():
        checks, tests = count(text)
        total = [total[0] + checks, total[1] + tests]
        print(f"{name:<40} {checks:>5} checks {tests:>4} tests")
    print(f"{'in all':<40} {total[0]:>5} checks {total[1]:>4} tests")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
