"""The signature's layout: its format and version, the kinds of its lines, and the sections
and keys a step line is read back as, with the helpers that build and split them.

Both sides import it, so the writer (a rank: rank/record.py, fed by rank/context.py) and the
reader (signature.py) cannot drift apart. Where the signature file lies in a run directory,
and every other file there, is `run_dir.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

SIGNATURE_FORMAT = "pytest-resume-equiv/signature"
SIGNATURE_VERSION = 2
"""2: restore-log, resume-point and ignored lines beside the steps (1: steps only)."""
READABLE_SIGNATURE_VERSIONS = (1, 2)

FLOAT_TAG = "$float"
TENSOR_TAG = "$tensor"

# The signature's lines. Every line after the header is one JSON object: a step line
# `{"step": N, "values": {...}, "<section>": {...}, ...}`, or `{"<kind>": payload}` for one
# of LINE_KINDS.

STEP = "step"
VALUES = "values"
"""A step line's own keys: the step number, and the user's recorded values."""
AUTOMATIC = "automatic"
"""A step line automatic recording wrote with no `record` call (`true`). A trainer that calls
`record` numbers the steps itself, which the rank learns only at its first call: the
automatic lines written before it (the first iteration's, when the trainer records after
another forward) are superseded by that call's line, and the reader moves their automatic
values into it."""
COUNTERS = "counters"
"""A step line's step counters with automatic recording (`{"optimizer": 4, "lr_scheduler":
4}`): not compared, read against a resumed launch's LOADED line."""

RESTORE = "restore"
"""A restore-log entry (`{"call", "what", "at", "after_step"}`), written before the next line."""
RESUME_POINT = "resume_point"
"""A resume-point snapshot: every capture section, the draws traced, the checkpoint's files."""
IGNORED = "ignored"
"""The audit keys the trainer left out on purpose (`track(..., ignore=True)`)."""
PREFLIGHT = "preflight"
"""The determinism knobs as the training set them (`rank/preflight.py`), at the first record."""
FILE_EVENT = "file_event"
"""A file the training wrote, renamed, linked or deleted (`rank/files.py`), written at once
(a rank killed in a save leaves the events before the kill)."""
LOADED = "loaded"
"""Automatic recording in a resumed launch: the step counters the load restored (optimizer
`step`, scheduler `last_epoch`), read before the first optimizer step (rank/auto.py)."""
END = "end"
"""The footer (`{"records": N}`): the rank finished recording and closed the file."""
LINE_KINDS = (END, RESTORE, RESUME_POINT, IGNORED, PREFLIGHT, FILE_EVENT, LOADED)
"""The lines that are not steps, each `{kind: payload}`."""


def line_kind(line: dict) -> str:
    """Which kind of line a parsed signature line is (STEP when it is none of LINE_KINDS)."""
    return next((kind for kind in LINE_KINDS if kind in line), STEP)


@dataclass(frozen=True)
class Section:
    """An automatic section of a step line, captured at every `record` (and in the resume-point
    snapshot) by the capture function registered under its name (`rank/context.py`, CAPTURES).
    The reader flattens it beside the user's values as keys `<name>:<entry>`; the user's keys
    are identifiers, so they cannot collide. A new section is one entry here plus its capture."""

    name: str
    holds: str
    fingerprints: bool = False
    """Its values are content fingerprints: compared bit for bit, or through the statistics
    beside them (norm, mean, largest magnitude) under a tolerance or a measured noise."""


RNG = "rng"
WATCH = "watch"
AUTO = "auto"
SECTIONS = (
    Section(
        RNG,
        "every random stream of the rank: `cpu`, `<device>:<index>`, `numpy`, `python`, and "
        "`generator <creation site> #k` (or the name given to `track`)",
    ),
    Section(
        WATCH,
        "the watched objects' fingerprints, as `<object>.<part>` (model.params, optimizer.lr)",
        fingerprints=True,
    ),
    Section(
        AUTO,
        "what automatic recording saw in the step (rank/auto.py): `loss` (one value per "
        "backward), `data` (an id per sample given to the model, from its content), `batch` (the same "
        "ids of the batches a DataLoader yielded), `skipped` (no optimizer step ran)",
    ),
)


def section_names() -> tuple[str, ...]:
    """The automatic sections' names, in the order they are captured and read back."""
    return tuple(section.name for section in SECTIONS)


def audit_key(section: str, name: str) -> str:
    """The key a section's entry is read back as (`rng` + `cpu` -> `rng:cpu`)."""
    return f"{section}:{name}"


def split_key(key: str) -> tuple[str, str]:
    """(section, entry) of an audit key; ("", key) for one of the user's keys."""
    section, colon, name = key.partition(":")
    return (section, name) if colon and section in section_names() else ("", key)


def section_of(key: str) -> str:
    """The section an audit key belongs to; "" for one of the user's keys."""
    return split_key(key)[0]


def is_audit_key(key: str) -> bool:
    """A key the in-rank audit added (`rng:...`, `watch:...`), not one the user recorded."""
    return section_of(key) != ""


def is_training_value(key: str) -> bool:
    """A value of the training itself: one the trainer recorded, or the loss and input data
    automatic recording saw (`auto:loss`, `auto:data`). What the teeth check compares: the
    state audit (random streams, fingerprints of watched objects) is not."""
    return section_of(key) in ("", AUTO)


def is_fingerprint_key(key: str) -> bool:
    """A key whose values are fingerprints (a tolerance applies to their statistics only)."""
    section = section_of(key)
    return any(s.name == section and s.fingerprints for s in SECTIONS)


