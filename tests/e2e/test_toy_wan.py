"""Toy Wan fixtures and the FSDP2 + DCP diffusion example: its resume bugs are caught."""

import shutil
from pathlib import Path

import pytest
from helpers import CPU, section_of

pytest.importorskip("diffusers", reason="the toy Wan tests need diffusers: pip install -e '.[wan]'")

import torch  # noqa: E402

from pytest_resume_equiv.toy import (  # noqa: E402
    ToyFlowMatchingCondition,
    ToyWanConfigError,
    build_toy_wan,
    load_toy_wan,
    materialize_toy_wan,
    toy_wan_config,
)

TOY_DIT = Path(__file__).resolve().parents[2] / "examples" / "toy_dit"


def test_config_pins_eager_rope_and_native_attention():
    config = toy_wan_config()
    assert (config["rope_impl"], config["attention_backend"], config["num_layers"]) == (
        "eager",
        "native",
        2,
    )
    with pytest.raises(
        ToyWanConfigError,
        match="rope_impl='fused' is not supported; RoPE is pinned to 'eager' because fused RoPE kernels are not available on every device",
    ):
        toy_wan_config(rope_impl="fused")
    with pytest.raises(ToyWanConfigError, match="attention_backend='flash' is not supported"):
        build_toy_wan(attention_backend="flash")


def test_model_trains_and_round_trips_through_a_directory(tmp_path):
    model = build_toy_wan(seed=3)
    again = build_toy_wan(seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    assert 5_000 < sum(p.numel() for p in model.parameters()) < 50_000
    cond = ToyFlowMatchingCondition(seed=0, dp_rank=1)
    sample = cond.sample(torch.randn(2, 4, 2, 4, 4), torch.randn(2, 4, 16))
    out = model(sample["noisy"], sample["timestep_ids"], sample["text"]).sample
    torch.nn.functional.mse_loss(out, sample["target"]).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)

    path = materialize_toy_wan(str(tmp_path / "wan"), seed=3)
    loaded = load_toy_wan(path)
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values())
    )


def test_the_wan_extra_loads_the_model_dir_with_from_pretrained(toy_wan_model_dir, toy_wan):
    """`pip install 'pytest-resume-equiv[wan]'` alone must let diffusers load the toy model
    directory: Wan keeps some modules in fp32, which diffusers loads only with accelerate."""
    from importlib.metadata import requires

    wan_extra = [r for r in requires("pytest-resume-equiv") if 'extra == "wan"' in r]
    assert any(r.startswith("accelerate") for r in wan_extra), wan_extra
    from diffusers import WanTransformer3DModel

    loaded = WanTransformer3DModel.from_pretrained(toy_wan_model_dir)
    built = toy_wan(seed=0)
    assert loaded.state_dict().keys() == built.state_dict().keys()
    assert all(torch.equal(a, loaded.state_dict()[k]) for k, a in built.state_dict().items())


def test_condition_rng_state_round_trip():
    a, b = ToyFlowMatchingCondition(seed=5, dp_rank=0), ToyFlowMatchingCondition(seed=5, dp_rank=1)
    latents, text = torch.zeros(2, 4, 2, 4, 4), torch.zeros(2, 4, 16)
    assert not torch.equal(a.sample(latents, text)["noise"], b.sample(latents, text)["noise"])
    state = a.rng_state_dict()
    first = a.sample(latents, text)
    a.load_rng_state_dict(state)
    again = a.sample(latents, text)
    assert torch.equal(first["noise"], again["noise"]) and torch.equal(
        first["timestep_ids"], again["timestep_ids"]
    )


TOY_BUGS = """
from pathlib import Path

from pytest_resume_equiv import resume_equivalent

TRAIN = str(Path(__file__).with_name("train.py"))


# the same launches as test_toy_dit_resume.py's, the bug on the resumed side only (it is in
# how the trainer loads): the session runs the uninterrupted launch once
@resume_equivalent(steps=6, split=3, nproc=2)
def test_rank0_extra_state(resume_equiv, toy_wan_model_dir):
    resume_equiv.run(
        [TRAIN, f"--model-dir={toy_wan_model_dir}", "--max-steps={steps}", "--save-at={splits}",
         "--output-dir={run_dir}"],
        resume_args=["--resume-from={checkpoint}", "--bug=rank0-extra-state"],
    )
"""


