"""Valid bodies the grader must pass (tests/test_grader.py grades each on both sides): the
handout's exercises as a student writes them into the CS224n handout's skeleton, in its
variable names (attention_scores, attention_probs, inputs_embeds, pos_embeds, alpha) and the
modules it gives (self.dropout, self.interm_af, self.embed_layer_norm, ...), one whole body
per marked region; then, per exercise, the same math written another way."""

HANDOUT_ADAMW = (  # the handout's AdamW: its state named as one likes, Kingma & Ba's
    # efficient bias correction, eps on sqrt(v), the decay after the update, with the lr
    "            if len(state) == 0:\n"
    '                state["t"] = 0\n'
    '                state["m"] = torch.zeros_like(p.data)\n'
    '                state["v"] = torch.zeros_like(p.data)\n'
    '            beta1, beta2 = group["betas"]\n'
    '            state["t"] += 1\n'
    '            t, m, v = state["t"], state["m"], state["v"]\n'
    "            m.mul_(beta1).add_(grad, alpha=1 - beta1)\n"
    "            v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)\n"
    '            if group["correct_bias"]:\n'
    "                alpha_t = alpha * math.sqrt(1 - beta2**t) / (1 - beta1**t)\n"
    "            else:\n"
    "                alpha_t = alpha\n"
    '            p.data.addcdiv_(m, v.sqrt().add_(group["eps"]), value=-alpha_t)\n'
    '            p.data.add_(p.data, alpha=-alpha * group["weight_decay"])\n'
)
HANDOUT_ATTENTION = (
    "        attention_scores = torch.matmul(query, key.transpose(-1, -2))\n"
    "        attention_scores = attention_scores / math.sqrt(self.attention_head_size)\n"
    "        attention_probs = F.softmax(attention_scores + attention_mask, dim=-1)\n"
    "        attention_probs = self.dropout(attention_probs)\n"
    "        context = torch.matmul(attention_probs, value)\n"
    "        bs, _, seq_len, _ = context.shape\n"
    "        context = context.transpose(1, 2).contiguous()\n"
    "        return context.view(bs, seq_len, self.all_head_size)\n"
)
HANDOUT_LAYER = [
    "        output = dropout(dense_layer(output))\n        return ln_layer(input + output)\n",
    "        attn = self.self_attention(hidden_states, attention_mask)\n"
    "        attn = self.add_norm(hidden_states, attn, self.attention_dense,\n"
    "                             self.attention_dropout, self.attention_layer_norm)\n"
    "        interm = self.interm_af(self.interm_dense(attn))\n"
    "        return self.add_norm(attn, interm, self.out_dense, self.out_dropout,\n"
    "                             self.out_layer_norm)\n",
]
HANDOUT_EMBED = [
    "        inputs_embeds = self.word_embedding(input_ids)\n",
    "        pos_embeds = self.pos_embedding(pos_ids)\n",
    "        embeds = inputs_embeds + pos_embeds + tk_type_embeds\n"
    "        embeds = self.embed_layer_norm(embeds)\n"
    "        return self.embed_dropout(embeds)\n",
]
HANDOUT_CLASSIFIER = [  # the handout's Part 1 model, its layers named as one likes
    "        self.drop = torch.nn.Dropout(config.hidden_dropout_prob)\n"
    "        self.linear = torch.nn.Linear(config.hidden_size, config.num_labels)\n",
    "        outputs = self.bert(input_ids, attention_mask)\n"
    '        cls = outputs["pooler_output"]\n'
    "        return self.linear(self.drop(cls))\n",
]
HANDOUT_FOREACH = (
    "        for p, m, v, s in zip(params, exp_avgs, exp_avg_sqs, states, strict=True):\n"
    "            m.mul_(beta1).add_(p.grad, alpha=1 - beta1)\n"
    "            v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)\n"
    '            bias1, bias2 = self._bias_corrections(group, s["step"])\n'
    "            alpha = lr * math.sqrt(bias2) / bias1\n"
    "            p.addcdiv_(m, v.sqrt().add_(eps), value=-alpha)\n"
    '            p.mul_(1 - lr * group["weight_decay"])\n'
)
# exercise -> [(what the variant is, [whole bodies, one per region] or [(old, new), ...])]
VARIANTS = {
    "adamw": [
        ("the handout's algorithm", [HANDOUT_ADAMW]),
        (
            "the handout's eps, decay first",
            [
                (
                    "denom = torch.sqrt(exp_avg_sq, out=self._scratch(p)).add_(eps * root2)",
                    "denom = torch.sqrt(exp_avg_sq, out=self._scratch(p)).add_(eps)",
                )
            ],
        ),
        (
            "torch's eps, decay after",
            [
                (
                    'if group["weight_decay"]:\n                p.mul_(1.0 - alpha * group["weight_decay"])',
                    "pass",
                ),
                (
                    "p.addcdiv_(exp_avg, denom, value=-alpha * root2 / bias1)",
                    'p.addcdiv_(exp_avg, denom, value=-alpha * root2 / bias1)\n            p.mul_(1.0 - alpha * group["weight_decay"])',
                ),
            ],
        ),
    ],
    "adamw_foreach": [("the handout's algorithm", [HANDOUT_FOREACH])],
    "pearson": [
        (
            "torch.corrcoef in float32",
            [
                "    import torch\n\n"
                "    both = torch.tensor(np.stack([x, y]), dtype=torch.float32)\n"
                "    return float(torch.corrcoef(both)[0, 1])\n"
            ],
        )
    ],
    "auc": [  # a library's ranks, as the given average_ranks ranks: not the answer itself
        (
            "scipy.stats.rankdata for the ranks",
            [
                (
                    "ranks = average_ranks(scores)",
                    "from scipy.stats import rankdata\n\n    ranks = rankdata(scores)",
                )
            ],
        )
    ],
    "symmetric_kl": [
        (
            "mt-dnn's SymKlCriterion: F.kl_div",
            [
                (
                    "kl_q_p = (lq.detach().exp() * (lq.detach() - lp)).sum(-1)  # P learns",
                    'kl_q_p = F.kl_div(lp, lq.detach().exp(), reduction="none").sum(-1)',
                ),
                (
                    "kl_p_q = (lp.detach().exp() * (lp.detach() - lq)).sum(-1)  # Q learns",
                    'kl_p_q = F.kl_div(lq, lp.detach().exp(), reduction="none").sum(-1)',
                ),
            ],
        )
    ],
    "attention": [
        ("the handout's skeleton, its names", [HANDOUT_ATTENTION]),
        (
            "F.dropout",
            [
                (
                    "self.dropout(probs) @ value",
                    "F.dropout(probs, self.dropout.p, self.training) @ value",
                )
            ],
        ),
        (
            "SDPA with its dropout for the output",
            [
                (
                    "out = self.dropout(probs) @ value  # (B, nh, T, hs)",
                    "p = self.dropout.p if self.training else 0.0\n"
                    "        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=p)",
                )
            ],
        ),
        (
            "einsum, 1 / sqrt of the head's size read off the key",
            [
                (
                    "S = query @ key.transpose(-2, -1) / math.sqrt(self.attention_head_size)",
                    'S = torch.einsum("bhqd,bhkd->bhqk", query, key) / key.size(-1) ** 0.5',
                ),
                (
                    "out = self.dropout(probs) @ value",
                    'out = torch.einsum("bhqk,bhkd->bhqd", self.dropout(probs), value)',
                ),
            ],
        ),
    ],
    "embeddings": [
        ("the handout's skeleton, its names", HANDOUT_EMBED),
        (
            "F.embedding, F.layer_norm and F.dropout on the given modules' parameters",
            [
                (
                    "inputs_embeds = self.word_embedding(input_ids)",
                    "inputs_embeds = F.embedding(input_ids, self.word_embedding.weight)",
                ),
                (
                    "return self.embed_dropout(self.embed_layer_norm(embeds))",
                    "ln = self.embed_layer_norm\n"
                    "        embeds = F.layer_norm(embeds, ln.normalized_shape, ln.weight, ln.bias, ln.eps)\n"
                    "        return F.dropout(embeds, self.embed_dropout.p, self.training)",
                ),
            ],
        ),
    ],
    "classifier": [
        ("the handout's skeleton, its names", HANDOUT_CLASSIFIER),
        (
            "the config kept as self.config",
            [
                (
                    "self.dropout = nn.Dropout(config.hidden_dropout_prob)",
                    "self.config = config\n        self.dropout = nn.Dropout(config.hidden_dropout_prob)",
                )
            ],
        ),
        (
            "F.dropout",
            [
                (
                    "self.dropout(cls)",
                    "torch.nn.functional.dropout(cls, self.dropout.p, self.training)",
                )
            ],
        ),
        (
            "[CLS] from the last hidden states",
            [('["pooler_output"]  # (B, H)', '["last_hidden_state"][:, 0]  # (B, H)')],
        ),
        (
            "BERT's embed, then encode, by keywords",
            [
                (
                    "self.bert(input_ids, attention_mask)",
                    "self.bert.encode(self.bert.embed(input_ids), attention_mask=attention_mask)",
                )
            ],
        ),
        (
            "zero token types given, in int32",
            [
                (
                    "self.bert(input_ids, attention_mask)",
                    "self.bert(input_ids, attention_mask, torch.zeros_like(input_ids, dtype=torch.int32))",
                )
            ],
        ),
    ],
    "multitask": [
        (
            "the pair outputs (B, 1), unsqueezed",
            [
                (
                    "return self.paraphrase(torch.cat([u, v], -1)).squeeze(-1)  # (B, 2H) -> (B,)",
                    "return self.paraphrase(torch.cat([u, v], -1))  # (B, 1)",
                ),
                (
                    "return self.similarity(torch.cat([u, v], -1)).squeeze(-1)  # (B, 2H) -> (B,)",
                    "return self.similarity(torch.cat([u, v], -1))  # (B, 1)",
                ),
            ],
        ),
        (
            "mean pooling over the mask",
            [
                (
                    'return self.bert(input_ids, attention_mask)["pooler_output"]  # (B, H)',
                    'hidden = self.bert(input_ids, attention_mask)["last_hidden_state"]  # (B, T, H)\n        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)\n        return (hidden * mask).sum(1) / mask.sum(1)  # (B, H)',
                ),
            ],
        ),
        (
            "[CLS] from the last hidden states",
            [
                (
                    'return self.bert(input_ids, attention_mask)["pooler_output"]  # (B, H)',
                    'return self.bert(input_ids, attention_mask)["last_hidden_state"][:, 0]  # (B, H)',
                ),
            ],
        ),
        (
            "Sentence-BERT's [u, v, |u - v|] for the paraphrase",
            [
                (
                    "        self.paraphrase = nn.Linear(2 * BERT_HIDDEN_SIZE, 1)",
                    "        self.paraphrase = nn.Linear(3 * BERT_HIDDEN_SIZE, 1)",
                ),
                (
                    "return self.paraphrase(torch.cat([u, v], -1)).squeeze(-1)  # (B, 2H) -> (B,)",
                    "return self.paraphrase(torch.cat([u, v, (u - v).abs()], -1)).squeeze(-1)",
                ),
            ],
        ),
        (
            "the cosine, times 5, for the similarity",
            [
                (
                    "return self.similarity(torch.cat([u, v], -1)).squeeze(-1)  # (B, 2H) -> (B,)",
                    "return 5 * F.cosine_similarity(u, v, dim=-1)  # (B,)",
                ),
            ],
        ),
        (
            "config.hidden_size and the heads in an nn.ModuleDict",
            [
                (
                    "        self.dropout = nn.Dropout(config.hidden_dropout_prob)\n        self.sentiment = nn.Linear(BERT_HIDDEN_SIZE, N_SENTIMENT_CLASSES)\n        self.paraphrase = nn.Linear(2 * BERT_HIDDEN_SIZE, 1)\n        self.similarity = nn.Linear(2 * BERT_HIDDEN_SIZE, 1)\n",
                    '        H = config.hidden_size\n        self.dropout = nn.Dropout(config.hidden_dropout_prob)\n        self.heads = nn.ModuleDict(\n            {"sst": nn.Linear(H, 5), "para": nn.Linear(2 * H, 1), "sts": nn.Linear(2 * H, 1)}\n        )\n        self.sentiment, self.paraphrase, self.similarity = (self.heads[k] for k in ("sst", "para", "sts"))\n',
                ),
            ],
        ),
        (
            "F.dropout at the config's p, kept",
            [
                (
                    "        self.dropout = nn.Dropout(config.hidden_dropout_prob)",
                    "        self.p = config.hidden_dropout_prob\n        self.dropout = lambda x: F.dropout(x, self.p, self.training)",
                ),
            ],
        ),
        (
            "both sentences through BERT in one batch",
            [
                (
                    "u = self.dropout(self(input_ids_1, attention_mask_1))  # (B, H)\n        v = self.dropout(self(input_ids_2, attention_mask_2))  # (B, H)\n        return self.paraphrase(torch.cat([u, v], -1)).squeeze(-1)  # (B, 2H) -> (B,)",
                    "T = max(input_ids_1.size(1), input_ids_2.size(1))\n        ids = torch.cat([F.pad(input_ids_1, (0, T - input_ids_1.size(1))), F.pad(input_ids_2, (0, T - input_ids_2.size(1)))])\n        mask = torch.cat([F.pad(attention_mask_1, (0, T - attention_mask_1.size(1))), F.pad(attention_mask_2, (0, T - attention_mask_2.size(1)))])\n        u, v = self.dropout(self(ids, mask)).chunk(2)  # (B, H) each\n        return self.paraphrase(torch.cat([u, v], -1)).squeeze(-1)",
                ),
            ],
        ),
        (
            "zero token types given to BERT, made by new_zeros in int32",
            [
                (
                    'return self.bert(input_ids, attention_mask)["pooler_output"]  # (B, H)',
                    "types = input_ids.new_zeros(input_ids.shape, dtype=torch.int32)\n"
                    '        return self.bert(input_ids, attention_mask, types)["pooler_output"]',
                ),
            ],
        ),
        (
            "the SST head by F.linear",
            [
                (
                    "return self.sentiment(self.dropout(self(input_ids, attention_mask)))  # (B, 5)",
                    "z = self.dropout(self(input_ids, attention_mask))  # (B, H)\n        return F.linear(z, self.sentiment.weight, self.sentiment.bias)  # (B, 5)",
                ),
            ],
        ),
        (
            "dropout by a hand-made mask, in float32 arithmetic",
            [
                (
                    "return self.sentiment(self.dropout(self(input_ids, attention_mask)))  # (B, 5)",
                    "z = self(input_ids, attention_mask)  # (B, H)\n        if self.training:\n            keep = (torch.rand_like(z) >= self.dropout.p).to(z.dtype)\n            z = z * keep / (1 - self.dropout.p)\n        return self.sentiment(z)  # (B, 5)",
                ),
            ],
        ),
    ],
    "multitask_step": [
        (
            "autograd's backward of the scaled loss",
            [
                (
                    "rt.scaler.scale(part).backward()",
                    "torch.autograd.backward(rt.scaler.scale(part))",
                )
            ],
        ),
        (
            "a step that asks whether there is a loss scaler",
            [
                (
                    "rt.scaler.scale(part).backward()",
                    "(rt.scaler.scale(part) if rt.scaler.is_enabled() else part).backward()",
                )
            ],
        ),
    ],
    "momentum_teacher": [
        (
            "a loop of mul_ and add_",
            [
                (
                    "torch._foreach_lerp_(\n            [self.params[n] for n in names], [student[n].detach() for n in names], 1.0 - beta\n        )",
                    "for n in names:\n            self.params[n].mul_(beta).add_(student[n].detach(), alpha=1.0 - beta)",
                )
            ],
        )
    ],
    "mean_pool": [
        (
            "a loop over sentences, boolean indexing (the meta device cannot run it)",
            [
                (
                    "return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)",
                    "return torch.stack([h[k.bool()].mean(0) for h, k in zip(hidden, attention_mask)])",
                )
            ],
        ),
        (
            "masked_fill",
            [
                (
                    "return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)",
                    "return hidden.masked_fill(m == 0, 0).sum(1) / m.sum(1)",
                )
            ],
        ),
    ],
    "layer": [
        (
            "torch.dropout in add_norm",
            [
                (
                    "input + dropout(dense_layer(output))",
                    "input + torch.dropout(dense_layer(output), dropout.p, dropout.training)",
                )
            ],
        ),
        (
            "an inverted dropout mask by hand in add_norm",
            [
                (
                    "return ln_layer(input + dropout(dense_layer(output)))",
                    "h = dense_layer(output)\n        if dropout.training:\n"
                    "            keep = torch.rand_like(h) >= dropout.p\n"
                    "            h = h * keep.to(h.dtype) / (1 - dropout.p)\n"
                    "        return ln_layer(input + h)",
                )
            ],
        ),
        (
            "F.dropout in add_norm",
            [
                (
                    "input + dropout(dense_layer(output))",
                    "input + F.dropout(dense_layer(output), dropout.p, dropout.training)",
                )
            ],
        ),
        (
            "F.linear and F.layer_norm on add_norm's modules' parameters",
            [
                (
                    "ln_layer(input + dropout(dense_layer(output)))",
                    "F.layer_norm(input + dropout(F.linear(output, dense_layer.weight, "
                    "dense_layer.bias)), ln_layer.normalized_shape, ln_layer.weight, "
                    "ln_layer.bias, ln_layer.eps)",
                )
            ],
        ),
        (
            "exact GELU by name",
            [
                (
                    "self.interm_af(self.interm_dense(a))",
                    'F.gelu(self.interm_dense(a), approximate="none")',
                )
            ],
        ),
        ("the handout's skeleton, its names", HANDOUT_LAYER),
    ],
}
