"""The environment rows: versions, the device the plugin picks and why, the devices and their
free memory, and how `nproc` devices per launch are leased to pytest-xdist workers.

Everything goes through an injectable `import_module` (as `launch/devices.py` does), so the
cuda, npu and xpu branches run on CPU against fake device modules.
"""

from __future__ import annotations

import importlib
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from .. import __version__
from ..launch.devices import (
    ACCELERATORS,
    VISIBLE_DEVICES_ENV,
    Device,
    DeviceLease,
    DeviceUnavailable,
    Importer,
    backend_for,
    count_devices,
    select_device,
    visible_ids,
)
from ..launch.resources import parallelism
from .rows import FAIL, OK, WARN, Row

GIB = 1024**3
LOW_MEMORY = 1 * GIB
"""Free memory below which a device is named as nearly full (another job holds it)."""


@dataclass(frozen=True)
class Picked:
    """The device the later checks run on, and the rows that say how it was picked."""

    device: Device
    rows: list[Row]
    fallback: bool = False
    """The device asked for cannot run resume tests here: the checks run on CPU instead."""


def _row(check: str, status: str, seen: str, fix: str = "") -> Row:
    return Row("environment", check, status, seen, fix)


def versions(import_module: Importer = importlib.import_module) -> list[Row]:
    python = f"Python {platform.python_version()}"
    try:
        torch = import_module("torch")
    except Exception as exc:  # a broken install is a row, not a traceback
        return [
            _row(
                "versions",
                FAIL,
                f"torch does not import ({type(exc).__name__}: {exc}); {python}, "
                f"pytest-resume-equiv {__version__}",
                "install torch (pip install torch, or your accelerator's build of it)",
            )
        ]
    version = getattr(torch, "__version__", "unknown")
    return [_row("versions", OK, f"torch {version}, pytest-resume-equiv {__version__}, {python}")]


def pick(requested: str, nproc: int, import_module: Importer = importlib.import_module) -> Picked:
    """The device the plugin picks for `--resume-equiv-device=requested` and launches of
    `nproc` ranks, and why; when it cannot run them, a failed row and CPU for the rest."""
    cpu = Device("cpu", "gloo", 0)
    if requested == "cpu":
        seen = "cpu, as asked: ranks run on CPU processes with gloo"
        return Picked(cpu, [_row("device", OK, seen)])
    try:
        device = select_device(requested, nproc, import_module)
    except DeviceUnavailable as exc:
        if requested == "auto":
            fix = (
                "install the accelerator's torch build (or torch_npu), or run the tests on "
                "CPU: pytest --resume-equiv-device=cpu (and doctor --device cpu)"
            )
            seen = f"{exc}: resume tests skip with --resume-equiv-device=auto"
        else:
            fix = (
                f"run on a machine with {nproc} {requested} devices, lower nproc (doctor "
                f"--nproc), or free them (a visible-devices variable may hide some)"
            )
            seen = f"{exc}: resume tests of {nproc} ranks skip (fail with require-device)"
        return Picked(
            cpu, [_row("device", FAIL, f"{seen}; the checks below ran on cpu", fix)], True
        )
    why = (
        f"the first accelerator found (auto looks for {', '.join(ACCELERATORS)} in that order)"
        if requested == "auto"
        else "as asked"
    )
    rows = [_row("device", OK, f"{device.kind} with backend {device.backend}: {why}")]
    if device.kind == "xpu" and device.backend == "gloo":
        rows.append(
            _row(
                "xpu backend",
                WARN,
                "this torch has no xccl: xpu ranks talk over gloo (through the host)",
                "install a torch build with xccl (torch >= 2.8 XPU wheels) for device collectives",
            )
        )
    return Picked(device, rows)


def _name(module: object, index: int) -> str:
    get = getattr(module, "get_device_name", None)
    try:
        return str(get(index)) if get is not None else "unnamed"
    except Exception as exc:
        return f"unnamed ({type(exc).__name__})"


