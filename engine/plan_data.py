"""What a run reads: the data sets a plan trains and scores on, and the files behind them,
checked before a run folder is made."""

from pathlib import Path

import datasets as data
from datasets import CONTRASTIVE
from engine.flags import RunConfig
from evaluation import MULTITASK
from presets import Stage


def plan_data(cfg: RunConfig, stages: list[Stage], tokenizer) -> dict:
    """Every split a run scores, and the training sets its stages train on."""
    cross = cfg.multitask.cross_encode
    trained = {t for s in stages for t in s.tasks}
    task_data = data.load_task_data(cfg.data, tokenizer, MULTITASK, cfg.seed, trained, cross)
    contrastive = [s.contrastive for s in stages if s.kind == CONTRASTIVE]
    if contrastive:
        s = contrastive[0]
        task_data[CONTRASTIVE] = data.load_contrastive_data(
            cfg.data, tokenizer, s.simcse_loss, s.simcse_data, cfg.seed
        )
    return task_data


def plan_files(cfg: RunConfig, stages: list[Stage]) -> list[Path]:
    """The files plan_data will read for these stages (checked before a folder is made)."""
    trained = {t for s in stages for t in s.tasks}
    contrastive = [s.contrastive.simcse_data for s in stages if s.kind == CONTRASTIVE]
    return data.files_read(cfg.data, MULTITASK, trained, (contrastive or [None])[0])


# ---------------------------------------------------------------------------------------
# Named plans
