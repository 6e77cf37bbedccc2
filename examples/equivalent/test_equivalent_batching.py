"""Does another batching train the same model? One baseline (1 rank, the whole global batch
in one forward) and two variants, each one test item (`test_batching[accum4]`,
`test_batching[dp2_accum2]`), compared at every optimizer step over the global batch: the
step counts, learning rates and samples exactly, the loss and the parameters within
round-off. The baseline runs once for both items."""

from pathlib import Path

from pytest_resume_equiv import equivalent

TRAIN = str(Path(__file__).with_name("train.py"))


@equivalent(
    steps=4,
    baseline=dict(nproc=1),
    variants={
        "accum4": dict(nproc=1, args=["--accum", "4"]),
        "dp2_accum2": dict(nproc=2, args=["--accum", "2"]),
    },
)
def test_batching(resume_equiv):
    resume_equiv.run([TRAIN, "--steps", "{steps}"])
