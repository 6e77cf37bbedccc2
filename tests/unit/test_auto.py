"""Automatic recording (rank/auto.py): a step per optimizer step, with no call in the trainer.

The counting alone (`StepCounter`), then a rank recording a real training loop in process:
several optimizers in one iteration, a step a GradScaler skipped, micro-batches, a resumed
launch's numbering, explicit `record` calls beside the automatic values, and `auto=False`.
"""

import copy
import os

import torch

import pytest_resume_equiv as req
from pytest_resume_equiv.rank.auto import StepCounter
from pytest_resume_equiv.rank.context import current
from pytest_resume_equiv.rank.inputs import batch_parts, sample_ids
from pytest_resume_equiv.rank.run_dir import signature_path
from pytest_resume_equiv.rank.trace import FORWARD
from pytest_resume_equiv.signature import read_signature


def test_optimizers_stepping_with_nothing_between_make_one_step():
    counter, a, b = StepCounter(), object(), object()
    assert counter.stepped(a) is None and counter.stepped(b) is None
    step = counter.boundary()
    assert (step.number, step.optimizers, step.skipped) == (1, [id(a), id(b)], False)
    assert counter.boundary() is None  # a second forward: nothing more to write


def test_the_same_optimizer_again_starts_the_next_step():
    counter, a = StepCounter(), object()
    counter.stepped(a)
    done = counter.stepped(a)
    assert done.number == 1 and counter.pending.number == 2


def test_micro_batches_go_into_the_step_they_lead_to():
    counter, a = StepCounter(), object()
    for i in range(3):  # three micro-batches, one step
        counter.boundary()
        counter.batch([("0", f"batch{i}")])
        counter.loss(f"loss{i}")
    counter.stepped(a)
    counter.boundary()
    counter.batch([("0", "next")])
    step = counter.pending or counter.boundary()
    assert step is None  # the next iteration has not stepped yet
    counter.stepped(a)
    second = counter.boundary()
    assert second.number == 2 and second.inputs == [[("0", "next")]] and second.losses == []


def test_a_skipped_step_counts_and_keeps_the_numbers_after_it():
    counter, a = StepCounter(), object()
    numbers = []
    for ran in (True, False, True):
        counter.boundary()
        counter.stepped(a, ran=ran)
        numbers.append((counter.pending.number, counter.pending.skipped))
    assert numbers == [(1, False), (2, True), (3, False)]


def test_a_sample_has_one_id_however_the_batch_is_split():
    """What accounting across topologies needs: the same rows give the same ids in one batch
    of 4 or two of 2 (on 2 ranks); another row, or another value beside it, another id."""
    x, mask = torch.randn(4, 3), torch.tensor([1, 0, 1, 1])

    def ids(*inputs):
        return sample_ids(batch_parts([(str(i), t) for i, t in enumerate(inputs)]))

    whole = ids(x, mask)
    assert len(set(whole)) == 4 and whole == ids(x[:2], mask[:2]) + ids(x[2:], mask[2:])
    assert ids(x[:1], mask[:1]) != ids(x[1:2], mask[:1])
    assert ids(x, torch.tensor([1, 1, 1, 1]))[1] != whole[1]  # its mask is part of it
    assert ids(x, torch.tensor(2.0)) != ids(x, torch.tensor(3.0))  # a scalar beside: whole
    assert all(0 <= i < 2**52 for i in whole)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def _train(steps, micro=1, optimizers=1, scaler=None, record=False, data_seed=0, skip_at=()):
    torch.manual_seed(0)
    model = Net()
    groups = [model.body.parameters(), model.head.parameters()][: max(1, optimizers)]
    if optimizers == 1:
        groups = [model.parameters()]
    opts = [torch.optim.AdamW(params, lr=0.1) for params in groups]
    sched = torch.optim.lr_scheduler.StepLR(opts[0], step_size=1, gamma=0.5)
    gen = torch.Generator().manual_seed(data_seed)
    loss_fn = torch.nn.MSELoss()
    for step in range(1, steps + 1):
        for _ in range(micro):
            x, y = torch.randn(2, 4, generator=gen), torch.randn(2, 1, generator=gen)
            loss = loss_fn(model(x), y) / micro
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
        if step in skip_at:
            model.head.weight.grad.fill_(float("inf"))
        for opt in opts:
            if scaler is not None:
                scaler.step(opt)
            else:
                opt.step()
        if scaler is not None:
            scaler.update()
        sched.step()
        for opt in opts:
            opt.zero_grad()
        if record:
            req.record(step, lr=sched.get_last_lr()[0])


