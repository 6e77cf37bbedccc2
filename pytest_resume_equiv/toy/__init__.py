"""Toy Wan (diffusion transformer) builders and a flow-matching condition model.

For trainers of Wan-style DiTs: a model that builds in well under a second on CPU, with the
RoPE implementation pinned to eager and attention pinned to PyTorch's native path, so resume
tests are bitwise reproducible on every device. Needs `pip install 'pytest-resume-equiv[wan]'`.
Importable inside ranks: nothing here imports pytest.
"""

from .condition import ToyFlowMatchingCondition
from .wan import (
    WAN_INSTALL_HINT,
    ToyWanConfigError,
    build_toy_wan,
    load_toy_wan,
    materialize_toy_wan,
    toy_wan_config,
)

__all__ = [
    "WAN_INSTALL_HINT",
    "ToyFlowMatchingCondition",
    "ToyWanConfigError",
    "build_toy_wan",
    "load_toy_wan",
    "materialize_toy_wan",
    "toy_wan_config",
]
