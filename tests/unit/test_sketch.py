"""The sketch an equivalence launch records beside each step (rank/sketch.py): dropout made an
identity or kept, and counted; a forward's token count; the gradient's squared norm before
and after each backward and at the step, with no edit to the training."""

import torch
import torch.nn.functional as F
from torch import nn

from pytest_resume_equiv.rank.auto import AutoRecorder
from pytest_resume_equiv.rank.sketch import Sketch, token_count


def sketch_of(off: bool):
    notes: dict[str, list] = {}
    sketch = Sketch(lambda k, v: notes.setdefault(k, []).append(v), lambda: [])
    sketch.install_dropout(off)
    return sketch, notes


def test_dropout_off_is_an_identity_and_counted_and_uninstalled():
    x = torch.ones(4, 8)
    sketch, notes = sketch_of(off=True)
    try:
        assert torch.equal(nn.Dropout(0.5)(x), x)  # the module calls the functional
        assert torch.equal(F.dropout(x, p=0.9, training=True), x)
        assert torch.equal(F.dropout(x, 0.5, False), x)  # not training: no mask, not counted
    finally:
        sketch.uninstall()
    assert len(notes["dropout_off"]) == 2 and "dropout" not in notes
    assert not torch.equal(F.dropout(x, p=0.5, training=True), x)  # restored


def test_dropout_on_draws_its_masks_and_is_counted():
    x = torch.ones(64, 8)
    sketch, notes = sketch_of(off=False)
    try:
        assert not torch.equal(F.dropout(x, 0.5), x)
    finally:
        sketch.uninstall()
    assert len(notes["dropout"]) == 1


def test_attention_dropout_given_by_position_is_switched_off():
    q = torch.randn(1, 2, 4, 8)
    sketch, notes = sketch_of(off=True)
    try:
        # query, key, value, attn_mask, dropout_p, is_causal by position
        out = F.scaled_dot_product_attention(q, q, q, None, 0.9, True)
    finally:
        sketch.uninstall()
    assert torch.allclose(out, F.scaled_dot_product_attention(q, q, q, None, 0.0, True))
    assert len(notes["dropout_off"]) == 1


def test_a_forwards_token_count_comes_from_labels_else_a_mask():
    labels = torch.tensor([[1, 2, -100], [3, -100, -100]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    assert float(token_count([("kw.labels", labels), ("1", mask)])) == 3
    assert float(token_count([("0", torch.tensor([[5, 6, 7]])), ("1", mask)])) == 5
    assert float(token_count([("kw.attention_mask", torch.tensor([[2, 1]]))])) == -1
    assert token_count([("0", torch.randn(2, 3))]) is None  # floats that are not 0s and 1s


def test_the_gradient_before_and_after_each_backward_and_at_the_step():
    """Two backwards of one window, nothing between them, then the step: the norm before the
    second backward is the one after the first (not zeroed, not scaled)."""
    steps = []
    recorder = AutoRecorder(steps.append)
    recorder.sketch = Sketch(recorder.counter.note, lambda: recorder.found.of("optimizer"))
    recorder.install()
    try:  # built as a trainer builds them: the optimizer is found when made
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.ones(2, 3)).sum().backward()
        optimizer.step()
        recorder.boundary()
    finally:
        recorder.uninstall()
    notes = steps[0].notes
    before, after = (
        [float(v) for v in notes["grad_before"]],
        [float(v) for v in notes["grad_after"]],
    )
    assert before[0] == 0 and before[1] == after[0] > 0 and after[1] == 4 * after[0]
    assert float(notes["grad_stepped"][0]) == after[1]


def test_a_samples_unpadded_id_does_not_change_with_its_micro_batchs_padding():
    """Dynamic padding pads a sample to its micro-batch's longest member; its id is read from
    the positions its mask keeps (right or left padding), so it is the same in any batch."""
    from pytest_resume_equiv.rank.sketch import unpadded_ids

    ids = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 0, 0, 0]])
    mask = (ids != 0).long()
    labels = torch.tensor([1, 0])
    alone = unpadded_ids([("kw.input_ids", ids[:1, :3]), ("kw.attention_mask", mask[:1, :3])])
    padded = unpadded_ids(
        [("kw.input_ids", ids), ("kw.attention_mask", mask), ("kw.labels", labels)]
    )
    left = unpadded_ids(
        [
            ("kw.input_ids", torch.tensor([[0, 5, 6, 7]])),
            ("kw.attention_mask", torch.tensor([[0, 1, 1, 1]])),
        ]
    )
    assert alone is not None and padded is not None and left is not None
    assert alone == left and len(set(padded)) == 2
    relabelled = unpadded_ids(
        [("kw.input_ids", ids), ("kw.attention_mask", mask), ("kw.labels", labels * 0)]
    )
    assert relabelled[1] == padded[1] and relabelled[0] != padded[0]  # the label is the sample's
    assert unpadded_ids([("0", torch.randn(2, 3))]) is None  # no mask: the content ids count


def test_each_parameters_stepped_gradient_is_named_by_its_model():
    steps = []
    recorder = AutoRecorder(steps.append)
    recorder.sketch = Sketch(
        recorder.counter.note,
        lambda: recorder.found.of("optimizer"),
        lambda: recorder.found.of("model"),
    )
    recorder.install()
    try:
        model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(4, 3)).sum().backward()
        optimizer.step()
        recorder.boundary()
    finally:
        recorder.uninstall()
    per_tensor = steps[0].notes["grad_tensors"][0]
    assert sorted(per_tensor) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    want = float(model[1].bias.grad.double().pow(2).sum())
    assert float(per_tensor["1.bias"]) == want
    assert float(steps[0].notes["grad_stepped"][0]) == sum(float(v) for v in per_tensor.values())
