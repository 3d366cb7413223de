"""The engine: what makes a run robust, apart from what it teaches. A student never needs
to open it.

- flags.py: every setting as a dataclass field, its flag, its check; JSON in and out
- checks.py: what a run's flags cannot do, refused before the run folder is made
- preset_flags.py: a preset under the typed flags; show.py: `--show`, a preset's settings,
  tasks and stages; handout.py: the handout's flags
- plan_data.py: the data a plan reads, and its files
- runtime.py: device, precision, compile, data-parallel shares and gathers, the fast CPU
  dropout, the command-line error wrapper
- runfolder.py: what a run writes; checkpoint.py: safe files, stops and resume;
  resume.py: a stage's place, saved and replayed
- estimate.py: --estimate, a run's minutes from a few timed steps
"""
