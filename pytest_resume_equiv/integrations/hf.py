"""Hugging Face `Trainer` adapter: `ResumeEquivCallback` records what the Trainer logs at
every optimizer step. Optional: without it every rank records the loss, the inputs, the
model, optimizer and scheduler by itself (docs/guides/hf-trainer.md); it adds the logged
values and the objects given as keywords.

    from pytest_resume_equiv.integrations.hf import ResumeEquivCallback

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[ResumeEquivCallback()])
    trainer.train(resume_from_checkpoint=ctx.checkpoint if ctx and ctx.resuming else None)

At every optimizer step it records `loss`, `lr` and `grad_norm` (the values the Trainer
logs) and fingerprints the model, the optimizer and the LR scheduler. In a test run it asks
the Trainer to log every step, since a step that is not logged has no loss to compare; the
user's `logging_steps` is left alone outside a test run, where the callback does nothing.
"""

from __future__ import annotations

from typing import Any, Optional

from .. import context, record, watch
from . import unwrap

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "pytest_resume_equiv.integrations.hf needs transformers: "
        "pip install 'pytest-resume-equiv[hf]'"
    ) from exc

LOGGED = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm"}
"""Trainer log key -> recorded key (the same names as the Lightning adapter)."""


class ResumeEquivCallback(TrainerCallback):
    """Record each optimizer step of a `Trainer` run (a no-op outside a test run).

    `watch_extra` objects (an EMA model, a noise scheduler, a `torch.Generator` holder...)
    are fingerprinted alongside the model, the optimizer and the scheduler.
    """

    def __init__(self, **watch_extra: Any) -> None:
        self.watch_extra = watch_extra
        self.last_step: Optional[int] = None

    def on_train_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: Any = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        **kwargs: Any,
    ) -> None:
        if context() is None:
            return
        watch(
            model=model,
            optimizer=unwrap(optimizer, "optimizer"),
            scheduler=unwrap(lr_scheduler, "scheduler"),
            **self.watch_extra,
        )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if context() is not None:
            control.should_log = True  # the step's loss reaches on_log only when it is logged

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if context() is None or not logs or "loss" not in logs:
            return  # evaluation logs and the end-of-training summary have no "loss"
        if state.global_step == self.last_step:
            return
        self.last_step = state.global_step
        record(state.global_step, **{LOGGED[k]: logs[k] for k in LOGGED if k in logs})
