"""The resume test of the versioned trainer, with a golden kept per environment.

    # release 1: write the golden (its trajectory and the checkpoint at each split)
    TRAINER_VERSION=1 pytest -p resume_equiv examples/golden \
        --resume-equiv-golden=examples/golden/goldens --resume-equiv-update-golden
    # later versions: the resume test, the golden trajectory and the old checkpoint
    TRAINER_VERSION=2-refactor pytest -p resume_equiv examples/golden \
        --resume-equiv-golden=examples/golden/goldens
"""

import os
from pathlib import Path

from pytest_resume_equiv import resume_equivalent

TRAIN = str(Path(__file__).with_name("train.py"))
VERSION = os.environ.get("TRAINER_VERSION", "1")


# rng_mutation=False: this example is about versions; keep the teeth check in your own tests
@resume_equivalent(steps=4, split=2, nproc=1, rng_mutation=False, golden_checkpoint=True)
def test_versioned_trainer(resume_equiv):
    resume_equiv.run(
        [
            TRAIN,
            f"--version={VERSION}",
            "--max-steps={steps}",
            "--save-at={splits}",
            "--output-dir={run_dir}",
        ],
        checkpoint="{run_dir}/checkpoints/step_{split}",
        resume_args=["--resume-from={checkpoint}"],
    )
