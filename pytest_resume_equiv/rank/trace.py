"""Where in the user's code something happened, and which random numbers were drawn in a
window of the run (between the last restore and the first resumed step).

The draw trace sees torch ops the dispatcher tags as drawing from a generator
(`nondeterministic_seeded`: randn, dropout, randperm, the DataLoader's base seed...), through a
dispatch mode, and calls of numpy's and Python's module-level random functions (the global
generators), through wrappers. Both are in place only inside the window, so a run pays for
them for a moment.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any, Callable, Optional

from .layout import device_stream, generator_stream, stream_key
from .patches import Patches

_OUR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The plugin's package: its frames are never the user's."""
_STDLIB_DIR = os.path.dirname(os.path.abspath(os.__file__))
MAX_DRAWS = 200
"""Draws kept per window: the first ones say what advanced a stream; the rest only repeat."""


def inside(path: str, folder: str) -> bool:
    """Whether `path` is in `folder`: a prefix match up to a separator, so torch's folder
    does not hold torch_npu, torchvision, torchtitan, torchtune, torchao or torchdata."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _skipped(path: str) -> bool:
    if inside(path, _OUR_DIR) or path.startswith("<"):
        return True
    return any(inside(path, d) for d in _skipped_dirs())


def _skipped_dirs() -> tuple[str, ...]:
    """torch's folder (once torch is imported) and the standard library's."""
    torch_folder = torch_dir()
    return (torch_folder, _STDLIB_DIR) if torch_folder else (_STDLIB_DIR,)


def torch_dir() -> Optional[str]:
    """torch's installed folder, None while torch is not imported."""
    torch = sys.modules.get("torch")
    return _dir_of(torch.__file__) if torch is not None else None


@functools.cache
def _dir_of(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


def short_path(path: str) -> str:
    """A path relative to the working directory when inside it, else its last two parts."""
    cwd = os.getcwd()
    if path.startswith(cwd + os.sep):
        return os.path.relpath(path, cwd)
    return os.sep.join(path.split(os.sep)[-2:])


def _library(path: str) -> bool:
    return f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path


def user_frame(depth: int = 1) -> str:
    """`file:line` of the first frame outside torch, the standard library and the plugin; when
    that is an installed library (transformers, accelerate, ...), with the line of the code
    that called into it: `accelerate/data_loader.py:583 (from train.py:95)`."""
    frame: Any = sys._getframe(depth)
    while frame is not None and _skipped(os.path.abspath(frame.f_code.co_filename)):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    path = os.path.abspath(frame.f_code.co_filename)
    where = f"{short_path(path)}:{frame.f_lineno}"
    if not _library(path):
        return where
    caller = frame.f_back
    while caller is not None:
        path = os.path.abspath(caller.f_code.co_filename)
        if not _skipped(path) and not _library(path):
            return f"{where} (from {short_path(path)}:{caller.f_lineno})"
        caller = caller.f_back
    return where


def called_from_plugin(depth: int) -> bool:
    """Whether the frame `depth` levels up is the plugin's own code (its audit, say)."""
    return inside(os.path.abspath(sys._getframe(depth).f_code.co_filename), _OUR_DIR)


def called_from_torch(depth: int) -> bool:
    """Whether the frame `depth` levels up is torch's own code."""
    folder = torch_dir()
    if folder is None:
        return False
    return inside(os.path.abspath(sys._getframe(depth).f_code.co_filename), folder)


FORWARD = "forward"
"""The op of the mark `mark_forward` leaves in a trace."""


class DrawTrace:
    """The random draws of one window, between `start()` and `stop()`.

    `restores` says how many restores the run has logged (each draw keeps it), and
    `generator_name` how the audit names a `torch.Generator` an op drew from.
    """

    def __init__(self, restores: Callable[[], int], generator_name: Callable[[Any], str]) -> None:
        self.restores = restores
        self.generator_name = generator_name
        self.draws: list[dict[str, Any]] = []
        self.active = False
        self._mode: Any = None
        self._patches = Patches(__name__)
        """The global generators' module functions, replaced inside the window."""

    def start(self) -> None:
        if self.active:
            return
        self.active = True
        self.draws = []
        self._mode = _torch_mode(self)
        if self._mode is not None:
            self._mode.__enter__()
        _patch_host_draws(self, self._patches)

    def stop(self) -> list[dict[str, Any]]:
        if self.active:
            self.active = False
            self._patches.restore()
            if self._mode is not None:
                self._mode.__exit__(None, None, None)
                self._mode = None
        return self.draws

    def mark_forward(self) -> None:
        """Where the first module forward of the window came (a draw of no stream): a
        resumed run whose trace ended at a forward is compared with the draws up to the same
        point."""
        self.add(FORWARD, "")

    def add(self, op: str, stream: str, shape: Optional[list[int]] = None) -> None:
        """One draw, with how many restores the run had logged before it."""
        if len(self.draws) < MAX_DRAWS:
            self.draws.append(
                {
                    "op": op,
                    "stream": stream,
                    "shape": shape,
                    "at": user_frame(3),
                    "after_restores": self.restores(),
                    "time_ns": time.time_ns(),
                }
            )


_HOST_SKIP = {"getstate", "setstate", "get_state", "set_state", "seed", "__reduce__"}


def _patch_host_draws(window: DrawTrace, patches: Patches) -> None:
    """For the window: the module functions of Python's and numpy's global generators
    (`random.random`, `np.random.rand`, ... are methods of one hidden instance) log a draw."""
    targets = [("random", "_inst", stream_key("python"))]
    if "numpy" in sys.modules:
        targets.append(("numpy.random", "mtrand._rand", stream_key("numpy")))
    for module_name, instance_path, stream in targets:
        module = sys.modules.get(module_name)
        instance: Any = module
        for part in instance_path.split("."):
            instance = getattr(instance, part, None)
        if module is None or instance is None:
            continue
        for name in dir(module):
            fn = getattr(module, name, None)
            if getattr(fn, "__self__", None) is instance and name not in _HOST_SKIP:
                patches.replace(module, name, _logging(window, fn, name, stream))


def _logging(window: DrawTrace, fn: Any, name: str, stream: str) -> Any:
    def draw(*args: Any, **kwargs: Any) -> Any:
        window.add(name, stream)
        return fn(*args, **kwargs)

    return draw


def _torch_mode(trace: DrawTrace) -> Any:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    from torch.utils._python_dispatch import TorchDispatchMode

    seeded = torch.Tag.nondeterministic_seeded

    class SeededOps(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if seeded in getattr(func, "tags", ()):
                try:
                    trace.add(_op_name(func), _torch_stream(trace, kwargs, out), _shape(out))
                except Exception:  # the trace explains; it must never break training
                    pass
            return out

    return SeededOps()


def _op_name(func: Any) -> str:
    packet = getattr(func, "overloadpacket", None)
    return getattr(packet, "__name__", None) or str(func)


def _torch_stream(trace: DrawTrace, kwargs: dict, out: Any) -> str:
    generator = kwargs.get("generator")
    if generator is not None:
        return stream_key(generator_stream(trace.generator_name(generator)))
    device = getattr(out, "device", None)
    if device is None or device.type == "cpu":
        return stream_key("cpu")
    return stream_key(device_stream(device.type, device.index or 0))


def _shape(out: Any) -> Optional[list[int]]:
    shape = getattr(out, "shape", None)
    return list(shape) if shape is not None else None
