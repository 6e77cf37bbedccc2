"""The in-rank audit: random streams, generator identities, watch() sections, the teeth check's mutation."""

import random
import sys

import numpy as np
import pytest
import torch

import pytest_resume_equiv as req
from pytest_resume_equiv.rank import rng
from pytest_resume_equiv.rank.context import current
from pytest_resume_equiv.rank.fingerprint import content_hash, device_digest


def audit_streams():
    return rng.streams(current().generators)


def watched():
    return current().watched.audit()


@pytest.fixture
def tracking(in_rank):
    """A rank whose generators are registered as they are made (what the bootstrap installs)."""
    in_rank()
    real = torch.Generator
    current().generators.install(lambda generator, call: None)
    yield
    current().generators.uninstall()
    assert torch.Generator is real


def test_generators_are_named_by_creation_site(tracking):
    g = torch.Generator().manual_seed(1)  # this line is the site
    line = test_generators_are_named_by_creation_site.__code__.co_firstlineno + 1
    other = torch.Generator().manual_seed(2)
    streams = audit_streams()
    assert f"generator test_audit.py:{line} #0" in " ".join(streams) or any(
        k.endswith(f"test_audit.py:{line} #0") for k in streams
    )
    assert isinstance(g, torch.Generator) and isinstance(torch.default_generator, torch.Generator)
    before = dict(streams)
    torch.randn(3, generator=g)
    after = audit_streams()
    changed = [k for k in after if after[k] != before.get(k)]
    assert len(changed) == 1 and changed[0].startswith("generator ")
    req.track(other, name="sampler")
    assert "generator sampler" in audit_streams()


def test_live_ordinals_ignore_dead_generators(tracking):
    def make():
        return torch.Generator()

    first = make()
    del first
    second = make()  # noqa: F841 - kept alive on purpose
    keys = [k for k in audit_streams() if k.startswith("generator ")]
    assert len(keys) == 1 and keys[0].endswith(" #0")


def test_host_streams_and_numpy_position(tracking):
    rng.seed_host_streams(0)
    start = audit_streams()
    np.random.rand()  # moves the position only; the key array is unchanged until 624 draws
    assert audit_streams()["numpy"] != start["numpy"]
    random.random()
    assert audit_streams()["python"] != start["python"]
    torch.rand(1)
    assert audit_streams()["cpu"] != start["cpu"]


def test_mutate_moves_every_stream(tracking):
    g = torch.Generator().manual_seed(3)
    # Start the host streams away from the mutation's own seed, which an earlier test in this
    # process may have left them at.
    random.seed(3)
    np.random.seed(3)
    before = audit_streams()
    rng.mutate(current().generators)
    after = audit_streams()
    assert all(after[k] != before[k] for k in before), [k for k in before if after[k] == before[k]]
    del g


def test_watch_sections(in_rank):
    in_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    req.watch(model=model, optimizer=opt, scheduler=sched)
    model(torch.randn(4, 2)).sum().backward()
    opt.step()
    sched.step()
    model[1].eval()
    audit = watched()
    assert set(audit) == {
        "model.params",
        "model.buffers",
        "model.modes",
        "optimizer.lr",
        "optimizer.hyper",
        "optimizer.state",
        "optimizer.params",
        "scheduler.last_lr",
        "scheduler.last_epoch",
    }
    assert audit["model.modes"] == ["1"]
    assert set(audit["optimizer.state"]["model.0.weight"]) == {"exp_avg", "exp_avg_sq", "step"}
    assert audit["optimizer.lr"][0]["repr"] == "0.05"
    assert audit["scheduler.last_epoch"] == 1
    assert audit["model.params"]["0.weight"]["hash"] == content_hash(model[0].weight)


def test_watch_is_a_noop_outside_a_run():
    req.watch(model=torch.nn.Linear(1, 1))
    assert current().context is None and current().watched.objects == {}


def test_device_digest_is_exact_and_order_sensitive():
    # The accelerator path, exercised on CPU tensors: integer ops only.
    t = torch.arange(10, dtype=torch.float32)
    assert device_digest(t) == device_digest(t.clone())
    assert device_digest(t) != device_digest(t.flip(0))
    bumped = t.clone()
    bumped[7] = torch.nextafter(bumped[7], torch.tensor(100.0))
    assert device_digest(t) != device_digest(bumped)
    assert device_digest(torch.zeros(3, dtype=torch.uint8)) != device_digest(
        torch.zeros(4, dtype=torch.uint8)
    )


def test_a_loader_is_audited_by_the_parts_a_resume_must_carry(in_rank):
    from torch.utils.data import DataLoader, DistributedSampler

    in_rank()
    data = list(range(8))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=2, sampler=sampler, generator=torch.Generator())
    req.watch(loader=loader)
    sampler.set_epoch(2)
    audit = watched()
    assert audit["loader.epoch"] == {"sampler.epoch": 2, "sampler.seed": 3}
    assert set(audit["loader.generator"]) == {"loader"}
    assert "loader.position" not in audit  # a plain DataLoader has no position to read


def test_a_stateful_loader_is_audited_with_its_position_and_workers(in_rank):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    in_rank()
    loader = stateful.StatefulDataLoader(list(range(8)), batch_size=2, shuffle=True)
    req.watch(loader=loader)
    batches = iter(loader)
    next(batches)
    first = watched()
    next(batches)
    second = watched()
    assert first["loader.position"]["batches yielded"] == 1
    assert second["loader.position"]["batches yielded"] == 2
    assert second["loader.position"]["samples yielded"] == 4
    assert "saved sampler iterator" in second["loader.generator"]


def _first_batch(batches):
    return next(batches)  # another line than the test's own next(): not where it is named


def test_a_samplers_generator_is_named_by_its_loader_wherever_its_iterator_starts(tracking):
    from torch.utils.data import DataLoader

    from pytest_resume_equiv.rank.layout import parent_stream, stream_key

    loader = DataLoader(list(range(8)), batch_size=2, shuffle=True)  # the loader's line
    line = test_a_samplers_generator_is_named_by_its_loader_wherever_its_iterator_starts
    built_at = line.__code__.co_firstlineno + 5
    here = iter(loader)
    next(here)
    started_here = [k for k in audit_streams() if k.startswith("generator ")]
    del here
    there = iter(loader)
    _first_batch(there)
    elsewhere = [k for k in audit_streams() if k.startswith("generator ")]
    assert started_here == elsewhere and len(elsewhere) == 1
    name = elsewhere[0]
    assert name.startswith("generator RandomSampler of the DataLoader built at ")
    assert name.endswith(f"test_audit.py:{built_at} #0")
    assert parent_stream(stream_key(name)) == "rng:cpu"
    own = torch.Generator().manual_seed(1)  # a generator the user makes: named by its line
    own_line = sys._getframe().f_lineno - 1
    mine = [k for k in audit_streams() if k.endswith(f"test_audit.py:{own_line} #0")]
    assert len(mine) == 1 and parent_stream(stream_key(mine[0])) is None
    del own, there


def test_uninstall_gives_the_dataloader_its_own_init_back(in_rank):
    from torch.utils.data import DataLoader

    in_rank()
    real = DataLoader.__init__
    current().generators.install(lambda generator, call: None)
    assert DataLoader.__init__ is not real
    current().generators.uninstall()
    assert DataLoader.__init__ is real
