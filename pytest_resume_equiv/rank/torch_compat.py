"""Every difference between the torch releases the package supports, in one place: the rest
of the package calls these and never tests torch's version itself.

The supported range is pyproject.toml's (`torch>=2.4`), tested at its corners by
`scripts/support_matrix.sh` (docs/reference/support.md). Each switch tests for the API, not
for a version number, and names the release that brought it:

- global module forward hooks given the call's keyword arguments (`with_kwargs=`): torch 2.5.
  Before it, `Module.__call__` is wrapped to hand its keyword arguments to the hook (a row of
  `patches.PATCHES`).
- `fully_shard` (FSDP2) public in `torch.distributed.fsdp`: torch 2.6; in
  `torch.distributed._composable.fsdp` before.
- FSDP2 on CPU (gloo): torch 2.7 (`torch.cpu.Stream.record_event`); before it `fully_shard`
  runs on an accelerator only (2.4: its root forward initialises CUDA; 2.6: "'Stream' object
  has no attribute 'record_event'").
- the `fp32_precision` API: torch 2.9 (rank/preflight.py reads it where it is, and records a
  read that fails as unreadable).

`doctor` names what this torch has (`features`) and where it stands against `TESTED`.
"""

from __future__ import annotations

import inspect
import sys
import threading
from typing import Any, Callable, Optional

from .patches import Patches

TESTED = (("3.9", "2.4.1"), ("3.10", "2.6.0"), ("3.11", "2.13.0"), ("3.13", "2.15.0"))
"""(Python, torch) of each corner scripts/support_matrix.sh last ran, oldest first, CI's
corner among them (docs/reference/support.md, which tests/unit/test_torch_compat.py keeps
in step with this)."""


def _torch() -> Any:
    return sys.modules["torch"]


def release(version: str) -> tuple[int, ...]:
    """`2.4.1+cu121` -> (2, 4, 1); `2.16.0.dev20270101` -> (2, 16, 0)."""
    numbers = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def against_tested(torch_version: str, python_version: str) -> tuple[bool, str]:
    """Whether this torch and Python lie within the tested matrix (by minor release), and the
    words for it: "torch 2.4.0: tested (2.4.1)", "torch 2.16.0: not tested: newer than the
    newest tested (2.15.0)"."""
    words, ok = [], True
    for name, version, tested in (
        ("torch", torch_version, [t for _, t in TESTED]),
        ("Python", python_version, [p for p, _ in TESTED]),
    ):
        minor = release(version)[:2]
        same = [t for t in tested if release(t)[:2] == minor]
        if same:
            words.append(f"{name} {version}: tested ({same[0]})")
        elif minor < release(tested[0])[:2]:
            ok = False
            words.append(
                f"{name} {version}: not tested: older than the oldest tested ({tested[0]})"
            )
        elif minor > release(tested[-1])[:2]:
            ok = False
            words.append(
                f"{name} {version}: not tested: newer than the newest tested ({tested[-1]})"
            )
        else:
            words.append(f"{name} {version}: between tested versions ({', '.join(tested)})")
    return ok, "; ".join(words)


def features() -> list[str]:
    """What this torch offers of what the plugin and its trainers use, in words."""
    torch = _torch()
    shard = fully_shard()
    where = {None: "absent"}.get(shard, getattr(shard, "__module__", "?"))
    cpu = hasattr(getattr(torch, "cpu", None), "Stream") and hasattr(
        torch.cpu.Stream, "record_event"
    )
    return [
        "automatic recording: "
        + (
            "global forward hooks with keyword arguments"
            if forward_hooks_take_kwargs()
            else "keyword arguments through a wrapped Module.__call__ (torch < 2.5)"
        ),
        f"FSDP2 fully_shard: {where}"
        + ("" if shard is None or cpu else "; on an accelerator only (on CPU: torch 2.7+)"),
        "fp32_precision API: " + ("read" if has_fp32_precision_api() else "absent (torch < 2.9)"),
    ]


def forward_hooks_take_kwargs() -> bool:
    """Whether `register_module_forward_hook` takes `with_kwargs=` (torch >= 2.5)."""
    from torch.nn.modules import module as nn_module

    try:
        parameters = inspect.signature(nn_module.register_module_forward_hook).parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return True
    return "with_kwargs" in parameters


class _KwargsHook:
    """A global forward hook given `(module, args, kwargs, output)` on a torch whose global
    hooks get no keyword arguments: `Module.__call__` keeps each call's keyword arguments on
    a per-thread stack while the call runs, and the hook (called inside it) reads the top.
    A forward that raised gets `(module, args, output)`, as torch gives it then."""

    def __init__(self, hook: Callable[..., Any], always_call: bool) -> None:
        from torch.nn.modules import module as nn_module

        self.calls = threading.local()
        self.patches = Patches(__name__)
        original = nn_module.Module.__call__
        calls = self.calls

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            stack = calls.__dict__.setdefault("stack", [])
            stack.append((kwargs, sys.exc_info()[1]))
            try:
                return original(self, *args, **kwargs)
            finally:
                stack.pop()

        def with_kwargs(module: Any, args: Any, output: Any) -> Any:
            stack = getattr(calls, "stack", None)
            kwargs, handled = stack[-1] if stack else ({}, None)
            if sys.exc_info()[1] is not handled:
                # the forward raised, and torch calls from its `except`: as torch >= 2.5
                # calls a hook with kwargs then, without them
                return hook(module, args, output)
            return hook(module, args, kwargs, output)

        self.patches.replace(nn_module.Module, "__call__", __call__)
        self.handle = nn_module.register_module_forward_hook(with_kwargs, always_call=always_call)

    def remove(self) -> None:
        self.handle.remove()
        self.patches.restore()


def register_module_forward_hook_with_kwargs(
    hook: Callable[..., Any], *, always_call: bool = False
) -> Any:
    """`torch.nn.modules.module.register_module_forward_hook(hook, with_kwargs=True,
    always_call=...)` on any supported torch: `hook(module, args, kwargs, output)`. Returns
    a handle with `remove()`."""
    from torch.nn.modules import module as nn_module

    if forward_hooks_take_kwargs():
        return nn_module.register_module_forward_hook(
            hook, with_kwargs=True, always_call=always_call
        )
    return _KwargsHook(hook, always_call)


def fully_shard() -> Optional[Callable[..., Any]]:
    """FSDP2's `fully_shard`, wherever this torch keeps it (public from torch 2.6), or None."""
    try:
        from torch.distributed.fsdp import fully_shard as public
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard as composable
        except ImportError:
            return None
        return composable
    return public


def has_fp32_precision_api() -> bool:
    """Whether torch has the `fp32_precision` API (torch >= 2.9)."""
    getter = getattr(getattr(_torch(), "_C", None), "_get_fp32_precision_getter", None)
    return callable(getter)
