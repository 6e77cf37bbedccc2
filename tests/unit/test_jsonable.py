"""The in-memory records (facts, comparisons, verdicts, run and test records) written to JSON
and read back by `jsonable` from their fields: every kind comes back equal, and the JSON keeps
the keys the JSON report documents (a pytest-xdist worker's records are the same JSON)."""

import json
import re
from dataclasses import dataclass, field
from typing import Optional

import pytest

from pytest_resume_equiv.checks.after_crash import Row
from pytest_resume_equiv.checks.base import Verdict
from pytest_resume_equiv.checks.crash_table import CrashTable
from pytest_resume_equiv.compare import facts
from pytest_resume_equiv.compare.accounting import DataAccount
from pytest_resume_equiv.compare.comparators import DataFacts
from pytest_resume_equiv.compare.configurations import ConfigurationFacts, Difference
from pytest_resume_equiv.compare.diff import Comparison, Divergence
from pytest_resume_equiv.compare.envelope import Envelope, TopologyFacts
from pytest_resume_equiv.compare.gate import GateFacts
from pytest_resume_equiv.compare.jsonable import NOT_IN_JSON, from_json, json_key, to_json
from pytest_resume_equiv.compare.loaded_step import LoadedStep
from pytest_resume_equiv.compare.noise import NoiseFacts
from pytest_resume_equiv.compare.step_problems import StepProblem
from pytest_resume_equiv.compare.tolerance import PROFILES, ComparisonRules
from pytest_resume_equiv.diagnose import Diagnosis
from pytest_resume_equiv.diagnose.preflight import PreflightFacts
from pytest_resume_equiv.rank.encode import encode
from pytest_resume_equiv.report.records import LaunchRecord, RunRecord, TestRecord

ACCOUNT = DataAccount(
    "sample_ids",
    [1],
    [7],
    [2],
    False,
    True,
    [3],
    ([4], [2]),
    (1, 0),
    [(4, 5)],
    [4],
    [9],
    [6],
    [(4, 7)],
    4,
)
TOPOLOGY = TopologyFacts(
    (2, 1),
    [ACCOUNT],
    [Envelope("loss", 4, 0.5, 0.1, 0.4)],
    ["lr"],
    ["rank_loss"],
    ["shared"],
    ["loss relative 0.3 at step 1"],
)
NOISE = NoiseFacts(
    "uninterrupted", ["/r/a"], 1, {"0": {"loss": {"4": 0.25}}}, {"loss": 0.01}, ["step 4, x"]
)
GATE = GateFacts("failed", "the uninterrupted run", "", {"0": ["rng:cpu"]}, 3, "train.py:10")
PREFLIGHT = PreflightFacts(["cudnn.benchmark is True"], ["TF32 matmuls are allowed"])
LOADED = LoadedStep(3, {"0": 5}, {"0": {"optimizer": 5}})
CRASH = CrashTable(3, [Row("before-rename", "rename ckpt", "ckpt-3 (part)", 2, "exact", "ok")])
DATA = DataFacts([ACCOUNT])
CONFIGURATIONS = ConfigurationFacts(
    "1 rank",
    "dp2 (2 ranks)",
    4,
    [Difference("loss", 1, 0.5, 1.0, 0.5, 2.4e-7), Difference("samples consumed", 2, "8", "8")],
    1e-8,
    "auto:data",
)
COMPARISON = Comparison(
    3,
    6,
    2,
    [StepProblem("missing", 1, (5, 6), "rank 1: no step 5")],
    Divergence(4, 0, "loss", "loss", encode(4.5, "loss"), 5, "value differs", node="n1"),
    {0: ["loss"], 1: ["lr"]},
    3,
    [(4, 4.0, 5.0)],
    ["rank 0: rng:x"],
    ["watch:x"],
    [TOPOLOGY, DATA, NOISE, GATE],
    "within noise",
)
VERDICT = Verdict(
    "resume",
    "failed",
    "split 3",
    3,
    "",
    COMPARISON,
    Diagnosis("it was not restored", "cpu RNG", ["a note"]),
    [PREFLIGHT, CRASH, LOADED, CONFIGURATIONS],
    primary=True,
    link=2,
    launch="resumed-split3",
    runs={"resumed": "/r/res"},
    rerun="cd x && rerun",
    values_match=True,
)
TEETH = Verdict("teeth", "skipped", "teeth check", None, "nothing random")
LAUNCH = LaunchRecord(
    "uninterrupted", "uninterrupted", 2, 1.5, 0.25, None, True, "ok", False, 0, "/r/u", "torchrun"
)
RUN = RunRecord(["uninterrupted"], [LAUNCH], [VERDICT, TEETH], "split 3", ["w"], ["x"], ["p.png"])
RECORD = TestRecord("t.py::test_a", "failed", "failed", 6, [3], 2, "cpu", 3.25, [RUN], 1)
RULES = ComparisonRules(6, PROFILES["standard"], ("watch:*",), True)

