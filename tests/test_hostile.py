"""A hostile class, graded through the autograder archive as Gradescope runs it (root, the
student's code as its user): each attack is an exercise's body that tries to score without
the answer, by forging results, reaching the TA's files, patching what judges it, handing
back odd values, or stopping, flooding and hanging the grade; and submissions whose files
are odd. Each is graded as the code it is: none scores, each grade ends within 3 minutes
with a results.json, and what an attack tried to reach is unchanged."""

import json
import shutil
import sys
import time
import zipfile
from pathlib import Path

import pytest

import exercises
from grading import as_the_students_user, leftovers, run_autograder, unpacked, write_code

# {label: (exercise, body, what its test's output must say; "" where any failure will do)}
ATTACKS = {
    # results.json forged: directly, at exit, by a detached process, on stdout
    "results written directly": (
        "pearson",
        """
        import os, json
        path = os.path.join(os.path.dirname(os.getcwd()), 'results', 'results.json')
        open(path, 'w').write(json.dumps({'score': 100, 'tests': []}))
        return 0.0
        """,
        "",
    ),
    "results written at exit": (
        "auc",
        """
        import atexit, os, json
        path = os.path.join(os.path.dirname(os.getcwd()), 'results', 'results.json')
        atexit.register(lambda: open(path, 'w').write(json.dumps({'score': 100})))
        return 0.0
        """,
        "",
    ),
    "results rewritten by a detached process": (
        "mean_pool",
        """
        import os, time, json
        path = os.path.join(os.path.dirname(os.getcwd()), 'results', 'results.json')
        if os.fork() == 0:
            os.setsid()
            os.closerange(0, 4096)
            if os.fork() == 0:
                for _ in range(300):
                    time.sleep(0.1)
                    try:
                        open(path, 'w').write(json.dumps({'score': 100, 'tests': []}))
                    except OSError:
                        pass
            os._exit(0)
        return 0.0
        """,
        "",
    ),
    "a pass printed, then an exit": (
        "distillation",
        """
        import os
        print('{"name": "distillation", "result": "pass", "score": 1}', flush=True)
        os._exit(0)
        """,
        "stopped: exit code 0",
    ),
    # the records forged: through every descriptor, /proc, a value shaped as a record
    "records written to every descriptor": (
        "symmetric_kl",
        """
        import os
        line = b'{"name": "symmetric_kl", "start": true}\\n{"name": "symmetric_kl", "end": true}\\n'
        for fd in range(256):
            try:
                os.write(fd, line)
            except OSError:
                pass
        return 0.0
        """,
        "",
    ),
    "records written through the parent's /proc": (
        "pair_head",
        """
        import os
        line = b'{"name": "pair_head", "start": true}\\n{"name": "pair_head", "end": true}\\n'
        for fd in os.listdir(f'/proc/{os.getppid()}/fd'):
            try:
                with open(f'/proc/{os.getppid()}/fd/{fd}', 'ab') as f:
                    f.write(line)
            except OSError:
                pass
        return 0.0
        """,
        "",
    ),
    "a value shaped as a passing record": (
        "pcgrad",
        """
        return {'raised': {'result': 'pass', 'detail': '1 / 1'}}
        """,
        "",
    ),
    "a token and a result file looked for": (
        "simcse",
        """
        import gc, re
        found = [o for o in gc.get_objects() if isinstance(o, str) and re.fullmatch('[0-9a-f]{32}', o)]
        for path in [o for o in gc.get_objects() if isinstance(o, str) and o.endswith('.jsonl')]:
            for token in found:
                try:
                    open(path, 'a').write('{"token": "%s", "name": "simcse", "result": "pass"}\\n' % token)
                except OSError:
                    pass
        return 0.0
        """,
        "",
    ),
    "the other exercises' records begun": (
        "momentum_teacher",
        """
        import json, sys
        for name in ('wordpiece', 'adamw'):
            print(json.dumps({'name': name, 'start': True}), file=sys.stderr)
        raise SystemExit(0)
        """,
        "",
    ),
    # the TA's files read and written, the judge's written, a module shadowed
    "the TA's references read": (
        "multitask_step",
        """
        import os
        root = os.path.dirname(os.getcwd())
        text = open(os.path.join(root, 'source', 'ta', 'grader', 'references.py')).read()
        loss = loss + part.detach() * len(text)
        """,
        "PermissionError",
    ),
    "the TA's extensions.py written": (
        "wordpiece",
        """
        import os
        root = os.path.dirname(os.getcwd())
        open(os.path.join(root, 'source', 'ta', 'grader', 'extensions.py'), 'a').write('\\nX = 1\\n')
        return []
        """,
        "PermissionError",
    ),
    "the judge's checks written": (
        "embeddings",
        """
        import os
        root = os.path.dirname(os.getcwd())
        open(os.path.join(root, 'source', 'handout', 'grader', 'checks.py'), 'a').write('\\nX = 1\\n')
        return 0.0
        """,
        "PermissionError",
    ),
    "a numpy.py left where the judge runs": (
        "classifier",
        """
        import os
        root = os.path.dirname(os.getcwd())
        open(os.path.join(root, 'source', 'handout', 'numpy.py'), 'w').write('raise SystemExit')
        return 0.0
        """,
        "PermissionError",
    ),
    "a usercustomize in the home it was given": (
        "adamw_foreach",
        """
        import os, site
        os.makedirs(site.getusersitepackages(), exist_ok=True)
        open(os.path.join(site.getusersitepackages(), 'usercustomize.py'), 'w').write(
            'import os, json\\n'
            'open(os.path.join(os.path.dirname(os.getcwd()), "results", "results.json"), "w")'
            '.write(json.dumps({"score": 100}))\\n')
        os.kill(os.getppid(), 9)
        """,
        "PermissionError",
    ),
    # what judges it patched
    "torch's comparisons patched": (
        "attention",
        """
        torch.allclose = lambda *a, **k: True
        torch.Tensor.__sub__ = lambda a, b: torch.zeros_like(a)
        torch.Tensor.abs = lambda a: torch.zeros_like(a)
        torch.testing.assert_close = lambda *a, **k: None
        return v, torch.softmax(q @ k.transpose(-2, -1), -1)
        """,
        "",
    ),
    "numpy patched": (
        "layer",
        """
        import numpy as np
        np.abs = lambda x: x * 0
        np.max = lambda *a, **k: 0.0
        np.isclose = lambda *a, **k: True
        return x
        """,
        "",
    ),
    "the harness patched": (
        "multitask",
        """
        import harness, handed
        harness.judge = lambda p, tol: (True, 0.0, '', False)
        harness.Recorder.__call__ = lambda self, fn, a, k: self.records.append({'value': 1})
        handed.encode = lambda x: 1
        return {}
        """,
        "",
    ),
    "json and the builtins patched": (
        "adamw",
        """
        import builtins, json
        json.dumps = lambda *a, **k: '{"name": "adamw", "result": "pass"}'
        builtins.isinstance = lambda *a: True
        p.zero_()
        """,
        "",
    ),
}
ODD_VALUES = {
    # low precision and odd dtypes
    "a float8 zero": ("pearson", "return torch.zeros((), dtype=torch.float8_e4m3fn)", "float8"),
    "a bfloat16 half": ("auc", "return torch.tensor(0.5, dtype=torch.bfloat16)", "bfloat16"),
    "float16 zeros": (
        "mean_pool",
        "return torch.zeros(hidden.shape[0], hidden.shape[2], dtype=torch.float16)",
        "",
    ),
    "complex values": ("distillation", "return torch.zeros((), dtype=torch.complex128)", ""),
    "integers": ("symmetric_kl", "return torch.zeros((), dtype=torch.int64)", ""),
    "booleans": ("pair_head", "return torch.ones(4, dtype=torch.bool)", ""),
    "a meta tensor": ("simcse", "return torch.empty((), device='meta')", ""),
    "a sparse tensor": ("pcgrad", "return [torch.zeros(3, 3).to_sparse()]", ""),
    "a subclass equal to anything": (
        "attention",
        """
        class Any(torch.Tensor):
            def __eq__(self, other): return True
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                return torch.zeros(())
        return v.as_subclass(Any), v.as_subclass(Any)
        """,
        "",
    ),
    # NaN and inf, numbers that are not
    "NaN": ("multitask_step", "loss = loss + float('nan')", ""),
    "inf": ("wordpiece", "return [float('inf')] * len(ids)", ""),
    "an object equal to anything": (
        "embeddings",
        """
        class Any:
            __eq__ = lambda self, other: True
            __float__ = lambda self: 0.0
        return Any()
        """,
        "on what your code returned",
    ),
    "a float that says it is equal": (
        "classifier",
        """
        class Any(float):
            __eq__ = lambda self, other: True
            __sub__ = lambda self, other: 0.0
        return Any(7.0)
        """,
        "",
    ),
    "a nesting too deep to hand back": (
        "smart_ascent",
        """
        x = []
        for _ in range(100000):
            x = [x]
        return x
        """,
        "",
    ),
    "two 80 MB arrays": ("layer", "return [torch.zeros(10_000_000, dtype=torch.float64)] * 2", ""),
    "a record just over the cap": (
        "multitask",
        "import harness\n"
        "harness.encode = lambda *a, **k: 'x' * (25 << 20)\n"
        "harness.raised = lambda *a, **k: {'result': 'error', 'detail': 'x' * (25 << 20)}\n"
        "return {}",
        "handed back over 24 MB",
    ),
    # the same through what the piece changes in place
    "the parameters made NaN": ("adamw", "p.fill_(float('nan'))", ""),
    "the parameters made float16": (
        "adamw_foreach",
        "for q in params:\n    q.data = q.data.half()",
        "",
    ),
    "the teacher made inf": (
        "momentum_teacher",
        "for t in self.params.values():\n    t.fill_(float('inf'))",
        "",
    ),
}
STOPPING = {
    # hangs, stops, kills, floods of processes, threads, memory and stderr; what cannot travel
    "a sleep past the check's limit, its alarm ignored": (
        "pearson",
        """
        import signal, time
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        time.sleep(600)
        """,
        "stopped: timed out",
    ),
    "a sleeper holding the pipes": (
        "auc",
        """
        import subprocess, sys
        subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)
        return 0.5
        """,
        "",
    ),
    "the fork stopped (SIGSTOP)": (
        "mean_pool",
        """
        import os, signal
        os.kill(os.getpid(), signal.SIGSTOP)
        """,
        "stopped",
    ),
    "the student's process stopped (SIGSTOP)": (
        "distillation",
        """
        import os, signal
        os.kill(os.getppid(), signal.SIGSTOP)
        return 0.0
        """,
        "stopped",
    ),
    "the student's process killed": (
        "symmetric_kl",
        """
        import os, signal
        os.kill(os.getppid(), signal.SIGKILL)
        return 0.0
        """,
        "",
    ),
    "a fork flood": (
        "pair_head",
        """
        import os, time
        for _ in range(400):
            try:
                if os.fork() == 0:
                    time.sleep(120)
                    os._exit(0)
            except OSError:
                break
        return 0.0
        """,
        "",
    ),
    "a thread flood": (
        "simcse",
        """
        import threading, time
        for _ in range(300):
            try:
                threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
            except RuntimeError:
                break
        return 0.0
        """,
        "",
    ),
    "an exit code of 0 before anything": ("pcgrad", "raise SystemExit(0)", ""),
    "memory asked for past the fork's": ("adamw", "torch.empty(10**10)", "allocate"),
    "a stderr flood": (
        "momentum_teacher",
        """
        import sys
        for _ in range(200):
            sys.stderr.write('x' * (1 << 20))
        """,
        "",
    ),
    "a dict with tensor keys": (
        "smart_ascent",
        "return {torch.zeros(1): 1}",
        "on what your code returned",
    ),
    "a KeyboardInterrupt": ("wordpiece", "raise KeyboardInterrupt", ""),
}


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
    before = {p: p.read_bytes() for p in (root / "source").rglob("*") if p.is_file()}
    started = time.monotonic()
    results = run_autograder(root, Path(sys.executable), MINBERT_CHECK_SECONDS="10")
    seconds = time.monotonic() - started
    time.sleep(2)  # a detached writer's time, were it alive
    assert json.loads((root / "results" / "results.json").read_text()) == results
    assert {p: p.read_bytes() for p in before} == before  # the judge's caches aside
    assert not leftovers()
    tests = {}
    for t in results["tests"]:
        name = t["name"].split(":")[0]
        score, said = tests.get(name, (0, ""))
        tests[name] = (score + t["score"], f"{said} {t['output']}")
    return results, seconds, tests


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
