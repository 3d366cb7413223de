"""Shared fixtures: the real data folder (skipped when absent) and a tiny BERT config."""

import os
from pathlib import Path

import pytest

from base_bert import BertConfig

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The CS224n data folder from MINBERT_DATA (CI: ../shared/data), else data/."""
    path = Path(os.environ.get("MINBERT_DATA", REPO / "data"))
    if not path.is_absolute():
        path = REPO / path
    if not (path / "ids-sst-train.csv").is_file():
        pytest.skip(f"no CS224n data in {path}; set MINBERT_DATA")
    return path


@pytest.fixture
def tiny_config() -> BertConfig:
    """A 2-layer BERT small enough for tests that run in milliseconds."""
    return BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