KEYS = {
    "TestRecord": "test outcome verdict steps splits ranks device wall_seconds runs resumed_ranks "
    "variant_ranks "
    "launches reused_launches first_divergence",
    "RunRecord": "plan launches verdicts checks teeth control failure warnings ignored plots",
    "LaunchRecord": "name role ranks seconds startup_overlapped reused_from ok status timed_out "
    "killed_after_step run_dir command",
    "Verdict": "check status label split why comparison likely_cause facts primary chain_link "
    "launch runs rerun values_match",
    "Diagnosis": "class cause evidence fix notes rule",
    "Comparison": "split steps world_size problems divergence divergent_keys compared_steps "
    "context latent ignored facts how one_sided",
    "Divergence": "step rank key path expected actual detail node",
    "StepProblem": "kind rank steps message",
    "TopologyFacts": "kind nproc data envelopes exact per_rank shared blind text",
    "Envelope": "key step deviation noise allowed",
    "DataAccount": "key missing fewer repeated twice from_earlier moved replayed epochs "
    "batches unconsumed unknown unknown_steps alike first_different alien_steps",
    "DataFacts": "kind accounts text",
    "NoiseFacts": "kind source runs first_step spread relative unjudgeable",
    "GateFacts": "kind status reference why differing compared at how",
    "PreflightFacts": "kind findings precision",
    "CrashTable": "kind split rows sampled rerun_args",
    "LoadedStep": "kind split found counters files",
    "Row": "point where disk resumed_from status why rolled_back id then",
    "Tolerance": "name first later",
    "ComparisonRules": "steps tolerance ignore strict_latent",
}
RECORDS = [
    RECORD,
    RUN,
    LAUNCH,
    VERDICT,
    TEETH,
    VERDICT.diagnosis,
    COMPARISON,
    COMPARISON.divergence,
    COMPARISON.problems[0],
    TOPOLOGY,
    TOPOLOGY.envelopes[0],
    ACCOUNT,
    DATA,
    NOISE,
    GATE,
    PREFLIGHT,
    CRASH,
    CRASH.rows[0],
    PROFILES["standard"],
    RULES,
]


def through_json(value):
    return json.loads(json.dumps(to_json(value)))


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_kind_reads_back_equal_from_its_json(record):
    assert from_json(type(record), through_json(record)) == record


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_kind_keeps_its_json_keys(record):
    assert set(to_json(record)) == set(KEYS[type(record).__name__].split())


def test_every_fact_kind_is_covered_and_comes_back_as_its_own_class():
    again = from_json(Verdict, through_json(VERDICT))
    found = [*again.comparison.facts, *again.facts]
    assert [type(f) for f in found] == [
        TopologyFacts,
        DataFacts,
        NoiseFacts,
        GateFacts,
        PreflightFacts,
        CrashTable,
        LoadedStep,
        ConfigurationFacts,
    ]
    assert sorted(f.kind for f in found) == sorted(facts._KINDS)
    assert again == VERDICT
    assert again.comparison.facts[0].nproc == (2, 1)  # a tuple again, not a JSON list
    assert again.comparison.divergent_keys == {0: ["loss"], 1: ["lr"]}  # int ranks again


