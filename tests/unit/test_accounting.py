"""Exactly-once data accounting over the global batch, on hand-made signatures."""

import pytest
from test_compare import sig

from pytest_resume_equiv.compare.accounting import account


def run(phase, world, steps, ids, epoch=None):
    out = {}
    for rank in range(world):
        records = []
        for s in steps:
            values = {"sample_ids": ids(s)[rank::world]}
            if epoch is not None:
                values["watch:loader.epoch"] = {"sampler.epoch": epoch(s)}
            records.append((s, values))
        out[rank] = sig(rank, phase, records, world)
    return out


EPOCH = [[3, 1], [0, 2], [2, 0], [1, 3]]  # 4 samples, 2 per step: epochs of 2 steps


def order(step):
    return EPOCH[step - 1]


def test_ids_seen_again_in_a_later_epoch_are_not_moved():
    base = run("uninterrupted", 1, range(1, 5), order)
    (item,) = account(base, run("resumed", 1, range(2, 5), order), 1, 4)
    assert item.exact and "exactly once" in item.text()


def test_missing_and_repeated_over_the_global_batch_on_another_world_size():
    def ids(step):
        return [4 * (step - 1) + k for k in range(4)]

    base = run("uninterrupted", 2, range(1, 5), ids)  # 2 ids per rank per step
    # resumed on one rank after step 2 from a per-process count: 4 samples, not 8
    (item,) = account(base, run("resumed", 1, range(3, 5), lambda s: ids(s - 1)), 2, 4)
    assert item.missing == [12, 13, 14, 15] and item.repeated == [4, 5, 6, 7]
    assert item.moved == [8, 9, 10, 11]
    assert "ids 12-15 never seen, ids 4-7 seen twice or more, ids 8-11 consumed at another" in (
        item.text()
    )


