"""exercises.py: a handout made from this checkout, graded piece by piece; the solution passes;
the student's copy holds no answer; Gradescope's autograder grades a submission."""

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import exercises

REPO = exercises.HERE
ROW = re.compile(r"^(\w+)\s+(?:\d+|-) / \d+\s+(pass|fail|open|error|hidden)\b", re.M)


def run(folder, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=folder, capture_output=True, text=True, timeout=timeout
    )


def scorecard(folder, *names) -> dict[str, str]:
    """{exercise: pass | fail | open | error} from `exercises.py check` run in folder (names
    may hold --grader DIR)."""
    done = run(folder, "exercises.py", "check", *names)
    results = dict(ROW.findall(done.stdout))
    assert done.returncode == (0 if set(results.values()) <= {"pass", "hidden"} else 1), done.stdout
    return results


def write_body(handout, name: str, bodies: list[list[str]]) -> None:
    """Write each of the exercise's regions in the handout with the given lines."""
    for i, body in enumerate(bodies):
        region = exercises.exercises(handout)[name][i]  # read again: lines moved
        lines = (handout / region.file).read_text().splitlines(keepends=True)
        lines[region.begin + 1 : region.end] = body
        (handout / region.file).write_text("".join(lines))


def solution(name: str) -> list[list[str]]:
    return [
        (REPO / r.file).read_text().splitlines(keepends=True)[r.begin + 1 : r.end]
        for r in exercises.exercises(REPO)[name]
    ]


def test_every_exercise_has_a_check_points_and_twelve_at_least():
    found, docs = exercises.exercises(REPO), exercises.check_docs(REPO)
    assert set(docs) == set(found) and len(found) >= 12
    assert all(points > 0 for _, points in docs.values())
    for name, regions in found.items():
        assert all(r.hint and r.end > r.begin + 1 for r in regions), name


@pytest.mark.slow
def test_a_handout_fails_every_exercise_until_its_body_is_written(tmp_path):
    """Made from this checkout: every exercise open, the rest runs; one body put back
    passes alone; a wrong body fails with its difference; a body that prints a passing
    line and exits is an error and the others are still graded; the solution passes all."""
    handout, ta = tmp_path / "handout", tmp_path / "ta"
    assert run(REPO, "exercises.py", "make", str(handout), "--grader", str(ta)).returncode == 0
    names = set(exercises.exercises(REPO))
    assert scorecard(handout) == dict.fromkeys(names, "open")
    assert scorecard(handout, "--grader", str(ta)) == dict.fromkeys(names, "open")
    tokens = run(handout, "tokenizer.py", "A gripping film.")
    assert tokens.returncode == 1 and "exercise wordpiece:" in tokens.stderr
    assert run(handout, "multitask_classifier.py", "--preset", "demo", "--show").returncode == 0
    sanity = run(handout, "sanity_check.py")
    assert sanity.returncode == 1 and "exercise embeddings:" in sanity.stdout
    assert "piece by piece: python exercises.py check embeddings attention layer" in sanity.stdout

    write_body(handout, "attention", solution("attention"))
    wrong = ["    print('debugging')  # a student's print\n", "    return hidden.mean(1)\n"]
    write_body(handout, "mean_pool", [wrong])  # padding counted: a wrong body
    forged = [
        f"    print({json.dumps(json.dumps({'name': n, 'result': 'pass'}))})\n" for n in names
    ]
    write_body(handout, "pearson", [[*forged, "    import os\n", "    os._exit(0)\n"]])
    done = run(handout, "exercises.py", "check", "--grader", str(ta))
    after = dict(ROW.findall(done.stdout))
    assert after.pop("attention") == "pass" and after.pop("mean_pool") == "fail"
    assert after.pop("pearson") == "error" and "stopped" in done.stdout
    assert after == dict.fromkeys(names - {"attention", "mean_pool", "pearson"}, "open")
    assert "mean_pool" in done.stdout and "padding" in done.stdout  # the part that failed
    assert scorecard(REPO) == dict.fromkeys(names, "pass")


def solution_lines(names) -> set[str]:
    """The solution's lines of these exercises and the TA's references, stripped: every line
    of code or comment of 12 characters or more, but those the copy's given code holds as
    well (an import; a short `return ids`; the other exercises' solutions)."""
    given = set()
    for f in REPO.glob("*.py"):
        lines, inside = f.read_text().splitlines(), False
        for line in lines:
            inside = (inside or bool(exercises.BEGIN.match(line))) and not exercises.END.match(line)
            given |= {line.strip()} - {""} if not inside else set()
    others = set(exercises.exercises(REPO)) - set(names)  # given in this copy
    given |= {line.strip() for name in others for body in solution(name) for line in body}
    ours = {line.strip() for name in names for body in solution(name) for line in body}
    theirs = {
        line.strip() for f in exercises.ANSWERS for line in (REPO / f).read_text().splitlines()
    }
    return {s for s in ours if len(s) >= 12 and (s not in given or len(s) >= 30)} | {
        s for s in theirs if len(s) >= 12 and s not in given
    }


def answers_in(folder, names) -> list[str]:
    """'file: line' for every solution line of `names` found in a text file of folder."""
    wanted, hits = solution_lines(names), []
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue
        stripped = {line.strip() for line in text.splitlines()}
        hits += [f"{f.relative_to(folder)}: {line}" for line in sorted(wanted & stripped)]
    return hits


