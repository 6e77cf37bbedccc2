"""The settings resolver and marker validation, without launching anything."""

from types import SimpleNamespace

import pytest

from pytest_resume_equiv.settings import (
    OPTIONS,
    SettingError,
    parse_marker,
    resolve,
    resolve_session,
    resolve_test,
)

TIMEOUT = OPTIONS["timeout"]


def test_precedence_default_ini_env_cli_marker():
    assert resolve(TIMEOUT, None, {}, None).value == 600.0
    assert resolve(TIMEOUT, ("30", "tox.ini"), {}, None).value == 30.0
    env = {"PYTEST_RESUME_EQUIV_TIMEOUT": "40"}
    assert resolve(TIMEOUT, ("30", "tox.ini"), env, None).value == 40.0
    assert resolve(TIMEOUT, ("30", "tox.ini"), env, "50").value == 50.0


def test_the_marker_is_the_top_layer_of_a_tests_settings():
    config = FakeConfig(ini={"resume_equiv_timeout": "30"}, cli={"resume_equiv_timeout": "50"})
    session = resolve_session(config, env={"PYTEST_RESUME_EQUIV_RNG_MUTATION": "false"})
    plain = resolve_test(session, (), {"steps": 6, "split": 3})
    assert (plain.timeout, plain.sources["timeout"]) == (
        50.0,
        "command line --resume-equiv-timeout",
    )
    assert plain.describe("rng_mutation") == (
        "False (environment variable PYTEST_RESUME_EQUIV_RNG_MUTATION)"
    )
    marked = resolve_test(
        session, (), {"steps": 6, "split": 3, "timeout": 60, "rng_mutation": True}
    )
    assert (marked.timeout, marked.sources["timeout"]) == (
        60.0,
        "marker @resume_equivalent(timeout=...)",
    )
    assert marked.rng_mutation is True
    assert (marked.marker.steps, marked.marker.splits, marked.keep) == (6, (3,), "failed")


def test_an_invalid_session_option_fails_every_marked_test():
    session = resolve_session(FakeConfig(), env={"PYTEST_RESUME_EQUIV_TIMEOUT": "soon"})
    with pytest.raises(SettingError, match="^pytest-resume-equiv: invalid timeout 'soon' from env"):
        resolve_test(session, (), {"steps": 6, "split": 3})


def test_empty_env_value_is_unset():
    got = resolve(TIMEOUT, ("30", "tox.ini"), {"PYTEST_RESUME_EQUIV_TIMEOUT": ""}, None)
    assert (got.value, got.source) == (30.0, "ini option resume_equiv_timeout in tox.ini")


@pytest.mark.parametrize(
    ("ini", "env", "cli", "source"),
    [
        (("abc", "pytest.ini"), {}, None, "ini option resume_equiv_timeout in pytest.ini"),
        (
            None,
            {"PYTEST_RESUME_EQUIV_TIMEOUT": "abc"},
            None,
            "environment variable PYTEST_RESUME_EQUIV_TIMEOUT",
        ),
        (None, {}, "abc", "command line --resume-equiv-timeout"),
    ],
)
def test_bad_value_names_its_source(ini, env, cli, source):
    with pytest.raises(SettingError) as err:
        resolve(TIMEOUT, ini, env, cli)
    assert (
        str(err.value)
        == f"invalid timeout 'abc' from {source}: expected a positive number of seconds"
    )


@pytest.mark.parametrize("raw", ["0", "-3", "nan", "inf"])
def test_timeout_must_be_positive_and_finite(raw):
    with pytest.raises(SettingError, match="positive number of seconds"):
        resolve(TIMEOUT, None, {}, raw)


def test_choice_and_bool_options():
    assert (
        resolve(OPTIONS["device"], None, {"PYTEST_RESUME_EQUIV_DEVICE": "CPU"}, None).value == "cpu"
    )
    with pytest.raises(
        SettingError,
        match="invalid device 'gpu' from command line --resume-equiv-device: expected one of auto, cpu, cuda, npu, xpu",
    ):
        resolve(OPTIONS["device"], None, {}, "gpu")
    assert (
        resolve(
            OPTIONS["require_device"], None, {"PYTEST_RESUME_EQUIV_REQUIRE_DEVICE": "yes"}, None
        ).value
        is True
    )
    with pytest.raises(SettingError, match="expected true/false"):
        resolve(OPTIONS["require_device"], ("maybe", "setup.cfg"), {}, None)
    with pytest.raises(SettingError, match="expected one of failed, all, none"):
        resolve(OPTIONS["keep"], None, {"PYTEST_RESUME_EQUIV_KEEP": "some"}, None)


class FakeConfig:
    def __init__(self, ini=None, cli=None):
        self.inipath = "/p/pytest.ini"
        self._ini = ini or {}
        self._cli = cli or {}
        self.option = SimpleNamespace()

    def getini(self, name):
        return self._ini.get(name)

    def getoption(self, name, default=None):
        return self._cli.get(name, default)


