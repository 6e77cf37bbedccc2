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