@pytest.mark.parametrize("names", [[], ["attention", "adamw"]])
def test_a_students_copy_holds_no_answer(tmp_path, names):
    """No line of an open exercise's solution or of the TA's references is anywhere in a
    student's copy (docs, notebook, lab, anything copied); the TA's grader has them."""
    exercises.make(tmp_path / "copy", names, tmp_path / "ta")
    assert answers_in(tmp_path / "copy", names or list(exercises.exercises(REPO))) == []
    copied = [p.relative_to(tmp_path / "copy") for p in (tmp_path / "copy" / "tests").rglob("*.*")]
    assert copied == [Path("tests/reference/sanity_reference.npz")]  # sanity_check.py's
    for answers in exercises.ANSWERS:
        assert not (tmp_path / "copy" / answers).exists() and (tmp_path / "ta" / answers).is_file()


@pytest.mark.slow
def test_gradescope_grades_a_submission_as_its_run_script_does(tmp_path):
    """The autograder archive unpacked as Gradescope does; a submission with two of three
    exercises solved (and a file that is no exercise's, ignored) gets their points."""
    archive = tmp_path / "autograder.zip"
    exercises.main(["autograder", str(archive), "attention", "wordpiece", "pearson"])
    root = tmp_path / "autograder"
    with zipfile.ZipFile(archive) as z:
        z.extractall(root / "source")
        assert {"run_autograder", "setup.sh"} <= set(z.namelist())
    (root / "submission").mkdir()
    for file in ("bert.py", "tokenizer.py"):
        (root / "submission" / file).write_text((REPO / file).read_text())
    (root / "submission" / "exercises.py").write_text("raise SystemExit('not graded')\n")
    env = {"AUTOGRADER_ROOT": str(root), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    done = subprocess.run(
        ["bash", str(root / "source" / "run_autograder")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    scores = {t["name"]: (t["score"], t["max_score"]) for t in results["tests"]}
    assert scores == {"attention": (4, 4), "wordpiece": (3, 3), "pearson": (0, 1)}
    assert results["score"] == 7


def test_a_handout_with_some_exercises_and_what_make_refuses(tmp_path):
    """Only the named exercises open; what does not need them runs (the tokenizer's CLI
    while attention is open)."""
    exercises.main(["make", str(tmp_path / "some"), "pcgrad", "auc", "attention"])
    open_ = [
        name
        for name, regions in exercises.exercises(tmp_path / "some").items()
        for r in regions
        if "raise NotImplementedError"
        in (tmp_path / "some" / r.file).read_text().splitlines()[r.begin + 1]
    ]
    assert sorted(set(open_)) == ["attention", "auc", "pcgrad"]
    assert set(scorecard(tmp_path / "some")) == {"attention", "auc", "pcgrad"}  # the assigned
    assignment = (tmp_path / "some" / "ASSIGNMENT.md").read_text()
    rows = [
        line
        for line in assignment.splitlines()
        if line.startswith("| 1") or line[:4] in ("| 2 ", "| 3 ")
    ]
    assert [row.split("|")[2].strip() for row in rows] == ["`attention`", "`pcgrad`", "`auc`"]
    assert "`BertSelfAttention.attention`" in rows[0] and "7 points" in assignment
    for page in (tmp_path / "some").rglob("*.md"):  # no link into what the copy leaves out
        for m in exercises.LINK.finditer(page.read_text()):
            target = m[2].split("#")[0]
            assert not target or "://" in target or (page.parent / target).exists(), (page, m[0])
    readme = (tmp_path / "some" / "README.md").read_text()
    assert "Start with [ASSIGNMENT.md]" in readme and "exercises.py make" not in readme
    assert "## Teach with it" not in readme and "## Read on" in readme  # the TA's section
    tokens = run(tmp_path / "some", "tokenizer.py", "A gripping film.")
    assert tokens.returncode == 0 and "grip" in tokens.stdout
    assert not (tmp_path / "some" / "runs").exists() and (tmp_path / "some" / "README.md").is_file()
    with pytest.raises(SystemExit, match="not empty"):
        exercises.main(["make", str(tmp_path / "some")])
    with pytest.raises(SystemExit, match="no exercise nonsense"):
        exercises.main(["make", str(tmp_path / "other"), "nonsense"])
    with pytest.raises(SystemExit, match="inside this repository"):
        exercises.main(["make", str(REPO / "runs" / "handout")])
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit, match="not empty"):
        exercises.main(["make", str(tmp_path / "a-file")])
    with pytest.raises(SystemExit, match="is it this repository, a handout or a TA.s grader"):
        exercises.main(["check", "--dir", str(tmp_path / "nowhere")])


def test_a_marker_without_its_pair_is_named_by_file_and_line(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n    # BEGIN EXERCISE one: a hint\n    y = 2\n")
    with pytest.raises(SystemExit, match=r"a.py:2: exercise one never ends"):
        exercises.regions_of(tmp_path / "a.py", tmp_path)
    (tmp_path / "a.py").write_text("# BEGIN EXERCISE one: a\n# END EXERCISE two\n")
    with pytest.raises(SystemExit, match=r"a.py:2: END EXERCISE two without its BEGIN"):
        exercises.regions_of(tmp_path / "a.py", tmp_path)
