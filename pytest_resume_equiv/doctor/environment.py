"""The environment rows: versions, the device the plugin picks and why, the devices and their
free memory, and how `nproc` devices per launch are leased to pytest-xdist workers.

The device is picked as the plugin picks it (`launch/devices.py`: without initialising a
driver in this process); names and free memory are asked in a child process (`python -m
pytest_resume_equiv.doctor.environment KIND`), so the doctor holds no device context while
its launches run. The question itself (`device_facts`) takes an injectable `import_module`,
so the cuda, npu and xpu branches run on CPU against fake device modules.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Optional

from .. import __version__
from ..launch.devices import (
    ACCELERATORS,
    Device,
    DeviceLease,
    DeviceUnavailable,
    HostProbe,
    Importer,
    ask_child,
    backend_for,
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
    rows = [_row("versions", OK, f"torch {version}, pytest-resume-equiv {__version__}, {python}")]
    if not isinstance(version, str) or not hasattr(torch, "nn"):
        return rows  # a stand-in torch (the doctor's own tests): nothing more to read
    from ..rank import torch_compat

    tested, seen = torch_compat.against_tested(version, platform.python_version())
    fix = "" if tested else "docs/reference/support.md: the versions tested, and how to run them"
    rows.append(_row("tested versions", OK if tested else WARN, seen, fix))
    rows.append(_row("torch features", OK, "; ".join(torch_compat.features())))
    return rows


def pick(
    requested: str,
    nproc: int,
    probe: Optional[HostProbe] = None,
    import_module: Importer = importlib.import_module,
) -> Picked:
    """The device the plugin picks for `--resume-equiv-device=requested` and launches of
    `nproc` ranks, and why; when it cannot run them, a failed row and CPU for the rest."""
    cpu = Device("cpu", "gloo", 0)
    if requested == "cpu":
        seen = "cpu, as asked: ranks run on CPU processes with gloo"
        return Picked(cpu, [_row("device", OK, seen)])
    try:
        device = select_device(requested, nproc, probe, import_module=import_module)
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


DeviceFacts = list[tuple[str, Optional[tuple[int, int]]]]
"""Per device: its name, and (free, total) bytes where the device module can say."""
FACTS_WAIT = 120.0
"""Seconds the child that asks for names and memory gets (it imports torch, and torch_npu)."""


def device_facts(kind: str, import_module: Importer = importlib.import_module) -> DeviceFacts:
    """Name and memory of every `kind` device, asked of torch in this process (which
    initialises the driver: the doctor asks in a child, `facts_in_child`)."""
    torch = import_module("torch")
    if kind == "npu":
        import_module("torch_npu")
    module = getattr(torch, kind)
    found: DeviceFacts = []
    for index in range(int(module.device_count())):
        try:
            name = str(module.get_device_name(index))
        except Exception as exc:
            name = f"unnamed ({type(exc).__name__})"
        try:
            free, total = module.mem_get_info(index)
            memory: Optional[tuple[int, int]] = (int(free), int(total))
        except Exception:
            memory = None
        found.append((name, memory))
    return found


def facts_in_child(kind: str) -> DeviceFacts:
    """`device_facts` in a child process that exits afterwards; [] when it cannot answer."""
    rows = ask_child(["-m", __name__, kind], FACTS_WAIT) or []
    try:
        return [(str(n), tuple(m) if m else None) for n, m in rows]  # type: ignore[misc]
    except (TypeError, ValueError):
        return []


def devices(device: Device, query: Callable[[str], DeviceFacts] = facts_in_child) -> list[Row]:
    """The devices the launches will use: names and free memory."""
    if device.kind == "cpu":
        cores = os.cpu_count() or 1
        return [_row("devices", OK, f"cpu: {cores} cores (a launch takes a core per rank)")]
    facts = query(device.kind)
    if not facts:
        return [
            _row(
                "devices",
                WARN,
                f"{device.count} {device.kind} devices, but a process asking torch for their "
                "names and memory got no answer",
                f"python -c 'import torch; print(torch.{device.kind}.device_count())' shows "
                "the driver's error",
            )
        ]
    parts, low = [], []
    for index, (name, memory) in enumerate(facts[: device.count]):
        text = "free memory unknown"
        if memory is not None:
            text = f"{memory[0] / GIB:.1f} of {memory[1] / GIB:.1f} GiB free"
            if memory[0] < LOW_MEMORY:
                low.append(f"{device.kind}:{index}")
        parts.append(f"{device.kind}:{index} {name} ({text})")
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
    variable = device.visible_vars[0]
    ids = visible_ids(device.kind, device.count, environ, device.rocm)
    sets = [ids[i : i + nproc] for i in range(0, len(ids) - nproc + 1, nproc)]
    shown = " | ".join(f"{variable}={','.join(s)}" for s in sets)
    seen = (
        f"each launch leases {nproc} of {len(ids)} devices: {shown}; {len(sets)} launch(es) "
        f"at once (pytest -n {len(sets)} keeps them busy)"
    )
    if variable in environ:
        seen += f"; {variable}={environ[variable]} is set, so only those are handed out"
    spare = ids[len(sets) * nproc :]
    lease = DeviceLease(device.kind, ids, lock_dir, variables=device.visible_vars)
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


if __name__ == "__main__":
    print(json.dumps(device_facts(sys.argv[1])))
