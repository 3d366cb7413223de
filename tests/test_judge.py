"""The judge out of the student's reach (grader/processes.py, grader/harness.py): the
student's code runs in a process that holds no reference, token or result file and hands
back only what it returns; the judge runs where no student code ever ran. Replacing torch
functions, walking the stack or exiting early changes only what the student's code hands
back."""

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import exercises
from grader import handed, harness, processes
from grading import as_the_students_user, leftovers, unpacked, write_body

REPO = exercises.HERE


def test_the_judge_runs_no_exercise_body(tmp_path):
    """The solution graded with the judge in a handout whose every exercise is open: all
    pass, so no check reached an exercise's body from the judge's side."""
    handout = tmp_path / "handout"
    exercises.make(handout, [], quiet=True)
    names = list(exercises.exercises(REPO))
    rows = exercises.run_checks(REPO, REPO, names, handout)
    assert {n: rows[n]["result"] for n in names} == dict.fromkeys(names, "pass")


def test_past_the_grades_deadline_the_rest_is_charged_not_waited_on(monkeypatch):
    """processes.DEADLINE bounds a whole grade: the exercises the student's side did not
    reach by its share are charged, 'timed out', and the judge still writes every row,
    within what is left (here nothing: the judge's side cannot run, and says so)."""
    monkeypatch.setattr(processes, "DEADLINE", processes.JUDGING)  # no time for the student
    names = ["pearson", "auc"]
    files = {n: ["evaluation.py"] for n in names}
    rows = processes.grade(REPO, REPO / "grader", names, files)
    assert {n: rows[n]["detail"] for n in names} == dict.fromkeys(names, processes.LATE)
    monkeypatch.setattr(processes, "DEADLINE", 0)  # nor for the judge
    rows = processes.grade(REPO, REPO / "grader", names, files)
    assert {n: rows[n]["result"] for n in names} == dict.fromkeys(names, "grader")


def judges_running() -> list[str]:
    """The command lines of this process's children that are a grade's judge."""
    lines = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            line = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if parent == os.getpid() and "--judge" in line:
            lines.append(line)
    return lines


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_the_judge_starts_beside_the_student_only_where_memory_allows(monkeypatch):
    """A local grade starts its judge with the student's side (it imports meanwhile); one
    whose memory is Gradescope's (MINBERT_GRADE_MB=768) or whose student's code runs as
    another user starts it after, and both grade alike."""
    seen, student_side = [], processes.student_side

    def watched(*args):
        seen.append(judges_running())
        return student_side(*args)

    monkeypatch.setattr(processes, "student_side", watched)
    names = ["pearson", "auc"]
    files = {n: ["evaluation.py"] for n in names}
    rows = [processes.grade(REPO, REPO / "grader", names, files)]
    monkeypatch.setattr(processes, "GRADE_MB", 768.0)
    rows.append(processes.grade(REPO, REPO / "grader", names, files))
    assert [len(judges) for judges in seen] == [1, 0]
    assert "--judge pearson auc" in seen[0][0]
    assert [{n: r[n]["result"] for n in names} for r in rows] == [dict.fromkeys(names, "pass")] * 2
    assert not processes.at_once("minbert-student")


def test_what_the_student_hands_back_is_data():
    """Values through JSON and back: every dtype, a meta tensor's shape, requires_grad,
    lists and dicts; a record the grader cannot read is the student's error, never the
    grader's."""
    values = {
        "f": torch.randn(2, 3, dtype=torch.float64).requires_grad_(),
        "h": torch.randn(3, dtype=torch.bfloat16),
        "b": torch.tensor([True, False]),
        "i": torch.arange(4).view(2, 2),
        "m": torch.empty(2, 5, device="meta"),
        "s": torch.tensor(3.5),
        "rest": [1, 2.5, None, "x", [True]],
    }
    back = handed.decode(json.loads(json.dumps(handed.encode(values))))
    for k in ("f", "h", "b", "i", "s"):
        assert back[k].dtype == values[k].dtype and torch.equal(back[k], values[k].detach())
    assert back["f"].requires_grad and back["m"].device.type == "meta"
    assert back["m"].shape == (2, 5) and back["rest"] == [1, 2.5, None, "x", [True]]
    with pytest.raises(TypeError, match="handed back a object"):
        handed.encode(object())
    bad = {"value": {"tensor": {"dtype": "float32", "shape": [9], "data": "AAAA", "grad": 0}}}
    odd = {"value": {"tensor": {"dtype": "manual_seed", "shape": [], "grad": 0}}}
    replay = harness.Replay([bad, odd])
    with pytest.raises(harness.StudentError, match="cannot read"):
        replay(None, (), {})
    with pytest.raises(harness.StudentError, match="dtype manual_seed"):
        replay(None, (), {})