def _free(module: object, index: int) -> Optional[tuple[int, int]]:
    """(free, total) bytes of one device, or None where the module cannot say."""
    get = getattr(module, "mem_get_info", None)
    try:
        return tuple(int(x) for x in get(index))[:2] if get is not None else None  # type: ignore[return-value]
    except Exception:
        return None


def devices(device: Device, import_module: Importer = importlib.import_module) -> list[Row]:
    """The devices this process sees: names and free memory."""
    if device.kind == "cpu":
        cores = os.cpu_count() or 1
        return [_row("devices", OK, f"cpu: {cores} cores (a launch takes a core per rank)")]
    torch = import_module("torch")
    module = getattr(torch, device.kind)
    parts, low = [], []
    for index in range(device.count):
        free = _free(module, index)
        memory = "free memory unknown"
        if free is not None:
            memory = f"{free[0] / GIB:.1f} of {free[1] / GIB:.1f} GiB free"
            if free[0] < LOW_MEMORY:
                low.append(f"{device.kind}:{index}")
        parts.append(f"{device.kind}:{index} {_name(module, index)} ({memory})")
    seen = f"{device.count} {device.kind} devices: " + "; ".join(parts)
    if low:
        return [
            _row(
                "devices",
                WARN,
                seen,
                f"{', '.join(low)} nearly full: another process holds it (nvidia-smi / "
                "npu-smi shows which); a launch there may run out of memory",
            )
        ]
    return [_row("devices", OK, seen)]


def leases(
    device: Device,
    nproc: int,
    environ: Optional[Mapping[str, str]] = None,
    lock_dir: Optional[str] = None,
) -> list[Row]:
    """How launches of `nproc` ranks share this machine: on accelerators, the device sets
    pytest-xdist workers lease (visible-device variables, file locks), and whether another
    pytest holds some of them now."""
    environ = dict(os.environ) if environ is None else dict(environ)
    at_once, _ = parallelism(device, nproc, nproc)
    if device.kind == "cpu":
        seen = f"{at_once} launch(es) of {nproc} ranks side by side (a core per rank)"
        return [_row("leases", OK, seen)]
    variable = VISIBLE_DEVICES_ENV[device.kind]
    ids = visible_ids(device.kind, device.count, environ)
    sets = [ids[i : i + nproc] for i in range(0, len(ids) - nproc + 1, nproc)]
    shown = " | ".join(f"{variable}={','.join(s)}" for s in sets)
    seen = (
        f"each launch leases {nproc} of {len(ids)} devices: {shown}; {len(sets)} launch(es) "
        f"at once (pytest -n {len(sets)} keeps them busy)"
    )
    if variable in environ:
        seen += f"; {variable}={environ[variable]} is set, so only those are handed out"
    spare = ids[len(sets) * nproc :]
    lease = DeviceLease(device.kind, ids, lock_dir)
    try:
        free_now = lease.try_acquire(nproc)
    except OSError as exc:
        return [
            _row(
                "leases",
                FAIL,
                f"{seen}; the lease locks cannot be taken ({exc})",
                f"make {lease.lock_dir} writable (it holds one lock file per device)",
            )
        ]
    finally:
        lease.release()
    if not free_now:
        return [
            _row(
                "leases",
                WARN,
                f"{seen}; no {nproc} devices are free now: another pytest holds their locks",
                f"wait for it, or look for stale processes holding locks in {lease.lock_dir}",
            )
        ]
    if spare:
        return [
            _row(
                "leases",
                WARN,
                f"{seen}; {', '.join(spare)} never leased ({len(ids)} is not a multiple of {nproc})",
                f"use an nproc that divides {len(ids)}, or hide the spare devices with {variable}",
            )
        ]
    return [_row("leases", OK, seen)]


def backends_to_try(device: Device, import_module: Importer = importlib.import_module) -> list[str]:
    """gloo always (the CPU side every launch may use), and the device's own backend."""
    if device.kind == "cpu":
        return ["gloo"]
    own = backend_for(device.kind, import_module)
    return [own] if own == "gloo" else [own, "gloo"]


def device_count(kind: str, import_module: Importer = importlib.import_module) -> int:
    return 0 if kind == "cpu" else count_devices(kind, import_module)
