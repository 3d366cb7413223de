"""The references' libraries, each imported once in a grade's process rather than in
every fork or check: the judge's, those of the checks it judges (while the student's side
runs, or before a check with a value to judge; one missing here is imported when its check
first reads it); the student's, those whose functions out_of_reach swaps, and torch._dynamo,
which torch.optim.Optimizer's methods import at their first call (3 s a fork). The BERT
checks' weights and stand-ins on the student's side are torch's alone (tiny_bert.py)."""

import contextlib

JUDGE_LIBRARIES = {  # library: the checks whose references it holds
    "transformers.models.bert.modeling_bert": ("attention", "layer", "embeddings"),
    "transformers.models.bert.tokenization_bert": ("wordpiece",),
    "scipy.stats": ("pearson",),
    "sklearn.metrics": ("auc",),
}
STUDENT_LIBRARIES = ("scipy.stats", "sklearn.metrics", "torch._dynamo")


def libraries_of(names: list[str]) -> list[str]:
    """The references' libraries of these checks (JUDGE_LIBRARIES)."""
    return [lib for lib, used in JUDGE_LIBRARIES.items() if set(used) & set(names)]


def libraries_first(libraries) -> None:
    """Import these libraries (those missing: each check that needs one says so)."""
    for library in libraries:
        with contextlib.suppress(ModuleNotFoundError):
            __import__(library)
