"""Automatic recording: the training itself, seen from inside the rank, with no call in the
trainer.

A step is an optimizer step, counted by torch's global optimizer step hooks. An iteration is
told apart by what happens between optimizer steps: the optimizer steps with no forward (of
an outermost module in training mode, autograd on) and no `backward()` between them make one
step (a trainer that steps two optimizers one after the other, or one optimizer per
parameter group, records one step); a forward or a backward after a step starts the next
one. An optimizer that steps again with nothing between starts a new step too. A step that
the trainer skipped (a `GradScaler` found inf/NaN gradients, so `optimizer.step` did not
run) counts as a step and is recorded as skipped, so the steps after it keep their numbers.
The step that DCP's `get_state_dict` / `set_state_dict` take to build a fresh optimizer's
state (zero gradients, learning rates 0: `INIT_STATE_CALLERS`) is no step.

Recorded per step (written when the next iteration begins, or at the end of the run):
`loss`, the value of every tensor `backward()` was called on since the last step
(`Tensor.backward` and `torch.autograd.backward`, one per micro-batch); `data`, an id per
sample given to the outermost module's forward in training mode with autograd on (a module
with parameters: a loss module is not the model; a forward under no_grad trains nothing): a
hash of its row (dim 0) of every batched input tensor, with the other inputs whole, reduced
on the device without a copy of the rows to the host. Ids per sample, not per micro-batch,
so the global batch is accounted on any number of ranks (compare/accounting.py); `batch`,
the same ids of the batch a DataLoader yielded for each micro-batch (rank/loaded.py: the
samples, where the inputs are the samples changed in the loop, noised or augmented);
`skipped` when no optimizer step ran. Every optimizer, LR scheduler and `GradScaler` built
and the outermost trained modules are found here and audited as the watched objects are
(rank/watch.py), under the names `Found.named` gives.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import torch_compat
from .inputs import batch_parts, forward_inputs, scalar_value
from .loaded import LoaderTap
from .patches import Patches
from .sketch import Sketch
from .wrapping import Wrapper

Emit = Callable[["Step"], None]
"""Called with each step once it is complete (the rank state writes its line)."""


@dataclass
class Step:
    """One optimizer step, gathered until the next iteration begins."""

    number: int
    """1 for the first step this process took."""
    losses: list[Any] = field(default_factory=list)
    inputs: list[list[tuple[str, Any]]] = field(default_factory=list)
    """Per micro-batch, what its samples are told by (`batch_parts`)."""
    batches: list[list[tuple[str, Any]]] = field(default_factory=list)
    """Per micro-batch, the batch a DataLoader yielded for it, told the same way
    (rank/loaded.py): the samples, before the trainer changed them."""
    optimizers: list[int] = field(default_factory=list)
    """ids of the optimizers that stepped (or were skipped) in it."""
    notes: dict[str, list[Any]] = field(default_factory=dict)
    """What an equivalence launch's sketch filed under the step (rank/sketch.py), by key."""
    ran: bool = False
    """At least one `optimizer.step` ran (False: every one was skipped)."""

    @property
    def skipped(self) -> bool:
        return not self.ran