def _run(in_rank, train, **context):
    run_dir = in_rank(**context)
    current().install()
    current().open()  # as the bootstrap does before the user's code
    try:
        train()
        current().finish()
    finally:
        current().uninstall()
    return read_signature(signature_path(run_dir, 0))


def test_a_trainer_with_no_call_records_a_step_per_optimizer_step(in_rank):
    sig = _run(in_rank, lambda: _train(3, micro=2))
    assert [s for s, _ in sig.steps] == [1, 2, 3] and sig.complete
    values = sig.by_step()[2]
    # a loss per micro-batch, an id per sample (2 micro-batches of 2 rows)
    assert len(values["auto:loss"]) == 2 and len(values["auto:data"]) == 4
    assert sig.counters[2] == {"optimizer": 2, "lr_scheduler": 2}
    for key in ("watch:model.params", "watch:optimizer.state", "watch:optimizer.lr"):
        assert key in values, sorted(values)
    assert "watch:lr_scheduler.last_epoch" in values
    assert sig.found == ["model", "optimizer", "lr_scheduler"]  # the footer says what it found
    # each step saw other batches; the same trainer again sees the same ones
    assert len({str(v["auto:data"]) for _, v in sig.steps}) == 3
    again = _run(in_rank, lambda: _train(3, micro=2), run_dir=sig.path + ".again")
    assert [v["auto:data"] for _, v in again.steps] == [v["auto:data"] for _, v in sig.steps]
    other = _run(in_rank, lambda: _train(3, micro=2, data_seed=1), run_dir=sig.path + ".other")
    assert other.by_step()[1]["auto:data"] != values["auto:data"]


def test_two_optimizers_in_one_iteration_are_one_step(in_rank):
    sig = _run(in_rank, lambda: _train(3, optimizers=2))
    assert [s for s, _ in sig.steps] == [1, 2, 3]
    assert "watch:optimizer2.state" in sig.by_step()[1]


def test_a_step_the_grad_scaler_skipped_is_recorded_as_skipped(in_rank):
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    sig = _run(in_rank, lambda: _train(4, scaler=scaler, skip_at=(2,)))
    assert [s for s, _ in sig.steps] == [1, 2, 3, 4]
    assert [v.get("auto:skipped", False) for _, v in sig.steps] == [False, True, False, False]
    # the optimizer did not step at 2: its counter lags the steps from there on
    assert [sig.counters[s]["optimizer"] for s, _ in sig.steps] == [1, 1, 2, 3]


def test_a_grad_scaler_is_audited_with_no_watch(in_rank):
    """Its dynamic scale is state a checkpoint must carry: found when built, audited at every
    step (a scale that was not restored differs there)."""

    def train():
        _train(3, scaler=torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1))

    sig = _run(in_rank, train)
    assert "grad_scaler" in sig.found
    states = [v["watch:grad_scaler.state"] for _, v in sig.steps]
    assert len(set(map(str, states))) == 3  # the scale doubled after every clean step


def test_a_resumed_launch_numbers_from_the_split_and_says_what_it_loaded(in_rank):
    def resume():
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        state = {"step": torch.tensor(6.0), "exp_avg": torch.zeros(4, 4)}
        state["exp_avg_sq"] = torch.zeros(4, 4)
        opt.state[model.body.weight] = state  # a checkpoint of step 6
        for _ in range(2):
            model(torch.ones(1, 4)).sum().backward()
            opt.step()

    sig = _run(in_rank, resume, phase="resumed", split=3)
    assert [s for s, _ in sig.steps] == [4, 5]
    assert sig.loaded == {"split": 3, "counters": {"optimizer": 6}}


