"""Accelerator kinds, their process-group backends, visible-device variables and leases
(how long to wait for a lease is resources.py's business).

The pytest process never asks torch whether a device is there: `torch.cuda.is_available()`
initialises the driver and poisons every later fork of pytest (a user's unrelated test that
forks and uses CUDA then fails with "Cannot re-initialize CUDA in forked subprocess"), and
torch_npu's and XPU's counts do the same. `HostProbe` learns the devices instead from what the
installed torch was built for (its `version.py`, read without importing torch), NVML for
NVIDIA GPUs (nvml.py), and otherwise a child process that asks torch and exits. The child's
question is `count_here`, tested on CPU with fake torch / torch_npu modules.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import lru_cache
from types import ModuleType
from typing import Callable, Optional

from . import nvml

ACCELERATORS = ("cuda", "npu", "xpu")
BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl", "xpu": "xccl"}
VISIBLE_DEVICES_ENV = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "npu": "ASCEND_RT_VISIBLE_DEVICES",
    "xpu": "ZE_AFFINITY_MASK",
}
ROCM_VISIBLE_DEVICES_ENV = "HIP_VISIBLE_DEVICES"
"""On ROCm builds HIP_VISIBLE_DEVICES wins over CUDA_VISIBLE_DEVICES (torch/cuda/__init__.py,
`_parse_visible_devices`; the HIP runtime reads it first)."""
_PROBE_NAMES = {"cuda": "cuda", "npu": "npu (torch_npu)", "xpu": "xpu"}
CHILD_PROBE_WAIT = 120.0
"""Seconds the child that asks torch for a count gets (it imports torch, and torch_npu)."""

Importer = Callable[[str], ModuleType]


class DeviceUnavailable(Exception):
    """The requested device is absent or too few; the message is the skip/fail reason."""


@dataclass(frozen=True)
class Device:
    kind: str
    backend: str
    count: int
    """Devices visible to this process (0 for cpu)."""
    rocm: bool = False
    """A "cuda" device of a ROCm (HIP) build of torch."""

    @property
    def visible_vars(self) -> tuple[str, ...]:
        """The variables that restrict which devices a launch sees, the one read first first."""
        return visible_vars(self.kind, self.rocm)


def visible_vars(kind: str, rocm: bool = False) -> tuple[str, ...]:
    if kind == "cuda" and rocm:
        return (ROCM_VISIBLE_DEVICES_ENV, VISIBLE_DEVICES_ENV["cuda"])
    return (VISIBLE_DEVICES_ENV[kind],)


@dataclass(frozen=True)
class TorchBuild:
    """Which accelerators the installed torch (and torch_npu) can use at all."""

    cuda: bool = False
    rocm: bool = False
    """cuda is a HIP build (torch.version.hip)."""
    xpu: bool = False
    npu: bool = False
    """torch_npu is installed."""

    def supports(self, kind: str) -> bool:
        return bool(getattr(self, kind))


def _version_fields(path: str) -> dict[str, object]:
    """The constants torch's generated `version.py` assigns, read as text: importing torch
    just to read them would cost seconds, and nothing may run from it."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found: dict[str, object] = {}
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            found[target.id] = value.value
    return found


def torch_build() -> TorchBuild:
    """What the installed torch was built for: from `torch.version` when torch is imported
    already, else from its `version.py` on disk; nothing is imported."""
    torch = sys.modules.get("torch")
    version = getattr(torch, "version", None)
    if version is not None:
        fields = {k: getattr(version, k, None) for k in ("cuda", "hip", "xpu")}
    else:
        try:
            spec = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            return TorchBuild()
        path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
        try:
            fields = _version_fields(path)
        except (OSError, SyntaxError, ValueError):
            # an unusual install: say "maybe" for every kind and let the child answer
            return TorchBuild(cuda=True, xpu=True, npu=_installed("torch_npu"))
    return TorchBuild(
        cuda=bool(fields.get("cuda") or fields.get("hip")),
        rocm=bool(fields.get("hip")),
        xpu=bool(fields.get("xpu")),
        npu=_installed("torch_npu"),
    )


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def visible_entries(
    kind: str, environ: Mapping[str, str], rocm: bool = False
) -> Optional[list[str]]:
    """The entries of the first visible-devices variable set for `kind` (None: none set)."""
    for var in visible_vars(kind, rocm):
        value = environ.get(var)
        if value is not None:
            return [x.strip() for x in value.split(",") if x.strip()]
    return None


