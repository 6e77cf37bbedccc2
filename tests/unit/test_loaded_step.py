"""Which step a resumed launch's checkpoint is of (compare/loaded_step.py), on pure facts: the
step counters its load restored and the files its restore log read, dated by the save log of
the launch that wrote them; a finding names each piece of evidence and the step it says."""

from pytest_resume_equiv.compare.loaded_step import loaded_step
from pytest_resume_equiv.signature import Signature

CKPT = "/runs/base/checkpoints"


def writer(saves, rank=0):
    """A launch that saved `{step: path}` right after each step (and its counters)."""
    files = [{"op": "torch.save", "path": path, "after_step": step} for step, path in saves.items()]
    counters = {s: {"optimizer": s} for s in range(1, 7)}
    return {rank: Signature("u", {"rank": rank}, [], True, files=files, counters=counters)}


def resumed(reads, counters=None, given=f"{CKPT}/step_3"):
    """A resumed rank that read `reads` before its first step (and one after it, ignored)."""
    restores = [{"call": "torch.load", "what": f"file {p}", "after_step": None} for p in reads]
    restores.append({"call": "torch.load", "what": f"file {CKPT}/step_6/x.pt", "after_step": 5})
    loaded = {"split": 3, "counters": counters} if counters is not None else None
    point = {"split": 3, "checkpoint": {"path": given}}
    sig = Signature("r", {"rank": 0}, [], True, restores=restores, loaded=loaded)
    sig.resume_points.append(point)
    return {0: sig}


SAVES = {3: f"{CKPT}/step_3/rank-0.pt", 5: f"{CKPT}/step_5/rank-0.pt"}


def test_the_counters_and_the_files_read_agree_on_another_step():
    found = loaded_step(writer(SAVES), resumed([SAVES[5]], {"optimizer": 5}), 3)
    assert found is not None and found.files == {"0": {SAVES[5]: 5}}
    (line,) = found.lines("split 3")
    assert line.startswith(
        "split 3: the checkpoint loaded is of step 5, not step 3 (rank 0: the optimizer's step "
        "counter is 5 (the uninterrupted run's after step 5), the file read (rank-0.pt) was "
        "written after step 5); the resumed run went on as if from step 3."
    ), line


def test_the_files_alone_say_which_step_when_no_counter_does():
    """Plain SGD keeps no step counter, and no scheduler was built: the files read say it."""
    found = loaded_step(writer(SAVES), resumed([SAVES[5]]), 3)
    assert found is not None and found.found == {} and found.counters == {}
    assert (
        "of step 5, not step 3 (rank 0: the file read (rank-0.pt) was written after step 5)"
        in (found.lines("split 3")[0])
    )


def test_evidence_that_disagrees_is_named_piece_by_piece():
    found = loaded_step(writer(SAVES), resumed([SAVES[5]], {"optimizer": 3}), 3)
    (line,) = found.lines("split 3")
    assert "what was loaded is of steps 3 and 5, not of step 3 alone" in line
    assert "the optimizer's step counter is 3 (the uninterrupted run's after step 3)" in line
    assert "the file read (rank-0.pt) was written after step 5" in line


def test_the_split_checkpoint_is_no_finding():
    assert loaded_step(writer(SAVES), resumed([SAVES[3]], {"optimizer": 3}), 3) is None
    assert loaded_step(writer(SAVES), resumed([SAVES[3]]), 3) is None
    assert loaded_step(writer(SAVES), resumed(["/elsewhere/pretrained.pt"]), 3) is None


def test_never_against_the_resume_point_gate():
    """The gate found the state at the resume point equal to the split's: a file of another
    step read on the way (a metrics file, a config) is no finding."""
    assert loaded_step(writer(SAVES), resumed([SAVES[5]]), 3, gate_held=True) is None


def test_the_launch_that_wrote_the_checkpoint_dates_the_files():
    """An interrupted launch (or a chain's link) wrote the checkpoint, not the reference."""
    reference = writer({})
    source = writer(SAVES)
    assert loaded_step(reference, resumed([SAVES[5]]), 3) is None  # undated: says nothing
    found = loaded_step(reference, resumed([SAVES[5]]), 3, writer=source)
    assert found is not None and found.files == {"0": {SAVES[5]: 5}}


def test_a_save_logged_before_its_record_is_read_by_the_given_checkpoints_label():
    """A trainer that saves, then calls `record(step)`, logs the save of step N after step
    N-1: the save the resume was pointed at says so (written after step 2 for split 3)."""
    early = {2: SAVES[3], 4: SAVES[5]}
    assert loaded_step(writer(early), resumed([SAVES[3]]), 3) is None
    found = loaded_step(writer(early), resumed([SAVES[5]]), 3)
    assert found is not None and found.files == {"0": {SAVES[5]: 5}}
    # one save written across its record: the model before it, the optimizer after
    split_save = writer({2: SAVES[3], 3: f"{CKPT}/step_3/optim.pt", 4: SAVES[5]})
    assert loaded_step(split_save, resumed([SAVES[3], f"{CKPT}/step_3/optim.pt"]), 3) is None


def test_a_rolling_path_is_of_its_last_save_and_a_folder_of_the_saves_in_it():
    latest = f"{CKPT}/latest.pt"
    rolling = writer({s: latest for s in range(1, 7)})
    found = loaded_step(rolling, resumed([latest], given=latest), 3)
    assert found is not None and found.files == {"0": {latest: 6}}
    dcp = writer({3: f"{CKPT}/step_3", 5: f"{CKPT}/step_5"})  # DCP logs its folder
    found = loaded_step(dcp, resumed([f"{CKPT}/step_5/__0_0.distcp"]), 3)
    assert found is not None and set(found.files["0"].values()) == {5}


def test_a_removal_dates_nothing():
    removed = writer(SAVES)
    removed[0].files.append({"op": "shutil.rmtree", "path": f"{CKPT}/step_3", "after_step": 6})
    assert loaded_step(removed, resumed([SAVES[3]]), 3) is None


def test_a_counter_that_never_moves_says_nothing():
    """Plain SGD keeps no step state: its counter reads 0 after every step, which is the
    split's as much as any other's."""
    still = writer(SAVES)
    still[0].counters = {s: {"optimizer": 0} for s in range(1, 7)}
    found = loaded_step(still, resumed([SAVES[5]], {"optimizer": 0}), 3)
    assert found is not None and found.counters == {}
    assert "the checkpoint loaded is of step 5, not step 3" in found.lines("split 3")[0]
