"""BERT, written out: multi-head self-attention, transformer layers, embeddings, pooler.

Devlin et al., 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding"; the attention is Vaswani et al., 2017. Parameter names are exactly those
of Hugging Face's BertModel, so a checkpoint loads by name (base_bert.hf_to_ours), but
one layer is one small class here instead of five.

Two entry points matter besides `forward`: `embed` (token ids -> embedding output) and
`encode` (embedding output -> hidden states), so a regularizer such as SMART can
perturb the embedding output and run the rest of the network on it.
"""

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from base_bert import (
    BertConfig,
    ModelError,
    is_bert_weight,
    load_config,
    load_into,
    load_state_dict,
    resolve_model_dir,
)


class BertSelfAttention(nn.Module):
    """Multi-head self-attention: project to queries, keys, values; attend per head."""

    def __init__(self, config: BertConfig):
        super().__init__()
        H = config.hidden_size
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = H // config.num_attention_heads
        self.query = nn.Linear(H, H)
        self.key = nn.Linear(H, H)
        self.value = nn.Linear(H, H)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.kind = config.attention  # "manual", "sdpa", or "auto" (below)
        # "auto" takes torch's fused SDPA on a GPU only where the engine found it equal to
        # `attention` below on a probe (engine.runtime.check_attention): an edit here runs
        self.sdpa_checked = False

    def split_heads(self, x):
        """(B, T, H) -> (B, nh, T, hs): each head's slice of the hidden vector."""
        # BEGIN EXERCISE attention: split (B, T, H) into heads: (B, nh, T, hs)
        B, T, _ = x.shape
        x = x.view(B, T, self.num_attention_heads, self.attention_head_size)  # (B, T, nh, hs)
        return x.transpose(1, 2)  # (B, nh, T, hs)
        # END EXERCISE attention

    def merge_heads(self, x):
        """(B, nh, T, hs) -> (B, T, H): the heads side by side again."""
        # BEGIN EXERCISE attention: merge the heads back: (B, nh, T, hs) -> (B, T, H)
        B, _, T, _ = x.shape
        return x.transpose(1, 2).reshape(B, T, -1)  # (B, T, nh, hs) -> (B, T, H)
        # END EXERCISE attention

    def attention(self, q, k, v, mask):
        """Scaled dot-product attention by hand; returns (output, probabilities).

        q, k, v: (B, nh, T, hs); mask: (B, 1, 1, T) additive (0 keep, very negative drop).
        """
        # BEGIN EXERCISE attention: softmax(q k^T / sqrt(hs) + mask) over the keys; dropout, then times v; return (out, probs)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, nh, T, T)
        probs = F.softmax(scores + mask, dim=-1)  # (B, nh, T, T), each row sums to 1
        out = self.dropout(probs) @ v  # (B, nh, T, hs)
        return out, probs
        # END EXERCISE attention

    def forward(self, x, mask, probs: list | None = None):
        """x: (B, T, H); mask: (B, 1, 1, T) additive. probs: a list to append this layer's
        attention probabilities (B, nh, T, T) to (the hand-written attention then runs)."""
        q, k, v = (self.split_heads(f(x)) for f in (self.query, self.key, self.value))
        auto = self.kind == "auto" and x.is_cuda and self.sdpa_checked
        if (self.kind == "sdpa" or auto) and probs is None:  # fused, the same math (probed)
            p = self.dropout.p if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        else:
            out, a = self.attention(q, k, v, mask)  # (B, nh, T, hs), (B, nh, T, T)
            if probs is not None:
                probs.append(a.detach())
        return self.merge_heads(out)  # (B, T, H)


def add_norm_block(d_in: int, config: BertConfig) -> nn.ModuleDict:
    """A sublayer's output block: dense, dropout, LayerNorm (HF's names), used by add_norm."""
    return nn.ModuleDict(
        {
            "dense": nn.Linear(d_in, config.hidden_size),
            "LayerNorm": nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps),
            "dropout": nn.Dropout(config.hidden_dropout_prob),
        }
    )


