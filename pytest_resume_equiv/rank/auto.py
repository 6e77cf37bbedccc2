"""Automatic recording: the training itself, seen from inside the rank, with no call in the
trainer.

A step is an optimizer step, counted by torch's global optimizer step hooks. An iteration
is told apart by what happens between optimizer steps: the optimizer steps with no forward
(of an outermost module in training mode) and no `backward()` between them make one step (a trainer
that steps two optimizers one after the other, or one optimizer per parameter group, records
one step); a forward or a backward after a step starts the next one. An optimizer that steps
again with nothing between starts a new step too. A step that the trainer skipped (a
`GradScaler` found inf/NaN gradients, so `optimizer.step` did not run) counts as a step and
is recorded as skipped, so the steps after it keep their numbers.

Recorded per step (written when the next iteration begins, or at the end of the run):
`loss`, the value of every tensor `backward()` was called on since the last step
(`Tensor.backward` and `torch.autograd.backward`, one per micro-batch); `data`, an id per
sample given to the outermost module's forward in training mode (a module with parameters: a
loss module is not the model): a hash of its row (dim 0) of every batched input tensor, with
the other inputs whole, reduced on the device without a copy of the rows to the host. Ids per
sample, not per micro-batch, so the global batch is accounted on any number of ranks
(compare/accounting.py); `skipped` when no optimizer step ran. Every optimizer and LR
scheduler built and the outermost trained modules are found here and audited as the watched
objects are (rank/watch.py), under the names `Found.named` gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .fingerprint import Later, deferred, one_transfer
from .inputs import batch_parts, loss_value, sample_ids, tensors_in
from .wrapping import Wrapper

Write = Callable[[int, Mapping[str, Any], dict[str, Any], bool], None]
"""Writes one step line: its number, the trainer's values, the automatic values, and whether
automatic recording wrote it with no `record` call (the rank state's `write_step`)."""


@dataclass
class Step:
    """One optimizer step, gathered until the next iteration begins."""

    number: int
    """1 for the first step this process took."""
    losses: list[Any] = field(default_factory=list)
    inputs: list[list[tuple[str, Any]]] = field(default_factory=list)
    """Per micro-batch, what its samples are told by (`batch_parts`)."""
    optimizers: list[int] = field(default_factory=list)
    """ids of the optimizers that stepped (or were skipped) in it."""
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
            self.pending = Step(self.count, self.losses, self.inputs)
            self.losses, self.inputs = [], []
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
        seen = Step(0, self.losses, self.inputs)
        self.losses, self.inputs = [], []
        return seen

    def loss(self, value: Any) -> None:
        self.losses.append(value)

    def batch(self, inputs: list[tuple[str, Any]]) -> None:
        self.inputs.append(inputs)


class Found:
    """The objects the process trains with, found as they are used: optimizers (at their
    first step), LR schedulers (when built), outermost trained modules (at their first
    forward in training mode). Named by kind and order, the same in every run of the same
    trainer. Held until the run ends: the last step is written when the user's code has
    returned, and its objects are gone by then."""

    KINDS = ("model", "optimizer", "lr_scheduler")

    def __init__(self) -> None:
        self.objects: dict[str, list[Any]] = {kind: [] for kind in self.KINDS}

    def add(self, kind: str, obj: Any) -> None:
        held = self.objects[kind]
        if not any(x is obj for x in held):
            held.append(obj)

    def of(self, kind: str) -> list[Any]:
        return list(self.objects[kind])

    def named(self) -> dict[str, Any]:
        """`{"model": ..., "optimizer": ..., "optimizer2": ..., "lr_scheduler": ...}`."""
        out: dict[str, Any] = {}
        for kind in self.KINDS:
            for i, obj in enumerate(self.of(kind)):
                out[kind if i == 0 else f"{kind}{i + 1}"] = obj
        return out


def _has_parameters(module: Any) -> bool:
    return next(iter(module.parameters()), None) is not None


class AutoRecorder:
    """The hooks that feed a `StepCounter` and `Found`, and the step lines they make: each
    complete step is written (`write`), numbered from `first - 1` on, unless the trainer
    numbers the steps itself (`record`), whose lines then carry the automatic values.
    Installed by the rank state when automatic recording is on."""

    def __init__(self, write: Write, label: Callable[[int], None], offset: int = 0) -> None:
        self.write = write
        self.label = label
        """Told the number of each step as it is taken: the restore and file logs label
        what follows with it (a save right after `optimizer.step()` is of that step, though
        its line is written only when the next iteration begins)."""
        self.offset = offset
        """Added to the count (a resumed launch's first step is `split + 1`)."""
        self.explicit = False
        """The trainer called `record`: it numbers the steps, automatic values go beside."""
        self.carried: list[Step] = []
        """Steps taken since the trainer's last `record` (their values go in its next)."""
        self.loaded: Optional[Callable[[dict[str, int]], None]] = None
        """Called once with the step counters, before the first optimizer step (a resumed
        launch: they say which step the load restored)."""
        self.counter = StepCounter()
        self.found = Found()
        self.depth = 0
        """Module forwards under way (0: the next forward is an outermost one)."""
        self.handles: list[Any] = []
        self.calls = Wrapper()
        self.scaler_calls = Wrapper()
        self.not_training = Wrapper()
        """Library calls that step an optimizer to build its state, not to train (DCP's
        `_init_optim_state`, with zero gradients and a zero learning rate, from
        `get_state_dict` / `set_state_dict` in a process whose optimizer has no state yet:
        a resumed one). Steps inside them are no steps."""

    # -- what the hooks report ------------------------------------------------------------

    def step_taken(self, optimizer: Any, ran: bool = True) -> None:
        self.found.add("optimizer", optimizer)
        before = self.counter.pending
        self._complete(self.counter.stepped(optimizer, ran))
        taken = self.counter.pending
        if taken is not before and taken is not None and not self.explicit:
            self.label(taken.number + self.offset)

    def boundary(self) -> None:
        self._complete(self.counter.boundary())

    def _complete(self, step: Optional[Step]) -> None:
        """A step is complete: its own line, or carried into the trainer's next `record`."""
        if step is None:
            return
        if self.explicit:
            self.carried.append(step)
        else:
            self.write(step.number + self.offset, {}, self.values([step]), True)

    def finish(self) -> None:
        """The user's code returned: the step taken and not yet written is."""
        last = self.counter.boundary()
        if last is not None and not self.explicit:
            self._complete(last)

    def record_values(self) -> dict[str, Any]:
        """The trainer's `record`: from now on it numbers the steps; its line holds the
        automatic values of the steps since its last call and of what the iteration under
        way has seen so far."""
        self.explicit = True
        steps, self.carried = self.carried, []
        pending = self.counter.boundary()
        steps += [pending] if pending is not None else []
        steps.append(self.counter.take_seen())
        return self.values(steps)

    def values(self, steps: list[Step]) -> dict[str, Any]:
        """The `auto` section of a step line made of `steps` (several when the trainer's
        `record` comes less often than its optimizer steps)."""
        with one_transfer() as batch:  # the losses and inputs left on a device: one copy
            held = batch.resolve(
                {
                    "loss": [_deferred(v) for s in steps for v in s.losses],
                    "data": [
                        [(w, _deferred(f)) for w, f in inputs] for s in steps for inputs in s.inputs
                    ],
                }
            )
        out: dict[str, Any] = {}
        if held["loss"]:
            out["loss"] = held["loss"]
        if held["data"]:
            out["data"] = [i for parts in held["data"] for i in sample_ids(parts)]
        taken = [s for s in steps if s.optimizers]  # not what a record took before a step
        if taken and all(s.skipped for s in taken):
            out["skipped"] = True
        return out

    # -- hooks ----------------------------------------------------------------------------

    def install(self) -> None:
        """Hook optimizer steps, module forwards, backward calls, GradScaler steps and LR
        scheduler construction (torch must be imported)."""
        import torch
        import torch.optim.lr_scheduler as lr_scheduler
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        def pre_step(opt: Any, args: Any, kwargs: Any) -> None:
            self.found.add("optimizer", opt)
            if self.not_training.nested:
                return
            if self.loaded is not None:
                loaded, self.loaded = self.loaded, None
                loaded(counters(self.found, before_step=True))

        def post_step(opt: Any, args: Any, kwargs: Any) -> None:
            if not self.not_training.nested:
                self.step_taken(opt)

        def pre_forward(module: Any, args: Any) -> None:
            self.depth += 1
            if self.depth == 1 and module.training:
                self.boundary()
                if _has_parameters(module):  # found before the resume point's snapshot
                    self.found.add("model", module)

        def post_forward(module: Any, args: Any, kwargs: Any, output: Any) -> None:
            # the inputs are read here, where the global hook sees keyword arguments too
            self.depth = max(0, self.depth - 1)
            if self.depth == 0 and module.training and _has_parameters(module):
                given = [*tensors_in(args), *tensors_in(kwargs, "kw")]
                if given:
                    self.counter.batch(batch_parts(given))

        self.handles = [
            optim.register_optimizer_step_pre_hook(pre_step),
            optim.register_optimizer_step_post_hook(post_step),
            nn_module.register_module_forward_pre_hook(pre_forward),
            nn_module.register_module_forward_hook(
                post_forward, with_kwargs=True, always_call=True
            ),
        ]

        def backward_called(tensors: Any, *rest: Any, **kwargs: Any) -> None:
            self.boundary()
            for tensor in tensors if isinstance(tensors, (list, tuple)) else [tensors]:
                if isinstance(tensor, torch.Tensor):
                    self.counter.loss(loss_value(tensor))

        # reported once the outermost backward returned (Tensor.backward calls autograd's)
        self.calls.wrap(torch.Tensor, "backward", backward_called)
        self.calls.wrap(torch.autograd, "backward", backward_called)

        amp = getattr(torch, "amp", None)
        if amp is not None and hasattr(amp, "GradScaler"):
            self._wrap_scaler(amp.GradScaler)
        scheduler = getattr(lr_scheduler, "LRScheduler", None) or lr_scheduler._LRScheduler
        for base in {scheduler, lr_scheduler.ReduceLROnPlateau}:
            self.calls.wrap(
                base, "__init__", lambda obj, *a, **k: self.found.add("lr_scheduler", obj)
            )
        # every optimizer built, in the order built: a resumed run's snapshot at its first
        # forward sees them before they step
        self.calls.wrap(
            torch.optim.Optimizer, "__init__", lambda obj, *a, **k: self.found.add("optimizer", obj)
        )

    def install_dcp_state_dict(self, module: Any) -> None:
        """`torch.distributed.checkpoint.state_dict`, once imported: its optimizer state
        initialisation steps no step (`not_training`)."""
        self.not_training.wrap(module, "_init_optim_state", lambda *args, **kwargs: None)

    def _wrap_scaler(self, scaler_class: type) -> None:
        """`GradScaler.step(optimizer)` that did not step the optimizer: a skipped step."""
        original = scaler_class.step
        counter = self.counter

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = counter.ran
            result = original(scaler, optimizer, *args, **kwargs)
            if counter.ran == before:
                self.step_taken(optimizer, ran=False)
            return result

        step.__wrapped__ = original  # type: ignore[attr-defined]
        scaler_class.step = step  # type: ignore[method-assign]
        self.scaler_calls.wrapped[f"{id(scaler_class)}.step"] = (scaler_class, "step", original)

    def uninstall(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self.calls.unwrap()
        self.scaler_calls.unwrap()
        self.not_training.unwrap()


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


def _deferred(value: Any) -> Any:
    return deferred(value) if isinstance(value, Later) else value