def test_the_json_report_keys_of_a_verdict_with_a_comparison_a_diagnosis_and_facts():
    data = through_json(RECORD)
    (run,) = data["runs"]
    (resume,), (teeth,) = run["verdicts"], run["checks"]
    assert resume["likely_cause"] == {
        "class": "cpu RNG",
        "cause": "it was not restored",
        "notes": ["a note"],
        "rule": "",
        "fix": "",
        "evidence": {},
    }
    assert resume["chain_link"] == 2 and teeth["chain_link"] == 0
    assert resume["first_divergence"]["uninterrupted"] == "4.5"  # readable, for the report
    assert resume["topology"] == TOPOLOGY.lines()
    assert resume["data"] == [ACCOUNT.text()]
    kinds = [f["kind"] for f in resume["comparison"]["facts"] + resume["facts"]]
    assert kinds == [
        "topology",
        "data",
        "noise",
        "gate",
        "preflight",
        "crash_table",
        "loaded_step",
        "configurations",
    ]
    assert resume["comparison"]["facts"][1]["text"] == [ACCOUNT.text()]
    assert run["teeth"] == {"status": "skipped", "why": "nothing random"}
    assert (data["launches"], data["reused_launches"], data["wall_seconds"]) == (1, 0, 3.25)


def test_what_lives_in_memory_only_stays_out_of_the_json():
    verdict = Verdict("resume", "passed", "split 3", 3, signatures=({}, {}))
    row = Row("p", "w", verdict=verdict)
    assert "signatures" not in to_json(verdict) and "verdict" not in to_json(row)
    assert from_json(Row, through_json(row)).verdict is None


@dataclass
class Sample:
    """A record of the shapes the helper reads: renamed, optional, nested, in memory only."""

    count: int
    named: str = field(default="", metadata=json_key("name"))
    where: Optional[tuple[int, str]] = None
    nested: list[DataAccount] = field(default_factory=list)
    cache: dict = field(default_factory=dict, metadata=NOT_IN_JSON)


def test_a_renamed_field_is_written_and_read_under_its_json_key():
    sample = Sample(2, "a", (1, "x"), [DataAccount("ids")], {"kept": "out"})
    data = through_json(sample)
    assert set(data) == {"count", "name", "where", "nested"}
    assert from_json(Sample, data) == Sample(2, "a", (1, "x"), [DataAccount("ids")])
    assert from_json(Sample, {"count": 1}) == Sample(1)  # missing keys take their defaults


@pytest.mark.parametrize(
    "data, message",
    [
        ({"name": "a"}, "worker 3: no 'count' (a Sample needs it)"),
        ({"count": "2"}, "worker 3.count: expected an integer, got str '2'"),
        ({"count": True}, "worker 3.count: expected an integer"),
        ({"count": 1, "where": [1]}, "worker 3.where: expected 2 items, got 1"),
        ({"count": 1, "nested": [{"missing": []}]}, "worker 3.nested[0]: no 'key'"),
        ([], "worker 3: expected a Sample object, got list"),
    ],
)
def test_json_that_does_not_fit_says_where(data, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        from_json(Sample, data, "worker 3")


def test_an_unknown_kind_of_fact_says_which():
    data = through_json(TEETH)
    data["facts"] = [{"kind": "horoscope"}]
    with pytest.raises(ValueError, match=r"teeth\.facts\[0\]: unknown kind of fact 'horoscope'"):
        from_json(Verdict, data, "teeth")


def test_only_a_record_is_written_and_a_value_without_a_json_form_says_what_it_is():
    with pytest.raises(TypeError, match="dict is not a dataclass record"):
        to_json({"a": 1})
    with pytest.raises(TypeError, match="set has no JSON form"):
        to_json(Verdict("resume", "passed", "split 3", runs={"x": {1}}))