def test_a_save_right_after_optimizer_step_n_is_logged_after_step_n(in_rank):
    """Most trainers step, then save (`if step % k == 0: save`) before the next forward; the
    automatic line of step N is written only when the next iteration begins, but the save
    (and a restore there) belongs to step N, in a resumed launch too."""
    import os

    def train(first, last, run_dir):
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(first, last + 1):
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            if step % 2 == 0:
                torch.save(model.state_dict(), os.path.join(run_dir, f"step_{step}.pt"))

    run_dir = in_rank()
    sig = _run(in_rank, lambda: train(1, 4, run_dir), run_dir=run_dir)
    saved = {os.path.basename(e["path"]): e["after_step"] for e in sig.files}
    assert saved == {"step_2.pt": 2, "step_4.pt": 4}
    resumed_dir = in_rank(phase="resumed", split=2)
    resumed = _run(in_rank, lambda: train(3, 6, resumed_dir), phase="resumed", split=2)
    saved = {os.path.basename(e["path"]): e["after_step"] for e in resumed.files}
    assert saved == {"step_4.pt": 4, "step_6.pt": 6}


def test_a_trainer_that_records_after_another_forward_records_each_step_once(in_rank):
    """The trainer's first `record` comes after an evaluation forward (in training mode,
    autograd on: under no_grad it would be no training forward), which already completed the
    first automatic step: that automatic line is superseded by the record's, which keeps what
    it saw; a resumed launch likewise."""

    def train(first):
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(first, first + 3):
            model(torch.full((2, 4), float(step))).sum().backward()
            opt.step()
            opt.zero_grad()
            model(torch.full((2, 4), -float(step)))
            req.record(step, value=step)

    sig = _run(in_rank, lambda: train(1))
    assert [s for s, _ in sig.steps] == [1, 2, 3]
    assert [len(v["auto:data"]) for _, v in sig.steps] == [4, 4, 4]  # 2 trained, 2 evaluated
    assert [len(v["auto:loss"]) for _, v in sig.steps] == [1, 1, 1]
    resumed = _run(in_rank, lambda: train(4), phase="resumed", split=3)
    assert [s for s, _ in resumed.steps] == [4, 5, 6]
    assert [len(v["auto:data"]) for _, v in resumed.steps] == [4, 4, 4]


