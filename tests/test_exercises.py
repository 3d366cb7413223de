"""exercises.py: a handout made from this checkout, graded piece by piece; the solution passes."""

import re
import subprocess
import sys

import pytest

import exercises

REPO = exercises.HERE
ROW = re.compile(r"^(\w+)\s+\S+\s+(pass|fail|open|error)\b", re.M)


def run(folder, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=folder, capture_output=True, text=True, timeout=timeout
    )


def scorecard(folder, *names) -> dict[str, str]:
    """{exercise: pass | fail | open | error} from `exercises.py check` run in folder."""
    done = run(folder, "exercises.py", "check", *names)
    results = dict(ROW.findall(done.stdout))
    assert done.returncode == (0 if set(results.values()) == {"pass"} else 1), done.stdout
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


def test_every_exercise_has_a_check_and_twelve_at_least():
    found = exercises.exercises(REPO)
    assert set(exercises.check_docs(REPO)) == set(found) and len(found) >= 12
    for name, regions in found.items():
        assert all(r.hint and r.end > r.begin + 1 for r in regions), name


@pytest.mark.slow
def test_a_handout_fails_every_exercise_until_its_body_is_written(tmp_path):
    """Made from this checkout: every exercise open, the rest runs; one body put back
    passes alone; a wrong body fails with its difference; the solution passes all."""
    handout = tmp_path / "handout"
    assert run(REPO, "exercises.py", "make", str(handout)).returncode == 0
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
    after = scorecard(handout)
    assert after.pop("attention") == "pass" and after.pop("mean_pool") == "fail"
    assert after == dict.fromkeys(names - {"attention", "mean_pool"}, "open")
    assert scorecard(REPO) == dict.fromkeys(names, "pass")


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
    assert sorted(open_) == ["attention", "auc", "pcgrad"]
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
    with pytest.raises(SystemExit, match="is it this repository or a handout of it"):
        exercises.main(["check", "--dir", str(tmp_path / "nowhere")])


def test_a_marker_without_its_pair_is_named_by_file_and_line(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n    # BEGIN EXERCISE one: a hint\n    y = 2\n")
    with pytest.raises(SystemExit, match=r"a.py:2: exercise one never ends"):
        exercises.regions_of(tmp_path / "a.py", tmp_path)
    (tmp_path / "a.py").write_text("# BEGIN EXERCISE one: a\n# END EXERCISE two\n")
    with pytest.raises(SystemExit, match=r"a.py:2: END EXERCISE two without its BEGIN"):
        exercises.regions_of(tmp_path / "a.py", tmp_path)
