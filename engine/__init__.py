"""The engine: what makes a run robust, below the lesson. It imports no lesson module and
no command (make lint checks it); the lesson's step and runs use it.

- runtime.py: device, precision, compile, data-parallel shares and gathers, the fast CPU
  dropout
- checkpoint.py: safe files, stops and resume; resume.py: a stage's place, saved and replayed
- tsv.py: the data files read tolerantly, every bad row named by its line
"""
