"""The causes of a difference between two configurations read from what is counted: the
schedulers' counters against the backwards and the ranks of a step, the samples of each rank
and of each run, the buffers of each rank (`Stage.CONFIGURATION`, with
diagnose/at_configurations.py)."""

from __future__ import annotations

from typing import Optional

from ..compare.configurations import ConfigurationFacts
from .classes import (
    DATA_ORDER_BY_CONFIGURATION,
    PER_RANK_BATCH_STATISTICS,
    SAME_DATA_ON_EVERY_RANK,
    SCHEDULER_COUNTER_ONLY,
    SCHEDULER_PER_MICRO_STEP,
    SCHEDULER_PER_RANK,
)
from .config_evidence import (
    STAGE,
    close,
    counted,
    first_step,
    learning_rates_differ,
    until_first,
)
from .rules import Finding, Rule


def _scheduler_ratio(facts: ConfigurationFacts, per_rank: bool) -> Optional[Finding]:
    """A scheduler's `last_epoch` at the first differing step is the other run's times the
    ratio of backwards per optimizer step (or, `per_rank`, of ranks), that ratio above 1 and
    not the other one, and a learning rate differs: the run that counts more steps it once
    per backward (per rank). A counter alone, with the learning rates equal, changes nothing
    the training computes."""
    step = first_step(facts)
    if not learning_rates_differ(facts):
        return None
    a, b = facts.baseline_steps.get(step), facts.variant_steps.get(step)
    if a is None or b is None or not a.ranks or not b.ranks:
        return None
    ra, rb = a.ranks[min(a.ranks)], b.ranks[min(b.ranks)]
    backwards = rb.backwards / max(ra.backwards, 1)
    ranks = len(b.ranks) / len(a.ranks)
    ratio, other = (ranks, backwards) if per_rank else (backwards, ranks)
    for name, epoch in rb.last_epochs.items():
        before = ra.last_epochs.get(name)
        if not isinstance(epoch, int) or not isinstance(before, int) or epoch == before:
            continue
        if not counted(facts, f"watch:{name}.last_epoch"):
            continue
        for role, (x, y), k, o in (
            ("variant", (epoch, before), ratio, other),
            ("baseline", (before, epoch), 1 / ratio if ratio else 0, 1 / other if other else 0),
        ):
            if k > 1 and y > 0 and close(x / y, k) and not close(k, o):
                evidence = {"role": role, "scheduler": name, "epochs": [x, y], "k": round(k)}
                evidence["per"] = "rank" if per_rank else "backward"
                return Finding(f"{role}, step {step}", evidence)
    return None


def scheduler_per_micro_step(facts: ConfigurationFacts) -> Optional[Finding]:
    """A scheduler's counter at the first differing step is the other run's times the ratio
    of backwards per optimizer step (k > 1, not the ratio of ranks): it steps once per
    backward."""
    return _scheduler_ratio(facts, per_rank=False)


def _scheduler_words(f: Finding) -> str:
    """Both scheduler rules' words: what it steps once per, read from the finding."""
    x, y = f["epochs"]
    if f["per"] == "rank":
        how = f"once per rank ({f['k']} times the other configuration's ranks)"
        where = " on more ranks"
    else:
        how, where = f"once per backward ({f['k']} per optimizer step)", ""
    return (
        f"{f['scheduler']} counted {x} steps where the other configuration counted {y}: it steps "
        f"{how}, so the learning-rate sequence runs {f['k']} times fast{where}"
    )


def scheduler_per_rank(facts: ConfigurationFacts) -> Optional[Finding]:
    """A scheduler's counter at the first differing step is the other run's times the ratio
    of ranks (W > 1, not the ratio of backwards per step): it steps once per rank (accelerate
    steps a prepared scheduler once per process unless `split_batches=True`)."""
    return _scheduler_ratio(facts, per_rank=True)


def same_data_on_every_rank(facts: ConfigurationFacts) -> Optional[Finding]:
    """Every rank of a run consumed the very same samples at a step: the global batch holds
    each of them once per rank, and the samples the other ranks should take never."""
    for role, step, g in until_first(facts):
        shares = [r.samples for _, r in sorted(g.ranks.items())]
        if len(shares) > 1 and shares[0] and all(s == shares[0] for s in shares):
            size = sum(shares[0].values())
            return Finding(f"{role}, step {step}", {"role": role, "ranks": len(shares), "n": size})
    return None


