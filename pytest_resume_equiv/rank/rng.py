"""Audit every random stream of a rank: CPU, each local accelerator, numpy, Python, and
every `torch.Generator` the process created, named by where it was created (or, for one
torch's own code makes, by the DataLoader that owns it).

Generators are found by replacing `torch.Generator` with a subclass that registers each one
made (`logged_generator_class`; the bootstrap installs it before the user's code runs),
because a generator owned by some module or sampler and re-seeded at construction is the
resume bug nobody thinks to save.
"""

from __future__ import annotations

import os
import struct
import sys
import weakref
from typing import Any, Callable, Optional

from .fingerprint import content_hash, hash_bytes
from .layout import DEVICE_KINDS, device_stream, generator_stream, owned_generator, stream_key
from .patches import Patches
from .trace import called_from_torch, inside, short_path, torch_dir, user_frame

_OUR_DIR = os.path.dirname(os.path.abspath(__file__))
"""Frames in the in-rank machinery are skipped; the toy models' own frames are real sites."""


def creation_site(owners: Optional[Owners] = None) -> str:
    """Where the generator being made was made: the first frame outside torch and the in-rank
    API. A generator torch's own code makes (a sampler's, when an iterator starts) is named by
    what owns it instead (`owners`), since the user's line that started that iterator differs
    between runs that are the same: one starts it at an epoch's start, the other in its
    restore function."""
    torch_folder = torch_dir()
    frame = sys._getframe(1)
    made_by_torch = ""
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if inside(path, _OUR_DIR):
            frame = frame.f_back
            continue
        if not (torch_folder and inside(path, torch_folder)):
            return made_by_torch or f"{short_path(path)}:{frame.f_lineno}"
        owner = frame.f_locals.get("self")
        named = owners.name_of(owner) if owners is not None and owner is not None else None
        if named is not None:
            return named
        if not made_by_torch:
            what = type(owner).__name__ if owner is not None else frame.f_code.co_name
            made_by_torch = f"torch's {what}"
        frame = frame.f_back
    return made_by_torch or "<unknown>"


class Owners:
    """The samplers of every DataLoader built since `install`, with the line that built it: a
    generator a sampler makes is named after its loader (`layout.owned_generator`)."""

    def __init__(self) -> None:
        self.parts: list[tuple[weakref.ref, str]] = []
        """(weak reference to a sampler or batch sampler, the loader's build site)."""
        self._patches = Patches(__name__)

    def add(self, loader: Any, site: str) -> None:
        batch_sampler = getattr(loader, "batch_sampler", None)
        parts = [getattr(loader, "sampler", None), batch_sampler]
        parts.append(getattr(batch_sampler, "sampler", None))
        self.parts = [(ref, at) for ref, at in self.parts if ref() is not None]
        for part in parts:
            try:
                self.parts.append((weakref.ref(part), site))
            except TypeError:  # None, or a sampler that takes no weak reference
                pass

    def name_of(self, obj: Any) -> Optional[str]:
        """The identity of a generator `obj` makes, if `obj` is a known loader's sampler."""
        for ref, site in self.parts:
            if ref() is obj:
                return owned_generator(type(obj).__name__, site)
        return None

    def install(self) -> None:
        """Remember where each DataLoader is built (wraps `DataLoader.__init__`; a subclass's
        own `__init__` calls it too)."""
        from torch.utils.data import DataLoader

        if self._patches.holds(DataLoader, "__init__"):
            return
        real = DataLoader.__init__
        add = self.add

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            real(loader, *args, **kwargs)
            add(loader, user_frame(2))

        self._patches.replace(DataLoader, "__init__", __init__)

    def uninstall(self) -> None:
        self._patches.restore()


