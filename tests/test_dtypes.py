"""The dtype is part of every check (grader/harness.py judge): a floating output must have
its run's dtype, and the tolerance is the run's, never the one the dtype the student's
code hands back would give; each low-precision slip fails on both sides."""

import pytest

from test_grader import changes_graded


@pytest.fixture
def grade_changed(tmp_path):
    with changes_graded(tmp_path) as grade:
        yield grade


# A body that hands back a low-precision number: the tolerance is its run's, never its own.
LOW_PRECISION = {
    "pearson": [
        (
            "nothing computed, a float8 zero",
            [
                (
                    'return float(np.sum(dx * dy) / denom) if denom > 0 else float("nan")',
                    "import torch\n    return torch.tensor(0.0).to(torch.float8_e4m3fn)",
                )
            ],
        ),
        (
            "n and n - 1 mixed, in float16",
            [
                (
                    "denom = np.sqrt(np.sum(dx * dx) * np.sum(dy * dy))",
                    "denom = (len(x) - 1) * x.std() * y.std()",
                ),
                (
                    'return float(np.sum(dx * dy) / denom) if denom > 0 else float("nan")',
                    "import torch\n    return torch.tensor(np.sum(dx * dy) / denom).half()",
                ),
            ],
        ),
    ],
    "symmetric_kl": [
        (
            "mt-dnn's SymKlCriterion computed in float32 in a float64 run",
            [
                (
                    "kl_q_p = (lq.detach().exp() * (lq.detach() - lp)).sum(-1)  # P learns",
                    "lp, lq = lp.float(), lq.float()\n"
                    '    kl_q_p = F.kl_div(lp, lq.detach().exp(), reduction="none").sum(-1)',
                ),
                (
                    "kl_p_q = (lp.detach().exp() * (lp.detach() - lq)).sum(-1)  # Q learns",
                    'kl_p_q = F.kl_div(lq, lp.detach().exp(), reduction="none").sum(-1)',
                ),
            ],
        )
    ],
    "auc": [
        (
            "0.5 in bfloat16",
            [
                (
                    "return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))",
                    "import torch\n    return torch.tensor(0.5, dtype=torch.bfloat16)",
                )
            ],
        )
    ],
    "mean_pool": [
        (
            "float8 zeros",
            [
                (
                    "return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)",
                    "return torch.zeros(hidden.shape[0], hidden.shape[2]).to(torch.float8_e4m3fn)",
                )
            ],
        )
    ],
}


@pytest.mark.parametrize("name", sorted(LOW_PRECISION))
def test_a_low_precision_output_gets_no_wider_tolerance(name, grade_changed):
    """The dtype is part of every check: a number or a tensor handed back in float16,
    bfloat16 or float8 fails on both sides, a slip among them."""
    for what, edits in LOW_PRECISION[name]:
        for student in (False, True):
            row = grade_changed(name, edits, student=student)
            assert row["result"] in ("fail", "error"), f"{name}, {what}: {row}"