def _same_data_words(f: Finding) -> str:
    return (
        f"every one of the {f['ranks']} ranks consumed the same {f['n']} samples: the global "
        f"batch holds each of them {f['ranks']} times, and the samples the other ranks should "
        "take never"
    )


def counter_only(facts: ConfigurationFacts) -> Optional[Finding]:
    """Every quantity that differs is a scheduler's counter (`last_epoch`), the learning rates
    equal at every step compared: a schedule built for the steps it counts (HF's examples
    build accelerate's for `max_train_steps x num_processes`), which trains the same."""
    counters = [d for d in facts.differences if d.what.endswith(".last_epoch")]
    if not counters or len(counters) != len(facts.differences):
        return None
    first = counters[0]
    key = first.what
    evidence = {"key": key, "values": [first.baseline, first.variant], "step": first.step}
    return Finding(f"step {first.step}", evidence)


def _counter_only_words(f: Finding) -> str:
    a, b = f["values"]
    return (
        f"only {f['key']} differs (baseline {a}, variant {b}): the learning rates are equal at "
        "every step compared, so the schedule is built for the steps each configuration counts "
        "and trains the same; the counter would matter to a resume on another number of ranks"
    )


def other_samples(facts: ConfigurationFacts) -> Optional[Finding]:
    """The two runs consumed other samples at a step (a multiset over every rank and
    micro-batch, none repeated by every rank): the data order depends on the number of ranks
    or the batching, so the global batches differ."""
    steps = [d.step for d in facts.differences if d.what.startswith("samples consumed")]
    a, b = facts.baseline_steps, facts.variant_steps
    if not steps or steps[0] not in a or steps[0] not in b:
        return None
    if same_data_on_every_rank(facts) is not None:  # the other samples are the repeats'
        return None
    step = steps[0]
    only = sum((b[step].samples - a[step].samples).values())
    evidence = {"step": step, "n": only, "of": a[step].batch, "key": facts.samples_key}
    return Finding(f"step {step}", evidence)


def _other_samples_words(f: Finding) -> str:
    return (
        f"the variant's global batch holds {f['n']} of {f['of']} samples the baseline's does not "
        f"({f['key']}): the data order depends on the number of ranks or the batching"
    )


def per_rank_buffers(facts: ConfigurationFacts) -> Optional[Finding]:
    """A buffer differs between the ranks of a run after a step (the samples the ranks took
    differ): each rank keeps statistics of its own part of the batch (BatchNorm without
    SyncBatchNorm), where a data-parallel model's buffers are one."""
    for role, step, g in until_first(facts):
        if len(g.ranks) < 2:
            continue
        ranks = [r for _, r in sorted(g.ranks.items())]
        names = sorted(n for n in ranks[0].tensors if ".buffers[" in n)
        differ = [n for n in names if any(r.tensors.get(n) != ranks[0].tensors[n] for r in ranks)]
        if differ:
            return Finding(f"{role}, after step {step}", {"role": role, "buffers": differ[:3]})
    return None


def _buffers_words(f: Finding) -> str:
    return (
        f"the buffers {', '.join(f['buffers'])} differ between the ranks: each rank keeps "
        "statistics of its own part of the global batch (BatchNorm without SyncBatchNorm)"
    )


RULES: tuple[Rule[ConfigurationFacts], ...] = (
    Rule("configuration.same-data-on-every-rank", STAGE, SAME_DATA_ON_EVERY_RANK,
         same_data_on_every_rank, _same_data_words, after=("configuration.dropout-drawn",)),
    Rule("configuration.scheduler-per-micro-step", STAGE, SCHEDULER_PER_MICRO_STEP,
         scheduler_per_micro_step, _scheduler_words,
         after=("configuration.clipped-by-own-shards",)),
    Rule("configuration.scheduler-per-rank", STAGE, SCHEDULER_PER_RANK,
         scheduler_per_rank, _scheduler_words,
         after=("configuration.scheduler-per-micro-step",)),
    Rule("configuration.other-samples", STAGE, DATA_ORDER_BY_CONFIGURATION,
         other_samples, _other_samples_words, after=("configuration.same-data-on-every-rank",)),
    Rule("configuration.scheduler-counter-only", STAGE, SCHEDULER_COUNTER_ONLY,
         counter_only, _counter_only_words, after=("configuration.scheduler-per-rank",)),
    Rule("configuration.per-rank-buffers", STAGE, PER_RANK_BATCH_STATISTICS,
         per_rank_buffers, _buffers_words, after=("configuration.scheduler-counter-only",)),
)  # fmt: skip