def test_each_exercises_records_are_its_own_and_bounded(tmp_path):
    """The student's process's lines, read back: a line that is not JSON is skipped, an
    exercise that stops is charged, one whose records were begun twice (forged before or
    after) is an error, and one past RECORDS_MB (one huge line, or many) is charged alone."""
    lines = [
        '{"name": "a", "start": true}',
        '{"name": "a", "value": 1}',
        "not json",
        '{"name": "a", "end": true}',
        '{"name": "b", "start": true}',
        '{"name": "b", "value": 2, "extra": 3}',
    ]
    out = tmp_path
    done = processes.read_records(
        io.StringIO("\n".join(lines)), ["a", "b", "c"], out, "exit code 9"
    )
    assert done == {"a", "b"} and processes.records_of(out, "a") == [{"value": 1}]
    stopped = [{"raised": {"result": "error", "detail": "stopped: exit code 9"}}]
    assert processes.records_of(out, "b") == stopped
    block = [
        '{"name": "c", "start": true}',
        '{"name": "c", "value": 0.5}',
        '{"name": "c", "end": true}',
    ]
    twice = [{"raised": {"result": "error", "detail": processes.TWICE}}]
    for text in (block + lines[:4] + block, lines[:4] + block + block):  # forged before, after
        processes.read_records(io.StringIO("\n".join(text)), ["a", "c"], out, "exit code 0")
        assert processes.records_of(out, "c") == twice
        assert processes.records_of(out, "a") == [{"value": 1}]
    huge = '{"name": "a", "value": "' + "x" * processes.LINE + '"}'  # past any record's size
    for extra in ([huge], ['{"name": "a", "value": 1}'] * (processes.LINE // 24)):
        text = "\n".join(lines[:2] + extra + lines[3:4] + block)
        processes.read_records(io.StringIO(text), ["a", "c"], out, "exit code 0")
        assert processes.records_of(out, "a") == [processes.OVER]
        assert processes.records_of(out, "c") == [{"value": 0.5}]  # the next one is its own


def test_a_forged_record_is_charged_to_its_exercise_and_scoring_goes_on():
    """A record that says `pass`, one that is no record, one with no detail: each is its
    exercise's error, scored 0, and a row with no counts scores 0 too."""
    import checks  # noqa: F401  (the checks register)

    forged = [
        [{"raised": {"result": "pass", "detail": "1 / 1"}}],
        [17],
        [{"raised": {"result": "grader"}}],
        [{"raised": "pass"}],
    ]
    docs = exercises.check_docs(exercises.HERE)
    for records in forged:
        row = harness.judged("embeddings", records)
        assert row["result"] == "error", row
        assert exercises.score(row, docs["embeddings"]).here == 0
    fake = {"result": "pass", "detail": ""}  # a row with no counts: not a pass
    assert exercises.score(fake, docs["embeddings"]).here == 0


REACHING = [
    "    import json, os, pathlib\n",
    "    root = pathlib.Path(os.getcwd()).parent\n",
    "    tried = {}\n",
    "    for path, mode in [('source/ta/grader/references.py', 'r'),\n",
    "                       ('source/ta/grader/extensions.py', 'a'),\n",
    "                       ('source/handout/grader/extensions.py', 'a'),\n",
    "                       ('source/handout/evaluation.py', 'a'),\n",
    "                       ('results/results.json', 'w')]:\n",
    "        try:\n",
    "            with open(root / path, mode) as f:\n",
    "                f.read(10) if mode == 'r' else f.write('\\n# forged\\n')\n",
    "            tried[path] = 'done'\n",
    "        except OSError as e:\n",
    "            tried[path] = type(e).__name__\n",
    "    open(TRIED, 'w').write(json.dumps(tried))\n",
    "    return 0.0\n",
]


# a process detached (a double fork, a new session) that rewrites results.json for a minute
DETACHING = [
    "    import os, time\n",
    "    if os.fork() == 0:\n",
    "        os.setsid()\n",
    "        os.closerange(0, 4096)  # no pipe the grader waits on\n",
    "        if os.fork() == 0:\n",
    "            for _ in range(600):\n",
    "                time.sleep(0.1)\n",
    "                try:\n",
    "                    open(RESULTS, 'w').write(FORGED)\n",
    "                except OSError:\n",
    "                    pass\n",
    "        os._exit(0)\n",
    "    return 0.0\n",
]


def test_the_students_user_can_neither_outlive_nor_reach_the_grader(tmp_path):
    """Where the grader is root (Gradescope; .ci/run), the student's code runs as STUDENT:
    a body that detaches a process (a double fork and a new session) to rewrite
    results.json once the grade is written can neither write it nor outlive the grade,
    and one that reads the TA's references and writes the TA's or the judge's files (or
    results.json) is refused each, the files unchanged."""
    as_the_students_user()
    root = Path(os.path.realpath(tmp_path)) / "autograder"
    copy, ta = tmp_path / "copy", tmp_path / "ta"
    exercises.make(copy, ["auc", "pearson"], ta)
    archive = tmp_path / "autograder.zip"
    exercises.main(["autograder", str(archive), "--copy", str(copy), "--grader", str(ta)])
    unpacked(archive, root)
    forged = json.dumps({"score": 100, "tests": []})
    daemon = "".join(DETACHING).replace("RESULTS", repr(str(root / "results" / "results.json")))
    write_body(copy, "auc", daemon.replace("FORGED", repr(forged)).splitlines(keepends=True))
    drop = tmp_path / "drop"  # where the student's code says what it reached
    drop.mkdir(mode=0o777)
    os.chmod(drop, 0o777)
    reaching = "".join(REACHING).replace("TRIED", repr(str(drop / "tried.json")))
    write_body(copy, "pearson", reaching.splitlines(keepends=True))
    (root / "submission" / "evaluation.py").write_text((copy / "evaluation.py").read_text())
    for folder in (tmp_path, *tmp_path.parents):  # pytest's folders: 0700
        os.chmod(folder, folder.stat().st_mode | 0o005)
    source = {p: p.read_bytes() for p in (root / "source").rglob("*") if p.is_file()}
    env = os.environ | {"AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": sys.executable}
    done = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env, timeout=300)
    assert done.returncode == 0
    time.sleep(3)  # the daemon's time to write, were it alive
    results = json.loads((root / "results" / "results.json").read_text())
    assert sorted(t["name"] for t in results["tests"]) == ["auc", "pearson"], results
    assert results["score"] == 0, results  # neither returns what it should
    tried = json.loads((drop / "tried.json").read_text())
    assert len(tried) == 5 and set(tried.values()) == {"PermissionError"}, tried
    assert {p: p.read_bytes() for p in source} == source  # the judge's caches aside
    assert not leftovers()


EARLY = """import numpy as np
import scipy.stats as st
import torch
from scipy.stats import pearsonr

import definitions


def direct(x, y):
    return float(pearsonr(x, y)[0])


def through(x, y):
    return float(st.pearsonr(x, y).statistic)


def caught(x, y):
    try:
        return float(pearsonr(x, y)[0])
    except Exception:
        return float(np.corrcoef(x, y)[0, 1])


def pooled(hidden, mask):
    return definitions.mean_pool(hidden, mask)


def imported():
    from grader import references

    return references


def own(x, y):
    return float(np.corrcoef(x, y)[0, 1])


def adam():
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    torch.optim.AdamW([p], foreach=False).step()
    return p
"""


def test_no_points_for_calling_what_computes_the_answer(tmp_path):
    """A body that calls what computes its exercise's answer (scipy's pearsonr, the grader's
    definitions and references, torch's AdamW for adamw) is refused, by whatever name it was imported, at its
    module's top before any grading too; a refusal it catches still counts. The record says
    so at the body's line, and the judge makes it the exercise's error; numpy's primitives
    stay allowed, and afterwards every function is as it was."""
    import scipy.stats

    import extensions  # noqa: F401  (the checks register, with the answers they refuse)
    import harness as graded
    import out_of_reach as reach

    (tmp_path / "early.py").write_text(EARLY)
    sys.path.insert(0, str(tmp_path))
    try:
        import early
    finally:
        sys.path.remove(str(tmp_path))
    x, y = np.arange(5.0), np.array([1.0, 3.0, 2.0, 5.0, 4.0])
    h, m = torch.randn(2, 3, 4, dtype=torch.float64), torch.ones(2, 3)
    cases = [("pearson", early.direct, (x, y), "scipy.stats.pearsonr")]
    cases += [("pearson", early.through, (x, y), "scipy.stats.pearsonr")]
    cases += [("pearson", early.caught, (x, y), "scipy.stats.pearsonr")]
    cases += [("mean_pool", early.pooled, (h, m), "the grader's definitions.mean_pool")]
    cases += [("attention", early.imported, (), "the grader's references")]
    cases += [("adamw", early.adam, (), "torch.optim.adam._single_tensor_adam")]
    for name, fn, args, what in cases:
        recorder = graded.Recorder(name)
        with pytest.raises(reach.Refused, match=f"exercise {name}: {what}"):
            recorder(fn, args, {})
        said = recorder.records[-1]["raised"]
        assert said["result"] == "error" and "(early.py:" in said["detail"], said
        row = graded.judged(name, recorder.records)
        assert row["result"] == "error" and what in row["detail"], row
    recorder = graded.Recorder("pearson")
    assert recorder(early.own, (x, y), {}) == pytest.approx(scipy.stats.pearsonr(x, y)[0])
    assert early.pearsonr is scipy.stats.pearsonr and early.direct(x, y) == pytest.approx(
        early.own(x, y)
    )
    assert torch.equal(early.pooled(h, m), h.mean(1))


def test_every_answer_a_check_refuses_is_a_function_here():
    """Each library function a check names as computing its answer is found, so a renamed
    one cannot drop out of the student's reach unseen."""
    import checks  # noqa: F401
    import extensions  # noqa: F401
    import out_of_reach as reach

    for name, named in reach.ANSWERS.items():
        labels = {label for _, label in reach.answers(name)}
        assert {n.replace(":", ".") for n in named} <= labels, name


def test_complex_and_integer_outputs_fail_the_dtype_rule():
    """A complex output fails whatever it is compared with, and an integer or boolean one
    where real numbers are expected; integers where integers are expected pass."""
    import harness as graded

    wrong = [torch.tensor([0.5], dtype=torch.complex64), torch.tensor(0.5, dtype=torch.complex128)]
    wrong += [torch.tensor([1]), torch.tensor([True]), 1, True, [1, 2]]
    for got in wrong:
        expected = (
            [1.0, 2.0] if isinstance(got, list) else 0.5 if graded.kind(got) == "complex" else 1.0
        )
        ok, _, said, _ = graded.judge(graded.part("r", got, expected), 1e-6)
        assert ok is False and "where this run computes in torch.float64" in said, (got, said)
    right = [(torch.tensor(1.0), 1.0), ([1, 5], [1, 5]), (True, True), (torch.tensor([2]), [2])]
    for got, expected in right:
        assert graded.judge(graded.part("r", got, expected), 1e-6)[0] is True, got