class StepCounter:
    """Which optimizer steps make one step, and what was seen since the last one (the
    counting alone: no torch, so it is tested as it is)."""

    def __init__(self) -> None:
        self.count = 0
        self.pending: Optional[Step] = None
        """The step taken and not yet written (its iteration may step more optimizers)."""
        self.losses: list[Any] = []
        self.inputs: list[list[tuple[str, Any]]] = []
        """What the iteration under way has seen so far (it goes into its step)."""
        self.batches: list[list[tuple[str, Any]]] = []
        self.notes: dict[str, list[Any]] = {}
        self.ran = 0
        """Optimizer steps that ran, ever (a `GradScaler.step` that adds none skipped)."""

    def stepped(self, optimizer: Any, ran: bool = True) -> Optional[Step]:
        """An optimizer stepped (or `ran=False`: its step was skipped). Returns the step
        this one completes, if it starts a new one (the same optimizer again)."""
        done = None
        if self.pending is not None and id(optimizer) in self.pending.optimizers:
            done = self.boundary()
        if self.pending is None:
            self.count += 1
            self.pending = Step(self.count, self.losses, self.inputs, self.batches)
            self.pending.notes, self.notes = self.notes, {}
            self.losses, self.inputs, self.batches = [], [], []
        self.pending.optimizers.append(id(optimizer))
        if ran:
            self.pending.ran = True
            self.ran += 1
        return done

    def boundary(self) -> Optional[Step]:
        """A forward or a backward: the step taken before it (if any) is complete."""
        done, self.pending = self.pending, None
        return done

    def take_seen(self) -> Step:
        """What the iteration under way has seen so far, taken (an explicit `record` holds
        everything seen since the last one, in a trainer with no torch optimizer too)."""
        seen = Step(0, self.losses, self.inputs, self.batches, notes=self.notes)
        self.losses, self.inputs, self.batches, self.notes = [], [], [], {}
        return seen

    def loss(self, value: Any) -> None:
        self.losses.append(value)

    def batch(self, inputs: list[tuple[str, Any]]) -> None:
        self.inputs.append(inputs)

    def loaded(self, batch: list[tuple[str, Any]]) -> None:
        self.batches.append(batch)

    def note(self, key: str, value: Any) -> None:
        """A value of the iteration under way (an equivalence launch's sketch)."""
        self.notes.setdefault(key, []).append(value)


class Found:
    """The objects the process trains with, found as they are used: optimizers and LR
    schedulers and GradScalers (when built: a resumed run's snapshot at its first forward
    sees them), outermost trained modules (at their first forward in training mode). Named by kind and order, the same in every run of the same
    trainer. Held until the run ends: the last step is written when the user's code has
    returned, and its objects are gone by then."""

    KINDS = ("model", "optimizer", "lr_scheduler", "grad_scaler")

    def __init__(self) -> None:
        self.objects: dict[str, list[Any]] = {kind: [] for kind in self.KINDS}

    def add(self, kind: str, obj: Any) -> None:
        held = self.objects[kind]
        if not any(x is obj for x in held):
            held.append(obj)

    def of(self, kind: str) -> list[Any]:
        return list(self.objects[kind])

    def named(self) -> dict[str, Any]:
        """`{"model": ..., "optimizer": ..., "optimizer2": ..., "lr_scheduler": ...,
        "grad_scaler": ...}`."""
        out: dict[str, Any] = {}
        for kind in self.KINDS:
            for i, obj in enumerate(self.of(kind)):
                out[kind if i == 0 else f"{kind}{i + 1}"] = obj
        return out


INIT_STATE_CALLERS = {("_init_optim_state", "state_dict.py")}
"""Functions that step an optimizer to build its state, not to train: DCP's
`get_state_dict` / `set_state_dict` call `_init_optim_state`
(torch/distributed/checkpoint/state_dict.py), a `step()` with zero gradients and the learning
rates set to 0 on an optimizer that has no state yet (a resumed run before its load)."""


def _initialising_state() -> bool:
    """The optimizer step under way is one of `INIT_STATE_CALLERS`' (its hooks run in
    `Optimizer.step`'s wrapper, called by the function a few frames up)."""
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return False
        code = frame.f_code
        if (code.co_name, code.co_filename.rsplit("/", 1)[-1]) in INIT_STATE_CALLERS:
            return True
        frame = frame.f_back
    return False


def _has_parameters(module: Any) -> bool:
    return next(iter(module.parameters()), None) is not None


