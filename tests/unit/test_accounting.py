"""Exactly-once data accounting over the global batch, on hand-made signatures."""

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
