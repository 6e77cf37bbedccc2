"""The restore log: every call that restores state, with where in the user's code it was made.

At a resume the question is not only "what differs" but "was it restored at all, and when".
The bootstrap wraps the functions trainers restore state with (RNG setters and seeders,
`load_state_dict` of modules, optimizers, LR schedulers and grad scalers, DCP's loaders,
`torch.load`), so each call appends an entry to this rank's signature: the call, what it
restored (named as the RNG audit and `watch` name it), the first user frame, and the last step
recorded before it. Only the outermost of nested restore calls is logged (`set_state_dict`
calls `load_state_dict`). Outside a test run nothing is wrapped.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from collections.abc import Iterator
from typing import Any, Callable, Optional

from .after_import import AfterImport
from .layout import ALL_DEVICES, DEVICE_KINDS, device_stream, file_target, stream_key
from .own_states import DEVICE_GETTERS, OwnStates
from .patches import Patches
from .trace import called_from_torch, user_frame
from .wrapping import Wrapper, tagging

Entry = dict[str, Any]
"""One restore: `call`, `what` (the audit's name of what it restored), `at` (the user's
frame), `after_step` (the last step recorded before it)."""

SEED_CALLS = (
    "manual_seed",
    "manual_seed_all",
    ".seed",
    ".seed_all",
    "random.seed",
    "numpy.random.seed",
)
"""Calls that start a stream from a seed: initialization before the checkpoint is read, a
re-seeding (a bug) after it."""
LOAD_CALLS = (
    "torch.load",
    "load_file",
    "load_state_dict",
    "torch.distributed.checkpoint.load",
    "set_state_dict",
    "set_model_state_dict",
    "set_optimizer_state_dict",
)
"""Calls that read or apply a checkpoint: the first one is where the resume begins."""


def is_seed(call: str) -> bool:
    return call.endswith(SEED_CALLS)


def is_load(call: str) -> bool:
    return call.endswith(LOAD_CALLS)


class RestoreLog:
    """One rank's restore log and the wrappers that feed it (`install_*`, `uninstall`)."""

    def __init__(self) -> None:
        self.pending: list[Entry] = []
        """Entries not yet written to the signature (the writer drains them at each line)."""
        self.count = 0
        """Restores logged so far (a draw remembers how many came before it)."""
        self.after_step: Any = None
        """The last step recorded so far (None before the first): where a restore happens."""
        self.listeners: list[Callable[[Entry], None]] = []
        """Called with each entry (the resume point opens its draw trace at a restore)."""
        self._calls = Wrapper(__name__)
        """What `_wrap` replaced, for `uninstall`, and how deep in a logged call we are."""
        self._patches = Patches(__name__)
        """The restore families' `__init_subclass__`, the devices' `default_generators`."""
        self._after_import = AfterImport()
        self._watching = True
        """Whether a device initialised from now on gets its default generators watched."""
        self.own = OwnStates()
        """States the user's code read itself: setting one again is isolation, no restore."""

    @property
    def nested(self) -> bool:
        """Inside a logged restore call, or in code the plugin runs `unlogged()`."""
        return self._calls.nested

    @contextlib.contextmanager
    def unlogged(self) -> Iterator[None]:
        """Restore calls made by the plugin itself (seeding, the teeth check) are not the
        user's."""
        with self._calls.unreported():
            yield

    def log(self, call: str, what: Any) -> None:
        """Record one restore: `what` is the audit's name, or a weak reference to the object."""
        entry = {"call": call, "what": what, "at": user_frame(), "after_step": self.after_step}
        self.pending.append(entry)
        self.count += 1
        for listener in self.listeners:
            listener(entry)

    def drain(self, name_of: Callable[[Any], str]) -> list[Entry]:
        """The entries logged since the last drain, objects named now (`name_of`): a trainer
        usually loads a model before it calls `watch(model=...)`, and the log should say
        `watch:model`."""
        entries = []
        for entry in self.pending:
            what = entry["what"]
            if not isinstance(what, str):
                obj = what()
                what = name_of(obj) if obj is not None else "an object gone since"
            entries.append({**entry, "what": what})
        self.pending.clear()
        return entries

    def _wrap(
        self,
        owner: Any,
        attribute: str,
        call: str,
        what: Callable[..., Any],
        users_only: bool = False,
        reads: Optional[Callable[..., str]] = None,
    ) -> None:
        """Replace `owner.attribute` with a function that calls the original, then logs.
        `users_only`: not when torch itself called it (an RNG state that activation
        checkpointing's recompute, `fork_rng` or DTensor's RNG tracker puts back is no
        restore of the user's). `reads`: the path the call reads, which an exception out of it
        says (`wrapping.tagging`: a torn file the load could not read)."""

        def logged(*args: Any, **kwargs: Any) -> None:
            try:
                names = what(*args, **kwargs)
            except Exception:  # naming is best effort: the restore itself happened
                names = "?"
            for name in names if isinstance(names, list) else [names]:
                self.log(call, name)

        failed = tagging(call, reads, lambda: self.after_step) if reads else None
        bookkeeping = (lambda: called_from_torch(3)) if users_only else None
        self._calls.wrap(owner, attribute, logged, skip=bookkeeping, failed=failed)

    def _unless_own(self, names: Callable[..., Any]) -> Callable[..., Any]:
        """`names` for a setter, or nothing to log when it sets a state the user's code read
        itself in this process (own_states.py)."""

        def named(*args: Any, **kwargs: Any) -> Any:
            state = args[0] if args else next(iter(kwargs.values()), None)
            return [] if self.own.has(state) else names(*args, **kwargs)

        return named

    def install_torch(self) -> None:
        """Wrap torch's restore functions (the bootstrap calls it once torch is imported)."""
        import torch
        import torch.optim.lr_scheduler as lr_scheduler

        cpu = self._unless_own(lambda *a, **k: stream_key("cpu"))
        for owner in (torch, torch.random):
            name = owner.__name__
            fn = "set_rng_state"
            self._wrap(owner, fn, f"{name}.{fn}", cpu, users_only=True)
            for fn in ("manual_seed", "seed"):  # the CPU stream and every device's
                self._wrap(owner, fn, f"{name}.{fn}", _every_stream, users_only=True)
            self.own.watch(self._patches, owner, ("get_rng_state",))
        self.install_devices()
        scheduler = getattr(lr_scheduler, "LRScheduler", None) or lr_scheduler._LRScheduler
        bases = [
            (torch.nn.Module, "Module"),
            (torch.optim.Optimizer, "Optimizer"),
            (scheduler, "LRScheduler"),
            (lr_scheduler.ReduceLROnPlateau, "LRScheduler"),
        ]
        amp = getattr(torch, "amp", None)
        if amp is not None and hasattr(amp, "GradScaler"):
            bases.append((amp.GradScaler, "GradScaler"))
        for base, kind in bases:
            self._wrap_family(base, kind)
        self._wrap(torch, "load", "torch.load", _file_name, reads=_file_path)
        # Not imported here: importing DCP before the user's code changes how a gloo process
        # group is torn down (seen: accelerate's DDP hanging at exit). Wrapped once imported.
        self.after_import("safetensors.torch", self._wrap_safetensors)
        self.after_import("torch.distributed.checkpoint", self._wrap_dcp)
        self.after_import("torch.distributed.checkpoint.state_dict", self._wrap_dcp_helpers)

    def _wrap_safetensors(self, module: Any) -> None:
        self._wrap(module, "load_file", "safetensors.torch.load_file", _file_name, reads=_file_path)

    def _wrap_dcp(self, module: Any) -> None:
        self._wrap(module, "load", "torch.distributed.checkpoint.load", _dcp_file, reads=_dcp_path)

    def _wrap_dcp_helpers(self, module: Any) -> None:
        for name in ("set_state_dict", "set_model_state_dict", "set_optimizer_state_dict"):
            self._wrap(module, name, f"torch.distributed.checkpoint.state_dict.{name}", _dcp_name)

    def after_import(self, name: str, hook: Callable[[Any], None]) -> None:
        """`hook(module)` now if `name` is imported, else right after its import."""
        if name in sys.modules:
            hook(sys.modules[name])
            return
        if self._after_import not in sys.meta_path:
            sys.meta_path.insert(0, self._after_import)
        self._after_import.hooks.setdefault(name, []).append(hook)

    def _wrap_family(self, base: type, kind: str) -> None:
        """`load_state_dict` of `base` and of every subclass that defines its own (LambdaLR
        does, without calling the base's), including subclasses defined later (a user's
        model)."""
        call = f"{kind}.load_state_dict"
        pending = [base]
        while pending:
            cls = pending.pop()
            if "load_state_dict" in cls.__dict__:
                self._wrap(cls, "load_state_dict", call, _object_name)
            pending += cls.__subclasses__()
        if "__init_subclass__" in base.__dict__:
            return  # a hook of its own (none of torch's bases has one): leave it alone
        wrap = self._wrap

        def init_subclass(cls: type, **kwargs: Any) -> None:
            super(base, cls).__init_subclass__(**kwargs)
            if "load_state_dict" in cls.__dict__:
                wrap(cls, "load_state_dict", call, _object_name)

        self._patches.replace(base, "__init_subclass__", classmethod(init_subclass))

    def install_devices(self, kinds: tuple[str, ...] = DEVICE_KINDS) -> None:
        """Wrap the accelerator modules' RNG setters (torch.npu exists only once torch_npu is
        imported: the bootstrap imports it first, or wraps it when the trainer does)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return
        for kind in kinds:
            module = getattr(torch, kind, None)
            if module is None:
                continue
            every = stream_key(device_stream(kind, ALL_DEVICES))

            def one(*args: Any, _k: str = kind, **kwargs: Any) -> str:
                return stream_key(device_stream(_k, _device_index(_k, args, kwargs)))

            def each(*args: Any, _e: str = every, **kwargs: Any) -> str:
                return _e

            # torch.cuda.set_rng_state is torch.cuda.random.set_rng_state: wrap both names
            owners = [module, getattr(module, "random", None)]
            for owner in {id(o): o for o in owners if o is not None}.values():
                for fn, name in [
                    ("set_rng_state", self._unless_own(one)),
                    ("manual_seed", one),
                    ("seed", one),
                    ("set_rng_state_all", self._unless_own(each)),
                    ("manual_seed_all", each),
                    ("seed_all", each),
                ]:
                    self._wrap(owner, fn, f"torch.{kind}.{fn}", name, users_only=True)
                self.own.watch(self._patches, owner, DEVICE_GETTERS)
            self._watch_default_generators(kind, module)

    def _watch_default_generators(self, kind: str, module: Any) -> None:
        """See `torch.<kind>.default_generators[i].set_state(...)` / `.manual_seed(...)`
        (Megatron's and DeepSpeed's way to restore a device stream). The tuple is made when
        the device is initialised (`torch._C._cuda_init`), so it is replaced by a watching
        one then (`_lazy_call`, as torch queues its own seeding)."""
        lazy_call = getattr(module, "_lazy_call", None)
        if not callable(lazy_call):
            return
        log = self

        def watch() -> None:
            try:
                found = getattr(module, "default_generators", None)
                if log._watching and type(found) is tuple:
                    watching = _DefaultGenerators(found, kind, log)
                    log._patches.replace(module, "default_generators", watching)
            except Exception:  # noqa: BLE001 - runs inside torch's device initialisation
                pass

        try:
            lazy_call(watch)
        except Exception:  # noqa: BLE001 - a device stack without the hook: not watched
            pass

    def install_host(self) -> None:
        """Wrap numpy's and Python's global RNG setters (numpy only if it is imported)."""
        import random

        python, numpy_stream = stream_key("python"), stream_key("numpy")
        self._wrap(random, "setstate", "random.setstate", self._unless_own(lambda *a, **k: python))
        self._wrap(random, "seed", "random.seed", lambda *a, **k: python)
        self.own.watch(self._patches, random, ("getstate",))
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            np_random, sets = numpy.random, self._unless_own(lambda *a, **k: numpy_stream)
            self._wrap(np_random, "set_state", "numpy.random.set_state", sets)
            self._wrap(np_random, "seed", "numpy.random.seed", lambda *a, **k: numpy_stream)
            self.own.watch(self._patches, np_random, ("get_state",))

    def uninstall(self) -> None:
        """Put every wrapped function back (a rank never needs it; a test process does)."""
        self._calls.unwrap()
        self._watching = False
        self._patches.restore()
        self._after_import.hooks.clear()
        if self._after_import in sys.meta_path:
            sys.meta_path.remove(self._after_import)
        self.pending.clear()


def _device_index(kind: str, args: tuple, kwargs: dict) -> str:
    """The device an RNG setter acts on: `set_rng_state(state, device)` and `manual_seed`
    take an index, "cuda:1", torch.device("cuda", 1), or "cuda" / torch.device("cuda") /
    nothing for the current device."""
    device = kwargs.get("device", args[1] if len(args) > 1 else None)
    if isinstance(device, str):
        after = device.partition(":")[2]
        index: Any = int(after) if after.isdigit() else None
    else:
        index = getattr(device, "index", device)
    if index is None or index == -1:
        module = getattr(sys.modules["torch"], kind)
        initialized = getattr(module, "is_initialized", None)
        if callable(initialized) and initialized():
            return str(module.current_device())
        # Not initialised: torch queues the call (`_lazy_call`) and runs it at initialisation
        # on the device current then, which is 0 (`set_device` initialises first). Asking
        # `current_device()` would initialise the device: a context on a GPU in a
        # device=cpu run, a context on NPU 0 in every rank.
        return "0"
    return str(index)


def _every_stream(*args: Any, **kwargs: Any) -> list[str]:
    """What `torch.manual_seed` / `torch.seed` reseed: the CPU stream and every device of
    each kind with devices (torch/random.py seeds cuda, mps, xpu and the privateuse1 device,
    torch_npu's, whether initialised or not). `device_count()` initialises nothing."""
    torch = sys.modules["torch"]
    found = [stream_key("cpu")]
    for kind in DEVICE_KINDS:
        module = getattr(torch, kind, None)
        try:
            count = int(module.device_count()) if module is not None else 0
        except Exception:  # noqa: BLE001 - a broken driver has no streams to name
            count = 0
        if count > 0:
            found.append(stream_key(device_stream(kind, ALL_DEVICES)))
    return found


SETTERS = ("set_state", "manual_seed", "seed", "graphsafe_set_state")
"""The methods of a device's default generator that restore or reseed its stream."""
PROFILE_BUDGET = 64
"""Calls the one-shot watch of a fetched default generator sees before it ends."""


class _DefaultGenerators(tuple):
    """`torch.<kind>.default_generators` that sees its generators restored by the user's
    code. A `torch._C.Generator` cannot be wrapped (an immutable C type), so a fetch from
    outside torch (`default_generators[i]`) starts a one-shot profile hook on that thread
    that logs a setter called on that generator, and ends when the fetching function
    returns or after PROFILE_BUDGET calls: Megatron's `_set_cuda_rng_state` fetches and sets
    on the next line. Not when another profiler is on (it is left alone)."""

    def __new__(cls, items: tuple, kind: str, log: RestoreLog) -> _DefaultGenerators:
        made = super().__new__(cls, items)
        made.kind = kind
        made.log = log
        return made

    def __getitem__(self, index: Any) -> Any:
        generator = super().__getitem__(index)
        if isinstance(index, int) and not called_from_torch(2) and sys.getprofile() is None:
            self._watch(generator, index % len(self), sys._getframe(1))
        return generator

    def _watch(self, generator: Any, index: int, caller: Any) -> None:
        log, kind = self.log, self.kind
        left = [PROFILE_BUDGET]

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "c_call" and getattr(arg, "__self__", None) is generator:
                name = getattr(arg, "__name__", "")
                if name in SETTERS and not log.nested:
                    call = f"torch.{kind}.default_generators[{index}].{name}"
                    log.log(call, stream_key(device_stream(kind, index)))
            left[0] -= 1
            if left[0] <= 0 or (event == "return" and frame is caller):
                sys.setprofile(None)

        sys.setprofile(profile)


def _object_name(obj: Any, *args: Any, **kwargs: Any) -> Any:
    """The object itself (weakly): it is named when the entry is written."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return type(obj).__name__


def _dcp_name(*args: Any, **kwargs: Any) -> list[Any]:
    """The models and optimizers a DCP `set_*_state_dict` helper restores."""
    torch = sys.modules["torch"]
    found = []
    for value in [*args, *kwargs.values()]:
        for obj in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(obj, (torch.nn.Module, torch.optim.Optimizer)):
                found.append(_object_name(obj))
    return found or ["checkpoint"]


def _dcp_path(*args: Any, checkpoint_id: Any = None, storage_reader: Any = None, **kw: Any) -> str:
    path = checkpoint_id or getattr(storage_reader, "path", None)
    return _absolute(path) if path else ""


def _dcp_file(*args: Any, **kwargs: Any) -> str:
    path = _dcp_path(*args, **kwargs)
    return file_target(path) if path else "checkpoint"


def _file_path(f: Any = None, *args: Any, **kwargs: Any) -> str:
    return _absolute(f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", ""))


def _file_name(f: Any = None, *args: Any, **kwargs: Any) -> str:
    return file_target(_file_path(f))


def _absolute(path: Any) -> str:
    """A path read, absolute: a relative one means the rank's working directory, which the
    plugin reading the log later does not share (the file events are logged absolute too)."""
    try:
        name = os.fsdecode(path)
    except TypeError:  # not a path (a file object with no name)
        return ""
    return os.path.abspath(name) if name else ""
