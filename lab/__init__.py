"""The lab: tools that serve experiments rather than the model, each run as
`python -m lab.NAME` from the repository's root, or as `python lab/NAME.py` from anywhere.

bench and timing (speed and memory against the references), gpu_check (the checks only a
GPU runs), sweep (Optuna searches), reports (the three CS224n reports' tables), ensemble
(averaged runs), explore and plots (a run's report page, attention, figures, typed
sentences labelled), fetch (the data files), export (a Hugging Face folder, its card, the
Hub), house (the README's picture of where each file lives).
"""
