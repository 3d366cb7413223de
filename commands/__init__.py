"""The commands: what `python multitask_classifier.py`, `python classifier.py` and
`python prepare_submit.py` run, above the lesson. They build a run from flags out of the
lesson's pieces; no lesson module imports them (make lint checks it), except a script
calling its own command from its `if __name__ == "__main__":` block.

- command.py: `python multitask_classifier.py`: its flags, a preset under them, the data a
  plan reads, --resume, --predict, --score, --estimate; classify.py: `python
  classifier.py`, the handout's Part 1; cli.py: the command line, flags parsed and one
  line for a user's slip
- flags.py: each setting of settings.py as a flag, its check; a run's config as JSON
- checks.py: what a run's flags cannot do, refused before the run folder is made
- show.py: `--show`, a preset's settings, tasks and stages; handout.py: the handout's flags
- runner.py: a plan's stages trained and scored in a run folder; runfolder.py: what a run
  writes; outputs.py: the printed table, the selection gap, the prediction files
- estimate.py: --estimate and --fit_minutes, a run's minutes from a few timed steps
- submission.py: prepare_submit.py's checks of the prediction files, and its zip
"""
