"""Everything a rank changes in its own process to see what the training does: the one helper
that replaces an attribute (`Patches`), and the table of every patch, hook and handler
(`PATCHES`), with what each costs and what turns it off.

A rank runs the user's code unchanged, so the plugin sees a restore, a save, a step or a
random draw only by patching what the code calls. Each patch costs something on every call
of what it patches, and each one is a way the rank differs from the same training run alone:
the table says both, in one place, and docs/reference/in-process.md is generated from it
(`python scripts/in_process_doc.py`). A new patch is one row here; tests/unit/test_patches.py
checks that every attribute a rank replaces through `Patches` has its row.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from typing import Any

_INHERITED = object()
"""Stands for an attribute the owner did not hold itself (a class's inherited one)."""


class Patches:
    """The attributes one part of the rank (a log, a recorder, a registry) replaced, each with
    what its owner held before, so `restore` puts every one back.

    `module` is the replacing module's `__name__`: the row of PATCHES it answers to."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.replaced: dict[tuple[int, str], tuple[Any, str, Any]] = {}
        """(id(owner), attribute) -> (owner, attribute, what the owner's own namespace held
        there, or _INHERITED), in the order replaced."""

    def holds(self, owner: Any, attribute: str) -> bool:
        """Whether `owner.attribute` is replaced by these patches now."""
        return (id(owner), attribute) in self.replaced

    def replace(self, owner: Any, attribute: str, replacement: Any) -> None:
        """Set `owner.attribute` to `replacement`, remembering what it replaced (a second
        replace of the same attribute is ignored: the first one is what `restore` undoes).

        A function replacement takes the original's name, qualified name, module, doc and
        attributes, and `__wrapped__` (functools.update_wrapper): it reads as the function it
        stands for, and `inspect.unwrap` finds the original. A class or any other object is
        set as it is: `__wrapped__` on a class is inherited by its instances and subclasses
        (`inspect.signature` of a user's subclass would follow it to the original)."""
        if self.holds(owner, attribute):
            return
        own = vars(owner).get(attribute, _INHERITED) if hasattr(owner, "__dict__") else _INHERITED
        if isinstance(replacement, types.FunctionType):
            functools.update_wrapper(replacement, getattr(owner, attribute))
        setattr(owner, attribute, replacement)
        self.replaced[(id(owner), attribute)] = (owner, attribute, own)

    def restore(self) -> None:
        """Put back every attribute replaced, the last first (an inherited one is deleted, so
        the owner inherits it again)."""
        for owner, attribute, own in reversed(list(self.replaced.values())):
            if own is _INHERITED:
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, own)
        self.replaced.clear()


def qualified_name(owner: Any, attribute: str) -> str:
    """How PATCHES names a replaced attribute: `torch.load`, `torch.Tensor.backward`,
    `torch.nn.modules.module.Module.load_state_dict`."""
    if isinstance(owner, types.ModuleType):
        return f"{owner.__name__}.{attribute}"
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}.{attribute}"
    return f"{type(owner).__module__}.{type(owner).__qualname__}().{attribute}"


@dataclass(frozen=True)
class Patch:
    """One row of PATCHES: one thing a rank changes in its process."""

    what: str
    """What is patched, named as the user's code reaches it."""
    owner: str
    """The module that installs it (and removes it at `RankState.uninstall`)."""
    how: str
    """replaced (an attribute, through `Patches`), a torch hook, a dispatch mode, an import
    hook, a profile hook, or the process's own state (a stream, a signal, an exit handler)."""
    cost: str
    """What it adds per call of what it patches, in words."""
    switch: str
    """What turns it off: ALWAYS (on in every launched rank), or the option that does."""
    targets: tuple[str, ...] = ()
    """For `how == REPLACED`: fnmatch patterns of the `qualified_name`s it replaces."""


REPLACED = "replaced"
TORCH_HOOK = "torch hook"
ALWAYS = "always"
AUTO_SWITCH = (
    "automatic recording off: `auto=False` in the marker, `--resume-equiv-auto=off`, "
    "`PYTEST_RESUME_EQUIV_AUTO=off`"
)
EQUIVALENCE_ONLY = "on in an `@equivalent` test's launches only (automatic recording on)"
TIMINGS_ONLY = "only with `RESUME_EQUIV_TIMINGS` set (benchmarks/bench_phases.py)"
_DEVICES = "cuda, npu, xpu"
_RESTORE_LOGGED = (
    "a thread-local depth check; after the outermost call returns, an entry in the restore log "
    "with the first user frame (a walk up the stack)"
)