def test_dcp_building_an_optimizers_state_is_no_step(in_rank):
    """DCP's get_state_dict / set_state_dict step a fresh optimizer (zero gradients, lr 0) to
    build its state: a resumed FSDP2 trainer does so before its load, and it is no step."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def resume():
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        model_state, optim_state = get_state_dict(model, opt)  # steps opt once, at lr 0
        for state in optim_state["state"].values():
            state["step"] = torch.tensor(3.0)  # as loaded from a checkpoint of step 3
        set_state_dict(model, opt, model_state_dict=model_state, optim_state_dict=optim_state)
        for _ in range(2):
            model(torch.ones(1, 4)).sum().backward()
            opt.step()

    sig = _run(in_rank, resume, phase="resumed", split=3)
    assert [s for s, _ in sig.steps] == [4, 5]
    assert sig.loaded == {"split": 3, "counters": {"optimizer": 3}}


def _resume_from(step):
    """A resumed trainer whose load restored an optimizer of `step` (none: loaded nothing)."""

    def resume():
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        if step:
            state = {"step": torch.tensor(float(step)), "exp_avg": torch.zeros(4, 4)}
            state["exp_avg_sq"] = torch.zeros(4, 4)
            opt.state[model.body.weight] = state
        for _ in range(2):
            model(torch.ones(1, 4)).sum().backward()
            opt.step()

    return resume


def test_a_resume_after_a_crash_numbers_from_the_step_its_load_restored(in_rank):
    """After a crash the trainer finds its checkpoint itself: the steps go on from the one it
    loaded (an older checkpoint than the split), or from 1 when it found none."""
    older = _run(in_rank, _resume_from(2), phase="resumed", split=4, picks_checkpoint=True)
    assert [s for s, _ in older.steps] == [3, 4]
    assert older.loaded == {"split": 4, "counters": {"optimizer": 2}}
    fresh = _run(
        in_rank,
        _resume_from(0),
        phase="resumed",
        split=4,
        picks_checkpoint=True,
        run_dir=older.path + ".fresh",
    )
    assert [s for s, _ in fresh.steps] == [1, 2]


def test_explicit_records_number_the_steps_and_keep_the_automatic_values(in_rank):
    sig = _run(in_rank, lambda: _train(3, micro=2, record=True))
    assert [s for s, _ in sig.steps] == [1, 2, 3]
    values = sig.by_step()[3]
    assert "lr" in values and len(values["auto:loss"]) == 2
    assert "watch:optimizer.state" in values


def test_an_object_the_trainer_watches_is_not_audited_twice(in_rank):
    def train():
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        req.watch(net=model, opt=opt)
        for _ in range(2):
            model(torch.ones(2, 4)).sum().backward()
            opt.step()

    sig = _run(in_rank, train)
    assert sig.found == []
    assert not [k for k in sig.by_step()[1] if k.startswith(("watch:model", "watch:optimizer"))]
    assert "watch:net.params" in sig.by_step()[1] and "watch:opt.state" in sig.by_step()[1]


def test_auto_off_records_only_the_explicit_calls(in_rank):
    sig = _run(in_rank, lambda: _train(3, record=True), auto=False)
    assert [s for s, _ in sig.steps] == [1, 2, 3]
    assert not [k for k in sig.by_step()[1] if k.startswith(("auto:", "watch:"))]
    silent = _run(in_rank, lambda: _train(3), auto=False, run_dir=sig.path + ".silent")
    assert silent.steps == []


def test_auto_resolves_from_ini_env_cli_and_the_marker():
    from test_settings import FakeConfig

    from pytest_resume_equiv.settings import SettingError, resolve_session, resolve_test

    on = resolve_test(resolve_session(FakeConfig(), env={}), (), {"steps": 6, "split": 3})
    assert on.auto is True and on.sources["auto"] == "default"
    env = {"PYTEST_RESUME_EQUIV_AUTO": "off"}
    off = resolve_test(resolve_session(FakeConfig(), env=env), (), {"steps": 6, "split": 3})
    assert off.auto is False and "PYTEST_RESUME_EQUIV_AUTO" in off.sources["auto"]
    for config in (
        FakeConfig(ini={"resume_equiv_auto": "off"}),
        FakeConfig(cli={"resume_equiv_auto": "off"}),
    ):
        assert (
            resolve_test(resolve_session(config, env={}), (), {"steps": 6, "split": 3}).auto
            is False
        )
    marked = resolve_test(
        resolve_session(FakeConfig(), env=env), (), {"steps": 6, "split": 3, "auto": True}
    )
    assert marked.auto is True and "marker" in marked.sources["auto"]
    try:
        resolve_test(
            resolve_session(FakeConfig(), env={}), (), {"steps": 6, "split": 3, "auto": "no"}
        )
    except SettingError as exc:
        assert "auto" in str(exc) and "True" in str(exc)
    else:
        raise AssertionError("auto='no' was accepted")


def test_a_checkpoint_of_another_step_is_a_finding():
    from pytest_resume_equiv.compare.loaded_step import loaded_step
    from pytest_resume_equiv.signature import Signature

    def sig(counters=None, loaded=None):
        return Signature("x", {"rank": 0}, [], True, counters=counters or {}, loaded=loaded)

    base = {0: sig({s: {"optimizer": s, "lr_scheduler": s} for s in range(1, 7)})}
    right = {0: sig(loaded={"split": 3, "counters": {"optimizer": 3, "lr_scheduler": 3}})}
    wrong = {0: sig(loaded={"split": 3, "counters": {"optimizer": 5, "lr_scheduler": 5}})}
    assert loaded_step(base, right, 3) is None
    finding = loaded_step(base, wrong, 3)
    assert finding is not None and finding.failed
    assert "the checkpoint loaded is of step 5, not step 3" in finding.lines("split 3")[0]
    unknown = {0: sig(loaded={"split": 3, "counters": {"optimizer": 40}})}
    assert loaded_step(base, unknown, 3) is None  # of no step the run had: the comparison says


def test_the_input_ids_are_accounted_as_sample_ids():
    """A resume that trains again on steps 1-3's inputs at steps 4-6 is named from the input
    ids alone (no sample ids recorded), by the steps it replayed."""
    from pytest_resume_equiv.compare.accounting import CONTENT_KEY, account, is_identity_key
    from pytest_resume_equiv.signature import Signature

    def run(data):
        steps = [(s, {CONTENT_KEY: ids}) for s, ids in data.items()]
        return {0: Signature("x", {"rank": 0}, steps, True)}

    base = {s: [10 * s, 10 * s + 1] for s in range(1, 7)}
    replay = {s: base[s - 3] for s in range(4, 7)}
    assert is_identity_key(CONTENT_KEY)
    (exact,) = account(run(base), run({s: base[s] for s in range(4, 7)}), 3, 6)
    assert exact.exact and "every sample consumed exactly once" in exact.text()
    (found,) = account(run(base), run(replay), 3, 6)
    assert "6 samples never seen" in found.text() and "6 samples seen twice" in found.text()
    assert "consumed at steps 4-6 the samples of steps 1-3, in order" in found.text()


def test_the_trainers_own_sample_ids_are_accounted_instead_of_the_input_ids():
    from pytest_resume_equiv.compare.accounting import CONTENT_KEY, identity_keys
    from pytest_resume_equiv.signature import Signature

    both = {0: Signature("x", {"rank": 0}, [(1, {CONTENT_KEY: [5], "sample_ids": [1]})], True)}
    alone = {0: Signature("x", {"rank": 0}, [(1, {CONTENT_KEY: [5]})], True)}
    assert identity_keys(both) == ["sample_ids"] and identity_keys(alone) == [CONTENT_KEY]


def test_a_record_holds_what_was_seen_since_the_last_one_without_a_torch_optimizer(in_rank):
    """A trainer that updates its weights by hand (no optimizer step ever): each record holds
    the losses and inputs of its own step, not everything seen since the start."""

    def train():
        model = Net()
        for step in range(1, 4):
            model(torch.full((2, 4), float(step))).sum().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
            req.record(step, value=step)

    sig = _run(in_rank, train)
    assert [len(v["auto:data"]) for _, v in sig.steps] == [2, 2, 2]
    assert [len(v["auto:loss"]) for _, v in sig.steps] == [1, 1, 1]


def test_after_the_splits_optimizer_step_draws_are_traced_and_saves_labelled(in_rank):
    """The step's line is written at the next iteration's first forward, after the next batch
    was fetched: what comes between the split's optimizer step and that forward (the fetch's
    draws, the save) belongs after the split's step, as after an explicit record(split)."""
    checkpoint = []

    def train():
        checkpoint.append(os.path.join(current().context.run_dir, "step_3.pt"))
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(1, 5):
            x = torch.randn(2, 4)  # the batch fetched: a draw
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            if step == 3:
                torch.save(model.state_dict(), checkpoint[0])

    sig = _run(in_rank, train, split=3)
    point = sig.resume_point(3)
    assert [d["op"] for d in point["draws"]] == ["randn"]  # step 4's batch, before its forward
    saves = [e for e in sig.files if e["path"] == os.path.realpath(checkpoint[0])]
    assert saves and {e["after_step"] for e in saves} == {3}


