"""How far SST gets without moving the encoder, for docs/demo.md ("What bounds the held-out AUC").

It embeds the SST training and dev sentences with the untouched MiniLM (mean pooling over
the real tokens, float32, eval mode, at most 64 tokens as --preset demo), then fits heads
on the 8,544 training embeddings and prints each one's dev accuracy: logistic regression
(sklearn, C in 0.1, 1, 10, on the raw and on unit-length embeddings) and an MLP with one
hidden layer (256 units, ReLU, dropout 0.1, Adam at 1e-3, batch 64, 40 epochs, seed 0;
its best epoch on dev). Every choice is read off the dev set, so each number is if
anything optimistic.

Run from the repository root (7.5 minutes on a 2-core CPU that another run shared):

    python docs/scripts/sst_probe.py [--data_dir DATA]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import numpy as np  # noqa: E402
import torch  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402

import datasets as data  # noqa: E402
from bert import BertModel, mean_pool  # noqa: E402
from tokenizer import BertTokenizer  # noqa: E402

MAX_LENGTH = 64  # --preset demo's


@torch.no_grad()
def embed(model, tok, sentences: list[str]) -> np.ndarray:
    """(N, H) mean-pooled embeddings, in batches of similar length."""
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    out = np.empty((len(sentences), model.config.hidden_size), dtype=np.float32)
    for start in range(0, len(order), 128):
        rows = order[start : start + 128]
        enc = tok([sentences[i] for i in rows], max_length=MAX_LENGTH)
        hidden = model(enc["input_ids"], enc["attention_mask"])["last_hidden_state"]
        out[rows] = mean_pool(hidden, enc["attention_mask"]).numpy()
    return out


def mlp_accuracy(x, y, x_dev, y_dev, epochs=40) -> float:
    """Best dev accuracy over the epochs of a one-hidden-layer MLP."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(x.shape[1], 256),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(256, 5),
    )
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y, x_dev = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(x_dev)
    best = 0.0
    for _ in range(epochs):
        net.train()
        for idx in torch.randperm(len(x)).split(64):
            loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            best = max(best, (net(x_dev).argmax(-1).numpy() == y_dev).mean())
    return float(best)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_dir", default=None, help="default $MINBERT_DATA, else data/")
    args = parser.parse_args(argv)
    folder = data.data_dir(args.data_dir)
    train, dev = (data.read_task(folder, "sst", split) for split in ("train", "dev"))
    tok = BertTokenizer.from_pretrained("minilm")
    model = BertModel.from_pretrained("minilm").eval()
    x, x_dev = (embed(model, tok, [e.sentence for e in s]) for s in (train, dev))
    y, y_dev = (np.array([e.label for e in s]) for s in (train, dev))
    print(f"SST: {len(train)} training and {len(dev)} dev sentences, the untouched encoder")
    print("| head | dev accuracy |")
    print("| --- | ---: |")
    unit = {
        "raw": lambda a: a,
        "unit length": lambda a: a / np.linalg.norm(a, axis=1, keepdims=True),
    }
    for name, f in unit.items():
        for c in (0.1, 1, 10):
            clf = LogisticRegression(C=c, max_iter=2000).fit(f(x), y)
            print(f"| logistic regression, {name}, C = {c} | {clf.score(f(x_dev), y_dev):.3f} |")
    print(f"| MLP, one hidden layer of 256 | {mlp_accuracy(x, y, x_dev, y_dev):.3f} |")


if __name__ == "__main__":
    main()
