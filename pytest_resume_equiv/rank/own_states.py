"""RNG states this process read itself: setting one again is isolation, not a restore.

Lightning's `isolate_rng()` (around its sanity check and its validation), a trainer's own
`state = torch.get_rng_state(); evaluate(); torch.set_rng_state(state)`: each reads a
stream's state and later sets that same state again, in the same process. A restore from a
checkpoint sets a state this process never read: another process saved it. Identity is the
state itself (a digest of its bytes), not the code that sets it. The plugin's reads (its
audit of every stream at each step) and torch's own (`fork_rng`) are not remembered.
"""

from __future__ import annotations

import hashlib
from typing import Any

from .fingerprint import content_hash
from .patches import Patches
from .trace import called_from_plugin, called_from_torch

DEVICE_GETTERS = ("get_rng_state", "get_rng_state_all")
"""A device module's getters (`torch.cuda`, `torch.cuda.random`, ...)."""


class OwnStates:
    """The digests of the states this process's code read through the global getters."""

    def __init__(self) -> None:
        self.read: set[str] = set()

    def has(self, state: Any) -> bool:
        """Whether `state` (what a setter was given) is one this process read itself."""
        return bool(self.read) and _digest(state) in self.read

    def watch(self, patches: Patches, module: Any, getters: tuple[str, ...]) -> None:
        """Remember what the `getters` of `module` hand to the user's code."""
        for name in getters:
            self._watch_one(patches, module, name)

    def _watch_one(self, patches: Patches, owner: Any, attribute: str) -> None:
        original = getattr(owner, attribute, None)
        if original is None or patches.holds(owner, attribute):
            return

        def reading(*args: Any, **kwargs: Any) -> Any:
            state = original(*args, **kwargs)
            if not called_from_plugin(2) and not called_from_torch(2):
                try:
                    self.read.add(_digest(state))
                except Exception:  # noqa: BLE001 - best effort: an unknown state is no own one
                    pass
            return state

        patches.replace(owner, attribute, reading)


def _digest(state: Any) -> str:
    found = hashlib.blake2b(digest_size=16)
    _feed(found, state)
    return found.hexdigest()


def _feed(found: Any, value: Any) -> None:
    """What identifies a state: a tensor's fingerprint (torch's getters give CPU byte
    tensors), an array's bytes (numpy's), nested tuples and lists (Python's, numpy's,
    `get_rng_state_all`), else its repr."""
    if isinstance(value, (tuple, list)):
        found.update(b"(")
        for item in value:
            _feed(found, item)
        found.update(b")")
    elif callable(getattr(value, "detach", None)):
        found.update(str(content_hash(value)).encode())
    elif callable(getattr(value, "tobytes", None)):
        found.update(value.tobytes())
    else:
        found.update(repr(value).encode())