class AutoRecorder:
    """The hooks that feed a `StepCounter` and `Found`, and hand each complete step to
    `emit`. Installed by the rank state when automatic recording is on."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        self.counter = StepCounter()
        self.found = Found()
        self.depth = 0
        """Module forwards under way (0: the next forward is an outermost one)."""
        self.handles: list[Any] = []
        self.calls = Wrapper(__name__)
        self.patches = Patches(__name__)
        """`GradScaler.step`: it compares the optimizer steps taken before and after the call,
        which a `Wrapper` (a report after the outermost call) does not."""
        self.loader = LoaderTap()
        self.first_step_seen: Optional[Callable[[], None]] = None
        """Called once, before the first optimizer step of the process (a resumed run reads
        the counters its load restored there)."""
        self.loaded_modules: list[Any] = []
        """Modules whose `load_state_dict` ran (a resumed run's model, before its first
        forward: `adopt_loaded`)."""
        self.sketch: Optional[Sketch] = None
        """An equivalence launch's gradient sketch, token counts and dropout (set before
        `install`)."""
        self.taken: Optional[Callable[[int], None]] = None
        """Called with a step's number when its first optimizer step ran (or was skipped):
        what the process does from here on (a save) comes after that step."""

    # -- what the hooks report ------------------------------------------------------------

    def step_taken(self, optimizer: Any, ran: bool = True) -> None:
        self.found.add("optimizer", optimizer)
        before = self.counter.pending
        self._emit(self.counter.stepped(optimizer, ran))
        pending = self.counter.pending
        if pending is not None and pending is not before and self.taken is not None:
            self.taken(pending.number)

    def boundary(self) -> None:
        self._emit(self.counter.boundary())

    def flush(self) -> Optional[Step]:
        """The step taken and not yet written (the run ended, or an explicit record)."""
        return self.counter.boundary()

    def _emit(self, step: Optional[Step]) -> None:
        if step is not None:
            self.emit(step)

    # -- hooks ----------------------------------------------------------------------------

    def _pre_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if _initialising_state():
            return
        self.found.add("optimizer", opt)
        if self.sketch is not None and self.counter.pending is None:
            self.sketch.before_step()  # the step's first optimizer: the stepped gradient
        if self.first_step_seen is not None:
            first, self.first_step_seen = self.first_step_seen, None
            first()

    def _post_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if not _initialising_state():
            self.step_taken(opt)

    def _pre_forward(self, module: Any, args: Any) -> None:
        grad = sys.modules["torch"].is_grad_enabled()
        self.depth += 1
        # a forward under no_grad (a loss logged, a teacher) trains nothing: no step begins
        # there and its inputs are no training data, in training mode too
        if self.depth == 1 and module.training and grad:
            self.boundary()
            if _has_parameters(module):  # found before the resume point's snapshot
                self.found.add("model", module)
        elif self.depth == 1 and grad and self._optimized(module):
            # trained in eval mode (left there after a validation pass): its modes are what
            # the audit must show; its inputs stay out of the data (an evaluation)
            self.found.add("model", module)

    def _post_forward(self, module: Any, args: Any, *rest: Any) -> None:
        """The inputs are read here, where the global hook sees keyword arguments too. A
        forward that raised calls this always-called hook as (module, args, None), without
        its keyword arguments: the depth unwinds, nothing is recorded, and the trainer's own
        exception goes on untouched."""
        self.depth = max(0, self.depth - 1)
        if len(rest) != 2 or self.depth != 0 or not module.training:
            return
        if not (sys.modules["torch"].is_grad_enabled() and _has_parameters(module)):
            return
        given = forward_inputs(args, rest[0])
        if given:
            self.counter.batch(batch_parts(given))
            if self.sketch is not None:
                self.sketch.forward(given)
        loaded = self.loader.take()
        if loaded:
            self.counter.loaded(batch_parts(loaded))

    def install(self) -> None:
        """Hook optimizer steps, module forwards, backward calls, GradScaler steps and LR
        scheduler construction (torch must be imported)."""
        import torch
        import torch.optim.lr_scheduler as lr_scheduler
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        self.handles = [
            optim.register_optimizer_step_pre_hook(self._pre_step),
            optim.register_optimizer_step_post_hook(self._post_step),
            nn_module.register_module_forward_pre_hook(self._pre_forward),
            torch_compat.register_module_forward_hook_with_kwargs(
                self._post_forward, always_call=True
            ),
        ]

        def backward_called(tensors: Any, *rest: Any, **kwargs: Any) -> None:
            self.boundary()
            for tensor in tensors if isinstance(tensors, (list, tuple)) else [tensors]:
                if isinstance(tensor, torch.Tensor):
                    self.counter.loss(scalar_value(tensor))
            if self.sketch is not None:
                self.sketch.after_backward()

        # reported once the outermost backward returned (Tensor.backward calls autograd's)
        before = self.sketch.before_backward if self.sketch is not None else None
        self.calls.wrap(torch.Tensor, "backward", backward_called, before=before)
        self.calls.wrap(torch.autograd, "backward", backward_called, before=before)

        amp = getattr(torch, "amp", None)
        if amp is not None and hasattr(amp, "GradScaler"):
            self._wrap_scaler(amp.GradScaler)
        scheduler = getattr(lr_scheduler, "LRScheduler", None) or lr_scheduler._LRScheduler
        for base in {scheduler, lr_scheduler.ReduceLROnPlateau}:
            self.calls.wrap(
                base, "__init__", lambda obj, *a, **k: self.found.add("lr_scheduler", obj)
            )
        self.calls.wrap(
            nn_module.Module,
            "load_state_dict",
            lambda module, *a, **k: self.loaded_modules.append(module),
        )
        # every optimizer built, in the order built: a resumed run's snapshot at its first
        # forward sees them before they step
        self.calls.wrap(
            torch.optim.Optimizer, "__init__", lambda obj, *a, **k: self.found.add("optimizer", obj)
        )
        self.loader.install()

    def adopt_loaded(self) -> None:
        """The modules loaded so far that an optimizer updates are the model, found before
        its first forward: a resumed run's snapshot at `resume_point()`, called before the
        step's forward, audits it as the uninterrupted run's does (an EMA, loaded too, is
        no optimizer's)."""
        for module in self.loaded_modules:
            if _has_parameters(module) and self._optimized(module):
                self.found.add("model", module)
        self.loaded_modules = []

    def _optimized(self, module: Any) -> bool:
        """Whether an optimizer built so far updates `module`'s first parameter (a module
        found already is not looked up again)."""
        if any(m is module for m in self.found.of("model")):
            return False
        first = next(iter(module.parameters()), None)
        return first is not None and any(
            p is first
            for opt in self.found.of("optimizer")
            for group in opt.param_groups
            for p in group["params"]
        )

    def _wrap_scaler(self, scaler_class: type) -> None:
        """`GradScaler.step(optimizer)` that did not step the optimizer: a skipped step. A
        scaler is found when built (its dynamic scale is state a checkpoint must carry)."""
        original = scaler_class.step
        counter = self.counter
        self.calls.wrap(
            scaler_class, "__init__", lambda obj, *a, **k: self.found.add("grad_scaler", obj)
        )

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = counter.ran
            result = original(scaler, optimizer, *args, **kwargs)
            if counter.ran == before:
                self.step_taken(optimizer, ran=False)
            return result

        self.patches.replace(scaler_class, "step", step)

    def uninstall(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self.calls.unwrap()
        self.patches.restore()
        self.loader.uninstall()
        if self.sketch is not None:
            self.sketch.uninstall()


def counters(found: Found, before_step: bool = False) -> dict[str, int]:
    """The step counters of the objects found: each optimizer's `step` (the largest of its
    parameters' state, 0 before its first step) and each scheduler's `last_epoch`. In a
    resumed launch, read before the first step, they say which step the checkpoint is of.
    `before_step`: the optimizers too may not have been seen stepping yet (read every one
    the process holds through the schedulers built on them)."""
    out: dict[str, int] = {}
    named = found.named()
    optimizers = {id(o): o for n, o in named.items() if n.startswith("optimizer")}
    if before_step:
        for scheduler in found.of("lr_scheduler"):
            opt = getattr(scheduler, "optimizer", None)
            if opt is not None and id(opt) not in optimizers:
                optimizers[id(opt)] = opt
    names = {id(o): n for n, o in named.items()}
    for i, opt in enumerate(optimizers.values()):
        name = names.get(id(opt), f"optimizer{i + 1}" if i else "optimizer")
        step = _optimizer_step(opt)
        if step is not None:
            out[name] = step
    for name, obj in named.items():
        if name.startswith("lr_scheduler"):
            epoch = getattr(obj, "last_epoch", None)
            if isinstance(epoch, int) and not isinstance(epoch, bool):
                out[name] = epoch
    return out


def _optimizer_step(optimizer: Any) -> Optional[int]:
    """An optimizer's step counter: its first parameter's `step` state (Adam, AdamW, ...);
    None for an optimizer that keeps none (plain SGD)."""
    for group in getattr(optimizer, "param_groups", []):
        for param in group.get("params", []):
            value = optimizer.state.get(param, {}).get("step")
            if value is None:
                return 0 if not optimizer.state else None
            try:
                return int(float(value))
            except (TypeError, ValueError):
                return None
    return None