def test_a_model_trained_in_eval_mode_is_found_with_its_modes(in_rank):
    """Left in eval mode after a validation pass and trained so: still the model (the
    optimizer updates it), audited with its modes; its inputs stay out of the data."""

    def train():
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.eval()
        for _ in range(2):
            model(torch.ones(2, 4)).sum().backward()
            opt.step()

    sig = _run(in_rank, train)
    values = sig.by_step()[1]
    assert "model" in sig.found and values["watch:model.modes"] == ["<root>", "body", "head"]
    assert "auto:data" not in values


def _noised(steps, noise_seed=0, skip=0, prefetch=False):
    """A DataLoader of 8 samples in batches of 2, noise added to each batch in the loop (a
    diffusion trainer's latents): the model's inputs are not the samples."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.arange(32, dtype=torch.float32).reshape(8, 4)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=2)
    noise = torch.Generator().manual_seed(noise_seed)
    iterator = iter(loader)
    for _ in range(skip):  # a resume's skip loop: batches yielded, never given to the model
        next(iterator)
    ahead = next(iterator) if prefetch else None
    for _ in range(steps):
        # accelerate's DataLoaderShard fetches one batch ahead of the one it hands over
        (x,), ahead = (ahead, next(iterator, None)) if prefetch else (next(iterator), None)
        noisy = x + torch.randn(x.shape, generator=noise)
        model(noisy).sum().backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():  # an evaluation, with a loader's batch no training forward takes
            model.eval()
            model(next(iter(loader))[0])
            model.train()


def test_the_batches_a_loader_yielded_are_the_samples_whatever_the_loop_adds(in_rank):
    """`auto:batch`: an id per sample of the batch the DataLoader yielded, the same ids the
    model's inputs would get unchanged; the noise added in the loop changes the inputs
    (`auto:data`), never the batch ids. Skipped and evaluation batches are not taken; a
    loader that fetches ahead gives each step the batch fetched last, in every run alike."""
    base = _run(in_rank, lambda: _noised(3))
    other_noise = _run(in_rank, lambda: _noised(3, noise_seed=1), run_dir=base.path + ".n")
    batch = [v["auto:batch"] for _, v in base.steps]
    data = torch.arange(32, dtype=torch.float32).reshape(8, 4)
    expected = [sample_ids(batch_parts([("0", data[2 * s : 2 * s + 2])])) for s in range(3)]
    assert batch == expected
    assert [v["auto:batch"] for _, v in other_noise.steps] == batch
    assert [v["auto:data"] for _, v in other_noise.steps] != [v["auto:data"] for _, v in base.steps]
    skipped = _run(in_rank, lambda: _noised(2, skip=1), run_dir=base.path + ".s")
    assert [v["auto:batch"] for _, v in skipped.steps] == batch[1:]
    ahead = _run(in_rank, lambda: _noised(3, prefetch=True), run_dir=base.path + ".p")
    assert [v["auto:batch"] for _, v in ahead.steps] == batch[1:] + [
        sample_ids(batch_parts([("0", data[6:8])]))
    ]
    # uninstalled with the rest: a loader outside a run is left as torch made it
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    assert not hasattr(_BaseDataLoaderIter.__next__, "__wrapped__")


def _eval_then_train(saved, resume=False):
    """nanoGPT's loop: at the top of every 3rd iteration an evaluation (eval mode, no_grad)
    runs before the training forward; the state is saved after step 3's eval."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    start = 0
    if resume:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        torch.set_rng_state(saved["rng"])
        start = 3
    for it in range(start, 5):
        if it % 3 == 0:
            model.eval()
            with torch.no_grad():
                model(torch.ones(2, 4))  # the evaluation: not the resume point
            model.train()
            if it == 3 and not resume:
                saved.update(copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()}))
                saved["rng"] = torch.get_rng_state()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_the_resume_point_is_the_first_training_forward_in_both_runs(in_rank, tmp_path):
    """Both runs snapshot the same program point: the first training forward of step split+1
    (an evaluation under no_grad before it is passed over in the resumed run as in the
    uninterrupted one), with the objects named alike (the model found in both), so an exact
    resume shows no difference there."""
    saved = {}
    base = _run(in_rank, lambda: _eval_then_train(saved), run_dir=tmp_path / "base")
    res = _run(
        in_rank,
        lambda: _eval_then_train(saved, resume=True),
        phase="resumed",
        run_dir=tmp_path / "res",
    )
    a, b = base.resume_point(3), res.resume_point(3)
    assert a["at"] == b["at"] and "first forward of Net" in a["at"]
    assert sorted(a["watch"]) == sorted(b["watch"]) and "model.params" in str(sorted(b["watch"]))
    assert a["watch"] == b["watch"] and a["rng"] == b["rng"]


