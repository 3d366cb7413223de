"""The tiny BERT the BERT checks build on: its weights, drawn on torch alone from a seed, so
the student's side never imports transformers (6 s and 150 MB a grade); Hugging Face's
BertModel of the same weights, the judge's reference; and the stand-ins built on torch's
own modules that answer for bert.py's exercises while another is graded.
"""

import torch
import torch.nn.functional as F
from torch import nn

f64 = torch.float64
INIT_STD = 0.02  # Hugging Face's initializer_range: its BERT's weights are drawn N(0, 0.02)


def tiny_config(**overrides):
    """A 2-layer BERT of hidden size 32, small enough to check in milliseconds."""
    from base_bert import BertConfig

    sizes = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    return BertConfig(**sizes, intermediate_size=64, max_position_embeddings=64, **overrides)


def tiny_weights() -> dict[str, torch.Tensor]:
    """The tiny BERT's weights in Hugging Face's names, float64, drawn as Hugging Face
    initialises BERT (matrices and tables N(0, 0.02), biases 0, each LayerNorm 1 and 0, the
    padding token's row 0) from a seeded generator: the same on both sides."""
    c, g = tiny_config(), torch.Generator().manual_seed(0)
    H, inner, weights = c.hidden_size, c.intermediate_size, {}

    def drawn(name, *shape):
        weights[name] = torch.randn(*shape, generator=g, dtype=f64) * INIT_STD

    def linear(name, n_out, n_in):
        drawn(f"{name}.weight", n_out, n_in)
        weights[f"{name}.bias"] = torch.zeros(n_out, dtype=f64)

    def layer_norm(name):
        weights[f"{name}.weight"], weights[f"{name}.bias"] = (
            torch.ones(H, dtype=f64),
            torch.zeros(H, dtype=f64),
        )

    drawn("embeddings.word_embeddings.weight", c.vocab_size, H)
    weights["embeddings.word_embeddings.weight"][c.pad_token_id] = 0.0
    drawn("embeddings.position_embeddings.weight", c.max_position_embeddings, H)
    drawn("embeddings.token_type_embeddings.weight", c.type_vocab_size, H)
    layer_norm("embeddings.LayerNorm")
    for i in range(c.num_hidden_layers):
        at = f"encoder.layer.{i}."
        for name in ("query", "key", "value"):
            linear(f"{at}attention.self.{name}", H, H)
        linear(f"{at}attention.output.dense", H, H)
        layer_norm(f"{at}attention.output.LayerNorm")
        linear(f"{at}intermediate.dense", inner, H)
        linear(f"{at}output.dense", H, inner)
        layer_norm(f"{at}output.LayerNorm")
    linear("pooler.dense", H, H)
    return weights


def tiny_hf(weights: dict):
    """Hugging Face's BertModel of the tiny config holding `weights`, float64, in eval mode:
    the reference of the BERT checks (the judge's side only)."""
    import transformers

    fields = {k: v for k, v in tiny_config().to_dict().items() if k != "attention"}
    hf = transformers.BertModel(transformers.BertConfig(**fields, attn_implementation="eager"))
    missing, unexpected = hf.double().load_state_dict(weights, strict=False)
    buffers = {name for name, _ in hf.named_buffers()}
    assert not unexpected and set(missing) <= buffers, (missing, unexpected)
    return hf.eval()


def ours_like(weights: dict):
    """bert.py's BertModel holding `weights`, float64, in eval mode (the student's side)."""
    from base_bert import hf_to_ours
    from bert import BertModel

    ours = BertModel(tiny_config()).double()
    ours.load_state_dict({hf_to_ours(k): v for k, v in weights.items() if hf_to_ours(k)})
    return ours.eval()


class StandInAttention(nn.Module):
    """Layer i's BertSelfAttention of `weights` by torch's scaled_dot_product_attention: the
    queries, keys and values projected, split into heads, attended under the additive mask,
    merged back; no dropout (Hugging Face's, its dropout off). The attention exercise's
    stand-in while another is graded."""

    def __init__(self, weights: dict, i: int = 0):
        super().__init__()
        c = tiny_config()
        H, self.heads = c.hidden_size, c.num_attention_heads
        self.projections = nn.ModuleList(nn.Linear(H, H, dtype=f64) for _ in range(3))
        for linear, name in zip(self.projections, ("query", "key", "value"), strict=True):
            at = f"encoder.layer.{i}.attention.self.{name}"
            linear.load_state_dict(
                {"weight": weights[f"{at}.weight"], "bias": weights[f"{at}.bias"]}
            )

    def forward(self, hidden_states, attention_mask):
        if not torch.is_tensor(attention_mask):  # Hugging Face's reads None as no mask
            kind = type(attention_mask).__name__
            raise TypeError(f"the attention's mask must be a tensor, got {kind}")
        B, T, H = hidden_states.shape
        q, k, v = (  # (B, T, H) -> (B, T, nh, hs) -> (B, nh, T, hs)
            p(hidden_states).view(B, T, self.heads, H // self.heads).transpose(1, 2)
            for p in self.projections
        )
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
        return out.transpose(1, 2).reshape(B, T, H)  # (B, nh, T, hs) -> (B, T, H)


def attention_in(ours, weights: dict, i: int = 0) -> None:
    """Layer i's BertSelfAttention of ours answered by StandInAttention, in ours' dtype and
    on its device."""
    first = next(ours.parameters())
    stand_in = StandInAttention(weights, i).to(dtype=first.dtype, device=first.device)
    ours.bert_layers[i].self_attention.forward = stand_in.forward


class StandInEncoder(nn.Module):
    """BERT for MultitaskBERT's check: a tiny encoder of torch's own modules (token, position
    and token type tables; torch's TransformerEncoder, post-LayerNorm with GELU and dropout
    0.1, padding masked; a tanh pooler over the first token) behind bert.py's BertModel's
    interface (forward, embed, encode, config), so a design that calls any of them runs on
    a real encoder that none of the student's other exercises answer for. Seeded."""

    def __init__(self):
        super().__init__()
        self.config = c = tiny_config()
        H = c.hidden_size
        torch.manual_seed(0)
        self.tables = nn.ModuleList(
            nn.Embedding(n, H) for n in (c.vocab_size, c.max_position_embeddings, c.type_vocab_size)
        )
        layer = nn.TransformerEncoderLayer(
            H, c.num_attention_heads, c.intermediate_size, 0.1, "gelu", 1e-12, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, c.num_hidden_layers, enable_nested_tensor=False)
        self.pooler = nn.Linear(H, H)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return self.encode(self.embed(input_ids, token_type_ids), attention_mask)

    def embed(self, input_ids, token_type_ids=None):
        words, positions, types = self.tables
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        at = torch.arange(input_ids.size(1), device=input_ids.device)
        return words(input_ids) + positions(at) + types(token_type_ids)  # (B, T, H)

    def encode(self, hidden_states, attention_mask):
        if attention_mask is None:
            attention_mask = torch.ones(hidden_states.shape[:2], device=hidden_states.device)
        last = self.encoder(hidden_states, src_key_padding_mask=attention_mask == 0)
        return {"last_hidden_state": last, "pooler_output": torch.tanh(self.pooler(last[:, 0]))}


class TinyLoader:
    """multitask_classifier.py's BertModel while MultitaskBERT's __init__ runs:
    from_pretrained gives StandInEncoder."""

    def from_pretrained(self, *args, **kwargs):
        return StandInEncoder().train()
