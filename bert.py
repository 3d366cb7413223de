"""BERT, written out: multi-head self-attention, transformer layers, embeddings, pooler.

Devlin et al., 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding"; the attention is Vaswani et al., 2017. Classes, methods and attributes
carry the CS224n handout's names (`self_attention`, `attention_dense`, `word_embedding`,
...); a Hugging Face checkpoint loads, and an export is written, through the one name map
in base_bert.py (HF_NAMES).

Two entry points matter besides `forward`: `embed` (token ids -> embedding output) and
`encode` (embedding output -> hidden states), so a regularizer such as SMART can
perturb the embedding output and run the rest of the network on it.
"""

import math
import warnings
from contextlib import contextmanager

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
    rename_hf_keys,
    resolve_model_dir,
)


class BertSelfAttention(nn.Module):
    """Multi-head self-attention: project to queries, keys, values; attend per head."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(config.hidden_size, self.all_head_size)
        self.key = nn.Linear(config.hidden_size, self.all_head_size)
        self.value = nn.Linear(config.hidden_size, self.all_head_size)
        # dropout on the attention probabilities, as the original Transformer does
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.kind = config.attention  # "manual", "sdpa", or "auto" (below)
        # "auto" takes torch's fused SDPA on a GPU only where the engine found it equal to
        # `attention` below on a probe (engine.runtime.check_attention): an edit here runs
        self.sdpa_checked = False
        self.recording = False  # BertModel.encode(output_attentions=True): `attention` runs

    def transform(self, x, linear_layer):
        """Project x (B, T, H) with linear_layer and split the heads: (B, nh, T, hs)."""
        bs, seq_len = x.shape[:2]
        proj = linear_layer(x)  # (B, T, H)
        proj = proj.view(bs, seq_len, self.num_attention_heads, self.attention_head_size)
        return proj.transpose(1, 2)  # (B, T, nh, hs) -> (B, nh, T, hs)

    def attention(self, key, query, value, attention_mask):
        """Scaled dot-product attention, by hand, of every head, merged back.

        key, query, value: (B, nh, T, hs); attention_mask: (B, 1, 1, T) additive (0 where a
        token is attended, very negative where it is padding) -> (B, T, H).
        """
        # BEGIN EXERCISE attention: softmax(query key^T / sqrt(hs) + attention_mask) over the keys, dropout, times value; the heads merged back: (B, T, H)
        S = query @ key.transpose(-2, -1) / math.sqrt(self.attention_head_size)  # (B, nh, T, T)
        probs = F.softmax(S + attention_mask, dim=-1)  # (B, nh, T, T), each row sums to 1
        out = self.dropout(probs) @ value  # (B, nh, T, hs)
        bs, _, seq_len, _ = out.shape
        return out.transpose(1, 2).reshape(bs, seq_len, -1)  # (B, T, nh, hs) -> (B, T, H)
        # END EXERCISE attention

    def fused(self, x) -> bool:
        """Whether torch's fused SDPA runs in place of `attention` (the same math)."""
        auto = self.kind == "auto" and x.is_cuda and self.sdpa_checked
        return (self.kind == "sdpa" or auto) and not self.recording

    def forward(self, hidden_states, attention_mask):
        """hidden_states: (B, T, H); attention_mask: (B, 1, 1, T) additive -> (B, T, H)."""
        query_layer = self.transform(hidden_states, self.query)  # (B, nh, T, hs)
        key_layer = self.transform(hidden_states, self.key)  # (B, nh, T, hs)
        value_layer = self.transform(hidden_states, self.value)  # (B, nh, T, hs)
        if not self.fused(hidden_states):
            return self.attention(key_layer, query_layer, value_layer, attention_mask)
        p = self.dropout.p if self.training else 0.0
        out = F.scaled_dot_product_attention(
            query_layer, key_layer, value_layer, attn_mask=attention_mask, dropout_p=p
        )  # (B, nh, T, hs)
        return out.transpose(1, 2).flatten(2)  # (B, T, nh, hs) -> (B, T, H)


