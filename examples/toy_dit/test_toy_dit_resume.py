"""Resume tests for the FSDP2 + DCP toy Wan trainers: one decorator, one call. The trainers
have no plugin line; the caught-bug demo shows what recording more adds (`--record-noise`)."""

from pathlib import Path

import pytest
import torch

from pytest_resume_equiv import resume_equivalent

TRAIN = str(Path(__file__).with_name("train.py"))
FSDP2_ON_CPU = hasattr(getattr(torch, "cpu", None), "Stream") and hasattr(
    torch.cpu.Stream, "record_event"
)
"""FSDP2's `fully_shard` on CPU (gloo) needs `torch.cpu.Stream.record_event`: torch 2.7+
(docs/reference/support.md); on an older torch these examples need an accelerator."""
pytestmark = pytest.mark.skipif(
    not FSDP2_ON_CPU and not torch.cuda.is_available(),
    reason=f"FSDP2 on CPU needs torch 2.7+ (torch {torch.__version__} has no "
    "torch.cpu.Stream.record_event): run these on an accelerator or a newer torch",
)


def _command(model_dir, *more):
    args = ["--max-steps={steps}", "--save-at={splits}", "--output-dir={run_dir}"]
    return [TRAIN, f"--model-dir={model_dir}", *args, *more]


@resume_equivalent(steps=6, split=3, nproc=2)
def test_toy_dit_resumes_exactly(resume_equiv, toy_wan_model_dir):
    resume_equiv.run(_command(toy_wan_model_dir), resume_args=["--resume-from={checkpoint}"])


@resume_equivalent(steps=6, split=3, nproc=2, rng_mutation=False)
def test_toy_dit_forgotten_condition_generator_is_caught(resume_equiv, toy_wan_model_dir):
    """The condition model's generator (noise, timesteps) is not restored. An explicit call
    where it matters: with `--record-noise` the trainer records the noise and timestep ids it
    drew, so the report leads with the sample identities, not the values computed from them.
    A real test would simply fail with the report; this demo catches it so the example run
    stays green, and prints it (pytest -rP)."""
    with pytest.raises(pytest.fail.Exception) as caught:
        resume_equiv.run(
            _command(toy_wan_model_dir, "--record-noise"),
            resume_args=["--resume-from={checkpoint}", "--bug=no-condition-rng"],
        )
    report = str(caught.value)
    print(report)
    assert "first divergence at step 4, rank 0, key 'timestep_ids'" in report
    assert "likely cause (never restored): ranks 0-1: the generator created at " in report


ELASTIC = str(Path(__file__).with_name("train_elastic.py"))


def _elastic(resume_equiv, model_dir):
    resume_equiv.run(
        [
            ELASTIC,
            f"--model-dir={model_dir}",
            "--max-steps={steps}",
            "--save-at={splits}",
            "--output-dir={run_dir}",
        ],
        resume_args=["--resume-from={checkpoint}"],
    )


@resume_equivalent(steps=5, split=3, nproc=2, resume_nproc=1)
def test_toy_dit_resumes_from_two_ranks_onto_one(resume_equiv, toy_wan_model_dir):
    """DCP reshards the FSDP2 state onto one rank; every sample is still consumed once."""
    _elastic(resume_equiv, toy_wan_model_dir)


@resume_equivalent(steps=5, split=3, nproc=1, resume_nproc=2)
def test_toy_dit_resumes_from_one_rank_onto_two(resume_equiv, toy_wan_model_dir):
    _elastic(resume_equiv, toy_wan_model_dir)