class BertLayer(nn.Module):
    """One transformer layer: self-attention, then a GELU feed-forward, each closed by
    add_norm. The ModuleDicts only reproduce HF's parameter names (`attention.self.query`,
    `attention.output.dense`, `intermediate.dense`, `output.dense`)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        H, inner = config.hidden_size, config.intermediate_size
        self.attention = nn.ModuleDict(
            {"self": BertSelfAttention(config), "output": add_norm_block(H, config)}
        )
        self.intermediate = nn.ModuleDict({"dense": nn.Linear(H, inner)})
        self.output = add_norm_block(inner, config)

    def add_norm(self, input, output, dense_layer, dropout, ln_layer):
        """A sublayer's close (post-LN): dense the sublayer's `output`, drop out, add the
        sublayer's `input` (the residual), LayerNorm."""
        # BEGIN EXERCISE layer: dense, dropout, add the residual, LayerNorm (post-LN)
        return ln_layer(input + dropout(dense_layer(output)))
        # END EXERCISE layer

    def forward(self, x, mask, probs: list | None = None):
        """x: (B, T, H); mask: (B, 1, 1, T) additive -> (B, T, H)."""
        att, out = self.attention["output"], self.output
        # BEGIN EXERCISE layer: self-attention then add_norm; GELU feed-forward (intermediate) then add_norm
        h = self.attention["self"](x, mask, probs)  # (B, T, H)
        a = self.add_norm(x, h, att["dense"], att["dropout"], att["LayerNorm"])  # (B, T, H)
        h = F.gelu(self.intermediate["dense"](a))  # (B, T, I), exact erf GELU
        return self.add_norm(a, h, out["dense"], out["dropout"], out["LayerNorm"])  # (B, T, H)
        # END EXERCISE layer


def embeddings_block(config: BertConfig) -> nn.ModuleDict:
    """The three embedding tables, their LayerNorm and dropout, under HF's names
    (`embeddings.word_embeddings`, ...); BertModel.embed adds them up."""
    H = config.hidden_size
    return nn.ModuleDict(
        {
            "word_embeddings": nn.Embedding(config.vocab_size, H, padding_idx=config.pad_token_id),
            "position_embeddings": nn.Embedding(config.max_position_embeddings, H),
            "token_type_embeddings": nn.Embedding(config.type_vocab_size, H),
            "LayerNorm": nn.LayerNorm(H, eps=config.layer_norm_eps),
            "dropout": nn.Dropout(config.hidden_dropout_prob),
        }
    )


