"""Resume test for the FSDP2 + DCP toy Wan trainer: one decorator, one call."""

from pathlib import Path

from pytest_resume_equiv import resume_equivalent

TRAIN = str(Path(__file__).with_name("train.py"))


@resume_equivalent(steps=6, split=3, nproc=2)
def test_toy_dit_resumes_exactly(resume_equiv, toy_wan_model_dir):
    resume_equiv.run(
        [
            TRAIN,
            f"--model-dir={toy_wan_model_dir}",
            "--max-steps={steps}",
            "--save-at={splits}",
            "--output-dir={run_dir}",
        ],
        resume_args=["--resume-from={checkpoint}"],
    )


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
