"""The CS224n handout's Part 2: MultitaskBERT, one BERT for three tasks, and the command
`python multitask_classifier.py` that trains a model on them.

MultitaskBERT is the handout's, by its names: its design is yours (the heads in __init__,
forward's embeddings, the three predict_*), and the `handout` preset trains it. Its
outputs:
    predict_sentiment(ids, mask)             (B, 5) logits, SST-5's classes
    predict_paraphrase(ids1, m1, ids2, m2)   (B,) one logit each (> 0: a paraphrase)
    predict_similarity(ids1, m1, ids2, m2)   (B,) a similarity, scored by its Pearson r
This project's own model, on the same encoder, is Sentence-BERT (sbert.py); every other
preset trains that one.

Training is a plan: a list of stages (presets.Stage), each trained by trainer.train_stage;
the command (commands/command.py: flags, run folder, --resume) runs a preset's plans.
Each preset (presets.py) is a named plan; the thesis ("SMART-SBERT with SimCSE: a robust
defense against catastrophic forgetting") trains sequentially: one QQP epoch, then loops of
STS -> SST -> a fresh 3% of QQP, keeping the model with the best overall dev score. After
every stage all three dev sets are scored: one row of the forgetting table.

    python multitask_classifier.py --option finetune --lr 1e-5    # the handout's run
    python multitask_classifier.py                    # thesis preset, bert-base-uncased
    python multitask_classifier.py --preset sequential --bert minilm
    python multitask_classifier.py --preset defended --show   # what it trains, stage by stage
    python multitask_classifier.py --preset demo --score      # the untrained model's dev row
    python multitask_classifier.py --resume runs/thesis-...
"""

import torch
import torch.nn.functional as F  # noqa: F401  (the handout's import: your bodies may use it)
from torch import nn

from bert import BertModel
from optimizer import AdamW
from settings import OptimConfig

BERT_HIDDEN_SIZE = 768  # the handout's: bert-base's width (a run sets its checkpoint's)
N_SENTIMENT_CLASSES = 5


class MultitaskBERT(nn.Module):
    """The handout's model: BERT for 3 tasks, sentiment classification (predict_sentiment),
    paraphrase detection (predict_paraphrase) and semantic textual similarity
    (predict_similarity)."""

    def __init__(self, config):
        """config (the handout's): hidden_size, hidden_dropout_prob, option (2024:
        fine_tune_mode); and bert, the checkpoint to load, with its attention (bert.py).
        Frozen or fine-tuned, BERT's parameters are set by each stage (trainer.train_stage)."""
        super().__init__()
        self.bert = BertModel.from_pretrained(config.bert, attention=config.attention)
        # BEGIN EXERCISE multitask: the layers of your three tasks' heads, e.g. dropout (config.hidden_dropout_prob), a linear layer onto SST's 5 classes, one on a pair's [u, v] for each pair task
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.sentiment = nn.Linear(BERT_HIDDEN_SIZE, N_SENTIMENT_CLASSES)
        self.paraphrase = nn.Linear(2 * BERT_HIDDEN_SIZE, 1)
        self.similarity = nn.Linear(2 * BERT_HIDDEN_SIZE, 1)
        # END EXERCISE multitask

    def forward(self, input_ids, attention_mask):
        """Takes a batch of sentences, (B, T), and produces embeddings for them."""
        # BEGIN EXERCISE multitask: the sentences' embeddings, e.g. BERT's pooled [CLS] vector (its "pooler_output"): (B, H)
        return self.bert(input_ids, attention_mask)["pooler_output"]  # (B, H)
        # END EXERCISE multitask

    def predict_sentiment(self, input_ids, attention_mask):
        """(B, T) ids and mask -> (B, 5) logits, SST's classes (0 negative ... 4 positive)."""
        # BEGIN EXERCISE multitask: 5 logits per sentence, unnormalized (no softmax): (B, 5)
        return self.sentiment(self.dropout(self(input_ids, attention_mask)))  # (B, 5)
        # END EXERCISE multitask

    def predict_paraphrase(self, input_ids_1, attention_mask_1, input_ids_2, attention_mask_2):
        """Two sentences per pair, (B, T1) and (B, T2) -> (B,) logits: unnormalized, the
        evaluation's sigmoid and the loss take them as logits (> 0: a paraphrase)."""
        # BEGIN EXERCISE multitask: one logit per pair from both sentences' embeddings: (B,)
        u = self.dropout(self(input_ids_1, attention_mask_1))  # (B, H)
        v = self.dropout(self(input_ids_2, attention_mask_2))  # (B, H)
        return self.paraphrase(torch.cat([u, v], -1)).squeeze(-1)  # (B, 2H) -> (B,)
        # END EXERCISE multitask

    def predict_similarity(self, input_ids_1, attention_mask_1, input_ids_2, attention_mask_2):
        """Two sentences per pair, (B, T1) and (B, T2) -> (B,) similarities, unnormalized:
        trained toward STS's 0-5 scores, judged by their Pearson correlation."""
        # BEGIN EXERCISE multitask: one similarity per pair from both sentences' embeddings: (B,)
        u = self.dropout(self(input_ids_1, attention_mask_1))  # (B, H)
        v = self.dropout(self(input_ids_2, attention_mask_2))  # (B, H)
        return self.similarity(torch.cat([u, v], -1)).squeeze(-1)  # (B, 2H) -> (B,)
        # END EXERCISE multitask

    # How the one training loop (trainer.train_step: embed -> sentences -> readout) and the
    # evaluation (model.predict) read this model: through predict_*, whole, so nothing is
    # perturbed (no SMART) and no sentence embedding is kept (no SimCSE). A pair batch holds
    # both sides as (2, B, T), the shorter padded.
    cosine = ()  # no pair task cut by a threshold (evaluation.fit_thresholds)

    def embed(self, batch):
        return None

    def sentences(self, batch, embeds=None):
        return None

    def readout(self, task, batch, sentences):
        return self.predict(task, batch)

    def predict(self, task, batch):
        """The output of `task`'s predict_*: (B, 5) logits, or (B,) for a pair task, each
        side cut to its own longest sentence."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        if task == "sst":
            return self.predict_sentiment(ids, mask)
        pair = {"para": self.predict_paraphrase, "sts": self.predict_similarity}[task]
        T1, T2 = mask.sum(-1).amax(-1).tolist()  # (2, B, T) -> each side's longest
        out = pair(ids[0, :, :T1], mask[0, :, :T1], ids[1, :, :T2], mask[1, :, :T2])
        return out.reshape(ids.size(1))  # (B, 1) or (B,) -> (B,)

    def checkpoint_config(self) -> dict:
        """What a checkpoint must match to load into this model."""
        bert = {k: v for k, v in self.bert.config.to_dict().items() if k != "attention"}
        return {"bert": bert, "model": "multitask_classifier.MultitaskBERT"}

    def configure_optimizers(self, cfg: OptimConfig) -> AdamW:
        """AdamW over every parameter at one learning rate, as the handout's
        multitask_classifier.py: a frozen BERT has no gradients, and AdamW skips it."""
        return AdamW(
            self.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=cfg.foreach_adamw
        )


if __name__ == "__main__":  # the command: flags, run folder, resume (commands/command.py)
    from commands.cli import run_cli
    from commands.command import main

    run_cli(main)
