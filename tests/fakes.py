"""Fake torch device modules, so the cuda / npu / xpu paths run on a CPU machine.

`FakeAccel` follows the functions of `torch.cuda` (torch/cuda/__init__.py: is_available,
device_count, get_device_name; torch/cuda/memory.py: mem_get_info -> (free, total) bytes),
which `torch.xpu` (torch/xpu/__init__.py, torch/xpu/memory.py) and torch_npu's `torch.npu`
(torch_npu/npu/utils.py, torch_npu/npu/memory.py) mirror. Like the real ones, a device index
past the count raises, and mem_get_info of an unavailable module raises.
"""

from types import ModuleType, SimpleNamespace

GIB = 1024**3


class FakeAccel:
    def __init__(self, count, name="Fake Accelerator", free=(80 * GIB,), total=80 * GIB):
        self.count = count
        self.name = name
        self.free = free
        """Free bytes per device (the last repeats for the others)."""
        self.total = total

    def is_available(self):
        return self.count > 0

    def device_count(self):
        return self.count

    def _index(self, device):
        index = 0 if device is None else int(device)
        if not 0 <= index < self.count:
            raise RuntimeError(f"Invalid device argument : did you call init? ({index})")
        return index

    def get_device_name(self, device=None):
        return f"{self.name} #{self._index(device)}"

    def mem_get_info(self, device=None):
        index = self._index(device)
        return (self.free[min(index, len(self.free) - 1)], self.total)


def importer(cuda=0, npu=None, xpu=0, xccl=False, **accel):
    """An import_module for a fake torch; npu=None means torch_npu is not installed. A count
    may also be a ready FakeAccel; `accel` goes to every FakeAccel made here."""

    def fake(count):
        return count if isinstance(count, FakeAccel) else FakeAccel(count, **accel)

    torch = ModuleType("torch")
    torch.__version__ = "2.6.0+fake"
    torch.cuda = fake(cuda)
    torch.xpu = fake(xpu)
    distributed = SimpleNamespace(is_xccl_available=lambda: xccl)

    def import_module(name):
        if name == "torch":
            return torch
        if name == "torch.distributed":
            return distributed
        if name == "torch_npu":
            if npu is None:
                raise ImportError("No module named 'torch_npu'")
            torch.npu = fake(npu)  # torch_npu registers torch.npu on import
            return ModuleType("torch_npu")
        raise ImportError(name)

    return import_module
