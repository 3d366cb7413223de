"""A tiny BERT with a linear classifier on it, and a batch of its inputs: the model SMART's tests
(test_smart.py, test_smart_training.py) perturb and train."""

import torch
from torch import nn

from base_bert import BertConfig
from bert import BertModel
from conftest import tiny_bert_config

TOL = 1e-6


def tiny_bert(seed: int = 0, dropout: float = 0.0) -> BertModel:
    torch.manual_seed(seed)
    small = {"vocab_size": 50, "max_position_embeddings": 16}  # the suite's tiny BERT, smaller
    dropouts = {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    return BertModel(BertConfig(**tiny_bert_config().to_dict() | small | dropouts))


class TinyClassifier(nn.Module):
    """Tiny BERT + a linear head on the pooled [CLS]: what the loop's heads look like."""

    def __init__(self, seed: int = 0, n_out: int = 3, dropout: float = 0.0):
        super().__init__()
        self.bert = tiny_bert(seed, dropout)
        self.head = nn.Linear(32, n_out)

    def head_on(self, embeds, mask):  # (B, T, H) -> (B, n_out)
        return self.head(self.bert.encode(embeds, mask)["pooler_output"])

    def forward(self, ids, mask):
        return self.head_on(self.bert.embed(ids), mask)


def batch(B: int = 4, T: int = 7, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 50, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 5:] = 0  # two rows with padding
    mask[2, 3:] = 0
    return ids * mask, mask
