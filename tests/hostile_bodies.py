"""The hostile class's bodies (tests/test_hostile.py grades them through the archive):
each an exercise's body that tries to score without the answer, by forging results,
reaching the TA's or Gradescope's files, calling what computes the answer, patching what
judges it, handing back odd values, or stopping, flooding and hanging the grade."""

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
    # Gradescope's own files read, the grader's definitions called, files left where any user
    # may write
    "Gradescope's metadata read": (
        "attention",
        "raise ValueError(open('../submission_metadata.json').read())",
        "PermissionError",
    ),
    "the grader's definitions called": (
        "sbert",
        "return __import__('definitions').mean_pool(*[__import__('torch').ones(1, 2)] * 2)",
        "computes its answer",
    ),
    "files left in memory and the temp folder": (
        "classifier",
        """
        for folder in ('/dev/shm', __import__('tempfile').gettempdir()):
            open(folder + '/minbert-left', 'wb').write(b'x' * (8 << 20))
        """,
        "",
    ),
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
