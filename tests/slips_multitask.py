"""Slips of the handout's Part 2 exercises (grader/multitask_checks.py): each a small
change of the solution that its check must fail (tests/test_grader.py grades them), as
tests/slips_checks.py holds Part 1's."""

# exercise -> [(what the slip is, [(old, new), ...])]
SLIPS = {
    "multitask": [
        (
            "the STS cosine of the sentences before the given dropout",
            [
                (
                    "cosine_to_score(F.cosine_similarity(u, v, dim=-1))",
                    "cosine_to_score(F.cosine_similarity(*sentences.view(2, -1, sentences.size(-1)).unbind(0), dim=-1))",
                )
            ],
        ),
        (
            "predict_sentiment's token types in float",
            [
                (
                    "types = torch.zeros_like(input_ids)",
                    "types = torch.zeros_like(input_ids, dtype=torch.float)",
                )
            ],
        ),
        (
            "the pairs' token types in float",
            [
                (
                    '"token_type_ids": torch.zeros_like(ids)}',
                    '"token_type_ids": torch.zeros_like(ids, dtype=torch.float)}',
                )
            ],
        ),
        (
            "the shorter side padded with id -1",
            [
                (
                    "F.pad(ids_1, (0, T - ids_1.size(1)))",
                    "F.pad(ids_1, (0, T - ids_1.size(1)), value=-1)",
                ),
                (
                    "F.pad(ids_2, (0, T - ids_2.size(1)))",
                    "F.pad(ids_2, (0, T - ids_2.size(1)), value=-1)",
                ),
            ],
        ),
        (
            "the sides stacked as (B, 2, T), then transposed: not contiguous",
            [
                (
                    "        )\n        mask = torch.stack(",
                    "        , 1).transpose(0, 1)\n        mask = torch.stack(",
                )
            ],
        ),
        (
            "STS as 5 * relu(cosine)",
            [
                (
                    "return cosine_to_score(F.cosine_similarity(u, v, dim=-1))",
                    "return 5 * F.relu(F.cosine_similarity(u, v, dim=-1))",
                )
            ],
        ),
        (
            "the pairs stacked as (B, 2, T)",
            [
                (
                    'return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}',
                    "ids, mask = ids.transpose(0, 1), mask.transpose(0, 1)\n"
                    '        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}',
                )
            ],
        ),
        (
            "the pairs' padding unmasked",
            [
                (
                    "F.pad(mask_1, (0, T - mask_1.size(1)))",
                    "F.pad(mask_1, (0, T - mask_1.size(1)), value=1)",
                ),
                (
                    "F.pad(mask_2, (0, T - mask_2.size(1)))",
                    "F.pad(mask_2, (0, T - mask_2.size(1)), value=1)",
                ),
            ],
        ),
        (
            "the pairs padded on the left",
            [
                ("F.pad(ids_1, (0, T - ids_1.size(1)))", "F.pad(ids_1, (T - ids_1.size(1), 0))"),
                ("F.pad(ids_2, (0, T - ids_2.size(1)))", "F.pad(ids_2, (T - ids_2.size(1), 0))"),
                (
                    "F.pad(mask_1, (0, T - mask_1.size(1)))",
                    "F.pad(mask_1, (T - mask_1.size(1), 0))",
                ),
                (
                    "F.pad(mask_2, (0, T - mask_2.size(1)))",
                    "F.pad(mask_2, (T - mask_2.size(1), 0))",
                ),
            ],
        ),
        (
            "the sentences detached before the head",
            [("self.dropout(sentences)", "self.dropout(sentences.detach())")],
        ),
        (
            "no dropout",
            [("self.heads[task](self.dropout(sentences))", "self.heads[task](sentences)")],
        ),
        (
            "dropout on the logits",
            [
                (
                    "self.heads[task](self.dropout(sentences))",
                    "self.dropout(self.heads[task](sentences))",
                )
            ],
        ),
        (
            "dropout twice",
            [
                (
                    "self.heads[task](self.dropout(sentences))",
                    "self.heads[task](self.dropout(self.dropout(sentences)))",
                )
            ],
        ),
        (
            "probabilities, not logits",
            [
                (
                    "self.heads[task](self.dropout(sentences))",
                    "self.heads[task](self.dropout(sentences)).softmax(-1)",
                )
            ],
        ),
        (
            "p written in, 0.5, not the model's",
            [
                (
                    "self.heads[task](self.dropout(sentences))",
                    "self.heads[task](F.dropout(sentences, 0.5, self.training))",
                )
            ],
        ),
        (
            "predict_sentiment's token types made without device=",
            [
                (
                    "types = torch.zeros_like(input_ids)",
                    "types = torch.zeros(input_ids.shape, dtype=torch.long)",
                )
            ],
        ),
        (
            "the pairs' token types made without device=",
            [
                (
                    '"token_type_ids": torch.zeros_like(ids)}',
                    '"token_type_ids": torch.zeros(ids.shape, dtype=ids.dtype)}',
                )
            ],
        ),
        (
            "predict_sentiment's logits detached",
            [
                (
                    '"token_type_ids": types},\n        )',
                    '"token_type_ids": types},\n        ).detach()',
                )
            ],
        ),
        (
            "the longer side stacked first",
            [
                (
                    'return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}',
                    "if ids_2.size(1) > ids_1.size(1):\n"
                    "            ids, mask = ids.flip(0), mask.flip(0)\n"
                    '        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}',
                )
            ],
        ),
        (
            "the STS score detached",
            [
                (
                    "return cosine_to_score(F.cosine_similarity(u, v, dim=-1))",
                    "return cosine_to_score(F.cosine_similarity(u, v, dim=-1)).detach()",
                )
            ],
        ),
        (
            "STS as the raw cosine",
            [
                (
                    "cosine_to_score(F.cosine_similarity(u, v, dim=-1))",
                    "F.cosine_similarity(u, v, dim=-1)",
                )
            ],
        ),
        (
            "STS as 5 * cosine",
            [
                (
                    "cosine_to_score(F.cosine_similarity(u, v, dim=-1))",
                    "5 * F.cosine_similarity(u, v, dim=-1)",
                )
            ],
        ),
        (
            "token types of 1",
            [("types = torch.zeros_like(input_ids)", "types = torch.ones_like(input_ids)")],
        ),
        (
            "the first mask for both sides",
            [("F.pad(mask_2, (0, T - mask_2.size(1)))", "F.pad(mask_1, (0, T - mask_1.size(1)))")],
        ),
        (
            "pairs stacked side by side",
            [
                (
                    'return {"input_ids": ids, "attention_mask": mask',
                    'ids, mask = ids.transpose(0, 1).reshape(ids.shape), mask.transpose(0, 1).reshape(ids.shape)\n        return {"input_ids": ids, "attention_mask": mask',
                )
            ],
        ),
        (
            "the shorter side padded on the left",
            [
                (
                    "[F.pad(ids_1, (0, T - ids_1.size(1))), F.pad(ids_2, (0, T - ids_2.size(1)))]",
                    "[F.pad(ids_1, (T - ids_1.size(1), 0)), F.pad(ids_2, (T - ids_2.size(1), 0))]",
                ),
                (
                    "[F.pad(mask_1, (0, T - mask_1.size(1))), F.pad(mask_2, (0, T - mask_2.size(1)))]",
                    "[F.pad(mask_1, (T - mask_1.size(1), 0)), F.pad(mask_2, (T - mask_2.size(1), 0))]",
                ),
            ],
        ),
        (
            "T taken from the first side",
            [("T = max(ids_1.size(1), ids_2.size(1))", "T = ids_1.size(1)")],
        ),
    ],
    "multitask_step": [
        (
            "the step's loss returned in bfloat16",
            [("loss = loss + part.detach()", "loss = loss + part.detach().to(torch.bfloat16)")],
        ),
        (
            "a NaN in the step's loss",
            [("loss = loss + part.detach()", "loss = loss + part.detach() * float('nan')")],
        ),
        (
            "the scaled loss summed",
            [("loss = loss + part.detach()", "loss = loss + rt.scaler.scale(part).detach()")],
        ),
        (
            "part shares left out",
            [("weights[task] * share * part", "weights[task] * part")],
        ),
        ("task weights left out", [("weights[task] * share * part", "share * part")]),
        (
            "L2-SP on every part",
            [("(l2sp_pull(model, ctx) if k == 0 else 0.0)", "l2sp_pull(model, ctx)")],
        ),
        (
            "the last part's loss only",
            [("loss = loss + part.detach()", "loss = part.detach()")],
        ),
        (
            "backward of the last part only",
            [
                (
                    "rt.scaler.scale(part).backward()",
                    "if k == len(pieces) - 1:\n            rt.scaler.scale(part).backward()",
                )
            ],
        ),
        ("the loss scaler bypassed", [("rt.scaler.scale(part).backward()", "part.backward()")]),
        (
            "the loss scaled twice",
            [
                (
                    "rt.scaler.scale(part).backward()",
                    "rt.scaler.scale(rt.scaler.scale(part)).backward()",
                )
            ],
        ),
        (
            "1 / parts for the share",
            [("weights[task] * share * part", "weights[task] / len(pieces) * part")],
        ),
        (
            "the returned loss keeps its graph",
            [("loss = loss + part.detach()", "loss = loss + part")],
        ),
    ],
}
