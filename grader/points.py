"""Each exercise's points: the one file a TA edits to weigh them. exercises.py reads it
(without importing it) for the scorecard, Gradescope's results.json and `list`.

    points   what the exercise is worth
    held     of those, what its held parts are worth: the parts judged against
             references.py, which only the TA's grader holds. On Gradescope they are a test
             of their own, shown after the due date; in a student's copy they are
             provisional and never counted.
    partial  True: each part earns its share of its side's points; False: all or nothing.
             PARTIAL is every exercise's default; an exercise may set its own.
"""

PARTIAL = False

POINTS = {
    # the handout's TODOs (exercises.py COURSE): 18 points
    "attention": {"points": 4, "held": 1},
    "layer": {"points": 3, "held": 0},
    "embeddings": {"points": 2, "held": 0},
    "adamw": {"points": 4, "held": 1},
    "classifier": {"points": 2, "held": 0},
    "multitask": {"points": 3, "held": 0},
    # the project's
    "multitask_step": {"points": 3, "held": 0},
    "wordpiece": {"points": 3, "held": 0},
    "adamw_foreach": {"points": 2, "held": 1},
    "mean_pool": {"points": 2, "held": 0},
    "pair_head": {"points": 2, "held": 0},
    "sbert": {"points": 2, "held": 0},
    "symmetric_kl": {"points": 2, "held": 1},
    "smart_ascent": {"points": 3, "held": 2},
    "momentum_teacher": {"points": 2, "held": 1},
    "simcse": {"points": 2, "held": 1},
    "pcgrad": {"points": 2, "held": 1},
    "distillation": {"points": 2, "held": 1},
    "pearson": {"points": 1, "held": 0},
    "auc": {"points": 1, "held": 0},
}
