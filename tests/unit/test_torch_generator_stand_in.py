"""What stands for `torch.Generator` while a rank audits its generators (rank/rng.py,
`logged_generator_class`) behaves as torch.Generator does for the code a trainer writes:
`type()`, `isinstance` / `issubclass`, a subclass of its own, pickling and copying. Each answer
is taken once with torch's own class and once with the audit installed, and they must be the
same. The differences that remain are pinned below, each with what it means."""

import copy
import inspect
import pickle

import pytest
import torch

from pytest_resume_equiv.rank.context import current


@pytest.fixture
def audited(in_rank):
    """A rank whose generators are registered as they are made; the calls the stand-in
    reports as restores are collected. Taken out again at the end."""
    in_rank()
    calls = []
    current().generators.install(lambda generator, call: calls.append((generator, call)))
    assert torch.Generator is not torch._C.Generator  # the stand-in is in place
    yield calls
    current().generators.uninstall()
    assert torch.Generator is torch._C.Generator


def _copies(generator):
    return {
        "pickle": pickle.loads(pickle.dumps(generator)),
        "deepcopy": copy.deepcopy(generator),
        "copy": copy.copy(generator),
    }


def behaviour():
    """What a trainer's code can see of `torch.Generator` now, as plain values."""
    g = torch.Generator().manual_seed(7)

    class Named(torch.Generator):
        label = "mine"

        def draw(self):
            return torch.randint(0, 1000, (3,), generator=self).tolist()

    named = Named()
    named.manual_seed(3)
    answers = {
        "type(g) is torch.Generator": type(g) is torch.Generator,
        "isinstance(g, torch.Generator)": isinstance(g, torch.Generator),
        "isinstance(g, torch._C.Generator)": isinstance(g, torch._C.Generator),
        "a default generator is a torch.Generator": isinstance(
            torch.default_generator, torch.Generator
        ),
        "issubclass(torch._C.Generator, torch.Generator)": issubclass(
            torch._C.Generator, torch.Generator
        ),
        "issubclass(type(g), torch.Generator)": issubclass(type(g), torch.Generator),
        "a plain object is no generator": isinstance(object(), torch.Generator),
        "devices": [str(torch.Generator(*a, **k).device) for a, k in [(("cpu",), {}), ((), {})]]
        + [str(torch.Generator(device="cpu").device)],
        "draws": torch.randn(3, generator=g).tolist(),
        "a subclass's instance is of that class": type(named) is Named,
        "isinstance of the subclass and of torch.Generator": (
            isinstance(named, Named),
            isinstance(named, torch.Generator),
        ),
        "a default generator is not of the subclass": isinstance(torch.default_generator, Named),
        "issubclass(Named, torch.Generator)": issubclass(Named, torch.Generator),
        "the subclass's own method and attribute": (named.draw(), named.label),
        "the subclass's seed": named.initial_seed(),
    }
    for source, made in (("g", g), ("a subclass's instance", named)):
        for how, copied in _copies(made).items():
            answers[f"{how} of {source}"] = (
                type(copied) is torch.Generator,
                copied is not made,
                torch.equal(copied.get_state(), made.get_state()),
                torch.randn(2, generator=copied).tolist()
                == torch.randn(2, generator=made).tolist(),
            )
    return answers


def test_the_stand_in_answers_as_torch_generator_does(in_rank):
    expected = behaviour()
    in_rank()
    current().generators.install(lambda generator, call: None)
    try:
        got = behaviour()
    finally:
        current().generators.uninstall()
    assert got == expected


def test_every_generator_made_is_audited_and_only_the_users_seeding_is_reported(audited):
    """A subclass's instance and a copy are generators the trainer made: audited. Copying is
    no restore; torch's own class method called on a generator the audit never made (a
    default one) reports nothing."""

    class Named(torch.Generator):
        pass

    g, named = torch.Generator(), Named()
    copies = [*_copies(g).values(), *_copies(named).values()]
    live = [generator for _, generator in current().generators.live()]
    assert all(any(made is found for found in live) for made in [g, named, *copies])
    assert audited == []
    named.manual_seed(4)
    g.set_state(copies[0].get_state())
    torch.Generator.manual_seed(torch.default_generator, 5)
    assert [(generator, call) for generator, call in audited] == [
        (named, "manual_seed"),
        (g, "set_state"),
    ]


def test_a_generator_pickled_under_the_audit_loads_as_torchs_own_without_it(in_rank):
    in_rank()
    current().generators.install(lambda generator, call: None)
    try:
        data = pickle.dumps(torch.Generator().manual_seed(9))
    finally:
        current().generators.uninstall()
    loaded = pickle.loads(data)
    assert type(loaded) is torch._C.Generator and loaded.initial_seed() == 9


def test_what_differs_from_torch_generator(audited):
    """`torch._C.Generator` itself is not replaced (torch's C code and the default generators
    use it), so the stand-in is a subclass of it:

    - `type(g) is torch._C.Generator` is False, and `repr(g)` names `torch.Generator`. torch's
      C++ accepts a subclass (its check is a subclass check) and Python code asks
      `isinstance`, which answers as without the audit. torch.compile is the exception: dynamo
      tells a generator by its exact type, so a compiled function given a generator made in
      a rank fails to trace (known; told in docs/reference/in-process.md).
    - `inspect.signature(torch.Generator)` is the stand-in's `(*args, **kwargs)`; torch's
      class, a builtin type, has none (ValueError).
    - A generator made before the audit, or loaded from a pickle written without it, is
      torch's own and not audited (the trainer names it with `track`)."""
    g = torch.Generator()
    assert type(g) is not torch._C.Generator and isinstance(g, torch._C.Generator)
    assert repr(g).startswith("<torch.Generator object")
    assert str(inspect.signature(torch.Generator)) == "(*args: 'Any', **kwargs: 'Any') -> 'Any'"
    current().generators.uninstall()
    with pytest.raises(ValueError):
        inspect.signature(torch.Generator)
