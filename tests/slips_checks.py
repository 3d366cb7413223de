"""Slips of the handout's exercises (grader/checks.py, Part 1): each a small change of the
solution that its check must fail (tests/test_grader.py grades them).

A slip is (what it is, [(old, new), ...]): each old text occurs once in the exercise's
marked bodies, and is replaced by new."""

NAN = "float('nan')"  # a slip's text for a NaN
# exercise -> [(what the slip is, [(old, new), ...])]
SLIPS = {
    "attention": [
        (
            "the heads split detached",
            [("return x.transpose(1, 2)  # (B, nh, T, hs)", "return x.transpose(1, 2).detach()")],
        ),
        (
            "scores upcast to float64, never cast back",
            [
                (
                    "scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))",
                    "scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.size(-1))",
                )
            ],
        ),
        ("every output NaN", [("return out, probs", f"return out * {NAN}, probs")]),
        ("no dropout", [("self.dropout(probs) @ v", "probs @ v")]),
        ("dropout on the output", [("self.dropout(probs) @ v", "self.dropout(probs @ v)")]),
        (
            "dropout without 1 / (1 - p)",
            [("self.dropout(probs) @ v", "self.dropout(probs) * (1 - self.dropout.p) @ v")],
        ),
        ("no 1 / sqrt(hs)", [(" / math.sqrt(q.size(-1))", "")]),
        ("the mask ignored", [("F.softmax(scores + mask, dim=-1)", "F.softmax(scores, dim=-1)")]),
        (
            "softmax over the queries",
            [("F.softmax(scores + mask, dim=-1)", "F.softmax(scores + mask, dim=-2)")],
        ),
        (
            "heads split without the transpose",
            [
                (
                    "return x.transpose(1, 2)  # (B, nh, T, hs)",
                    "return x.reshape(B, self.num_attention_heads, T, -1)",
                )
            ],
        ),
        (
            "heads merged without the transpose",
            [("x.transpose(1, 2).reshape(B, T, -1)", "x.reshape(B, T, -1)")],
        ),
        (
            "p written in, 0.5, not the module's",
            [("self.dropout(probs) @ v", "F.dropout(probs, 0.5, self.training) @ v")],
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
                    'F.gelu(self.intermediate["dense"](a))',
                    'F.gelu(self.intermediate["dense"](a).double())',
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
                    'F.gelu(self.intermediate["dense"](a))',
                    'F.gelu(self.intermediate["dense"](a), approximate="tanh")',
                )
            ],
        ),
        (
            "ReLU",
            [('F.gelu(self.intermediate["dense"](a))', 'F.relu(self.intermediate["dense"](a))')],
        ),
        (
            "the tanh GELU, the dense layers by F.linear (no hook sees the activation)",
            [
                (
                    'F.gelu(self.intermediate["dense"](a))',
                    'F.gelu(self.intermediate["dense"](a), approximate="tanh")',
                ),
                (
                    "dropout(dense_layer(output))",
                    "dropout(F.linear(output, dense_layer.weight, dense_layer.bias))",
                ),
            ],
        ),
        (
            "the layer's input as the second residual",
            [
                (
                    'return self.add_norm(a, h, out["dense"]',
                    'return self.add_norm(x, h, out["dense"]',
                )
            ],
        ),
        (
            "dropout after the GELU",
            [
                (
                    'h = F.gelu(self.intermediate["dense"](a))',
                    'h = out["dropout"](F.gelu(self.intermediate["dense"](a)))',
                )
            ],
        ),
        (
            "dropout on the attention's output before add_norm",
            [
                (
                    'h = self.attention["self"](x, mask, probs)',
                    'h = att["dropout"](self.attention["self"](x, mask, probs))',
                )
            ],
        ),
        (
            "probabilities not passed on",
            [('self.attention["self"](x, mask, probs)', 'self.attention["self"](x, mask)')],
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
            [("pos = torch.arange(T, device=input_ids.device)", "pos = torch.arange(T)")],
        ),
        (
            "positions from 1",
            [
                (
                    "torch.arange(T, device=input_ids.device)",
                    "torch.arange(1, T + 1, device=input_ids.device)",
                )
            ],
        ),
        ("no token types", [("+ e.token_type_embeddings(token_type_ids)  # (B, T, H)", "")]),
        ("no dropout", [("return e.dropout(e.LayerNorm(x))", "return e.LayerNorm(x)")]),
        (
            "dropout before the LayerNorm",
            [("return e.dropout(e.LayerNorm(x))", "return e.LayerNorm(e.dropout(x))")],
        ),
        (
            "every output NaN",
            [
                (
                    "return e.dropout(e.LayerNorm(x))",
                    f"return e.dropout(e.LayerNorm(x)) * {NAN}",
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
                    'p.mul_(1.0 - lr * group["weight_decay"])',
                    'p.mul_(1.0 - lr * self.defaults["weight_decay"])',
                )
            ],
        ),
        (
            "lr read from the defaults, not the group",
            [
                (
                    "p.addcdiv_(exp_avg, denom, value=-lr * root2 / bias1)",
                    'p.addcdiv_(exp_avg, denom, value=-self.defaults["lr"] * root2 / bias1)',
                )
            ],
        ),
        (
            "no bias correction",
            [
                (
                    'bias1, bias2 = self._bias_corrections(group, state["step"])',
                    "bias1, bias2 = 1.0, 1.0",
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
                ('p.mul_(1.0 - lr * group["weight_decay"])', "pass"),
            ],
        ),
        ("no weight decay", [('p.mul_(1.0 - lr * group["weight_decay"])', "pass")]),
        (
            "beta2 for the first moment",
            [("exp_avg.lerp_(grad, 1.0 - beta1)", "exp_avg.lerp_(grad, 1.0 - beta2)")],
        ),
        (
            "correct_bias ignored",
            [
                (
                    'bias1, bias2 = self._bias_corrections(group, state["step"])',
                    'bias1, bias2 = 1 - beta1 ** state["step"], 1 - beta2 ** state["step"]',
                )
            ],
        ),
    ],
    "classifier": [
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
