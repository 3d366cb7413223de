"""Slips of the handout's exercises (grader/checks.py, Part 1): each a small change of the
solution that its check must fail (tests/test_grader.py grades them).

A slip is (what it is, [(old, new), ...]): each old text occurs once in the exercise's
marked bodies, and is replaced by new."""

NAN = "float('nan')"  # a slip's text for a NaN
# exercise -> [(what the slip is, [(old, new), ...])]
SLIPS = {
    "attention": [
        ("key and query swapped", [("query @ key.transpose", "key @ query.transpose")]),
        (
            "squeeze(0) on the output: a batch of one loses its batch",
            [("reshape(bs, seq_len, -1)  #", "reshape(bs, seq_len, -1).squeeze(0)  #")],
        ),
        (
            "the output in float16",
            [("reshape(bs, seq_len, -1)  #", "reshape(bs, seq_len, -1).half()  #")],
        ),
        (
            "scores upcast to float64, never cast back",
            [
                (
                    "S = query @ key.transpose(-2, -1)",
                    "S = query.double() @ key.double().transpose(-2, -1)",
                )
            ],
        ),
        (
            "every output NaN",
            [("reshape(bs, seq_len, -1)  #", f"reshape(bs, seq_len, -1) * {NAN}  #")],
        ),
        ("no dropout", [("self.dropout(probs) @ value", "probs @ value")]),
        ("dropout on the output", [("self.dropout(probs) @ value", "self.dropout(probs @ value)")]),
        (
            "dropout without 1 / (1 - p)",
            [("self.dropout(probs) @ value", "self.dropout(probs) * (1 - self.dropout.p) @ value")],
        ),
        (
            "dropout always on (training=True)",
            [("self.dropout(probs) @ value", "F.dropout(probs, self.dropout.p, True) @ value")],
        ),
        ("no 1 / sqrt(hs)", [(" / math.sqrt(self.attention_head_size)", "")]),
        (
            "1 / hs, not 1 / sqrt(hs)",
            [("math.sqrt(self.attention_head_size)", "self.attention_head_size")],
        ),
        (
            "1 / sqrt(H), the hidden size",
            [("math.sqrt(self.attention_head_size)", "math.sqrt(self.all_head_size)")],
        ),
        ("the mask ignored", [("F.softmax(S + attention_mask, dim=-1)", "F.softmax(S, dim=-1)")]),
        (
            "the mask added after the softmax",
            [("F.softmax(S + attention_mask, dim=-1)", "F.softmax(S, dim=-1) + attention_mask")],
        ),
        (
            "softmax over the queries",
            [("F.softmax(S + attention_mask, dim=-1)", "F.softmax(S + attention_mask, dim=-2)")],
        ),
        (
            "heads merged without the transpose",
            [("out.transpose(1, 2).reshape(bs", "out.reshape(bs")],
        ),
        (
            "heads not merged: (B, nh, T, hs)",
            [("return out.transpose(1, 2).reshape(bs, seq_len, -1)", "return out")],
        ),
        (
            "heads merged in the wrong order",
            [
                (
                    "out.transpose(1, 2).reshape(bs, seq_len, -1)",
                    "out.permute(0, 2, 3, 1).reshape(bs, seq_len, -1)",
                )
            ],
        ),
        (
            "p written in, 0.5, not the module's",
            [("self.dropout(probs) @ value", "F.dropout(probs, 0.5, self.training) @ value")],
        ),
    ],
    "layer": [
        (
            "LayerNorm before the residual",
            [
                (
                    "return ln_layer(input + dropout(dense_layer(output)))",
                    "return input + ln_layer(dropout(dense_layer(output)))",
                )
            ],
        ),
        (
            "the feed-forward upcast to float64",
            [
                (
                    "self.interm_af(self.interm_dense(a))",
                    "self.interm_af(self.interm_dense(a).double())",
                )
            ],
        ),
        (
            "no dropout in add_norm",
            [("input + dropout(dense_layer(output))", "input + dense_layer(output)")],
        ),
        (
            "dropout after the LayerNorm",
            [
                (
                    "ln_layer(input + dropout(dense_layer(output)))",
                    "dropout(ln_layer(input + dense_layer(output)))",
                )
            ],
        ),
        (
            "dropout on the residual",
            [("input + dropout(dense_layer(output))", "dropout(input) + dense_layer(output)")],
        ),
        (
            "the tanh GELU",
            [
                (
                    "self.interm_af(self.interm_dense(a))",
                    'F.gelu(self.interm_dense(a), approximate="tanh")',
                )
            ],
        ),
        ("ReLU", [("self.interm_af(self.interm_dense(a))", "F.relu(self.interm_dense(a))")]),
        ("no activation", [("self.interm_af(self.interm_dense(a))", "self.interm_dense(a)")]),
        (
            "the tanh GELU, the dense layers by F.linear (no hook sees the activation)",
            [
                (
                    "self.interm_af(self.interm_dense(a))",
                    'F.gelu(self.interm_dense(a), approximate="tanh")',
                ),
                (
                    "dropout(dense_layer(output))",
                    "dropout(F.linear(output, dense_layer.weight, dense_layer.bias))",
                ),
            ],
        ),
        (
            "the layer's input as the second residual",
            [("return self.add_norm(a, inner", "return self.add_norm(hidden_states, inner")],
        ),
        (
            "the feed-forward fed the layer's input",
            [("self.interm_dense(a))", "self.interm_dense(hidden_states))")],
        ),
        (
            "dropout after the GELU",
            [
                (
                    "inner = self.interm_af(self.interm_dense(a))",
                    "inner = self.out_dropout(self.interm_af(self.interm_dense(a)))",
                )
            ],
        ),
        (
            "dropout on the attention's output before add_norm",
            [
                (
                    "attended = self.self_attention(hidden_states, attention_mask)",
                    "attended = self.attention_dropout(self.self_attention(hidden_states, attention_mask))",
                )
            ],
        ),
        (
            "the attention's mask left out",
            [
                (
                    "self.self_attention(hidden_states, attention_mask)",
                    "self.self_attention(hidden_states, torch.zeros_like(attention_mask))",
                )
            ],
        ),
        (
            "the two add_norms' LayerNorms swapped",
            [
                ("            self.attention_layer_norm,\n", "            self.out_layer_norm,\n"),
                (
                    "self.out_dropout, self.out_layer_norm)",
                    "self.out_dropout, self.attention_layer_norm)",
                ),
            ],
        ),
        (
            "input and output swapped in add_norm",
            [
                (
                    "ln_layer(input + dropout(dense_layer(output)))",
                    "ln_layer(output + dropout(dense_layer(input)))",
                )
            ],
        ),
    ],
    "embeddings": [
        (
            "position ids made without device=",
            [("self.pos_embedding(pos_ids)", "self.pos_embedding(torch.arange(seq_length))")],
        ),
        ("positions from 1", [("self.pos_embedding(pos_ids)", "self.pos_embedding(pos_ids + 1)")]),
        (
            "squeeze(0) on the output: a batch of one loses its batch",
            [
                (
                    "self.embed_dropout(self.embed_layer_norm(embeds))",
                    "self.embed_dropout(self.embed_layer_norm(embeds)).squeeze(0)",
                )
            ],
        ),
        (
            "no token types",
            [("inputs_embeds + pos_embeds + tk_type_embeds", "inputs_embeds + pos_embeds")],
        ),
        (
            "token types made 0 again, the given ones unread",
            [
                (
                    "inputs_embeds + pos_embeds + tk_type_embeds",
                    "inputs_embeds + pos_embeds + self.tk_type_embedding(torch.zeros_like(input_ids))",
                )
            ],
        ),
        (
            "no positions",
            [("inputs_embeds + pos_embeds + tk_type_embeds", "inputs_embeds + tk_type_embeds")],
        ),
        (
            "the word table read at the positions",
            [("self.word_embedding(input_ids)", "self.word_embedding(torch.arange(seq_length))")],
        ),
        (
            "no dropout",
            [
                (
                    "return self.embed_dropout(self.embed_layer_norm(embeds))",
                    "return self.embed_layer_norm(embeds)",
                )
            ],
        ),
        (
            "no LayerNorm",
            [
                (
                    "return self.embed_dropout(self.embed_layer_norm(embeds))",
                    "return self.embed_dropout(embeds)",
                )
            ],
        ),
        (
            "dropout before the LayerNorm",
            [
                (
                    "self.embed_dropout(self.embed_layer_norm(embeds))",
                    "self.embed_layer_norm(self.embed_dropout(embeds))",
                )
            ],
        ),
        (
            "every output NaN",
            [
                (
                    "return self.embed_dropout(self.embed_layer_norm(embeds))",
                    f"return self.embed_dropout(self.embed_layer_norm(embeds)) * {NAN}",
                )
            ],
        ),
    ],
    "adamw": [
        (
            "eps inside the square root",
            [
                (
                    "denom = torch.sqrt(exp_avg_sq, out=self._scratch(p)).add_(eps * root2)",
                    "denom = torch.sqrt(exp_avg_sq + eps * root2, out=self._scratch(p))",
                )
            ],
        ),
        (
            "weight decay read from the defaults, not the group",
            [
                (
                    'p.mul_(1.0 - alpha * group["weight_decay"])',
                    'p.mul_(1.0 - alpha * self.defaults["weight_decay"])',
                )
            ],
        ),
        (
            "lr read from the defaults, not the group",
            [
                (
                    "p.addcdiv_(exp_avg, denom, value=-alpha * root2 / bias1)",
                    'p.addcdiv_(exp_avg, denom, value=-self.defaults["lr"] * root2 / bias1)',
                )
            ],
        ),
        (
            "no bias correction",
            [
                (
                    "bias1, bias2 = (1 - beta1**t, 1 - beta2**t) if group",
                    "bias1, bias2 = (1.0, 1.0) if group",
                )
            ],
        ),
        (
            "coupled L2 instead of decoupled decay",
            [
                (
                    "exp_avg.lerp_(grad, 1.0 - beta1)",
                    'grad = grad + group["weight_decay"] * p\n            exp_avg.lerp_(grad, 1.0 - beta1)',
                ),
                ('p.mul_(1.0 - alpha * group["weight_decay"])', "pass"),
            ],
        ),
        ("no weight decay", [('p.mul_(1.0 - alpha * group["weight_decay"])', "pass")]),
        (
            "weight decay only with correct_bias",
            [('if group["weight_decay"]:', 'if group["weight_decay"] and group["correct_bias"]:')],
        ),
        (
            "beta2 for the first moment",
            [("exp_avg.lerp_(grad, 1.0 - beta1)", "exp_avg.lerp_(grad, 1.0 - beta2)")],
        ),
        ("the step counted twice", [('state["step"] += 1', 'state["step"] += 2')]),
        (
            "the step count never kept (t = 1 each step)",
            [('state["step"] += 1', 'state["step"] = 1')],
        ),
        ("the moments started afresh each step", [("if not state:", "if True:")]),
        (
            "the first moment updated out of place, never kept",
            [("exp_avg.lerp_(grad, 1.0 - beta1)", "exp_avg = exp_avg.lerp(grad, 1.0 - beta1)")],
        ),
        (
            "the state on the optimizer, shared by every parameter",
            [
                (
                    "if not state:",
                    "state = self.state.setdefault('shared', {})\n            if not state:",
                )
            ],
        ),
        (
            "decay by the defaults' lr",
            [("1.0 - alpha * group", '1.0 - self.defaults["lr"] * group')],
        ),
        (
            "correct_bias ignored",
            [
                (
                    'if group["correct_bias"] else (1.0, 1.0)',
                    "if True else (1.0, 1.0)",
                )
            ],
        ),
    ],
    "classifier": [
        (
            "dropout's p written in, 0.3, not the config's",
            [("nn.Dropout(config.hidden_dropout_prob)", "nn.Dropout(0.3)")],
        ),
        (
            "the head onto 5 classes, whatever the task",
            [
                (
                    "nn.Linear(config.hidden_size, self.num_labels)",
                    "nn.Linear(config.hidden_size, 5)",
                )
            ],
        ),
        (
            "a linear layer without its bias",
            [
                (
                    "nn.Linear(config.hidden_size, self.num_labels)",
                    "nn.Linear(config.hidden_size, self.num_labels, bias=False)",
                )
            ],
        ),
        (
            "float token types handed to BERT",
            [
                (
                    "self.bert(input_ids, attention_mask)",
                    "self.bert(input_ids, attention_mask, torch.zeros(input_ids.shape, device=input_ids.device))",
                )
            ],
        ),
        ("no dropout", [("self.classifier(self.dropout(cls))", "self.classifier(cls)")]),
        (
            "dropout on the logits",
            [("self.classifier(self.dropout(cls))", "self.dropout(self.classifier(cls))")],
        ),
        (
            "probabilities, not logits",
            [
                (
                    "self.classifier(self.dropout(cls))",
                    "self.classifier(self.dropout(cls)).softmax(-1)",
                )
            ],
        ),
        (
            "the mean of the tokens, not [CLS]",
            [('["pooler_output"]  # (B, H)', '["last_hidden_state"].mean(1)  # (B, H)')],
        ),
        (
            "the last token, not [CLS]",
            [('["pooler_output"]  # (B, H)', '["last_hidden_state"][:, -1]  # (B, H)')],
        ),
        (
            "BERT's output detached",
            [('["pooler_output"]  # (B, H)', '["pooler_output"].detach()  # (B, H)')],
        ),
        (
            "the mask left out",
            [("self.bert(input_ids, attention_mask)", "self.bert(input_ids)")],
        ),
        (
            "p written in, 0.5, not the model's",
            [
                (
                    "self.classifier(self.dropout(cls))",
                    "self.classifier(torch.nn.functional.dropout(cls, 0.5, self.training))",
                )
            ],
        ),
    ],
}

# Part 2's slips beyond tests/slips_multitask.py's: test_grader.py adds them to its table
MORE = {
    "multitask_step": [
        (
            "optimizer.step() after each part: accumulation undone",
            [
                (
                    "rt.scaler.scale(part).backward()",
                    "rt.scaler.scale(part).backward()\n        optimizer.step()",
                )
            ],
        ),
        (
            "optimizer.step() and zero_grad() after each part",
            [
                (
                    "rt.scaler.scale(part).backward()",
                    "rt.scaler.scale(part).backward()\n"
                    "        optimizer.step()\n"
                    "        optimizer.zero_grad()",
                )
            ],
        ),
    ],
}
