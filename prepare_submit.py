"""Your submission: the predictions in the handout's files, checked, zipped with the code.

    python prepare_submit.py RUN_DIR [--part1 RUN_DIR ...]   (make submit RUN=RUN_DIR)
    python prepare_submit.py                                  (the handout's way)

1. With RUN_DIR: the run's six Part 2 files ({sst,para,sts}-{dev,test}-output.csv) and
   each --part1 run's (classifier.py) {pretrain,finetune}-{sst,cfimdb}-{dev,test}-out.csv
   (the 2024 handout's names: last-linear-layer-..., full-model-...) are copied into
   ./predictions/; only these are zipped. Without it: the files of those names already in
   ./predictions/, where the handout's commands write them (the runs that wrote them are
   in ./.predictions.json).
2. Part 1 needs its four files for each option it has, by either name; an option with
   none is one line (the zip still has the rest).
3. Every file is read: the handout's header; a number in range on every row (no NaN);
   only the data file's ids, each as often as the file has it; every test id, and every
   dev id the data reader keeps (a dev row without a usable label is not scored, by the
   handout's reader either: one line gives their count). A gap names the command that
   fills it.
4. A run that started from MiniLM is refused: it was trained on Quora and NLI pairs, and
   the handout allows no outside pre-trained model. --allow_outside_pretraining says you
   know (the offline demo).
5. cs224n_default_final_project_submission.zip holds every top-level .py, engine/*.py and
   commands/*.py (the code imports them) and the checked prediction files, as the handout's zipper writes them.
"""

import sys

if __name__ == "__main__":  # the command: its flags, checks and zip (commands/submission.py)
    from commands.cli import run_cli
    from commands.submission import main

    run_cli(main, sys.argv[1:])
