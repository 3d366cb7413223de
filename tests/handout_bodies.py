"""bert.py's and AdamW's exercises as a student writes them into the CS224n handout's skeleton: its
variable names (attention_scores, attention_probs, inputs_embeds, pos_embeds, alpha) and the
modules it gives (self.dropout, self.interm_af, self.embed_layer_norm, ...), one whole body
per marked region. tests/test_grader.py grades each as a variant that must pass."""

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