class Generators:
    """The rank's `torch.Generator`s in creation order, each by its creation site or the name
    given to `track`, and the names left out of the audit (`track(..., ignore=True)`)."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, weakref.ref, bool]] = []
        """(creation site or given name, weak reference, named?) in creation order."""
        self.ignored: set[str] = set()
        """Stream names of generators tracked with ignore=True."""
        self._patches = Patches(__name__)
        """`torch.Generator`, replaced while installed."""
        self.owners = Owners()

    def register(self, generator: Any, name: Optional[str] = None) -> None:
        site = name or creation_site(self.owners)
        self.entries.append((site, weakref.ref(generator), name is not None))

    def track(self, generator: Any, name: str, ignore: bool = False) -> None:
        """Audit `generator` under `name` (also one made before the API was active);
        `ignore`: leave it out of the audit (it is listed as ignored)."""
        if ignore:
            self.ignored.add(generator_stream(name))
        for i, (_, ref, _) in enumerate(self.entries):
            if ref() is generator:
                self.entries[i] = (name, ref, True)
                return
        self.register(generator, name)

    def ignored_keys(self) -> list[str]:
        return sorted(stream_key(name) for name in self.ignored)

    def live(self) -> list[tuple[str, Any]]:
        """(identity, generator) of the live generators, in creation order.

        The ordinal counts live generators per site, so a sampler that makes a fresh generator
        every epoch is 'site #0' in both runs even though the resumed run made fewer of them.
        """
        self.entries = [entry for entry in self.entries if entry[1]() is not None]
        counts: dict[str, int] = {}
        live = []
        for site, ref, named in self.entries:
            generator = ref()
            if named:
                live.append((site, generator))
                continue
            ordinal = counts.get(site, 0)
            counts[site] = ordinal + 1
            live.append((f"{site} #{ordinal}", generator))
        return live

    def identity_of(self, generator: Any) -> str:
        """The audit's name for a live generator ("site #k", or the name given to `track`).
        An op's generator argument can be another Python object for the same generator: then
        the live one in the same state is it."""
        live = self.live()
        for identity, candidate in live:
            if candidate is generator:
                return identity
        state = generator.get_state()
        torch = sys.modules["torch"]
        for identity, candidate in live:
            if candidate.device == generator.device and torch.equal(candidate.get_state(), state):
                return identity
        return f"unknown {generator.device}"

    def install(self, on_restored: Callable[[Any, str], None]) -> None:
        """Replace `torch.Generator` so every generator created from now on is registered here;
        `on_restored(generator, call)` hears of each seeding or state setting by the user's
        code (torch's own seeding of generators it makes, a sampler's at each epoch, is not
        a restore)."""
        import torch

        if self._patches.holds(torch, "Generator"):
            return
        generator_class = logged_generator_class(torch._C.Generator, self.register, on_restored)
        self._patches.replace(torch, "Generator", generator_class)
        self.owners.install()

    def uninstall(self) -> None:
        """Give torch its own `Generator` back (a rank never needs it; a test process does)."""
        self._patches.restore()
        self.owners.uninstall()


def logged_generator_class(
    real: type, register: Callable[[Any], None], on_restored: Callable[[Any, str], None]
) -> type:
    """What stands for `torch.Generator` while the audit is installed: a subclass of the real
    class, named `torch.Generator`, so a generator made from it is a real one for every op
    and `type(g) is torch.Generator` holds as it does without the plugin. Each one is
    registered when made (a user's subclass too), and its `manual_seed` / `set_state` calls
    made outside torch are reported. `isinstance(x, torch.Generator)` and
    `issubclass(c, torch.Generator)` keep answering for every real generator (the default
    ones, one made before the audit); a user's subclass answers as any class does."""

    class GeneratorType(type(real)):  # type: ignore[misc]
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, real) if cls is Generator else super().__instancecheck__(obj)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, real) if cls is Generator else super().__subclasscheck__(sub)

    class Generator(real, metaclass=GeneratorType):  # type: ignore[misc, valid-type]
        __doc__ = real.__doc__
        __module__ = "torch"
        __qualname__ = "Generator"  # pickled by reference as `torch.Generator`

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            generator = real.__new__(cls, *args, **kwargs)
            register(generator)
            return generator

        def manual_seed(self, seed: Any) -> Any:
            result = real.manual_seed(self, seed)
            if not called_from_torch(2) and _made_here(self):
                on_restored(self, "manual_seed")
            return result

        def set_state(self, state: Any) -> Any:
            result = real.set_state(self, state)
            if not called_from_torch(2) and _made_here(self):
                on_restored(self, "set_state")
            return result

    def _made_here(generator: Any) -> bool:
        """Made from this class (`torch.Generator.manual_seed(torch.default_generator, 1)`
        calls the method on a generator it never registered)."""
        return Generator in type(generator).__mro__

    return Generator


def _device_modules() -> list[tuple[str, Any]]:
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    out = []
    for kind in DEVICE_KINDS:
        module = getattr(torch, kind, None)
        initialized = getattr(module, "is_initialized", None)
        # Never initialize a device stack just to audit it: a CPU run must stay on CPU.
        if module is not None and callable(initialized) and initialized():
            out.append((kind, module))
    return out


def streams(generators: Generators) -> dict[str, str]:
    """A fingerprint of the current state of every random stream of this process (the rng
    section of a step line)."""
    found: dict[str, str] = {}
    torch = sys.modules.get("torch")
    if torch is not None:
        found["cpu"] = content_hash(torch.get_rng_state())
        for kind, module in _device_modules():
            for index, state in enumerate(module.get_rng_state_all()):
                found[device_stream(kind, index)] = content_hash(state)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, pos, has_gauss, gauss = numpy.random.get_state()
        # The whole state, position included: the key array changes only every 624 draws.
        found["numpy"] = hash_bytes(keys.tobytes() + struct.pack("<iid", pos, has_gauss, gauss))
    if "random" in sys.modules:
        import random

        found["python"] = hash_bytes(repr(random.getstate()).encode())
    for identity, generator in generators.live():
        stream = generator_stream(identity)
        if stream not in generators.ignored:
            found[stream] = content_hash(generator.get_state())
    return found


def mutate(generators: Generators) -> None:
    """Move every random stream to an unrelated state (the teeth check of a test); the caller
    keeps it out of the restore log."""
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
    for _, generator in generators.live():
        generator.manual_seed(generator.initial_seed() ^ salt)


def seed_devices(seed: int, kinds: tuple[str, ...] = DEVICE_KINDS) -> None:
    """Seed every device of these kinds whose module is loaded (queued until the device is
    initialised, as torch does). `torch.manual_seed` reaches torch_npu's streams only
    through the privateuse1 hook, once torch_npu is imported: seeded here by name."""
    torch = sys.modules.get("torch")
    for kind in kinds:
        module = getattr(torch, kind, None)
        seed_all = getattr(module, "manual_seed_all", None)
        in_bad_fork = getattr(module, "_is_in_bad_fork", None)
        if callable(seed_all) and not (callable(in_bad_fork) and in_bad_fork()):
            seed_all(seed)


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
        seed_devices(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed % 2**32)