def test_resume_point_calls_mark_the_step_after_the_split(in_rank):
    """A trainer that calls resume_point() at the top of its step, an eval (in eval mode)
    before it: the snapshot of split 3 is taken at the call that starts step 4, with the
    weights of step 3's line, not one step later."""

    def train():
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            model.eval()
            with torch.no_grad():
                model(torch.rand(1, 4))
            model.train()
            req.resume_point()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()

    sig = _run(in_rank, train, split=3, steps=5)
    point = sig.resume_point(3)
    assert point is not None and "test_auto.py" in point["at"]
    assert point["watch"]["model.params"] == sig.by_step()[3]["watch:model.params"]
    # the eval's forward is the window's first: a resumed run whose trace ends at its first
    # forward is compared with the draws before it
    assert [d["op"] for d in point["draws"]] == ["rand", FORWARD]


def test_a_resumed_run_audits_its_loaded_model_at_a_resume_point_before_any_forward(in_rank):
    """resume_point() at the top of the step comes before the model's first forward: the
    model it loaded (the one the optimizer updates, not an EMA) is audited there."""

    def resume():
        model, ema = Net(), Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.load_state_dict(Net().state_dict())
        ema.load_state_dict(model.state_dict())
        for _ in range(2):
            req.resume_point()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()

    sig = _run(in_rank, resume, phase="resumed", split=3)
    point = sig.resume_point(3)
    assert point is not None and "model.params" in point["watch"]
    assert sig.found == ["model", "optimizer"]  # the EMA is no optimizer's