@pytest.mark.long(110)
def test_toy_dit_example_passes_and_its_resume_bugs_are_caught(pytester):
    """The FSDP2 + DCP example as a user runs it, its trainer with no plugin line, beside two
    classic diffusion resume bugs: a condition model's generator not restored (the example's
    demo of recording more: the noise and timestep ids recorded explicitly), and per-rank
    extra state read from rank 0 (zero edits); and its elastic twin resumed from 2 ranks onto
    1 and from 1 onto 2 (DCP resharding)."""
    shutil.copytree(TOY_DIT, pytester.path / "toy_dit")
    (pytester.path / "toy_dit" / "test_toy_bugs.py").write_text(TOY_BUGS)
    # no teeth check: the caught generator bug already shows the values depend on the RNG
    result = pytester.runpytest_subprocess(
        *CPU, "-rA", "--resume-equiv-rng-mutation=false", "toy_dit"
    )
    text = result.stdout.str()
    print(text)
    result.assert_outcomes(passed=4, failed=1)
    assert "PASSED toy_dit/test_toy_dit_resume.py::test_toy_dit_resumes_exactly" in text
    assert "recorded automatically: auto:data, auto:loss, watch:lr_scheduler, watch:model" in text
    # the elastic trainer, resumed on another number of ranks (DCP resharding)
    for name, ranks in (
        ("two_ranks_onto_one", "1 rank (uninterrupted on 2)"),
        ("one_rank_onto_two", "2 ranks (uninterrupted on 1)"),
    ):
        section = section_of(text, f"test_toy_dit_resumes_from_{name}")
        assert f"PASSED toy_dit/test_toy_dit_resume.py::test_toy_dit_resumes_from_{name}" in text
        assert f"split 3: resumed on {ranks}:" in section
        assert "data exact: data (the model's inputs, by content): every sample" in section

    generator = section_of(text, "test_toy_dit_forgotten_condition_generator_is_caught")
    # the sample identities first: the values computed from them follow
    assert "split 3: first divergence at step 4, rank 0, key 'timestep_ids'" in generator
    line = next(x for x in generator.splitlines() if "keys that differ at step 4" in x)
    for rank in (0, 1):
        part = line.split(f"rank {rank}: ")[1].split(";")[0]
        assert "noise" in part and "timestep_ids" in part, line
    assert (
        "likely cause (never restored): ranks 0-1: the generator created at toy/condition.py:"
        in generator
    )
    assert "Fix: save and restore it, generator.get_state() / generator.set_state()" in generator

    extra = section_of(text, "test_rank0_extra_state")
    assert "first divergence at step 4, rank 1" in extra
    assert "random streams match; only rank 1 differs: per-rank state" in extra
    assert "rank 1: at the resume point rng:cpu equals rank 0's saved state" in extra
    # one uninterrupted launch served the exact resume and the rank-0 bug
    assert "(reused: run for toy_dit/test_to" in text


def test_model_dir_is_made_once_across_xdist_workers(pytester):
    pytest.importorskip("xdist")
    pytester.makeconftest(
        """
        import pytest_resume_equiv.toy as toy

        original = toy.materialize_toy_wan

        def counting(path, *args, **kwargs):
            with open(path + ".made", "a") as f:
                f.write("made\\n")
            return original(path, *args, **kwargs)

        toy.materialize_toy_wan = counting
        """
    )
    pytester.makepyfile(
        test_dirs="""
        import os
        import pytest

        @pytest.mark.parametrize("i", range(4))
        def test_dir(toy_wan_model_dir, i):
            assert os.path.exists(os.path.join(toy_wan_model_dir, "config.json"))
            print("DIR", toy_wan_model_dir)
        """
    )
    result = pytester.runpytest_subprocess("-p", "resume_equiv", "-n", "2", "-s")
    result.assert_outcomes(passed=4)
    made = list(pytester.path.glob("runpytest-0/**/resume-equiv-toy-wan.made"))
    assert len(made) == 1 and made[0].read_text() == "made\n"
