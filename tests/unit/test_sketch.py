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
