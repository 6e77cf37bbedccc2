"""Audit every random stream of a rank: CPU, each local accelerator, numpy, Python, and
every `torch.Generator` the process created, named by where it was created.

Generators are found by wrapping `torch.Generator` construction once the in-rank API is active
(the bootstrap does it before the user's code runs), because a generator owned by some module
or sampler and re-seeded at construction is the resume bug nobody thinks to save.
"""

from __future__ import annotations

import os
import struct
import sys
import weakref
from typing import Any, Optional

from .fingerprint import content_hash, hash_bytes
from .trace import short_path

_TORCH_DIR: Optional[str] = None
_OUR_DIR = os.path.dirname(os.path.abspath(__file__))
"""Frames in the in-rank machinery are skipped; the toy models' own frames are real sites."""

_generators: list[tuple[str, weakref.ref, bool]] = []
"""(creation site or given name, weak reference, named?) in creation order."""
_ignored: set[str] = set()
"""Audit names of generators tracked with ignore=True: left out of the audit."""
_installed = False


def creation_site() -> str:
    """The first frame outside torch and the in-rank API: where the generator was made."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_OUR_DIR) and not (_TORCH_DIR and path.startswith(_TORCH_DIR)):
            return f"{short_path(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def _register(generator: Any, name: Optional[str] = None) -> None:
    _generators.append((name or creation_site(), weakref.ref(generator), name is not None))


def identity_of(generator: Any) -> str:
    """The audit's name for a live generator ("site #k", or the name given to `track`).
    An op's generator argument can be another Python object for the same generator: then
    the live one in the same state is it."""
    live = _live_generators()
    for identity, candidate in live:
        if candidate is generator:
            return identity
    state = generator.get_state()
    torch = sys.modules["torch"]
    for identity, candidate in live:
        if candidate.device == generator.device and torch.equal(candidate.get_state(), state):
            return identity
    return f"unknown {generator.device}"


def _live_generators() -> list[tuple[str, Any]]:
    """(identity, generator) of the live generators, in creation order.

    The ordinal counts live generators per site, so a sampler that makes a fresh generator
    every epoch is 'site #0' in both runs even though the resumed run made fewer of them.
    """
    global _generators
    _generators = [entry for entry in _generators if entry[1]() is not None]
    counts: dict[str, int] = {}
    live = []
    for site, ref, named in _generators:
        generator = ref()
        if named:
            live.append((site, generator))
            continue
        ordinal = counts.get(site, 0)
        counts[site] = ordinal + 1
        live.append((f"{site} #{ordinal}", generator))
    return live


def install() -> None:
    """Wrap `torch.Generator` so every generator created from now on is audited."""
    global _installed, _TORCH_DIR
    if _installed:
        return
    import torch

    _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
    real = torch._C.Generator

    class _GeneratorType(type):
        # isinstance/issubclass keep answering for real generators (the default ones too).
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, real)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, real)

        def __getattr__(cls, name: str) -> Any:
            return getattr(real, name)

    class _Logged(real):  # type: ignore[misc, valid-type]
        """A real generator whose seeding and state setting go into the restore log."""

        def manual_seed(self, seed: Any) -> Any:
            result = super().manual_seed(seed)
            restore.generator_restored(self, "manual_seed")
            return result

        def set_state(self, state: Any) -> Any:
            result = super().set_state(state)
            restore.generator_restored(self, "set_state")
            return result

    class Generator(metaclass=_GeneratorType):
        __doc__ = real.__doc__

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            generator = _Logged(*args, **kwargs)
            _register(generator)
            return generator

    from . import restore

    _Logged.__module__ = Generator.__module__ = "torch"
    _Logged.__qualname__ = Generator.__qualname__ = "Generator"
    torch.Generator = Generator
    _installed = True


def track(generator: Any, name: str, ignore: bool = False) -> None:
    """Audit `generator` under `name` (also for generators made before the API was active);
    `ignore`: leave it out of the audit (it is listed as ignored)."""
    if ignore:
        _ignored.add(f"generator {name}")
    for i, (_, ref, _) in enumerate(_generators):
        if ref() is generator:
            _generators[i] = (name, ref, True)
            return
    _register(generator, name)


def ignored() -> list[str]:
    return sorted(f"rng:{name}" for name in _ignored)


def _device_modules() -> list[tuple[str, Any]]:
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    out = []
    for kind in ("cuda", "npu", "xpu"):
        module = getattr(torch, kind, None)
        initialized = getattr(module, "is_initialized", None)
        # Never initialize a device stack just to audit it: a CPU run must stay on CPU.
        if module is not None and callable(initialized) and initialized():
            out.append((kind, module))
    return out


def audit() -> dict[str, str]:
    """A fingerprint of the current state of every random stream of this process."""
    streams: dict[str, str] = {}
    torch = sys.modules.get("torch")
    if torch is not None:
        streams["cpu"] = content_hash(torch.get_rng_state())
        for kind, module in _device_modules():
            for index, state in enumerate(module.get_rng_state_all()):
                streams[f"{kind}:{index}"] = content_hash(state)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, pos, has_gauss, gauss = numpy.random.get_state()
        # The whole state, position included: the key array changes only every 624 draws.
        streams["numpy"] = hash_bytes(keys.tobytes() + struct.pack("<iid", pos, has_gauss, gauss))
    if "random" in sys.modules:
        import random

        streams["python"] = hash_bytes(repr(random.getstate()).encode())
    for identity, generator in _live_generators():
        if f"generator {identity}" not in _ignored:
            streams[f"generator {identity}"] = content_hash(generator.get_state())
    return streams


def mutate() -> None:
    """Move every random stream to an unrelated state (the teeth check of a test)."""
    from .restore import unlogged

    with unlogged():
        _mutate()


def _mutate() -> None:
    salt = 0x5EED
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(torch.initial_seed() ^ salt)
        for _, module in _device_modules():
            module.manual_seed_all(salt)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(salt)
    if "random" in sys.modules:
        import random

        random.seed(salt)
    for _, generator in _live_generators():
        generator.manual_seed(generator.initial_seed() ^ salt)


def seed_host_streams(seed: int) -> None:
    """Start every global RNG of the rank (torch CPU and devices, numpy, Python) from `seed`.

    Each is otherwise seeded from the OS at start-up (torch's CPU generator too, in recent
    releases), so a trainer that never seeds one would show it as different in every pair of
    runs. The trainer's own seeding still overrides this.
    """
    import random

    random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed % 2**32)
