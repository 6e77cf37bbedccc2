"""The resume test a user writes for the minimal trainer: one decorator, one call."""

from pathlib import Path

from pytest_resume_equiv import resume_equivalent

TRAIN = str(Path(__file__).with_name("train.py"))


@resume_equivalent(steps=6, split=3, nproc=2)
def test_minimal_trainer_resumes_exactly(resume_equiv):
    resume_equiv.run(
        [TRAIN, "--max-steps={steps}", "--save-at={splits}", "--output-dir={run_dir}"],
        checkpoint="{run_dir}/checkpoints/step_{split}",
        resume_args=["--resume-from={checkpoint}"],
    )
