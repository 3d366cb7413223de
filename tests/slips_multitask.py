"""Slips of the handout's Part 2 exercises (grader/multitask_checks.py) and of
SentenceBERT's heads (`sbert`, grader/extensions.py): each a small change of the solution
that its check must fail (tests/test_grader.py grades them), as tests/slips_checks.py
holds Part 1's."""

# exercise -> [(what the slip is, [(old, new), ...])]
SLIPS = {
    "multitask": [
        (
            "the mask left out: every token attended",
            [
                (
                    'return self.bert(input_ids, attention_mask)["pooler_output"]',
                    'return self.bert(input_ids, torch.ones_like(attention_mask))["pooler_output"]',
                ),
            ],
        ),
        (
            "a sigmoid on the paraphrase logit",
            [
                (
                    "return self.paraphrase(torch.cat([u, v], -1)).squeeze(-1)",
                    "return torch.sigmoid(self.paraphrase(torch.cat([u, v], -1))).squeeze(-1)",
                ),
            ],
        ),
        (
            "softmax probabilities, not SST's logits",
            [
                (
                    "return self.sentiment(self.dropout(self(input_ids, attention_mask)))",
                    "return F.softmax(self.sentiment(self.dropout(self(input_ids, attention_mask))), -1)",
                ),
            ],
        ),
        (
            "the SST head made in predict_sentiment, not in __init__",
            [
                (
                    "return self.sentiment(self.dropout(self(input_ids, attention_mask)))",
                    "return nn.Linear(BERT_HIDDEN_SIZE, N_SENTIMENT_CLASSES)(self.dropout(self(input_ids, attention_mask)))",
                ),
            ],
        ),
        (
            "BERT under torch.no_grad()",
            [
                (
                    'return self.bert(input_ids, attention_mask)["pooler_output"]',
                    'with torch.no_grad():\n            return self.bert(input_ids, attention_mask)["pooler_output"]',
                ),
            ],
        ),
        (
            "the embeddings detached",
            [
                (
                    'return self.bert(input_ids, attention_mask)["pooler_output"]',
                    'return self.bert(input_ids, attention_mask)["pooler_output"].detach()',
                ),
            ],
        ),
        (
            "the paraphrase from the first sentence twice",
            [
                (
                    "return self.paraphrase(torch.cat([u, v], -1)).squeeze(-1)",
                    "return self.paraphrase(torch.cat([u, u], -1)).squeeze(-1)",
                ),
            ],
        ),
        (
            "the similarity from the second sentence twice",
            [
                (
                    "return self.similarity(torch.cat([u, v], -1)).squeeze(-1)",
                    "return self.similarity(torch.cat([v, v], -1)).squeeze(-1)",
                ),
            ],
        ),
        (
            "the first mask for the second sentence",
            [
                (
                    "return self.similarity(torch.cat([u, v], -1)).squeeze(-1)",
                    "v = self.dropout(self(input_ids_2, attention_mask_1))\n        return self.similarity(torch.cat([u, v], -1)).squeeze(-1)",
                ),
            ],
        ),
        (
            "squeeze() without a dim",
            [
                (
                    "return self.paraphrase(torch.cat([u, v], -1)).squeeze(-1)",
                    "return self.paraphrase(torch.cat([u, v], -1)).squeeze()",
                ),
            ],
        ),
        (
            "the embeddings centred on the batch's mean",
            [
                (
                    'return self.bert(input_ids, attention_mask)["pooler_output"]',
                    'out = self.bert(input_ids, attention_mask)["pooler_output"]\n        return out - out.mean(0)',
                ),
            ],
        ),
        (
            "a mean over every token, padding included",
            [
                (
                    'return self.bert(input_ids, attention_mask)["pooler_output"]',
                    'return self.bert(input_ids, attention_mask)["last_hidden_state"].mean(1)',
                ),
            ],
        ),
        (
            "SST's logits in float64 whatever the model's dtype",
            [
                (
                    "return self.sentiment(self.dropout(self(input_ids, attention_mask)))",
                    "return self.sentiment(self.dropout(self(input_ids, attention_mask))).double()",
                ),
            ],
        ),
        (
            "a tensor made without device= in the paraphrase head",
            [
                (
                    "return self.paraphrase(torch.cat([u, v], -1)).squeeze(-1)",
                    "return self.paraphrase(torch.cat([u, v], -1) + torch.zeros(2 * BERT_HIDDEN_SIZE)).squeeze(-1)",
                ),
            ],
        ),
        (
            "dropout left on in eval",
            [
                (
                    "return self.sentiment(self.dropout(self(input_ids, attention_mask)))",
                    "return self.sentiment(F.dropout(self(input_ids, attention_mask), 0.3, training=True))",
                ),
            ],
        ),
        (
            "the predicted class, not logits",
            [
                (
                    "return self.sentiment(self.dropout(self(input_ids, attention_mask)))",
                    "return self.sentiment(self.dropout(self(input_ids, attention_mask))).argmax(-1)",
                ),
            ],
        ),
        (
            "the hidden size written in: 768, bert-base's",
            [
                (
                    "        self.sentiment = nn.Linear(BERT_HIDDEN_SIZE, N_SENTIMENT_CLASSES)",
                    "        self.sentiment = nn.Linear(768, N_SENTIMENT_CLASSES)",
                ),
            ],
        ),
        (
            "BERT frozen whatever the option",
            [
                (
                    "        self.dropout = nn.Dropout(config.hidden_dropout_prob)",
                    "        self.bert.requires_grad_(False)\n        self.dropout = nn.Dropout(config.hidden_dropout_prob)",
                ),
            ],
        ),
        (
            "the second mask for the first sentence of a paraphrase",
            [
                (
                    "return self.paraphrase(torch.cat([u, v], -1)).squeeze(-1)",
                    "u = self.dropout(self(input_ids_1, attention_mask_2))\n        return self.paraphrase(torch.cat([u, v], -1)).squeeze(-1)",
                ),
            ],
        ),
        (
            "a NaN in SST's logits",
            [
                (
                    "return self.sentiment(self.dropout(self(input_ids, attention_mask)))",
                    "return self.sentiment(self.dropout(self(input_ids, attention_mask))) + float('nan')",
                ),
            ],
        ),
        (
            "the paraphrase logit in bfloat16",
            [
                (
                    "return self.paraphrase(torch.cat([u, v], -1)).squeeze(-1)",
                    "return self.paraphrase(torch.cat([u, v], -1)).squeeze(-1).bfloat16()",
                ),
            ],
        ),
        (
            "the similarity in float16",
            [
                (
                    "return self.similarity(torch.cat([u, v], -1)).squeeze(-1)",
                    "return self.similarity(torch.cat([u, v], -1)).squeeze(-1).half()",
                ),
            ],
        ),
    ],
    "sbert": [
        (
            "the STS cosine of the sentences before the given dropout",
            [
                (
                    "cosine_to_score(F.cosine_similarity(u, v, dim=-1))",
                    "cosine_to_score(F.cosine_similarity(*sentences.view(2, -1, sentences.size(-1)).unbind(0), dim=-1))",
                ),
            ],
        ),
        (
            "STS as 5 * relu(cosine)",
            [
                (
                    "return cosine_to_score(F.cosine_similarity(u, v, dim=-1))",
                    "return 5 * F.relu(F.cosine_similarity(u, v, dim=-1))",
                ),
            ],
        ),
        (
            "the sentences detached before the head",
            [
                (
                    "self.dropout(sentences)",
                    "self.dropout(sentences.detach())",
                ),
            ],
        ),
        (
            "no dropout",
            [
                (
                    "self.heads[task](self.dropout(sentences))",
                    "self.heads[task](sentences)",
                ),
            ],
        ),
        (
            "dropout on the logits",
            [
                (
                    "self.heads[task](self.dropout(sentences))",
                    "self.dropout(self.heads[task](sentences))",
                ),
            ],
        ),
        (
            "dropout twice",
            [
                (
                    "self.heads[task](self.dropout(sentences))",
                    "self.heads[task](self.dropout(self.dropout(sentences)))",
                ),
            ],
        ),
        (
            "probabilities, not logits",
            [
                (
                    "self.heads[task](self.dropout(sentences))",
                    "self.heads[task](self.dropout(sentences)).softmax(-1)",
                ),
            ],
        ),
        (
            "p written in, 0.5, not the model's",
            [
                (
                    "self.heads[task](self.dropout(sentences))",
                    "self.heads[task](F.dropout(sentences, 0.5, self.training))",
                ),
            ],
        ),
        (
            "the STS score detached",
            [
                (
                    "return cosine_to_score(F.cosine_similarity(u, v, dim=-1))",
                    "return cosine_to_score(F.cosine_similarity(u, v, dim=-1)).detach()",
                ),
            ],
        ),
        (
            "STS as the raw cosine",
            [
                (
                    "cosine_to_score(F.cosine_similarity(u, v, dim=-1))",
                    "F.cosine_similarity(u, v, dim=-1)",
                ),
            ],
        ),
        (
            "STS as 5 * cosine",
            [
                (
                    "cosine_to_score(F.cosine_similarity(u, v, dim=-1))",
                    "5 * F.cosine_similarity(u, v, dim=-1)",
                ),
            ],
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