PATCHES: tuple[Patch, ...] = (
    Patch(
        "`sys.stdout` and `sys.stderr` (and file descriptors 1 and 2): the rank's log files "
        "in the run directory",
        "rank/bootstrap.py",
        "process",
        "none (line-buffered files instead of a terminal)",
        ALWAYS,
    ),
    Patch(
        "`faulthandler`: enabled, and registered on SIGUSR1 (the plugin asks a hung rank for "
        "its stacks with it)",
        "rank/bootstrap.py",
        "process",
        "none until the signal comes; a trainer's own SIGUSR1 handler replaces it",
        ALWAYS,
    ),
    Patch(
        "`torch.Generator`: a subclass of the real class (named `torch.Generator`) whose "
        "instances are registered for the RNG audit and whose `manual_seed` and `set_state` "
        "are logged as restores (torch.compile tells a generator by its exact type: a compiled "
        "function given a generator made in a rank fails to trace)",
        "rank/rng.py",
        REPLACED,
        "each generator made: a walk up the stack to name where it was made, and a weak "
        "reference; each `manual_seed` / `set_state`: a look at the calling frame, and for the "
        "user's calls an entry in the restore log",
        ALWAYS,
        ("torch.Generator",),
    ),
    Patch(
        "`torch.utils.data.DataLoader.__init__`: where each loader is built, so a generator "
        "its sampler makes is named after it",
        "rank/rng.py",
        REPLACED,
        "each loader built: weak references to its samplers and the first user frame",
        ALWAYS,
        ("torch.utils.data.dataloader.DataLoader.__init__",),
    ),
    Patch(
        "the global RNG setters: `torch.manual_seed`, `torch.seed`, `torch.set_rng_state` (and "
        f"their `torch.random` names), `torch.<device>.set_rng_state[_all]`, `manual_seed[_all]`, "
        f"`seed[_all]` ({_DEVICES}, and their `.random` names), `random.seed`, `random.setstate`, "
        "`numpy.random.seed`, `numpy.random.set_state`",
        "rank/restore.py",
        REPLACED,
        f"a look at the calling frame (torch's own calls are not logged), then {_RESTORE_LOGGED}",
        ALWAYS,
        (
            "torch.manual_seed",
            "torch.seed",
            "torch.set_rng_state",
            "torch.random.*",
            "torch.cuda.*",
            "torch.npu.*",
            "torch.xpu.*",
            "random.seed",
            "random.setstate",
            "numpy.random.seed",
            "numpy.random.set_state",
        ),
    ),
    Patch(
        "the global RNG getters: `torch.get_rng_state` (and its `torch.random` name), "
        f"`torch.<device>.get_rng_state[_all]` ({_DEVICES}, and their `.random` names), "
        "`random.getstate`, `numpy.random.get_state`",
        "rank/restore.py",
        REPLACED,
        "a look at the calling frame; for the user's calls, a digest of the state returned "
        "(a few KiB hashed), so that setting that state again in the same process (Lightning's "
        "`isolate_rng`, an evaluation put between a get and a set) is no restore "
        "(rank/own_states.py)",
        ALWAYS,
        (
            "torch.get_rng_state",
            "torch.random.*",
            "torch.cuda.*",
            "torch.npu.*",
            "torch.xpu.*",
            "random.getstate",
            "numpy.random.get_state",
        ),
    ),
    Patch(
        f"`torch.<device>.default_generators` ({_DEVICES}): the tuple is replaced by a watching "
        "one when the device is initialised",
        "rank/restore.py",
        REPLACED,
        "an item fetched from outside torch: a look at the calling frame and a one-shot profile "
        "hook (`sys.setprofile`) for at most 64 calls or until the fetching function returns, "
        "which logs a setter called on that generator; none while another profiler is set",
        ALWAYS,
        ("torch.*.default_generators",),
    ),
    Patch(
        "`load_state_dict` of `torch.nn.Module`, `torch.optim.Optimizer`, the LR schedulers "
        "(`LRScheduler`, `ReduceLROnPlateau`), `torch.amp.GradScaler`, and of every subclass "
        "that defines its own, a user's class defined later too (through `__init_subclass__` of "
        "those bases)",
        "rank/restore.py",
        REPLACED,
        f"{_RESTORE_LOGGED} and a weak reference to the object; a new subclass: one look at its "
        "namespace (one more wrapper when it defines `load_state_dict`)",
        ALWAYS,
        ("*.load_state_dict", "*.__init_subclass__"),
    ),
    Patch(
        "the checkpoint readers: `torch.load`, `safetensors.torch.load_file`, "
        "`torch.distributed.checkpoint.load` and DCP's `set_state_dict`, `set_model_state_dict`, "
        "`set_optimizer_state_dict` (all but `torch.load` once the trainer imports their module)",
        "rank/restore.py",
        REPLACED,
        f"{_RESTORE_LOGGED}, naming the file read (an absolute path) or the objects restored",
        ALWAYS,
        (
            "torch.load",
            "safetensors.torch.load_file",
            "torch.distributed.checkpoint.load",
            "torch.distributed.checkpoint.state_dict.set_*state_dict",
        ),
    ),
    Patch(
        "`sys.meta_path`: a finder that wraps `torch_npu`, `safetensors.torch`, "
        "`torch.distributed.checkpoint` and its `state_dict` module once the trainer imports "
        "them (importing DCP early changes how gloo tears down)",
        "rank/restore.py",
        "import hook",
        "each import of a module not yet imported: one dict lookup, until every awaited "
        "module has been imported",
        ALWAYS,
    ),
    Patch(
        "the file calls: `open` (`builtins` and `io`), `os.replace`, `os.rename`, `os.link`, "
        "`os.symlink`, `os.unlink`, `os.remove`, `os.rmdir`, `os.fsync`, `shutil.rmtree`, and "
        "the savers `torch.save`, DCP's `save` and `async_save`, `safetensors.torch.save_file` "
        "(the last three once the trainer imports their module)",
        "rank/files.py",
        REPLACED,
        "a thread-local depth check; after the outermost call returns, the path named (`open`: "
        "a look at the mode first; a write: `os.path.realpath`) and, inside the run's folders "
        'only, a file event written to the signature at once. With interrupt="crash" the '
        "crash point is asked before each call",
        ALWAYS,
        (
            "builtins.open",
            "io.open",
            "os.replace",
            "os.rename",
            "os.link",
            "os.symlink",
            "os.unlink",
            "os.remove",
            "os.rmdir",
            "os.fsync",
            "shutil.rmtree",
            "torch.save",
            "torch.distributed.checkpoint.save",
            "torch.distributed.checkpoint.async_save",
            "safetensors.torch.save_file",
        ),
    ),
    Patch(
        "global optimizer step hooks (`register_optimizer_step_pre_hook`, "
        "`register_optimizer_step_post_hook`): a step is an optimizer step",
        "rank/auto.py",
        TORCH_HOOK,
        "each optimizer step: two Python calls and the step counting; a completed step is "
        "written as a line of the signature",
        AUTO_SWITCH,
    ),
    Patch(
        "global module forward hooks (`register_module_forward_pre_hook`, "
        "`register_module_forward_hook` with keyword arguments, always called): what the model "
        "was given",
        "rank/auto.py",
        TORCH_HOOK,
        "every call of every module: torch's hook path and two Python calls; the outermost "
        "training forward: a fingerprint per sample of its inputs, reduced on the device (no "
        "copy of the rows to the host)",
        AUTO_SWITCH,
    ),
    Patch(
        "`torch.nn.Module.__call__`, on torch 2.4 only (its global forward hooks get no keyword "
        "arguments): each call's keyword arguments, for the forward hook above",
        "rank/torch_compat.py",
        REPLACED,
        "every call of every module: one more Python call, and a push and a pop on a "
        "thread-local list",
        AUTO_SWITCH,
        ("torch.nn.modules.module.Module.__call__",),
    ),
    Patch(
        "`torch.Tensor.backward` and `torch.autograd.backward`: the loss of each micro-batch",
        "rank/auto.py",
        REPLACED,
        "a thread-local depth check; after the outermost call: the loss tensor kept (read with "
        "the step's other device values in one transfer)",
        AUTO_SWITCH,
        ("torch.Tensor.backward", "torch.autograd.backward"),
    ),
    Patch(
        "`__init__` of `torch.optim.Optimizer`, the LR schedulers and `torch.amp.GradScaler`, "
        "and `torch.nn.Module.load_state_dict` (over the restore log's wrapper): the objects "
        "automatic recording audits",
        "rank/auto.py",
        REPLACED,
        "a thread-local depth check; after the outermost call: the object remembered",
        AUTO_SWITCH,
        ("*.__init__", "*.load_state_dict"),
    ),
    Patch(
        "`torch.amp.GradScaler.step`: a step the scaler skipped (inf/NaN gradients) is "
        "recorded as skipped",
        "rank/auto.py",
        REPLACED,
        "each call: one counter compared before and after",
        AUTO_SWITCH,
        ("torch.amp.grad_scaler.GradScaler.step",),
    ),
    Patch(
        "`torch.utils.data.dataloader._BaseDataLoaderIter.__next__`: the batch each loader "
        "yielded, the samples before the trainer's loop changes them",
        "rank/loaded.py",
        REPLACED,
        "each batch: a reference kept until the next training forward takes it (no copy)",
        AUTO_SWITCH,
        ("torch.utils.data.dataloader._BaseDataLoaderIter.__next__",),
    ),
    Patch(
        "`torch.nn.functional`'s dropouts (`dropout`, `dropout1d/2d/3d`, `alpha_dropout`, "
        "`feature_alpha_dropout`) and `scaled_dot_product_attention`'s `dropout_p`, in an "
        "`@equivalent` test's launches only: counted, and made an identity with "
        'dropout="off" (the default)',
        "rank/sketch.py",
        REPLACED,
        "each call: one Python call; with dropout off, none of the mask's work",
        EQUIVALENCE_ONLY,
        ("torch.nn.functional.*dropout*", "torch.nn.functional.scaled_dot_product_attention"),
    ),
    Patch(
        "the gradient sketch, in an `@equivalent` test's launches only: the squared norm of "
        "the rank's gradients before and after each `backward()` and at the step's first "
        "optimizer step, and each training forward's token count",
        "rank/sketch.py",
        "through rank/auto.py's hooks",
        "each backward: two passes over the gradients (one float64 sum each, left on the "
        "device); each optimizer step: one more",
        EQUIVALENCE_ONLY,
    ),
    Patch(
        "a global module forward pre-hook (`register_module_forward_pre_hook`): the first "
        "training forward after a split or a load is the resume point",
        "rank/resume_point.py",
        TORCH_HOOK,
        "every call of every module: torch's hook path instead of its fast path, and one Python "
        "call; once per split: the resume point's snapshot (every audited section)",
        ALWAYS,
    ),
    Patch(
        "`torch.distributed.init_process_group`, in a rank whose torch is imported at its "
        "start (a forked rank), marked before and after for the phase table",
        "rank/timings.py",
        REPLACED,
        "each call: two appended lines in the timings file",
        TIMINGS_ONLY,
        ("torch.distributed.init_process_group",),
    ),
    Patch(
        "an `atexit` handler: the signature's footer is written when the process exits",
        "rank/context.py",
        "process",
        "none until exit",
        ALWAYS,
    ),
    Patch(
        "a `TorchDispatchMode`, entered only inside the draw trace's window: from the resume's "
        "first restore (or a split's step) to the first forward",
        "rank/trace.py",
        "dispatch mode",
        "inside the window only: every torch op goes through the mode (a Python call); an op "
        "that draws random numbers is logged with its user frame",
        ALWAYS,
    ),
    Patch(
        "the module functions of Python's and numpy's global generators (`random.random`, "
        "`numpy.random.rand`, ...), only inside the draw trace's window",
        "rank/trace.py",
        REPLACED,
        "inside the window only: each call is logged with its user frame",
        ALWAYS,
        ("random.*", "numpy.random.*"),
    ),
)
"""Every change a rank makes to its process, in the order a rank makes them (the draw trace's
window opens later, while the training runs)."""