def test_a_forward_under_no_grad_is_no_training_input(in_rank):
    """A loss logged after the step under no_grad, the model still in training mode: no step
    begins there and its inputs are not the next step's data (a resumed run, which did not
    log the step before its first, would read other data at its first step)."""

    def train(log):
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            if log:
                with torch.no_grad():
                    model(torch.full((3, 4), 7.0))

    plain = _run(in_rank, lambda: train(False))
    logged = _run(in_rank, lambda: train(True), run_dir=plain.path + ".logged")
    assert [v["auto:data"] for _, v in logged.steps] == [v["auto:data"] for _, v in plain.steps]


class Fails(torch.nn.Module):
    """A model whose forward raises on a batch with a NaN in it (a trainer's own check)."""

    def __init__(self):
        super().__init__()
        self.net = Net()

    def forward(self, x):
        if torch.isnan(x).any():
            raise ValueError("NaN in the batch")
        return self.net(x)


def test_a_forward_that_raises_reaches_the_trainer_untouched_with_no_warning(in_rank):
    """torch calls an always-called global forward hook without the keyword arguments when the
    forward raised: the recorder's hook must take that call, say nothing, and leave the
    trainer's exception as it was; the steps around it are recorded as usual."""
    import warnings

    def train():
        torch.manual_seed(0)
        model = Fails()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        caught = []
        for step in range(3):
            x = torch.randn(2, 4)
            if step == 1:
                try:
                    model(torch.full((2, 4), float("nan")))
                except ValueError as exc:  # the trainer skips the bad batch
                    caught.append(str(exc))
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        assert caught == ["NaN in the batch"]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the hook's "raised an exception ... silenced" warning
        sig = _run(in_rank, train)
    assert [s for s, _ in sig.steps] == [1, 2, 3]
    assert all(len(v["auto:data"]) == 2 for _, v in sig.steps)  # the failed forward's: none


