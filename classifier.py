"""Single-task sentiment classification: the CS224n handout's Part 1 (the thesis's Phase 1).

BertSentimentClassifier is the handout's model, by its name: BERT, dropout on the pooled
[CLS] vector, one linear layer onto the task's classes (SST-5: 5, CFIMDB: 2). Its forward
is the `classifier` exercise; it reads without Part 2 (multitask_classifier.py).
- `--option pretrain` (2023's default; 2024: `--fine-tune-mode last-linear-layer`, its
  default): BERT frozen, only the linear layer learns (lr 1e-3 unless --lr);
- `--option finetune` (2024: `--fine-tune-mode full-model`): every parameter learns
  (--lr, default 1e-5).
The other defaults are the handout's classifier.py's: 10 epochs, batch 8 (CFIMDB always at
most 8), dropout 0.3, up to 512 tokens, seed 11711; the handout trains in float32, this
command in --precision (auto: bf16 where the device multiplies it natively, the first line
says which). The
command (commands/classify.py) trains it with the one training loop, one stage per epoch, the
best dev accuracy kept. As the handout's command does, one run trains SST, then CFIMDB (`--task` picks one),
and writes predictions/{option}-{sst|cfimdb}-{dev|test}-out.csv, named by the word typed
(2023: pretrain, finetune; 2024: last-linear-layer, full-model), into each task's run
folder and into ./predictions/ (--predictions_dir), where prepare_submit.py finds them.

    python classifier.py --option finetune --use_gpu --epochs 10 --lr 1e-5
    python classifier.py --fine-tune-mode full-model --use_gpu --lr 1e-5
"""

import torch  # noqa: F401  (the handout's import: the exercise's body may use it)
from torch import nn

from bert import BertModel
from optimizer import AdamW
from settings import OptimConfig


class BertSentimentClassifier(nn.Module):
    """The handout's Part 1 model: BERT, dropout on the sentence's pooled [CLS] vector, one
    linear layer onto the task's C classes (SST: 5, CFIMDB: 2)."""

    def __init__(self, config):
        """config (the handout's): num_labels, hidden_size, hidden_dropout_prob; and bert,
        the checkpoint to load (a folder, 'minilm' or a hub name), with its attention
        (bert.py). Frozen or fine-tuned, BERT's parameters are set by each stage
        (trainer.train_stage)."""
        super().__init__()
        self.num_labels = config.num_labels
        self.bert = BertModel.from_pretrained(config.bert, attention=config.attention)
        self.hidden_dropout_prob = config.hidden_dropout_prob
        # BEGIN EXERCISE classifier: the layers that make BERT's pooled [CLS] vector into num_labels logits: dropout (config.hidden_dropout_prob), a linear layer
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, self.num_labels)
        # END EXERCISE classifier

    def forward(self, input_ids, attention_mask):
        """(B, T) token ids and mask -> (B, C) logits: F.cross_entropy's input, no softmax."""
        # BEGIN EXERCISE classifier: BERT's pooled [CLS] vector (its "pooler_output"), dropout, then the linear layer: (B, C) logits
        cls = self.bert(input_ids, attention_mask)["pooler_output"]  # (B, H)
        return self.classifier(self.dropout(cls))  # (B, C)
        # END EXERCISE classifier

    # How the one training loop (trainer.train_step: embed -> sentences -> readout) and the
    # evaluation (model.predict) read this model: forward is whole, so its logits stand
    # where a multitask model's pooled sentences stand, and nothing is perturbed (no SMART).
    cosine = ()  # no pair task cut by a threshold (evaluation.fit_thresholds)

    def embed(self, batch):
        return None

    def sentences(self, batch, embeds=None):
        return self(batch["input_ids"], batch["attention_mask"])  # (B, C) logits

    def readout(self, task, batch, logits):
        return logits

    def predict(self, task, batch):
        return self(batch["input_ids"], batch["attention_mask"])

    def checkpoint_config(self) -> dict:
        """What a checkpoint must match to load into this model."""
        bert = {k: v for k, v in self.bert.config.to_dict().items() if k != "attention"}
        return {"bert": bert, "classes": self.num_labels, "dropout": self.hidden_dropout_prob}

    def configure_optimizers(self, cfg: OptimConfig) -> AdamW:
        """AdamW over every parameter at one learning rate, as the handout's classifier.py:
        a frozen BERT has no gradients, and AdamW skips it."""
        return AdamW(
            self.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=cfg.foreach_adamw
        )


if __name__ == "__main__":  # the command: flags, run folder (commands/classify.py)
    from commands.classify import main
    from commands.cli import run_cli

    run_cli(main)