def resolve_gpus(
    entries: Optional[Sequence[str]], gpus: Sequence[nvml.Gpu]
) -> Optional[list[nvml.Gpu]]:
    """The NVML GPUs a CUDA_VISIBLE_DEVICES list names, in its order, as CUDA reads it
    (torch/cuda/__init__.py, `_parse_visible_devices` and `_transform_uuid_to_ordinals`): an
    index or a `GPU-` UUID prefix per entry, the list ends at the first entry that names no
    GPU, a repeated GPU empties it. None when NVML cannot tell (MIG instances)."""
    if entries is None:
        return list(gpus)
    chosen: list[nvml.Gpu] = []
    for entry in entries:
        if entry.startswith("MIG-"):
            return None
        if entry.startswith("GPU-"):
            matches = [g for g in gpus if g.uuid.startswith(entry)]
            gpu = matches[0] if len(matches) == 1 else None
        else:
            digits = entry[: len(entry) - len(entry.lstrip("0123456789"))]
            index = int(digits) if digits else -1
            gpu = gpus[index] if 0 <= index < len(gpus) else None
        if gpu is None:
            break
        if gpu in chosen:
            return []
        chosen.append(gpu)
    return chosen


@lru_cache(maxsize=1)
def host_gpus() -> Optional[tuple[nvml.Gpu, ...]]:
    """This host's NVIDIA GPUs, asked once per process (None: NVML cannot tell)."""
    found = nvml.gpus()
    return None if found is None else tuple(found)


CHILD_CODE = (
    "import json, sys\n"
    "from pytest_resume_equiv.launch.devices import count_here\n"
    "print(json.dumps(count_here(sys.argv[1])))\n"
)

_child_counts: dict[tuple[str, str], int] = {}


def count_in_child(kind: str) -> int:
    """torch's own count of `kind`, asked in a child process that exits afterwards, so that
    the driver it initialises is not pytest's. Once per kind and visible-devices list."""
    key = (kind, ",".join(os.environ.get(v, "-") for v in visible_vars(kind, True)))
    if key not in _child_counts:
        answer = ask_child(["-c", CHILD_CODE, kind], CHILD_PROBE_WAIT)
        try:
            _child_counts[key] = int(answer) if answer is not None else 0
        except (TypeError, ValueError):
            _child_counts[key] = 0  # a stack that cannot even answer is "no device"
    return _child_counts[key]