# The watch section: entries `<object>.<part>`; parts never hold a dot, objects may.


def watched_name(obj: str, part: str) -> str:
    """A watch section's entry: `model` + `params` -> `model.params`."""
    return f"{obj}.{part}"


def watch_key(obj: str, part: str) -> str:
    """The key of one part of a watched object (`watch:model.params`)."""
    return audit_key(WATCH, watched_name(obj, part))


def watched_subject(obj: str) -> str:
    """How the audit names a watched object as a whole (`watch:model`): the restore log's
    target for it, and the diagnosis's subject."""
    return audit_key(WATCH, obj)


def watched(key: str) -> tuple[str, str]:
    """(object, part) of a watch key (`watch:model.params` -> model, params); ("", "") for any
    other key."""
    section, name = split_key(key)
    if section != WATCH:
        return "", ""
    obj, _, part = name.rpartition(".")
    return obj, part


def watched_part(key: str) -> str:
    """The part of a watch key (`params`); "" for any other key."""
    return watched(key)[1]


def subject_of(key: str) -> str:
    """What an audit key is about: a stream is its own subject, a watched part belongs to its
    object (`watch:model.params` -> `watch:model`)."""
    obj, _ = watched(key)
    return watched_subject(obj) if obj else key


# The rng section: entries are stream names.

DEVICE_KINDS = ("cuda", "npu", "xpu")
"""The accelerators whose streams the audit reads, one per local device (`cuda:0`)."""
ALL_DEVICES = "*"
"""The index of a restore-log target that stands for every device of a kind (`rng:cuda:*`)."""
GENERATOR = "generator"


def stream_key(stream: str) -> str:
    """The key of a random stream (`cpu` -> `rng:cpu`)."""
    return audit_key(RNG, stream)


def device_stream(kind: str, index: Any) -> str:
    """A device's stream (`cuda`, 0 -> `cuda:0`; `cuda`, ALL_DEVICES -> every cuda device)."""
    return f"{kind}:{index}"


def generator_stream(identity: str) -> str:
    """A `torch.Generator`'s stream, by its creation site (`train.py:12 #0`), its owner
    (`owned_generator`), or given name."""
    return f"{GENERATOR} {identity}"


OWNED_BY = " of the DataLoader built at "
"""Joins the class of what made a generator inside torch (the sampler) and the line that built
the DataLoader it belongs to: `RandomSampler of the DataLoader built at train.py:40`."""
DERIVED_FROM = {"RandomSampler": "cpu"}
"""Owners that seed each generator they make from a draw on another stream: torch's
`RandomSampler` without a generator of its own seeds a fresh one from the CPU RNG whenever an
iterator starts (a `DistributedSampler` seeds from its seed and epoch, no stream)."""


def owned_generator(owner: str, loader_site: str) -> str:
    """The identity of a generator made inside torch by `owner` (a sampler's class name) of
    the DataLoader built at `loader_site`: the same in every run, wherever the iterator that
    made it was started."""
    return f"{owner}{OWNED_BY}{loader_site}"


def parent_stream(key: str) -> Optional[str]:
    """The stream key a generator's stream is re-derived from (`rng:cpu` for a RandomSampler's
    generator), None when it is not derived from another audited stream."""
    site = generator_site(key)
    if site is None or OWNED_BY not in site:
        return None
    parent = DERIVED_FROM.get(site.split(OWNED_BY)[0])
    return stream_key(parent) if parent else None


def generator_site(key: str) -> Optional[str]:
    """Where a generator's stream key says it was made (or its given name); None for any key
    that is not a generator's stream."""
    section, stream = split_key(key)
    prefix = f"{GENERATOR} "
    return stream[len(prefix) :] if section == RNG and stream.startswith(prefix) else None


def stream_kind(key: str) -> str:
    """The kind of a stream key: cpu, cuda, npu, xpu, numpy, python or generator; "" for a key
    that is not a stream's."""
    section, stream = split_key(key)
    if section != RNG:
        return ""
    return GENERATOR if generator_site(key) is not None else stream.partition(":")[0]


def device_index(key: str) -> str:
    """The device index of a device stream key (`rng:cuda:1` -> `1`); "" for any other key."""
    section, stream = split_key(key)
    return stream.partition(":")[2] if section == RNG and generator_site(key) is None else ""


# Restore-log targets ("what" was restored): an audit key or subject, a file, or a class name.

FILE_TARGET = "file"


def file_target(path: str) -> str:
    """The target of a restore that read a file (`file <path>`; `file` when it has no name)."""
    return f"{FILE_TARGET} {path}" if path else FILE_TARGET


def target_file(what: str) -> Optional[str]:
    """The path a restore-log target read, if it is a file's."""
    prefix = f"{FILE_TARGET} "
    return what[len(prefix) :] if what.startswith(prefix) else None


def submodule_target(subject: str, submodule: str) -> str:
    """A restore of a submodule of a watched module: `watch:model (encoder.0)`."""
    return f"{subject} ({submodule})"


def target_covers(what: str, key: str) -> bool:
    """Whether a restore-log target restored the audit subject or key `key`: the same name (a
    submodule's restore counts for its module), or every device of a kind (`rng:cuda:*`)."""
    what = what.split(" (")[0]
    every = f":{ALL_DEVICES}"
    return what == key or (what.endswith(every) and key.startswith(what[: -len(ALL_DEVICES)]))