def test_session_collects_errors_instead_of_raising():
    config = FakeConfig(ini={"resume_equiv_keep": "sometimes"}, cli={"resume_equiv_device": "cpu"})
    settings = resolve_session(config, env={"PYTEST_RESUME_EQUIV_TIMEOUT": "soon"})
    assert settings["device"] == "cpu"
    assert (
        "invalid timeout 'soon' from environment variable PYTEST_RESUME_EQUIV_TIMEOUT"
        in settings.error
    )
    assert (
        "invalid keep 'sometimes' from ini option resume_equiv_keep in /p/pytest.ini"
        in settings.error
    )


def test_session_defaults():
    settings = resolve_session(FakeConfig(), env={})
    assert settings.error is None
    assert (settings["device"], settings["timeout"], settings["keep"], settings["report"]) == (
        "auto",
        600.0,
        "failed",
        None,
    )
    assert settings.describe("device") == "auto (default)"


def test_marker_defaults_and_split_list():
    spec = parse_marker((), {"steps": 6, "split": [4, 2]})
    assert (spec.steps, spec.splits, spec.nproc, spec.nnodes, spec.world_size) == (
        6,
        (2, 4),
        2,
        1,
        2,
    )
    assert parse_marker((8, 3), {"nproc": 1}).splits == (3,)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (
            (),
            {"steps": 6, "split": 3, "nprocs": 2},
            "unknown keyword 'nprocs' (did you mean 'nproc'?); valid keywords: steps, split, nproc",
        ),
        ((), {"split": 3}, "needs steps=..."),
        ((), {"steps": 6}, "needs split=..."),
        ((), {"steps": 1, "split": 1}, "invalid steps=1: must be >= 2"),
        ((), {"steps": "6", "split": 3}, "invalid steps='6': must be an int >= 2"),
        (
            (),
            {"steps": 6, "split": 6},
            "invalid split=6: every split must be an int with 1 <= split < steps=6",
        ),
        ((), {"steps": 6, "split": 0}, "invalid split=0"),
        ((), {"steps": 6, "split": [2, 2]}, "splits must be distinct"),
        ((), {"steps": 6, "split": []}, "needs at least one step"),
        ((), {"steps": 6, "split": 3, "nproc": 0}, "invalid nproc=0: must be >= 1"),
        ((), {"steps": 6, "split": 3, "nnodes": True}, "invalid nnodes=True: must be an int >= 1"),
        ((), {"steps": 6, "split": 3, "timeout": "x"}, "invalid timeout='x'"),
        ((), {"steps": 6, "split": 3, "tolerance": (1e-5,)}, "invalid tolerance=(1e-05,)"),
        (
            (),
            {"steps": 6, "split": 3, "tolerance": {"loss": (-1, 0)}},
            "rtol and atol must be finite numbers >= 0",
        ),
        (
            (),
            {"steps": 6, "split": 3, "env": {"A": 1}},
            "invalid env={'A': 1}: expected a dict of str to str",
        ),
        ((), {"steps": 6, "split": 3, "rng_mutation": "no"}, "invalid rng_mutation='no'"),
        ((), {"steps": 6, "split": 3, "interrupt": "pause"}, "invalid interrupt='pause'"),
        (
            (),
            {"steps": 6, "split": 3, "ignore": [3]},
            "invalid ignore=[3]: expected a list of patterns",
        ),
        ((), {"steps": 6, "split": 3, "resume_nproc": 0}, "invalid resume_nproc=0: must be >= 1"),
        ((), {"steps": 6, "split": 3, "chain": 1}, "invalid chain=1: must be True or False"),
        ((), {"steps": 6, "split": 3, "chain": True}, "a chain needs several splits"),
        (
            (),
            {"steps": 6, "split": [2, 4], "chain": True, "resume_nproc": 1},
            "chain=True goes with the uninterrupted topology",
        ),
        ((6, 3, 2), {}, "at most 2 positional arguments"),
        ((6,), {"steps": 6, "split": 3}, "steps given both positionally and as a keyword"),
    ],
)
def test_marker_errors_name_keyword_and_value(args, kwargs, message):
    with pytest.raises(SettingError) as err:
        parse_marker(args, kwargs)
    assert message in str(err.value)
    assert str(err.value).startswith("@resume_equivalent")


def test_topology_and_chain_keywords():
    spec = parse_marker((), {"steps": 6, "split": 3, "nproc": 2, "resume_nproc": 1})
    assert spec.topology_changes and spec.resumed_world_size == 1
    same = parse_marker((), {"steps": 6, "split": 3, "nproc": 2, "resume_nproc": 2})
    assert not same.topology_changes
    assert parse_marker((), {"steps": 6, "split": [2, 4], "chain": True}).chain


def test_tolerance_forms():
    every = parse_marker((), {"steps": 4, "split": 2, "tolerance": (1e-6, 0)}).tolerance
    assert every.first == every.later == (("*", 1e-6, 0.0),)
    spec = parse_marker(
        (), {"steps": 4, "split": 2, "tolerance": {"loss": (0, 1e-3), "param*": [1e-5, 0]}}
    )
    assert spec.tolerance.later == (("loss", 0.0, 1e-3), ("param*", 1e-5, 0.0))


