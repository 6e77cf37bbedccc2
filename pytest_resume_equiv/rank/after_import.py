"""A meta path finder that calls hooks with a module right after its first import: the
restore log wraps DCP's and safetensors' loaders only once the trainer imports them
(importing DCP early changes how a gloo process group is torn down)."""

from __future__ import annotations

import importlib.abc
import importlib.util
from typing import Any, Callable


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls a function with a module right after it is first imported."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[Callable[[Any], None]]] = {}

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        hooks = self.hooks.pop(name, None)
        if not hooks:
            return None
        spec = importlib.util.find_spec(name)  # the real one (this finder no longer has it)
        if spec is None or spec.loader is None:
            return None
        real = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            real(module)
            for hook in hooks:
                hook(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