def test_a_list_of_tensors_is_a_sample_per_item_whatever_their_shapes():
    """A DiT's batch: one latent per sample (their frame counts differ) and a list of text
    embeddings, in a dict, nested in a dataclass; each item is one sample, told by its own
    content and shape, in one batch of 3 or split in two (issue 40)."""
    import dataclasses

    from pytest_resume_equiv.rank.loaded import batch_tensors

    @dataclasses.dataclass
    class Batch:
        inputs: dict
        timesteps: torch.Tensor

    torch.manual_seed(0)
    latents = [torch.randn(4, frames, 2, 2) for frames in (1, 3, 2)]
    text = [torch.randn(tokens, 8) for tokens in (5, 3, 6)]
    steps = torch.tensor([0.1, 0.5, 0.9])

    def ids(lo, hi):
        batch = Batch({"latents": latents[lo:hi], "text": text[lo:hi]}, steps[lo:hi])
        return sample_ids(batch_parts(list(batch_tensors([batch]))))

    whole = ids(0, 3)
    assert len(set(whole)) == 3 and whole == ids(0, 1) + ids(1, 3)
    latents[1] = latents[1].reshape(4, 1, 6, 2)  # the same values in another shape
    assert ids(1, 2) != whole[1:2] and ids(0, 1) == whole[:1]


class Check(torch.nn.Module):
    """No parameters; refuses a batch with a NaN by raising (a trainer skips it)."""

    def forward(self, x):
        if torch.isnan(x).any():
            raise ValueError("corrupt")
        return x


def _noise_first(saved, resume=False):
    """VeOmni's loop: a check module before the model (it raises once, at step 1), then
    noise drawn from a generator of its own before the model's forward, in each of 2
    micro-batches; the state is saved after step 3 (generator included)."""
    torch.manual_seed(0)
    model, check = Net(), Check()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    noise = torch.Generator().manual_seed(7)
    data = torch.Generator().manual_seed(3)
    start = 1
    if resume:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        noise.set_state(saved["noise"])
        data.set_state(saved["data"])
        start = 4
    for step in range(start, 7):
        for micro in range(2):
            x = torch.randn(2, 4, generator=data)
            if step == 1 and micro == 0:
                try:
                    check(torch.full((2, 4), float("nan")))
                except ValueError:
                    pass
            x = check(x) + torch.randn(2, 4, generator=noise)
            model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        if step == 3 and not resume:
            saved.update(
                model=copy.deepcopy(model.state_dict()),
                opt=copy.deepcopy(opt.state_dict()),
                noise=noise.get_state(),
                data=data.get_state(),
            )


def test_noise_drawn_before_the_forward_and_a_forward_that_raised_keep_the_point_aligned(
    in_rank, tmp_path
):
    """The issue 40 report: the uninterrupted run's snapshot came after two micro-batches'
    draws, the resumed run's after one, once a forward had raised. Both runs must snapshot
    the same program point, after the same draws, and record the inputs at every step."""
    saved = {}
    base = _run(in_rank, lambda: _noise_first(saved), run_dir=tmp_path / "base")
    res = _run(
        in_rank, lambda: _noise_first(saved, True), phase="resumed", run_dir=tmp_path / "res"
    )
    a, b = base.resume_point(3), res.resume_point(3)
    assert a["at"] == b["at"] and a["rng"] == b["rng"] and a["watch"] == b["watch"]
    assert all(len(v["auto:data"]) == 4 for _, v in base.steps)  # 2 micro-batches of 2
    assert [v["auto:data"] for s, v in base.steps if s > 3] == [
        v["auto:data"] for _, v in res.steps
    ]


def test_a_watched_scheduler_leaves_the_optimizer_it_steps_audited(in_rank):
    """req.watch(model=..., scheduler=...) beside automatic recording: the scheduler holds
    its optimizer (`.optimizer`) but fingerprints none of its state, so the optimizer the
    trainer built stays in the audit (issue 41, case 4: a lost optimizer state read as
    'computed differently' with the optimizer missing from the gate)."""

    def train():
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        req.watch(model=model, scheduler=sched)
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            sched.step()
            opt.zero_grad()

    sig = _run(in_rank, train)
    keys = sig.by_step()[2]
    assert "watch:optimizer.state" in keys and "watch:scheduler.last_epoch" in keys