class BertLayer(nn.Module):
    """One transformer layer: self-attention, then a GELU feed-forward, each closed by
    add_norm (post-LN)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        H, eps = config.hidden_size, config.layer_norm_eps
        self.self_attention = BertSelfAttention(config)
        # the attention's add_norm
        self.attention_dense = nn.Linear(H, H)
        self.attention_layer_norm = nn.LayerNorm(H, eps=eps)
        self.attention_dropout = nn.Dropout(config.hidden_dropout_prob)
        # the feed-forward, exact (erf) GELU
        self.interm_dense = nn.Linear(H, config.intermediate_size)
        self.interm_af = F.gelu
        # the feed-forward's add_norm
        self.out_dense = nn.Linear(config.intermediate_size, H)
        self.out_layer_norm = nn.LayerNorm(H, eps=eps)
        self.out_dropout = nn.Dropout(config.hidden_dropout_prob)

    def add_norm(self, input, output, dense_layer, dropout, ln_layer):
        """A sublayer's close: dense_layer on the sublayer's `output`, dropout, plus the
        sublayer's `input` (the residual), then ln_layer."""
        # BEGIN EXERCISE layer: dense_layer on output, dropout, add the residual input, then ln_layer
        return ln_layer(input + dropout(dense_layer(output)))
        # END EXERCISE layer

    def forward(self, hidden_states, attention_mask):
        """hidden_states: (B, T, H); attention_mask: (B, 1, 1, T) additive -> (B, T, H)."""
        # BEGIN EXERCISE layer: self_attention, add_norm; the feed-forward (interm_dense, interm_af), add_norm
        attended = self.self_attention(hidden_states, attention_mask)  # (B, T, H)
        a = self.add_norm(
            hidden_states,
            attended,
            self.attention_dense,
            self.attention_dropout,
            self.attention_layer_norm,
        )  # (B, T, H): the attention sublayer, closed
        inner = self.interm_af(self.interm_dense(a))  # (B, T, I)
        return self.add_norm(a, inner, self.out_dense, self.out_dropout, self.out_layer_norm)
        # END EXERCISE layer