def test_an_epoch_replayed_is_named_from_the_watched_loader_epoch():
    base = run("uninterrupted", 1, range(1, 5), order, epoch=lambda s: (s - 1) // 2)
    replayed = {3: [3, 1], 4: [0, 2]}  # epoch 1 resumed with epoch 0's permutation
    (item,) = account(base, run("resumed", 1, range(3, 5), replayed.get), 2, 4)
    assert item.replayed == ([3, 4], [1, 2])
    assert "(epoch 0's order replayed in epoch 1: the resumed run consumed at steps 3-4" in (
        item.text()
    )


def test_no_ids_no_account():
    base = {0: sig(0, "uninterrupted", [(s, {"loss": 1.0}) for s in range(1, 4)], 1)}
    assert account(base, base, 1, 3) == []


# The model's inputs by content (auto:data): no sample ids recorded by the trainer


def inputs(step):
    """The global batch of a step: 4 inputs, each an id made of its content."""
    return [1000 * step + k for k in range(4)]


def by_content(phase, world, steps, batch):
    """Each rank's share of the global batch, recorded as automatic recording does."""
    return {
        rank: sig(rank, phase, [(s, {"auto:data": batch(s)[rank::world]}) for s in steps], world)
        for rank in range(world)
    }


BASE = by_content("uninterrupted", 2, range(1, 7), inputs)


@pytest.mark.parametrize("world", [2, 1], ids=["same-topology", "one-rank"])
def test_a_batch_skipped_at_the_resume_is_named_by_its_step(world):
    """Over the global batch, every rank's together: the same words on 1 rank as on 2."""
    (item,) = account(
        BASE, by_content("resumed", world, range(4, 7), lambda s: inputs(s + 1)), 3, 6
    )
    assert item.unconsumed == [4] and item.batches == [(4, 5), (5, 6)]
    assert item.order_words() == (
        "the batch of step 4 was never consumed: step 4 consumed the batch of step 5, and each "
        "later step the batch of the step after its own"
    )
    # step 6 consumed data past the uninterrupted run's: seen once, not twice
    assert item.repeated == [] and item.unknown_steps == [6] and not item.content_differs
    assert "seen twice" not in item.text() and "past its data" in item.text()


def test_a_batch_consumed_again_is_named_by_its_step():
    (item,) = account(BASE, by_content("resumed", 2, range(4, 7), lambda s: inputs(s - 1)), 3, 6)
    assert item.order_words() == (
        "step 4 consumed the batch of step 3 again, and each later step the batch of the step "
        "before its own (the batch of step 6 was never consumed)"
    )


def test_one_batch_repeated_mid_run():
    res = by_content("resumed", 2, range(4, 7), lambda s: inputs(4) if s == 5 else inputs(s))
    (item,) = account(BASE, res, 3, 6)
    assert item.order_words() == (
        "step 5 consumed the batch of step 4 again (the batch of step 5 was never consumed)"
    )


def test_inputs_found_nowhere_are_not_counted_as_samples_lost_or_repeated():
    """Every input new: no order of the same samples, so no sample was never seen or seen
    twice. Not augmentation either by itself: other samples (ones the uninterrupted run had
    not reached) make new inputs too, so the words say both."""
    res = by_content("resumed", 2, range(4, 7), lambda s: [i + 7 for i in inputs(s)])
    (item,) = account(BASE, res, 3, 6)
    assert item.content_differs and item.order_words() == ""
    text = item.text()
    assert "steps 4-6 consumed 12 inputs found nowhere in the uninterrupted run" in text
    assert "other samples (ones the uninterrupted run did not reach" in text
    assert "or the same samples transformed otherwise" in text
    assert "augmentation" not in text
    assert "never seen" not in text and "seen twice" not in text


def test_a_reshuffle_in_a_test_shorter_than_an_epoch_is_counted_by_sample():
    """The trial on HF's run_clm_no_trainer.py, 1 rank: 16 samples, batches of 2, steps=6 (12
    samples reached); the resumed run drew another permutation, and one sample of its step 4
    is one the uninterrupted run never reached. Samples moved and repeated: counted, never
    called other content (the old words said "as by a random augmentation")."""
    first = [3, 7, 1, 12, 9, 4, 15, 0, 6, 11, 2, 13, 5, 8, 10, 14]
    again = [9, 14, 3, 11, 6, 0, 7, 2, 12, 15, 1, 4, 8, 5, 13, 10]
    base = by_content("uninterrupted", 1, range(1, 7), lambda s: first[2 * s - 2 : 2 * s])
    res = by_content("resumed", 1, range(4, 7), lambda s: again[2 * s - 8 : 2 * s - 6])
    (item,) = account(base, res, 3, 6)
    assert not item.content_differs and item.unknown_steps == [4]
    text = item.text()
    assert "samples never seen" in text and "seen twice or more" in text, text
    assert "1 sample the uninterrupted run never consumed (at step 4: past its data, or " in text
    assert "samples it did not reach within its steps)" in text
    assert "found nowhere" not in text and "augmentation" not in text and "transformed" not in text


def test_the_loaders_batches_are_the_sample_ids_when_a_loader_was_seen():
    """Noise added in the loop: the model's inputs are new at every step, the batches the
    DataLoader yielded are the samples. Those are accounted, and name the batch skipped."""
    from pytest_resume_equiv.compare.accounting import identity_keys

    def run(phase, steps, shift):
        values = [
            (
                s,
                {
                    "auto:data": [i + 7 * (phase == "resumed") for i in inputs(s)],
                    "auto:batch": [i + 1 for i in inputs(s + shift)],
                },
            )
            for s in steps
        ]
        return {0: sig(0, phase, values, 1)}

    base, res = run("uninterrupted", range(1, 7), 0), run("resumed", range(4, 7), 1)
    assert identity_keys(base) == ["auto:batch"]
    (item,) = account(base, res, 3, 6)
    assert item.key == "auto:batch" and not item.content_differs
    assert item.text().startswith("data (the batches the DataLoader yielded, by content)")
    assert item.order_words().startswith("the batch of step 4 was never consumed")
    (exact,) = account(base, run("resumed", range(4, 7), 0), 3, 6)
    assert exact.exact  # the noise differs, the samples do not


def test_a_restart_keeps_its_replay_words():
    res = by_content("resumed", 2, range(4, 7), lambda s: inputs(s - 3))
    (item,) = account(BASE, res, 3, 6)
    assert "the resumed run consumed at steps 4-6 the samples of steps 1-3, in order" in item.text()


def test_inputs_seen_at_several_steps_are_named_with_their_twin():
    """An epoch of 3 steps without shuffle: the same inputs at steps 3 and 6. A resumed run
    that consumes them over and over: which step's batch it was is a reading, said as one."""
    base = by_content("uninterrupted", 1, range(1, 8), lambda s: inputs((s - 1) % 3 + 1))
    res = by_content("resumed", 1, range(3, 8), lambda s: inputs(3))
    (item,) = account(base, res, 2, 7)
    words = item.order_words()
    assert words.startswith(
        "step 4 consumed the batch of step 3 again (the same inputs as step 6's)"
    )
    assert words.endswith("(the batches of steps 4-5, 7 were never consumed)")


def test_samples_drawn_with_replacement_make_no_epochs():
    """minGPT samples with replacement (no epochs): a sample that comes back at step 3 does
    not make steps 1-2 an epoch, so a replay is named by its steps, never 'epoch 1'."""
    drawn = {1: [1, 2], 2: [3, 4], 3: [5, 1], 4: [6, 7], 5: [8, 9], 6: [2, 10]}
    base = run("uninterrupted", 1, range(1, 7), drawn.get)
    restarted = {4: drawn[1], 5: drawn[2], 6: drawn[3]}  # started over, numbered from 4
    (item,) = account(base, run("resumed", 1, range(4, 7), restarted.get), 3, 6)
    assert item.replayed == ([4, 5, 6], [1, 2, 3]) and item.epochs is None
    assert "epoch" not in item.text()
    # the same samples again each epoch: epochs of 2 steps, named
    epochs = {1: [1, 2], 2: [3, 4], 3: [4, 1], 4: [2, 3], 5: [3, 2], 6: [1, 4]}
    base = run("uninterrupted", 1, range(1, 7), epochs.get)
    restarted = {4: epochs[1], 5: epochs[2], 6: epochs[3]}
    (item,) = account(base, run("resumed", 1, range(4, 7), restarted.get), 3, 6)
    assert item.epochs == (0, 1)
