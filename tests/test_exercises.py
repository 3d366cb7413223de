"""exercises.py: a handout made from this checkout, graded piece by piece; the solution passes;
the student's copy holds no answer; Gradescope's autograder grades a submission."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import exercises
from grader import markers, student_copy
from grader.assignment import COURSE
from grading import as_the_students_user

REPO = exercises.HERE
ROW = re.compile(
    r"^(\w+)\s+[\d.]+(?: \+\d+\?)? / \d+\s+(pass|provisional|fail|open|error|hidden)\b", re.M
)
PASSING = {"pass", "provisional", "hidden"}  # a student's copy: the TA's parts wait


def run(folder, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=folder, capture_output=True, text=True, timeout=timeout
    )


def scorecard(folder, *names) -> dict[str, str]:
    """{exercise: its result} from `exercises.py check` run in folder (names may hold
    --grader DIR)."""
    done = run(folder, "exercises.py", "check", *names)
    results = dict(ROW.findall(done.stdout))
    assert done.returncode == (0 if set(results.values()) <= PASSING else 1), done.stdout
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
    assert all(c.points > 0 and c.held <= c.points for c in docs.values())
    assert sum(docs[n].points for n in COURSE) == 18  # the handout's TODOs
    for name, regions in found.items():
        assert all(r.hint and r.end > r.begin + 1 for r in regions), name


@pytest.mark.slow
def test_a_handout_fails_every_exercise_until_its_body_is_written(tmp_path):
    """Made from this checkout with --all: every exercise open, the rest runs; one body put back
    passes alone; a wrong body fails with its difference, the others still open (a body
    that exits, and the solution graded in full: tests/test_judge.py)."""
    handout, ta = tmp_path / "handout", tmp_path / "ta"
    made = run(REPO, "exercises.py", "make", str(handout), "--all", "--grader", str(ta))
    assert made.returncode == 0
    names = set(exercises.exercises(REPO))
    assert scorecard(handout) == dict.fromkeys(names, "open")
    tokens = run(handout, "tokenizer.py", "A gripping film.")
    assert tokens.returncode == 1 and "exercise wordpiece:" in tokens.stderr
    assert run(handout, "multitask_classifier.py", "--preset", "demo", "--show").returncode == 0
    sanity = run(handout, "sanity_check.py")
    assert sanity.returncode == 1 and "exercise embeddings:" in sanity.stdout
    assert "piece by piece: python exercises.py check embeddings attention layer" in sanity.stdout

    write_body(handout, "attention", solution("attention"))
    wrong = ["    print('debugging')  # a student's print\n", "    return hidden.mean(1)\n"]
    write_body(handout, "mean_pool", [wrong])  # padding counted: a wrong body
    done = run(handout, "exercises.py", "check", "--grader", str(ta))
    after = dict(ROW.findall(done.stdout))
    assert after.pop("attention") == "pass" and after.pop("mean_pool") == "fail"
    assert after == dict.fromkeys(names - {"attention", "mean_pool"}, "open")
    assert "mean_pool" in done.stdout and "padding" in done.stdout  # the part that failed


def solution_lines(names) -> set[str]:
    """The solution's lines of these exercises and the TA's references, stripped: every line
    of code or comment of 12 characters or more, but those the copy's given code holds as
    well (an import; a short `return ids`; the other exercises' solutions)."""
    given = set()
    for f in REPO.glob("*.py"):
        lines, inside = f.read_text().splitlines(), False
        for line in lines:
            inside = (inside or bool(markers.BEGIN.match(line))) and not markers.END.match(line)
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


@pytest.mark.parametrize("names, every", [([], False), (["attention", "adamw"], False), ([], True)])
def test_a_students_copy_holds_no_answer(tmp_path, names, every):
    """No line of an open exercise's solution or of the TA's references is anywhere in a
    student's copy (docs, notebook, lab, anything copied); the TA's grader has them. By
    default the copy opens the handout's TODOs; --all, every exercise."""
    opened = exercises.make(tmp_path / "copy", names, tmp_path / "ta", every=every)
    everything = list(exercises.exercises(REPO))
    assert set(opened) == set(names or (everything if every else COURSE))
    assert answers_in(tmp_path / "copy", opened) == []
    copied = [p.relative_to(tmp_path / "copy") for p in (tmp_path / "copy" / "tests").rglob("*.*")]
    assert sorted(copied) == [  # sanity_check.py's, and the copy's own tests
        Path("tests/reference/sanity_reference.npz"),
        Path("tests/test_assignment.py"),
    ]
    for answers in exercises.ANSWERS:
        assert not (tmp_path / "copy" / answers).exists() and (tmp_path / "ta" / answers).is_file()


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
    assert "`BertSelfAttention.attention`" in rows[0] and "exercises (4 points)" in assignment
    assert "This project's exercises (3 points, beyond the handout)" in assignment
    for page in (tmp_path / "some").rglob("*.md"):  # no link into what the copy leaves out
        for m in student_copy.LINK.finditer(page.read_text()):
            target = m[2].split("#")[0]
            assert not target or "://" in target or (page.parent / target).exists(), (page, m[0])
    readme = (tmp_path / "some" / "README.md").read_text()
    assert "Start with [ASSIGNMENT.md]" in readme and "exercises.py make" not in readme
    assert "## Teach with it" not in readme and "## Read on" in readme  # the TA's section
    assert student_copy.TEST_LINE not in readme and "make test   # this copy's tests" in readme
    tokens = run(tmp_path / "some", "tokenizer.py", "A gripping film.")
    assert tokens.returncode == 0 and "grip" in tokens.stdout
    assert not (tmp_path / "some" / "docs" / "teaching.md").exists()  # the TA's page
    assert "teaching.md" not in (tmp_path / "some" / "docs" / "README.md").read_text()  # its row
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


@pytest.mark.slow
def test_a_copys_own_tests_pass_on_the_given_code_and_fail_a_wrong_body(tmp_path):
    """`make test` in a copy runs tests/test_assignment.py: an open exercise skips, the
    given code runs; a body written wrong fails."""
    copy = tmp_path / "copy"
    exercises.make(copy, ["auc", "pcgrad"])
    own = run(copy, "-m", "pytest", "-rs", "-k", "auc or given", "-p", "no:cacheprovider")
    assert own.returncode == 0 and "1 passed, 1 skipped" in own.stdout, own.stdout  # its tests
    assert "exercise auc is open" in own.stdout
    write_body(copy, "auc", [["    return 0.5\n"]])
    own = run(copy, "-m", "pytest", "-k", "auc", "-p", "no:cacheprovider")
    assert own.returncode == 1 and "1 failed" in own.stdout, own.stdout


def test_make_refuses_a_year_it_does_not_know_and_names_with_all(tmp_path):
    with pytest.raises(
        SystemExit, match="--handout 2022: the handouts this project follows are 2023, 2024"
    ):
        exercises.main(["make", str(tmp_path / "other"), "--handout", "2022"])
    with pytest.raises(
        SystemExit, match="--all opens every exercise; name exercises or give --all"
    ):
        exercises.main(["make", str(tmp_path / "other"), "auc", "--all"])
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize(
    "year, flag, frozen",
    [("2023", "--option", "pretrain"), ("2024", "--fine-tune-mode", "last-linear-layer")],
)
def test_a_copy_follows_its_handout_year(tmp_path, year, flag, frozen):
    """The default copy opens the handout's TODOs at the handout's names; ASSIGNMENT.md names
    its year and its commands with that year's flag and file names."""
    opened = exercises.make(tmp_path / "copy", [], year=year, quiet=True)
    assert opened == list(COURSE)
    text = (tmp_path / "copy" / "ASSIGNMENT.md").read_text()
    assert f"CS224n {year} handout" in text and "The handout's exercises (18 points)" in text
    assert f"python classifier.py {flag} {frozen}" in text and f"{frozen}-sst-dev-out.csv" in text
    for place in ("`BertModel.embed`", "classifier.py: `BertSentimentClassifier.__init__`"):
        assert place in text
    assert "make venv && . .venv/bin/activate" in text and "make check" in text


def test_a_marker_without_its_pair_is_named_by_file_and_line(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n    # BEGIN EXERCISE one: a hint\n    y = 2\n")
    with pytest.raises(SystemExit, match=r"a.py:2: exercise one never ends"):
        markers.regions_of(tmp_path / "a.py", tmp_path)
    (tmp_path / "a.py").write_text("# BEGIN EXERCISE one: a\n# END EXERCISE two\n")
    with pytest.raises(SystemExit, match=r"a.py:2: END EXERCISE two without its BEGIN"):
        markers.regions_of(tmp_path / "a.py", tmp_path)


HANDOUT = ["attention", "layer", "embeddings", "adamw", "classifier", "multitask", "multitask_step"]


@pytest.mark.slow
def test_a_students_scorecard_is_honest_and_grades_each_exercise_alone(tmp_path):
    """The handout's seven open: 0 of 21. Solved: the parts the student's side judges are
    counted, the TA's shown apart as provisional (+N?), never as passed. A syntax error in
    trainer.py stops multitask_step alone; multitask is graded while classifier and
    pair_head are open (stand-ins); an error names the student's line, not torch's."""
    copy = tmp_path / "copy"
    exercises.make(copy, HANDOUT)
    before = run(copy, "exercises.py", "check")
    assert dict(ROW.findall(before.stdout)) == dict.fromkeys(HANDOUT, "open")
    assert "\n0 / 21 points\n" in before.stdout and before.returncode == 1
    for name in HANDOUT:
        write_body(copy, name, solution(name))
    after = run(copy, "exercises.py", "check")
    results = dict(ROW.findall(after.stdout))
    assert set(results.values()) == {"pass", "provisional"} and after.returncode == 0
    counted = sum(w.points - w.held for w in map(exercises.check_docs(REPO).get, HANDOUT))
    held = 21 - counted
    assert f"{counted} / 21 points counted here; {held} more are the TA's" in after.stdout
    assert re.search(r"^attention\s+3 \+1\? / 4\s+provisional", after.stdout, re.M)

    trainer = (copy / "trainer.py").read_text()
    (copy / "trainer.py").write_text(trainer + "\ndef broken(:\n")
    write_body(
        copy, "classifier", [['        raise NotImplementedError("exercise classifier: x")\n']]
    )
    write_body(
        copy,
        "pair_head",
        [
            [
                "        return self.heads[task](torch.cat([u, v], -1)).squeeze(-1)  # torch's Linear fails\n"
            ]
        ],
    )
    done = run(
        copy, "exercises.py", "check", "multitask", "multitask_step", "classifier", "pair_head"
    )
    results = dict(ROW.findall(done.stdout))
    assert results == {
        "multitask": "pass",
        "multitask_step": "error",
        "classifier": "open",
        "pair_head": "error",
    }
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert "SyntaxError: invalid syntax (trainer.py:" in lines["multitask_step"]
    assert "(sbert.py:" in lines["pair_head"], lines["pair_head"]


def test_a_copy_graded_from_the_tas_tree_is_graded_as_gradescope_grades_it(tmp_path):
    """`check --dir COPY` run in a tree that holds the answers grades the copy's files of
    its exercises over a handout made there, the copy's code as the student's user, never
    with the copy's grader nor in the copy; AdamW's decay gated on correct_bias fails there
    and on the student's side alike (a public part: the first step without the correction
    decays). What else the copy holds (a sitecustomize.py) never runs."""
    as_the_students_user()
    copy = tmp_path / "copy"
    exercises.make(copy, ["adamw"], quiet=True)
    body = solution("adamw")
    gated = [
        line.replace(
            'if group["weight_decay"]:', 'if group["weight_decay"] and group["correct_bias"]:'
        )
        for line in body[0]
    ]
    assert gated != body[0]
    write_body(copy, "adamw", [gated])
    (copy / "sitecustomize.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('x')\n")
    ta = run(REPO, "exercises.py", "check", "--dir", str(copy), "adamw")
    said = f"graded as Gradescope grades it: optimizer.py of {copy} run as minbert-student"
    assert said in ta.stdout, ta.stdout + ta.stderr
    assert dict(ROW.findall(ta.stdout)) == {"adamw": "fail"} and "correct_bias=False" in ta.stdout
    assert not (tmp_path / "ran").exists()
    student = run(copy, "exercises.py", "check", "adamw")
    assert "graded as Gradescope" not in student.stdout
    assert dict(ROW.findall(student.stdout)) == {"adamw": "fail"}


def test_a_copy_takes_the_named_files_a_clone_tracks_and_nothing_else(tmp_path):
    """A file is copied where FOR_STUDENTS names it: in a clone, only what git tracks (a
    TA's untracked archive stays); elsewhere every file, still by name (no backup, no run,
    no data file, no answer)."""
    tree = tmp_path / "tree"
    kept = ["bert.py", "engine/runtime.py", "grader/checks.py", "docs/a.md", "tests/reference/x"]
    left = ["autograder.zip", "bert.py~", "grader/references.py", "grader/references.py~"]
    left += ["docs/teaching.md", "runs/r/a.py", ".venv/lib/x.py", "data/quora-dev.csv", "a/b.py"]
    for name in kept + left:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("x")
    student_copy.copy_files(tree, tmp_path / "plain", student_copy.FOR_STUDENTS)
    copied = sorted(
        p.relative_to(tmp_path / "plain").as_posix()
        for p in (tmp_path / "plain").rglob("*")
        if p.is_file()
    )
    assert copied == sorted(kept)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=tree, check=True)
    subprocess.run([*git, "add", "bert.py", "grader/references.py"], cwd=tree, check=True)
    student_copy.copy_files(tree, tmp_path / "clone", student_copy.FOR_STUDENTS)
    student_copy.copy_files(tree, tmp_path / "ta", student_copy.TA_GRADER)
    assert [p.name for p in (tmp_path / "clone").rglob("*") if p.is_file()] == ["bert.py"]
    assert [p.name for p in (tmp_path / "ta").rglob("*") if p.is_file()] == ["references.py"]


def test_a_tas_grade_of_a_copy_is_refused_where_its_code_would_run_as_the_ta(tmp_path, monkeypatch):
    """Not root, or no student's user: the copy's code would run with the TA's rights, so
    `check --dir COPY` from the TA's tree stops in one line naming the way that is safe."""
    copy = tmp_path / "copy"
    exercises.make(copy, ["auc"], quiet=True)
    monkeypatch.setattr(exercises.gradescope, "unsafe", lambda: "not as root")
    monkeypatch.delenv(exercises.gradescope.LOCAL, raising=False)
    with pytest.raises(SystemExit, match=r"runs not as root: run it as root with that user"):
        exercises.main(["check", "--dir", str(copy)])
