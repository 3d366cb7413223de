"""A hostile class, graded through the autograder archive as Gradescope runs it (root, the
student's code as its user): each attack is an exercise's body that tries to score without
the answer, by forging results, reaching the TA's files, patching what judges it, handing
back odd values, or stopping, flooding and hanging the grade; and submissions whose files
are odd. Each is graded as the code it is: none scores, each grade ends within 3 minutes
with a results.json, and what an attack tried to reach is unchanged."""

import json
import pwd
import shutil
import sys
import time
import zipfile
from pathlib import Path

import pytest

import exercises
from grader import gradescope, processes
from grading import as_the_students_user, leftovers, run_autograder, unpacked, write_code
from hostile_bodies import ATTACKS, ODD_VALUES, STOPPING

HELD = "an earlier submission's held verdict"  # in Gradescope's submission_metadata.json


def grade(tmp_path: Path, attacks: dict, files: dict | None = None) -> tuple[dict, float, dict]:
    """Every attack's body written in a copy with every exercise open (the others stay
    open), submitted (with `files`: {name: bytes or a link's target} besides), graded
    through the archive: (results.json, seconds, {exercise: its tests' score and outputs})."""
    as_the_students_user()
    copy, ta, root = tmp_path / "copy", tmp_path / "ta", tmp_path / "autograder"
    exercises.make(copy, [], ta, quiet=True, every=True)
    for exercise, body, _ in attacks.values():
        write_code(copy, exercise, body)
    archive = tmp_path / "autograder.zip"
    exercises.main(["autograder", str(archive), "--copy", str(copy), "--grader", str(ta)])
    unpacked(archive, root)
    for name in (root / "source" / "files.txt").read_text().split():
        shutil.copyfile(copy / name, root / "submission" / name)
    for name, content in (files or {}).items():
        (root / "submission" / name).unlink(missing_ok=True)
        if isinstance(content, bytes):
            (root / "submission" / name).write_bytes(content)
        else:
            (root / "submission" / name).symlink_to(content)
    (root / "submission_metadata.json").write_text(json.dumps({"held": HELD}))  # Gradescope's
    before = {p: p.read_bytes() for p in (root / "source").rglob("*") if p.is_file()}
    started = time.monotonic()
    results = run_autograder(root, Path(sys.executable), MINBERT_CHECK_SECONDS="10")
    seconds = time.monotonic() - started
    time.sleep(2)  # a detached writer's time, were it alive
    assert json.loads((root / "results" / "results.json").read_text()) == results
    assert {p: p.read_bytes() for p in before} == before  # the judge's caches aside
    assert not leftovers() and HELD not in json.dumps(results)
    uid = pwd.getpwnam(gradescope.STUDENT).pw_uid
    assert not [e for f in processes.SHARED for e in Path(f).iterdir() if owner(e) == uid]
    tests = {}
    for t in results["tests"]:
        name = t["name"].split(":")[0]
        score, said = tests.get(name, (0, ""))
        tests[name] = (score + t["score"], f"{said} {t['output']}")
    return results, seconds, tests


def owner(entry: Path) -> int | None:
    """The uid owning a file of a shared folder; None where it went meanwhile (another
    test's temporary folder, removed between the listing and the look)."""
    try:
        return entry.lstat().st_uid
    except FileNotFoundError:
        return None


def judged_as_written(attacks: dict, results: dict, seconds: float, tests: dict) -> None:
    """No attack scores, each says what it must, the grade ended within 3 minutes."""
    assert seconds < 180, seconds
    assert results["score"] == 0, {n: t for n, t in tests.items() if t[0]}
    for label, (exercise, _, said) in attacks.items():
        score, output = tests[exercise]
        assert score == 0 and said in output, (label, output)


@pytest.mark.parametrize(
    "attacks", [ATTACKS, ODD_VALUES, STOPPING], ids=["forging", "values", "stopping"]
)
def test_a_hostile_class_is_graded_as_the_code_it_is(tmp_path, attacks):
    assert len({e for e, _, _ in attacks.values()}) == len(attacks)  # one attack per exercise
    judged_as_written(attacks, *grade(tmp_path, attacks))


def test_odd_submissions_are_graded_as_the_files_they_are(tmp_path):
    """A zip bomb, a link out, a link loop, a file in UTF-16, a file that does not compile:
    each file is graded as Python reads it, the rest as the handout's, within 3 minutes."""
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("bert.py", b"\0" * (200 << 20))  # 200 MB of zeros, 200 KB zipped
    files = {
        "bomb.zip": bomb.read_bytes(),
        "optimizer.py": "# -*- coding: utf-16 -*-\n".encode("utf-16"),
        "evaluation.py": b"def pearson(:\n",
        "loop": "loop",
        "smart.py": "/etc/shadow",
    }
    results, seconds, tests = grade(tmp_path, {}, files)
    assert seconds < 180 and results["score"] == 0, results
    assert "SyntaxError" in tests["pearson"][1] and "SyntaxError" in tests["auc"][1]
    assert "smart.py: not submitted" in results["output"]
    assert "bomb.zip was submitted" in results["output"]
