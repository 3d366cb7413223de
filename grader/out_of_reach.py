"""No points for an import: while the student's code runs for an exercise, each function
that computes its answer is out of its reach. The grader's own definitions, references and
mt-dnn's transcription, and the library functions a check names (`@check(answers=...)`:
scipy's pearsonr for pearson, sklearn's roc_auc_score for auc, torch's Adam update for
adamw), run a refusal under every name they were imported by: their code is swapped, so
`from scipy.stats import pearsonr` atop a module, imported before grading, is caught too.
The grader's own modules are not imported anew. A refusal the code catches still counts:
the exercise is an error naming the function. Compiled functions (torch's fused kernels)
cannot be swapped this way; numpy's and torch's primitives stay allowed.
"""

import contextlib
import importlib
import sys
import types
from collections.abc import Callable
from pathlib import Path

OWN = ("definitions", "references", "mtdnn_smart")  # the grader's modules that hold answers
ANSWERS: dict[str, tuple[str, ...]] = {}  # exercise -> "module:function"s that compute its answer


class Refused(Exception):
    """The student's code called a function that computes its exercise's answer."""


@contextlib.contextmanager
def out_of_reach(name: str, refused: list):
    """While the student's code runs for exercise `name`, each function that computes its
    answer (`answers`) runs a refusal, under every name it was imported by (its code is
    swapped: `from scipy.stats import pearsonr` atop a module is caught too), and the
    grader's own modules are not imported anew. A refusal raises Refused, naming the
    exercise, kept in `refused`; afterwards every function is as it was."""

    def refuse(label):
        refused.append(
            Refused(
                f"exercise {name}: {label} computes its answer: no points for calling it; write it yourself"
            )
        )
        raise refused[-1]

    found = answers(name)
    saved = {fn: fn.__code__ for fn, _ in found}
    for fn, label in found:
        code = refusal.__code__
        consts = [(refuse, label) if c == ("refuse", "label") else c for c in code.co_consts]
        fn.__code__ = code.replace(co_consts=tuple(consts))
    finder = types.SimpleNamespace(find_spec=lambda fullname, *_: unimportable(fullname, refuse))
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if f is not finder]
        for fn, code in saved.items():
            fn.__code__ = code


def answers(name: str) -> list[tuple[types.FunctionType, str]]:
    """(function, its name) of each that computes exercise `name`'s answer: those the
    grader's definitions, references and mtdnn_smart define, however imported, and
    ANSWERS[name], each with the functions it wraps; those without a closure (a wrapper
    calls the function it wraps, and a method calling super() leaves its class's others)."""
    found = []
    for module in list(sys.modules.values()):
        file = str(getattr(module, "__file__", None))
        if file.endswith(".py") and file[:-3].endswith(OWN) and Path(file).parent.name == "grader":
            found += defined_in(module, f"the grader's {Path(file).stem}")
    for where, _, function in (spec.partition(":") for spec in ANSWERS.get(name, ())):
        with contextlib.suppress(ImportError):
            found.append(
                (getattr(importlib.import_module(where), function, None), f"{where}.{function}")
            )
    out = []
    for fn, label in found:
        while isinstance(fn, types.FunctionType):
            out += [(fn, label)] * (not fn.__code__.co_freevars)
            fn = getattr(fn, "__wrapped__", None)
    return out


def defined_in(module, named: str) -> list[tuple[types.FunctionType, str]]:
    """The functions a module defines, its classes' methods too, each with its name."""
    found = []
    for value in list(vars(module).values()):
        for f in vars(value).values() if isinstance(value, type) else [value]:
            f = getattr(f, "__func__", f)  # a staticmethod's, a classmethod's
            if isinstance(f, types.FunctionType) and f.__module__ == module.__name__:
                found.append((f, f"{named}.{f.__qualname__}"))
    return found


def refusal(*args, **kwargs):
    """The code a function that computes an answer runs while the student's code does, its
    constant ("refuse", "label") swapped for the refusal and the function's name."""
    refuse, label = "refuse", "label"
    return refuse(label)


def unimportable(fullname: str, refuse: Callable) -> None:
    """An import finder's answer: the grader's own modules (OWN) refused by any name."""
    package, _, last = fullname.rpartition(".")
    if last in OWN and package in ("", "grader"):
        refuse(f"the grader's {last}.py")
