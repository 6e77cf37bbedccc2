"""The resume-point gate's line says what the restore log shows of what differs there
(compare/gate.py): never restored, nothing restored at all, restored then advanced by draws,
restored and not advanced where the uninterrupted run drew, or restored to other contents.
"A load is a copy: the resume restored something other than what was saved" only for the
last: it is false of a stream nobody restored."""

from types import SimpleNamespace

from pytest_resume_equiv.compare.gate import (
    ADVANCED,
    NEVER_RESTORED,
    NOT_ADVANCED,
    NOTHING_RESTORED,
    RESTORED_DIFFERS,
    RESTORED_OTHER,
    UNKNOWN,
    GateFacts,
    restore_evidence,
)

LOAD = {"call": "torch.load", "what": "file /r/ckpt.pt", "at": "train.py:5"}
SEED = {"call": "torch.manual_seed", "what": "rng:cpu", "at": "train.py:2"}
SET_RNG = {"call": "torch.set_rng_state", "what": "rng:cpu", "at": "train.py:7"}
MODEL = {"call": "Module.load_state_dict", "what": "watch:model", "at": "train.py:6"}
DRAW = {"op": "randint", "at": "train.py:9", "stream": "rng:cpu"}


def _res(*log):
    return SimpleNamespace(restores=list(log))


def test_what_the_restore_log_shows_of_each_differing_item():
    point = {"restores": 3, "draws": []}
    # seeded at the start, loaded, never set again: never restored
    assert restore_evidence(_res(SEED, LOAD, MODEL), point, {}, "rng:cpu") == NEVER_RESTORED
    assert restore_evidence(_res(), {"draws": []}, {}, "rng:cpu") == NOTHING_RESTORED
    assert restore_evidence(_res(), {}, {}, "watch:model.params") == NOTHING_RESTORED
    # minGPT with no resume: it seeds at the start and loads nothing
    assert restore_evidence(_res(SEED), {"restores": 1}, {}, "rng:cpu") == NOTHING_RESTORED
    restored = _res(LOAD, MODEL, SET_RNG)
    drawn = {"restores": 3, "draws": [{**DRAW, "after_restores": 3}]}
    assert restore_evidence(restored, drawn, {}, "rng:cpu") == ADVANCED
    # a draw before the restore did not advance what it restored
    early = {"restores": 3, "draws": [{**DRAW, "after_restores": 1}]}
    assert restore_evidence(restored, early, {}, "rng:cpu") == RESTORED_OTHER
    base_drew = {"draws": [{**DRAW, "after_restores": 0}]}
    assert restore_evidence(restored, early, base_drew, "rng:cpu") == NOT_ADVANCED
    # a watched object restored: whether it changed after (a scheduler stepped) is not known
    assert restore_evidence(restored, point, {}, "watch:model.params") == RESTORED_DIFFERS
    # restores after the snapshot are not the resume's
    assert restore_evidence(_res(LOAD, SET_RNG), {"restores": 1}, {}, "rng:cpu") == NEVER_RESTORED
    dcp = _res({"call": "dcp.checkpoint.load", "what": "file /r/step", "at": "t.py:3"})
    assert restore_evidence(dcp, {"restores": 1}, {}, "watch:model.params") == UNKNOWN
    assert restore_evidence(dcp, {"restores": 1}, {}, "rng:cpu") == NEVER_RESTORED


def _line(differing, how):
    gate = GateFacts("failed", differing=differing, how=how, at="train.py:9")
    (line,) = gate.lines("split 3")
    return line.split("no noise in the arithmetic explains this: ")[1]


def test_the_gate_line_says_what_the_evidence_shows():
    never = {"0": {"rng:cpu": NEVER_RESTORED}, "1": {"rng:cpu": NEVER_RESTORED}}
    line = _line({"0": ["rng:cpu", "auto:data"], "1": ["rng:cpu"]}, never)
    assert line == "rng:cpu was never restored (no restore call names it before this point)"
    assert "other than what was saved" not in line
    nothing = {"0": {"rng:cpu": NOTHING_RESTORED, "watch:model.params": NOTHING_RESTORED}}
    line = _line({"0": ["rng:cpu", "watch:model.params"]}, nothing)
    assert line.startswith("the resumed run's restore log holds no load and no restore call")
    assert "nothing was restored, and rng:cpu, watch:model were never restored" in line
    advanced = {"0": {"rng:cpu": ADVANCED, "rng:generator a.py:3 #0": ADVANCED}}
    line = _line({"0": ["rng:cpu", "rng:generator a.py:3 #0"]}, advanced)
    assert line.startswith("rng:cpu, rng:generator a.py:3 #0 were restored and then advanced")
    mixed = {"0": {"rng:cpu": ADVANCED}, "1": {"rng:numpy": NEVER_RESTORED}}
    line = _line({"0": ["rng:cpu"], "1": ["rng:numpy"]}, mixed)
    assert line.index("rng:numpy was never restored") < line.index("rng:cpu was restored and")
    other = {"0": {"rng:cpu": RESTORED_OTHER}}
    line = _line({"0": ["rng:cpu"]}, other)
    assert line == "the resume restored something other than what was saved"
    differs = {"0": {"watch:scheduler.last_epoch": RESTORED_DIFFERS}}
    line = _line({"0": ["watch:scheduler.last_epoch"]}, differs)
    assert line.startswith("watch:scheduler was restored and differs here")
    # a fact read back from an older run (no evidence): neutral, never a claim
    assert _line({"0": ["rng:cpu"]}, {}) == "rng:cpu does not hold what was saved"
