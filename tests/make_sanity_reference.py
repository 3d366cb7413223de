"""Write tests/reference/sanity_reference.npz with Hugging Face transformers (run once).

The reference that `python sanity_check.py` compares our code against offline:
transformers' BertModel outputs and BertTokenizer ids for fixed sentences, using the
embedded all-MiniLM-L6-v2 checkpoint. Re-run only if the sentences change:
    PYTHONPATH=. python tests/make_sanity_reference.py
"""

import numpy as np
import torch
import transformers

from base_bert import resolve_model_dir
from sanity_check import PAIRS, REFERENCE, SENTENCES


def main():
    model_dir = str(resolve_model_dir("minilm"))
    tok = transformers.BertTokenizer.from_pretrained(model_dir)
    model = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    a, b = zip(*PAIRS, strict=True)
    single = tok(SENTENCES, padding=True, return_tensors="np")
    pair = tok(list(a), list(b), padding=True, return_tensors="np")
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in pair.items()})
    arrays = {f"single_{k}": v for k, v in single.items()}
    arrays |= {f"pair_{k}": v for k, v in pair.items()}
    arrays["last_hidden_state"] = out.last_hidden_state.numpy()
    arrays["pooler_output"] = out.pooler_output.numpy()
    REFERENCE.parent.mkdir(exist_ok=True)
    np.savez_compressed(REFERENCE, **arrays)
    print(
        f"wrote {REFERENCE} ({REFERENCE.stat().st_size} bytes) with transformers {transformers.__version__}"
    )


if __name__ == "__main__":
    main()
