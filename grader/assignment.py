"""A student's copy's ASSIGNMENT.md: the CS224n handouts a copy follows (2023, 2024), the
exercises that hold their TODOs, and the page `python exercises.py make` writes."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Handout:
    """A CS224n handout a copy follows: where it is, and its flag for a frozen or a
    fine-tuned BERT on classifier.py and multitask_classifier.py, with its two words."""

    repo: str
    flag: str
    frozen: str
    full: str


HANDOUTS = {
    "2023": Handout("gpoesia/minbert-default-final-project", "--option", "pretrain", "finetune"),
    "2024": Handout(
        "amahankali10/CS224N-Spring2024-DFP-Student-Handout",
        "--fine-tune-mode",
        "last-linear-layer",
        "full-model",
    ),
}
# The handouts' TODOs (the same in both years), by the exercises that hold them: bert.py's
# attention, add_norm and forward, embed; AdamW.step; BertSentimentClassifier.forward;
# MultitaskBERT (its heads, forward and predict_*). The others are this project's.
COURSE = ("attention", "layer", "embeddings", "adamw", "classifier", "multitask")


TABLE = ["| # | exercise | points | where | what it asks |", "| ---: | --- | ---: | --- | --- |"]


def assignment_page(course, project, course_points, project_points, year: str, files) -> str:
    """ASSIGNMENT.md of a student's copy: the open exercises' table rows in the grader's
    order, the course's (the handout's TODOs) apart from the project's; how to set up and
    check them, the handout's own commands, the files to upload."""
    h = HANDOUTS[year]
    extra = (
        [
            f"## This project's exercises ({project_points} points, beyond the handout)",
            "",
            *TABLE,
            *project,
            "",
        ]
        if project
        else []
    )
    return "\n".join(
        [
            "# Your assignment",
            "",
            f"This copy follows the CS224n {year} handout ({h.repo}): {len(course)} of its TODOs",
            f"are open here ({course_points} points), at the handout's places and names, in the",
            'order to do them. Each body raises `NotImplementedError("exercise NAME: hint")` until',
            "you write it, between its `# BEGIN EXERCISE` and `# END EXERCISE` lines.",
            "This project's exercises below are open too; the rest is given."
            if project
            else "Everything else (the tokenizer, SMART, SimCSE, the training step) is given.",
            "",
            f"## The handout's exercises ({course_points} points)",
            "",
            *TABLE,
            *course,
            "",
            *extra,
            *how_to_check(h, files),
        ]
    )


def how_to_check(h: Handout, files: list[str]) -> list[str]:
    """ASSIGNMENT.md's commands: set up, check, and the handout's own, with its flag; the
    files to upload, those the open exercises are written in."""
    return [
        "## Set up once, then check as you go",
        "",
        "```bash",
        "make venv && . .venv/bin/activate  # a .venv with torch; or prefix each line with make",
        "make check                         # every exercise's check, then sanity_check.py",
        "python exercises.py check          # the scorecard; it names the exercise to write next",
        "python exercises.py check -v NAME  # one exercise, every failing part",
        "python exercises.py list           # the order, and what each one calls",
        "make test                          # this copy's tests: open exercises skip",
        "python sanity_check.py             # the handout's check of bert.py",
        "python optimizer_test.py           # the handout's check of AdamW",
        "```",
        "",
        "Each exercise is graded alone: where it calls another, a stand-in answers.",
        "Parts judged against references only the TA holds are left to the TA's grader:",
        "the scorecard shows their points apart, as `+N?` (provisional), never counted.",
        "",
        "## The handout's commands, once the exercises pass",
        "",
        "```bash",
        f"python classifier.py {h.flag} {h.frozen}   # Part 1, BERT frozen: predictions/{h.frozen}-sst-dev-out.csv, ...",
        f"python classifier.py {h.flag} {h.full} --lr 1e-5   # Part 1, fine-tuned",
        f"python multitask_classifier.py {h.flag} {h.full} --lr 1e-5   # Part 2: the handout's run",
        "python prepare_submit.py          # the code and predictions/, zipped for Gradescope",
        "```",
        "",
        f"Upload to Gradescope the files your exercises are written in: {', '.join(files)}",
        "(anything else is not graded; a file left out is graded as given, its exercises open).",
        "",
    ]
