"""Lightning adapter: `ResumeEquivCallback` records every optimizer step of `Trainer.fit` in
Lightning's terms. Optional: without it every rank records the loss, the inputs, the module,
optimizers and schedulers by itself (docs/guides/lightning.md); it adds `loss` / `lr` /
`grad_norm` as Lightning sees them and the objects given as keywords.

    from pytest_resume_equiv.integrations.lightning import ResumeEquivCallback

    trainer = L.Trainer(max_steps=..., callbacks=[ResumeEquivCallback(), checkpointing])
    trainer.fit(module, ckpt_path=ctx.checkpoint if ctx and ctx.resuming else None)

At every optimizer step it records `loss` (what `training_step` returned), `lr` (of the
first optimizer's first group) and `grad_norm` (this rank's gradients just before the step),
and fingerprints the LightningModule, every optimizer and every LR scheduler. Works with
`lightning` (preferred) or the standalone `pytorch_lightning` package.
"""

from __future__ import annotations

from typing import Any, Optional

from .. import context, record, watch
from . import grad_norm, unwrap

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - exercised only with the standalone package
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError as exc:
        raise ImportError(
            "pytest_resume_equiv.integrations.lightning needs lightning: "
            "pip install 'pytest-resume-equiv[lightning]'"
        ) from exc


class ResumeEquivCallback(Callback):
    """Record each optimizer step of a Lightning fit (a no-op outside a test run).

    `watch_extra` objects (an EMA model, a noise scheduler...) are fingerprinted alongside
    the module, optimizers and schedulers.
    """

    def __init__(self, **watch_extra: Any) -> None:
        self.watch_extra = watch_extra
        self.last_step: Optional[int] = None
        self.grad_norm: Optional[float] = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if context() is None:
            return
        objects: dict[str, Any] = {"model": pl_module}
        for i, optimizer in enumerate(trainer.optimizers):
            objects["optimizer" if i == 0 else f"optimizer{i}"] = unwrap(optimizer, "_optimizer")
        for i, config in enumerate(trainer.lr_scheduler_configs):
            objects["scheduler" if i == 0 else f"scheduler{i}"] = config.scheduler
        watch(**objects, **self.watch_extra)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if context() is not None:
            self.grad_norm = grad_norm(pl_module.parameters())

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if context() is None or step == self.last_step or step == 0:
            return  # a gradient-accumulation micro-batch: no optimizer step yet
        self.last_step = step
        values: dict[str, Any] = {}
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            values["loss"] = float(loss)
        if trainer.optimizers:
            values["lr"] = trainer.optimizers[0].param_groups[0]["lr"]
        if self.grad_norm is not None:
            values["grad_norm"] = self.grad_norm
        record(step, **values)
