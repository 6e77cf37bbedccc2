"""What a rank patches in its process: the one helper that replaces an attribute
(`rank/patches.py`, `Patches`) and the table of every patch (`PATCHES`), which must name each
attribute a rank replaces, under the module that replaces it."""

import fnmatch
import functools
import gc
import importlib
import inspect
import os
import shutil

import torch

from pytest_resume_equiv.marker import MARKER_KEYWORDS
from pytest_resume_equiv.rank import patches, torch_compat
from pytest_resume_equiv.rank.context import current
from pytest_resume_equiv.rank.patches import PATCHES, REPLACED, Patches, qualified_name
from pytest_resume_equiv.settings import OPTIONS

ONLY_WITH_A_DEVICE = ("torch.*.default_generators", "torch.npu.*")
"""Replaced when an accelerator is initialised, or once torch_npu is imported: never in a CPU
test process."""
NOT_ON_THIS_TORCH = (
    ("torch.nn.modules.module.Module.__call__",) if torch_compat.forward_hooks_take_kwargs() else ()
)
"""Replaced only on a torch that lacks the API it stands in for (rank/torch_compat.py)."""
ONLY_WITH_TIMINGS = ("torch.distributed.init_process_group",)
"""Replaced only when a benchmark asks for the phase timings (rank/timings.py)."""


class Base:
    def greet(self):
        """Says hello."""
        return "hello"


class Child(Base):
    pass


def test_a_function_replacement_reads_as_the_original_and_is_put_back():
    found = Patches(__name__)
    original = Base.greet

    def greet(self):
        return "patched " + original(self)

    found.replace(Base, "greet", greet)
    assert Base().greet() == "patched hello"
    assert Base.greet.__wrapped__ is original and Base.greet.__doc__ == "Says hello."
    assert Base.greet.__qualname__ == "Base.greet" and inspect.unwrap(Base.greet) is original
    found.replace(Base, "greet", lambda self: "second")  # the first replacement stays
    assert Base().greet() == "patched hello" and found.holds(Base, "greet")
    found.restore()
    assert Base.greet is original and not found.holds(Base, "greet") and not found.replaced


def test_an_inherited_attribute_is_inherited_again_after_restore():
    """Putting the inherited function back on the subclass would leave it there for good
    (a later patch of the base would no longer reach the subclass)."""
    found = Patches(__name__)
    found.replace(Child, "greet", lambda self: "child")
    assert Child().greet() == "child" and Base().greet() == "hello"
    found.restore()
    assert "greet" not in vars(Child) and Child().greet() == "hello"


def test_a_class_or_an_object_is_set_as_it_is():
    """`__wrapped__` on a class would be inherited by its instances and its subclasses."""
    found = Patches(__name__)

    class Stand(Base):
        pass

    holder = type("Holder", (), {"kind": Base, "items": (1, 2)})
    found.replace(holder, "kind", Stand)
    found.replace(holder, "items", (3,))
    assert holder.kind is Stand and "__wrapped__" not in vars(Stand)
    assert Stand.__qualname__.endswith("Stand") and holder.items == (3,)
    found.restore()
    assert holder.kind is Base and holder.items == (1, 2)


def test_patches_restore_the_last_replacement_first():
    """Two replacements of one attribute by two owners (the restore log's `load_state_dict`
    wrapper, then automatic recording's over it) come off in the reverse order."""
    first, second = Patches(__name__), Patches(__name__)
    original = Base.greet
    first.replace(Base, "greet", lambda self: "first")
    wrapped_once = Base.greet
    second.replace(Base, "greet", lambda self: "second")
    second.restore()
    assert Base.greet is wrapped_once
    first.restore()
    assert Base.greet is original


def _replaced_now() -> list[tuple[str, str]]:
    """(replacing module, qualified name) of every attribute some `Patches` holds now."""
    found = []
    for obj in gc.get_objects():
        if type(obj) is Patches and obj.module.startswith("pytest_resume_equiv."):
            for owner, attribute, _ in obj.replaced.values():
                found.append((obj.module, qualified_name(owner, attribute)))
    return found


def _row_path(module: str) -> str:
    """`pytest_resume_equiv.rank.restore` -> `rank/restore.py`, as PATCHES names owners."""
    return module.split(".", 1)[1].replace(".", "/") + ".py"


def _covers(row, module: str, name: str) -> bool:
    return row.owner == _row_path(module) and any(fnmatch.fnmatch(name, p) for p in row.targets)


def test_every_attribute_a_rank_replaces_has_its_row(in_rank):
    """A rank with everything installed (automatic recording on, the checkpoint libraries
    imported, the draw trace's window open): each replaced attribute is in PATCHES under the
    module that replaced it, each row's names match something replaced, and uninstalling
    leaves nothing replaced."""
    # imported first, so what is wrapped once the trainer imports them is wrapped at install
    for name in ("numpy", "safetensors.torch", "torch.distributed.checkpoint.state_dict"):
        importlib.import_module(name)
    real = (torch.load, torch.Generator, open, os.replace, shutil.rmtree, torch.Tensor.backward)
    in_rank(phase="resumed", auto=True, equivalence=True)
    state = current()
    state.install()
    try:
        state.point.window.start()
        try:
            replaced = _replaced_now()
        finally:
            state.point.window.stop()
    finally:
        state.uninstall()

    assert [entry for entry in replaced if not any(_covers(r, *entry) for r in PATCHES)] == []
    unmatched = [
        (row.owner, pattern)
        for row in PATCHES
        for pattern in row.targets
        if pattern not in (*ONLY_WITH_A_DEVICE, *NOT_ON_THIS_TORCH, *ONLY_WITH_TIMINGS)
        and not any(row.owner == _row_path(m) and fnmatch.fnmatch(n, pattern) for m, n in replaced)
    ]
    assert unmatched == [], unmatched
    assert all(bool(row.targets) == (row.how == REPLACED) for row in PATCHES)
    assert _replaced_now() == []
    after = (torch.load, torch.Generator, open, os.replace, shutil.rmtree, torch.Tensor.backward)
    assert after == real


def test_the_automatic_recording_switch_names_the_real_option():
    option = OPTIONS["auto"]
    assert "auto" in MARKER_KEYWORDS
    assert option.cli in patches.AUTO_SWITCH and option.env in patches.AUTO_SWITCH
    switches = {row.switch for row in PATCHES}
    assert switches == {
        patches.ALWAYS,
        patches.AUTO_SWITCH,
        patches.EQUIVALENCE_ONLY,
        patches.TIMINGS_ONLY,
    }


@functools.cache
def _owner_sources() -> dict[str, str]:
    root = os.path.dirname(os.path.dirname(patches.__file__))
    return {
        row.owner: open(os.path.join(root, row.owner), encoding="utf-8").read() for row in PATCHES
    }


def test_each_row_names_a_module_that_makes_such_a_patch():
    """A row's owner holds the call that makes it: `Patches`/`Wrapper` for a replacement, a
    `register_*hook` for a torch hook."""
    for row in PATCHES:
        source = _owner_sources()[row.owner]
        if row.how == REPLACED:
            assert "Patches(__name__)" in source or "Wrapper(__name__)" in source, row.owner
        elif row.how == patches.TORCH_HOOK:
            assert "register_" in source and "_hook(" in source, row.owner