class BertModel(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = embeddings_block(config)
        self.encoder = nn.ModuleDict(
            {"layer": nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))}
        )
        self.pooler = nn.ModuleDict({"dense": nn.Linear(config.hidden_size, config.hidden_size)})
        self.apply(self._init_weights)

    def _init_weights(self, module):
        """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def _check_ids(self, input_ids):
        """Clear errors for ids the embedding tables cannot hold.

        The id range is checked on the CPU only: on a GPU it would make every forward wait
        for the device, and the embedding lookup asserts there by itself.
        """
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {T} is longer than the position table "
                f"({self.config.max_position_embeddings}); truncate with max_length"
            )
        on_cpu = input_ids.device.type == "cpu"
        if (
            on_cpu
            and input_ids.numel()
            and (input_ids.min() < 0 or input_ids.max() >= self.config.vocab_size)
        ):
            raise ValueError(
                f"token ids must lie in [0, {self.config.vocab_size}); got min "
                f"{int(input_ids.min())}, max {int(input_ids.max())}: tokenizer and model vocab differ?"
            )

    def embed(self, input_ids, token_type_ids=None):
        """(B, T) token ids -> (B, T, H) embedding output: word + position + token type
        embeddings, LayerNorm, dropout. Token types default to 0 (one segment), as the
        handout's placeholder."""
        self._check_ids(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        e = self.embeddings
        # BEGIN EXERCISE embeddings: word + position (0..T-1) + token type embeddings, then LayerNorm, then dropout
        T = input_ids.size(1)
        pos = torch.arange(T, device=input_ids.device)  # (T,), broadcast over the batch
        x = (
            e.word_embeddings(input_ids)  # (B, T, H)
            + e.position_embeddings(pos)  # (T, H)
            + e.token_type_embeddings(token_type_ids)  # (B, T, H)
        )
        return e.dropout(e.LayerNorm(x))
        # END EXERCISE embeddings

    def encode(self, embeds, attention_mask, output_attentions=False):
        """(B, T, H) embedding output and (B, T) mask -> last hidden states and pooled [CLS];
        with output_attentions also 'attentions', one (B, nh, T, T) tensor of probabilities
        per layer, detached: a padded key gets 0, a padded query's row means nothing. They
        come from the hand-written attention, so where that is the model's (the CPU's) the
        other outputs are bit for bit those without them."""
        dtype = (
            embeds.dtype
            if not torch.is_autocast_enabled(embeds.device.type)
            else torch.get_autocast_dtype(embeds.device.type)
        )
        # (B, T) 1/0 -> (B, 1, 1, T) additive mask: 0 where attended, dtype min where padded
        mask = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        x, probs = embeds, [] if output_attentions else None
        for layer in self.encoder["layer"]:
            x = layer(x, mask, probs)
        pooled = torch.tanh(self.pooler["dense"](x[:, 0]))  # (B, H) from the [CLS] position
        out = {"last_hidden_state": x, "pooler_output": pooled}
        return out if probs is None else out | {"attentions": probs}

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return self.encode(self.embed(input_ids, token_type_ids), attention_mask)

    @classmethod
    def from_pretrained(cls, name_or_path: str = "minilm", **overrides) -> "BertModel":
        """Build from a checkpoint folder, 'minilm' (embedded) or a hub name.

        `overrides` change config fields that do not affect weights shapes, such as
        attention='sdpa' or the dropout probabilities. A weight of BERT's that the
        checkpoint lacks stops the load (the pooler's aside); a weight that bert.py adds to
        BERT's keeps its initialisation, named in one line.
        """
        model_dir = resolve_model_dir(name_or_path)
        model = cls(load_config(model_dir, **overrides))
        report = load_into(model, load_state_dict(model_dir), source=str(model_dir))
        untrained = [k for k in report["missing"] if is_bert_weight(k) and "pooler." not in k]
        if untrained:  # the encoder would train from random weights: never what was meant
            raise ModelError(
                f"{model_dir}: the weights lack {len(untrained)} of the model's tensors, e.g. "
                f"{', '.join(untrained[:3])}; does config.json match the checkpoint?"
            )
        new = [k for k in report["missing"] if not is_bert_weight(k)]
        if new:  # weights that bert.py adds to BERT's: they keep their initialisation
            print(f"new weights, initialised (not in {model_dir.name}): {', '.join(new)}")
        pooler = [k for k in report["missing"] if "pooler." in k]
        for kind, keys in (("missing", pooler), ("unexpected", report["unexpected"])):
            if keys:  # the pooler (used by --pooling cls) may be absent
                warnings.warn(
                    f"{model_dir}: {len(keys)} {kind} keys: {', '.join(keys[:5])}", stacklevel=2
                )
        return model


def mean_pool(hidden, attention_mask):
    """Average of the token vectors that the mask keeps (Sentence-BERT's pooling).

    hidden: (B, T, H); attention_mask: (B, T) -> (B, H).
    """
    # BEGIN EXERCISE mean_pool: the average of the token vectors whose mask is 1
    m = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    # END EXERCISE mean_pool


if __name__ == "__main__":
    import argparse

    from tokenizer import BertTokenizer

    parser = argparse.ArgumentParser(
        description="Embed sentence pairs with our BERT and print cosines."
    )
    parser.add_argument(
        "--bert", default="minilm", help="checkpoint folder, 'minilm' or a hub name"
    )
    args = parser.parse_args()
    pairs = [
        ("A man is playing a guitar.", "Someone plays an instrument."),
        ("A man is playing a guitar.", "The stock market fell sharply today."),
        ("How do I learn Python quickly?", "What is the fastest way to learn Python?"),
        ("The film was a delight from start to finish.", "I hated every minute of this movie."),
    ]
    tok = BertTokenizer.from_pretrained(args.bert)
    model = BertModel.from_pretrained(args.bert).eval()
    batch = tok([s for p in pairs for s in p], return_tensors="pt")
    with torch.no_grad():
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    emb = mean_pool(out["last_hidden_state"], batch["attention_mask"])  # (2P, H)
    emb = emb.view(len(pairs), 2, -1)  # (P, 2, H): both sentences of each pair
    cos = F.cosine_similarity(emb[:, 0], emb[:, 1], dim=-1)  # (P,)
    for (a, b), c in zip(pairs, cos.tolist(), strict=True):
        print(f"{c:+.3f}  {a!r} ~ {b!r}")