def ask_child(args: list[str], timeout: float) -> Optional[object]:
    """What a child Python (`sys.executable` with `args`) prints as JSON on its last line, or
    None when it fails, hangs past `timeout` or prints no JSON. The child, not this process,
    initialises whatever driver it touches."""
    try:
        done = subprocess.run(
            [sys.executable, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        lines = done.stdout.strip().splitlines()
        return json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def count_here(kind: str, import_module: Importer = importlib.import_module) -> int:
    """How many devices of `kind` torch sees in this process (0 when the kind's stack is
    missing). Initialises the driver: run only in a child (`count_in_child`)."""
    try:
        torch = import_module("torch")
        if kind == "npu":
            import_module("torch_npu")  # registers torch.npu
        module = getattr(torch, kind, None)
        if module is None or not module.is_available():
            return 0
        return int(module.device_count())
    except Exception:  # a missing or broken driver stack is "no device", with no traceback
        return 0


@dataclass
class HostProbe:
    """How the pytest process counts devices without initialising a driver (see the module's
    docstring). Each source is injectable (None: the real one, looked up when asked)."""

    build: Optional[Callable[[], TorchBuild]] = None
    gpus: Optional[Callable[[], Optional[Sequence[nvml.Gpu]]]] = None
    child: Optional[Callable[[str], int]] = None
    use_child: bool = True
    """False: start no child; a count only a child could give is then unknown (the header)."""
    environ: Optional[Mapping[str, str]] = field(default=None)

    def torch_build(self) -> TorchBuild:
        return (self.build or torch_build)()

    def count(self, kind: str) -> Optional[int]:
        """Devices of `kind` visible to this process; None when unknown without a child."""
        build = self.torch_build()
        if not build.supports(kind):
            return 0
        if kind == "cuda" and not build.rocm:
            found = (self.gpus or host_gpus)()
            if found is not None:
                environ = os.environ if self.environ is None else self.environ
                visible = resolve_gpus(visible_entries("cuda", environ), found)
                if visible is not None:
                    return len(visible)
        if not self.use_child:
            return None
        return (self.child or count_in_child)(kind)


def backend_for(kind: str, import_module: Importer = importlib.import_module) -> str:
    if kind == "xpu":
        try:
            dist = import_module("torch.distributed")
            if getattr(dist, "is_xccl_available", lambda: False)():
                return "xccl"
        except ImportError:
            pass
        return "gloo"
    return BACKENDS[kind]


def select_device(
    requested: str,
    devices: int,
    probe: Optional[HostProbe] = None,
    why: str = "",
    import_module: Importer = importlib.import_module,
) -> Device:
    """Pick the device for a test whose largest launch needs `devices` devices on this host
    (`why` says what needs them), or raise DeviceUnavailable."""
    if requested == "cpu":
        return Device("cpu", "gloo", 0)
    probe = HostProbe() if probe is None else probe
    kinds = ACCELERATORS if requested == "auto" else (requested,)
    found: list[tuple[str, int]] = []
    for kind in kinds:
        count = probe.count(kind) or 0
        if count:
            found.append((kind, count))
            break
    because = f" ({why})" if why else ""
    if not found:
        if requested == "auto":
            looked = ", ".join(_PROBE_NAMES[k] for k in ACCELERATORS)
            raise DeviceUnavailable(
                f"no accelerator found (looked for {looked}); "
                "pass --resume-equiv-device=cpu to run the ranks on CPU with gloo"
            )
        raise DeviceUnavailable(f"needs {devices} {requested} device(s){because}, found 0")
    kind, count = found[0]
    if count < devices:
        raise DeviceUnavailable(f"needs {devices} {kind} devices{because}, found {count}")
    rocm = kind == "cuda" and probe.torch_build().rocm
    return Device(kind, backend_for(kind, import_module), count, rocm)


def visible_ids(
    kind: str, count: int, environ: Optional[Mapping[str, str]] = None, rocm: bool = False
) -> list[str]:
    """Physical ids this process may hand out (respects an existing visible-devices list)."""
    environ = os.environ if environ is None else environ
    current = visible_entries(kind, environ, rocm)
    if current:
        return current[:count]
    return [str(i) for i in range(count)]


def lock_names(
    device: Device,
    ids: Sequence[str],
    environ: Optional[Mapping[str, str]] = None,
    gpus: Optional[Callable[[], Optional[Sequence[nvml.Gpu]]]] = None,
) -> dict[str, str]:
    """id -> the name its lock file takes: an NVIDIA GPU's UUID when NVML gives it, so that
    a GPU named by index in one pytest session and by UUID in another is one lock.

    Indexes map to NVML's order only where CUDA's order is the same: CUDA_DEVICE_ORDER=
    PCI_BUS_ID, or GPUs of one model (CUDA's default, fastest first, then breaks ties by PCI
    bus). Otherwise the index stays the name."""
    names = {i: i for i in ids}
    if device.kind != "cuda" or device.rocm:
        return names
    found = (gpus or host_gpus)()
    if not found:
        return names
    environ = os.environ if environ is None else environ
    same_order = (
        environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" or len({g.name for g in found}) == 1
    )
    for entry in ids:
        if entry.startswith("GPU-"):
            matches = [g for g in found if g.uuid.startswith(entry)]
            if len(matches) == 1:
                names[entry] = matches[0].uuid
        elif entry.isdigit() and same_order and int(entry) < len(found):
            names[entry] = found[int(entry)].uuid
    return names


class DeviceLease:
    """Exclusive use of some devices across processes (pytest-xdist workers), by file locks."""

    def __init__(
        self,
        kind: str,
        ids: list[str],
        lock_dir: Optional[str] = None,
        names: Optional[Mapping[str, str]] = None,
        variables: Optional[tuple[str, ...]] = None,
    ) -> None:
        self.kind = kind
        self.ids = ids
        self.lock_dir = lock_dir or default_lock_dir()
        self.names = dict(names or {})
        """id -> lock name (`lock_names`); an id not in it is its own name."""
        self.variables = variables or visible_vars(kind)
        self._stack = ExitStack()
        self.held: list[str] = []

    def try_acquire(self, n: int, prefer: Sequence[str] = ()) -> bool:
        """Take `n` free devices now, all or nothing: holding some while waiting for more
        would deadlock two workers that each hold half of what the other needs. The ids in
        `prefer` are tried first (the devices the test's previous launch had)."""
        from filelock import FileLock, Timeout

        os.makedirs(self.lock_dir, mode=0o700, exist_ok=True)
        order = [i for i in prefer if i in self.ids] + [i for i in self.ids if i not in prefer]
        for device_id in order:
            name = self.names.get(device_id, device_id).replace(os.sep, "_")
            # not thread-local: a lease is released where its launch ends, in any thread
            path = os.path.join(self.lock_dir, f"{self.kind}-{name}.lock")
            lock = FileLock(path, thread_local=False)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue
            self._stack.callback(lock.release)
            self.held.append(device_id)
            if len(self.held) == n:
                return True
        self.release()
        return False

    def env(self) -> dict[str, str]:
        held = ",".join(self.held)
        return {var: held for var in self.variables}

    def release(self) -> None:
        self._stack.close()
        self.held = []


def default_lock_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"pytest-resume-equiv-{os.getuid()}", "leases")


def node_slice(lease_env: Mapping[str, str], nproc: int, node: int) -> dict[str, str]:
    """The visible-devices variables of simulated node `node` of a launch on one host: its
    own `nproc` of the leased devices (two ranks on one GPU is "Duplicate GPU detected" in
    NCCL)."""
    sliced = {}
    for var, value in lease_env.items():
        ids = [x for x in value.split(",") if x]
        sliced[var] = ",".join(ids[node * nproc : (node + 1) * nproc])
    return sliced
