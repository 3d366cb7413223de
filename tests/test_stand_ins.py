"""The grader's stand-ins (grader/setups.py, grader/ascent.py) refuse what the functions
they stand for refuse: a body that crashes a real run never passes because a stand-in let
it through. Each pair is called on the same hostile inputs; both raise, or neither does.
tests/slips_*.py holds a slip that only this strictness catches, for each one a body can
reach."""

import torch

import ascent  # grader/ is on pytest's path
import setups
import smart
import tiny_bert
from bert import BertModel, BertSelfAttention


def runs(fn, *args) -> bool:
    """Whether the call returns, not raising."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001  (any refusal counts)
        return False
    return True


def same_refusals(stand_in, real, cases) -> None:
    for case in cases:
        assert runs(stand_in, *case) == runs(real, *case), case


B2, B1, B = torch.zeros(4, 3), torch.zeros(4, 1), torch.zeros(4)
OUTPUTS = [
    (p, q, kind)
    for kind in ("classification", "binary", "regression", "mse")
    for p, q in ((B2, B2), (B1, B1), (B, B), (B, B1), (B2, B), (torch.zeros(4, 3, 2),) * 2)
]


def test_the_divergences_stand_ins_refuse_what_smarts_divergences_refuse():
    same_refusals(ascent.outputs_checked, smart._check_outputs, OUTPUTS)
    same_refusals(ascent.stand_in_divergence, smart.divergence, OUTPUTS)
    same_refusals(ascent.stand_in_reference, smart.reference_divergence, OUTPUTS)


def ids(*shape, low=0, high=100, dtype=torch.long):
    return torch.randint(low, high, shape).to(dtype)


BAD_IDS = [
    (ids(2, 5), None),
    (ids(2, 5), torch.zeros(2, 5, dtype=torch.long)),
    (ids(2, 3, 5), None),  # not (B, T)
    (ids(2, 65), None),  # past the 64 positions
    (ids(2, 5, low=-1, high=0), None),
    (ids(2, 5, low=100, high=101), None),
    (ids(2, 5, dtype=torch.float32), None),
    (ids(2, 5), torch.zeros(2, 5)),  # float token types
    (ids(2, 5), torch.full((2, 5), 2)),  # a third segment
]


def test_the_encoders_stand_in_refuses_what_bert_model_refuses():
    table = torch.randn(100, 32)
    real, stand_in = BertModel(setups.tiny_config()).eval(), setups.StandInBert(table)
    same_refusals(stand_in.embed, real.embed, BAD_IDS)
    embeds, mask = torch.randn(2, 5, 32), torch.ones(2, 5)
    for bad in ((embeds, torch.ones(10)), (embeds, torch.ones(2, 6)), (embeds, mask)):
        assert runs(stand_in.encode, *bad) == runs(real.encode, *bad), bad[1].shape
    assert runs(stand_in.encode, embeds, mask, False)  # output_attentions, as BertModel


def test_the_scalers_and_the_attentions_stand_ins_refuse_what_they_stand_for():
    scaler = torch.amp.GradScaler("cpu")
    for loss in (torch.tensor(2.0, requires_grad=True), 2.0):
        assert runs(setups.ScaleBy8().scale, loss) == runs(scaler.scale, loss), loss
    for scaling in (setups.ScaleBy8(), scaler):  # unscale_ once a step, as GradScaler
        p = torch.nn.Parameter(torch.ones(3))
        optimizer = torch.optim.SGD([p], lr=0.0)
        scaling.scale(p.sum()).backward()
        scaling.unscale_(optimizer)
        assert not runs(scaling.unscale_, optimizer)
        scaling.step(optimizer), scaling.update()
        assert runs(scaling.unscale_, optimizer)  # a new step
    ours = BertModel(tiny_bert.tiny_config()).double()
    tiny_bert.attention_in(ours, tiny_bert.tiny_weights())
    stand_in = ours.bert_layers[0].self_attention
    real = BertSelfAttention(setups.tiny_config()).double().eval()
    x, mask = (
        torch.randn(2, 5, 32, dtype=torch.float64),
        torch.zeros(2, 1, 1, 5, dtype=torch.float64),
    )
    for case in ((x, mask), (x, None)):
        assert runs(stand_in, *case) == runs(real, *case), case[1]