def test_tolerance_profiles_from_the_marker_and_the_option():
    """The first resumed step and the later ones apart; the marker wins over the option, the
    option's source is named when it is bad."""
    standard = parse_marker((), {"steps": 4, "split": 2, "tolerance": "standard"}).tolerance
    assert standard.for_key("loss", 3, 2) == (2e-3, 1e-5)  # the first resumed step
    assert standard.for_key("loss", 4, 2) == (2e-3, 5e-3)
    relaxed = parse_marker((), {"steps": 4, "split": 2, "tolerance": "relaxed"}).tolerance
    assert (relaxed.for_key("x", 3, 2), relaxed.for_key("x", 4, 2)) == (
        (7.5e-3, 1e-4),
        (7.5e-3, 1e-2),
    )
    assert parse_marker((), {"steps": 4, "split": 2, "tolerance": "exact"}).tolerance.exact
    with pytest.raises(SettingError, match="unknown tolerance profile 'lax'"):
        parse_marker((), {"steps": 4, "split": 2, "tolerance": "lax"})
    session = resolve_session(FakeConfig(), env={"PYTEST_RESUME_EQUIV_TOLERANCE": "strict"})
    assert resolve_test(session, (), {"steps": 4, "split": 2}).tolerance.name == "strict"
    marked = resolve_test(session, (), {"steps": 4, "split": 2, "tolerance": "relaxed"})
    assert marked.tolerance.name == "relaxed"
    assert marked.sources["tolerance"] == "marker @resume_equivalent(tolerance=...)"
    pair = resolve_session(FakeConfig(), env={"PYTEST_RESUME_EQUIV_TOLERANCE": "1e-6,0"})
    assert pair["tolerance"].later == (("*", 1e-6, 0.0),)
    bad = resolve_session(FakeConfig(), env={"PYTEST_RESUME_EQUIV_TOLERANCE": "loose"})
    assert "invalid tolerance 'loose' from environment variable PYTEST_RESUME_EQUIV_TOLERANCE" in (
        bad.error
    )


def test_noise_settings():
    session = resolve_session(FakeConfig(), env={"PYTEST_RESUME_EQUIV_NOISE_RUNS": "3"})
    test = resolve_test(session, (), {"steps": 4, "split": 2, "noise": "measure"})
    assert (test.noise, test.noise_runs, test.strict_abstain) == ("measure", 3, False)
    assert resolve_test(session, (), {"steps": 4, "split": 2}).noise == "auto"
    with pytest.raises(SettingError, match="invalid noise='always'"):
        parse_marker((), {"steps": 4, "split": 2, "noise": "always"})
    one = resolve_session(FakeConfig(), env={"PYTEST_RESUME_EQUIV_NOISE_RUNS": "1"})
    assert "expected a whole number of uninterrupted runs >= 2" in one.error


def test_ignore_patterns_and_the_strict_latent_option():
    assert parse_marker((), {"steps": 4, "split": 2, "ignore": "rng:generator e.py:*"}).ignore == (
        "rng:generator e.py:*",
    )
    session = resolve_session(FakeConfig(), env={"PYTEST_RESUME_EQUIV_STRICT_LATENT": "1"})
    test = resolve_test(session, (), {"steps": 4, "split": 2, "ignore": ["watch:ema.*"]})
    assert test.strict_latent is True and test.marker.ignore == ("watch:ema.*",)


def test_golden_options_and_a_relative_ini_store_beside_the_ini_file():
    plain = resolve_session(FakeConfig(), env={})
    assert (plain["golden"], plain["update_golden"], plain["golden_only"]) == (None, False, False)
    from_ini = resolve_session(FakeConfig(ini={"resume_equiv_golden": "goldens"}), env={})
    assert from_ini["golden"] == "/p/goldens"
    env = {"PYTEST_RESUME_EQUIV_GOLDEN": "rel", "PYTEST_RESUME_EQUIV_UPDATE_GOLDEN": "1"}
    from_env = resolve_session(FakeConfig(cli={"resume_equiv_golden_only": True}), env=env)
    assert (from_env["golden"], from_env["update_golden"], from_env["golden_only"]) == (
        "rel",
        True,
        True,
    )
    test = resolve_test(from_env, (), {"steps": 6, "split": 3})
    assert test.describe("golden") == "rel (environment variable PYTEST_RESUME_EQUIV_GOLDEN)"
    unset = resolve_session(FakeConfig(), env={"PYTEST_RESUME_EQUIV_GOLDEN": ""})
    assert unset.error is None and unset["golden"] is None
    bad = resolve_session(FakeConfig(cli={"resume_equiv_golden": " "}), env={})
    assert "invalid golden ' ' from command line --resume-equiv-golden" in bad.error


def test_the_golden_checkpoint_keyword():
    assert parse_marker((), {"steps": 6, "split": 3}).golden_checkpoint is False
    assert parse_marker((), {"steps": 6, "split": 3, "golden_checkpoint": True}).golden_checkpoint
    with pytest.raises(SettingError, match=r"invalid golden_checkpoint='yes': must be True or"):
        parse_marker((), {"steps": 6, "split": 3, "golden_checkpoint": "yes"})
