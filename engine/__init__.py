"""The engine: what makes a run robust, apart from what it teaches. A student never needs
to open it.

Its core imports no lesson module (make lint checks it):
- runtime.py: device, precision, compile, data-parallel shares and gathers, the fast CPU
  dropout
- checkpoint.py: safe files, stops and resume; resume.py: a stage's place, saved and replayed
- tsv.py: the data files read tolerantly, every bad row named by its line

The files that build a run from flags out of the lesson's pieces (.ci/lint.py's BUILDERS):
- command.py: `python multitask_classifier.py`: its flags, a preset under them, the data a
  plan reads, --resume, --predict, --score, --estimate; classify.py: `python
  classifier.py`, the handout's Part 1; cli.py: the command line, flags
  parsed and one line for a user's slip
- flags.py: every setting as a dataclass field, its flag, its check; JSON in and out
- checks.py: what a run's flags cannot do, refused before the run folder is made
- show.py: `--show`, a preset's settings, tasks and stages; handout.py: the handout's flags
- runner.py: a plan's stages trained and scored in a run folder; runfolder.py: what a run
  writes; outputs.py: the printed table, the selection gap, the prediction files
- estimate.py: --estimate, a run's minutes from a few timed steps
- submission.py: prepare_submit.py's checks of the prediction files, and its zip
"""