class BertModel(nn.Module):
    """BERT: the embeddings (`embed`), a stack of BertLayers (`encode`), and the pooler's
    dense layer and tanh on the [CLS] token's last hidden state."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        H = config.hidden_size
        # the embeddings
        self.word_embedding = nn.Embedding(config.vocab_size, H, padding_idx=config.pad_token_id)
        self.pos_embedding = nn.Embedding(config.max_position_embeddings, H)
        self.tk_type_embedding = nn.Embedding(config.type_vocab_size, H)
        self.embed_layer_norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.embed_dropout = nn.Dropout(config.hidden_dropout_prob)
        position_ids = torch.arange(config.max_position_embeddings).unsqueeze(0)  # (1, P)
        self.register_buffer("position_ids", position_ids, persistent=False)
        self.tk_type_ids = None  # a pair's token types while `token_types` holds them
        # the encoder
        self.bert_layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        # for the [CLS] token
        self.pooler_dense = nn.Linear(H, H)
        self.pooler_af = nn.Tanh()
        self.apply(self._init_weights)
        self._register_load_state_dict_pre_hook(rename_hf_keys)  # a run saved by HF's names

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

    @contextmanager
    def token_types(self, token_type_ids):
        """Token types (B, T) for the `embed` calls inside, e.g. a cross-encoded pair's 0s
        and 1s: embed(input_ids), the handout's, has no argument for them. None: all 0."""
        outer, self.tk_type_ids = self.tk_type_ids, token_type_ids
        try:
            yield
        finally:
            self.tk_type_ids = outer

    def embed(self, input_ids):
        """(B, T) token ids -> (B, T, H) embedding output: word + position + token type
        embeddings, then embed_layer_norm, then embed_dropout."""
        self._check_ids(input_ids)
        input_shape = input_ids.size()
        seq_length = input_shape[1]
        # BEGIN EXERCISE embeddings: inputs_embeds, the word embeddings of input_ids: (B, T, H)
        inputs_embeds = self.word_embedding(input_ids)  # (B, T, H)
        # END EXERCISE embeddings

        pos_ids = self.position_ids[:, :seq_length]  # (1, T): 0 .. T-1
        # BEGIN EXERCISE embeddings: pos_embeds, the position embeddings of pos_ids: (1, T, H)
        pos_embeds = self.pos_embedding(pos_ids)  # (1, T, H), broadcast over the batch
        # END EXERCISE embeddings

        # Token types: all 0 (one sentence), unless `token_types` holds a pair's.
        tk_type_ids = self.tk_type_ids
        if tk_type_ids is None:
            tk_type_ids = torch.zeros(input_shape, dtype=torch.long, device=input_ids.device)
        tk_type_embeds = self.tk_type_embedding(tk_type_ids)  # (B, T, H)

        # BEGIN EXERCISE embeddings: the three embeddings added, then embed_layer_norm, then embed_dropout: (B, T, H)
        embeds = inputs_embeds + pos_embeds + tk_type_embeds  # (B, T, H)
        return self.embed_dropout(self.embed_layer_norm(embeds))
        # END EXERCISE embeddings

    def encode(self, hidden_states, attention_mask, output_attentions=False):
        """(B, T, H) embedding output and (B, T) mask -> last hidden states and pooled [CLS];
        with output_attentions also 'attentions', one (B, nh, T, T) tensor of probabilities
        per layer, detached: a padded key gets 0, a padded query's row means nothing. They
        are what `attention` hands its dropout, so they come from the hand-written
        attention, and the other outputs are bit for bit those it gives without them."""
        dtype = (
            hidden_states.dtype
            if not torch.is_autocast_enabled(hidden_states.device.type)
            else torch.get_autocast_dtype(hidden_states.device.type)
        )
        # (B, T) 1/0 -> (B, 1, 1, T) additive mask: 0 where attended, dtype min where padded
        mask = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        with recorded(self.bert_layers, output_attentions) as probs:
            for layer_module in self.bert_layers:
                hidden_states = layer_module(hidden_states, mask)
        pooled = self.pooler_af(self.pooler_dense(hidden_states[:, 0]))  # (B, H) from [CLS]
        out = {"last_hidden_state": hidden_states, "pooler_output": pooled}
        return out | {"attentions": probs} if output_attentions else out

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        with self.token_types(token_type_ids):
            embedding_output = self.embed(input_ids)  # (B, T, H)
        return self.encode(embedding_output, attention_mask)

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
        pooler = [k for k in report["missing"] if k.startswith("pooler_dense.")]
        untrained = [k for k in report["missing"] if is_bert_weight(k) and k not in pooler]
        if untrained:  # the encoder would train from random weights: never what was meant
            raise ModelError(
                f"{model_dir}: the weights lack {len(untrained)} of the model's tensors, e.g. "
                f"{', '.join(untrained[:3])}; does config.json match the checkpoint?"
            )
        new = [k for k in report["missing"] if not is_bert_weight(k)]
        if new:  # weights that bert.py adds to BERT's: they keep their initialisation
            print(f"new weights, initialised (not in {model_dir.name}): {', '.join(new)}")
        for kind, keys in (("missing", pooler), ("unexpected", report["unexpected"])):
            if keys:  # the pooler (used by --pooling cls) may be absent
                warnings.warn(
                    f"{model_dir}: {len(keys)} {kind} keys: {', '.join(keys[:5])}", stacklevel=2
                )
        return model


@contextmanager
def recorded(layers, on: bool):
    """While on, each layer's attention probabilities (B, nh, T, T), detached, as each
    `attention` hands them to its dropout, in a list (None while off): the hand-written
    attention runs in every layer meanwhile."""
    if not on:
        yield None
        return
    probs, hooks = [], []
    for layer in layers:
        layer.self_attention.recording = True
        seen = lambda module, args: probs.append(args[0].detach())  # noqa: E731
        hooks.append(layer.self_attention.dropout.register_forward_pre_hook(seen))
    try:
        yield probs
    finally:
        for layer, hook in zip(layers, hooks, strict=True):
            layer.self_attention.recording = False
            hook.remove()
    if len(probs) != len(layers):
        raise ValueError(
            f"output_attentions: {len(probs)} of {len(layers)} layers handed their "
            "probabilities to self.dropout, where they are read; an attention that drops "
            "them out by F.dropout or SDPA computes the same but cannot show them"
        )


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
