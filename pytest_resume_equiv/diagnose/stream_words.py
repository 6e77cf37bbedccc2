"""How the report names a random stream, and the calls that save and restore it."""

from __future__ import annotations

from ..rank.layout import GENERATOR, OWNED_BY, device_index, generator_site, stream_kind

STREAM_WORDS = {
    "cpu": "the CPU RNG (torch's default generator)",
    "numpy": "numpy's global RNG",
    "python": "Python's random module",
}
"""By stream kind: the streams of one kind each."""
HOW = {
    "cpu": "torch.get_rng_state() / torch.set_rng_state()",
    "numpy": "np.random.get_state() / np.random.set_state()",
    "python": "random.getstate() / random.setstate()",
}
"""How the one stream of each of these kinds is saved and restored."""
GENERATOR_HOW = "generator.get_state() / generator.set_state()"


def stream_words(name: str) -> str:
    site = generator_site(name)
    if site is not None and OWNED_BY in site:
        owner = site.rsplit(" #", 1)[0]
        return f"the generator the {owner} makes whenever an iterator starts"
    if site is not None:
        return f"the generator created at {site}"
    kind = stream_kind(name)
    return STREAM_WORDS.get(kind) or f"the {kind} RNG of device {device_index(name)}"


def how_restored(name: str) -> str:
    """How a stream's state is saved and restored (`get / set`)."""
    kind = stream_kind(name)
    if kind == GENERATOR:
        return GENERATOR_HOW
    return HOW.get(kind, f"torch.{kind}.get_rng_state_all() / set_rng_state_all()")


def restore_call(name: str) -> str:
    """The call that restores a stream, as the restore log would show it."""
    kind = stream_kind(name)
    if kind == GENERATOR:
        return "set_state"
    return how_restored(name).split(" / ")[1] if kind in ("numpy", "python") else "set_rng_state"
