"""Trainers for interrupt="crash" (tests/e2e/test_crash_zoo.py): one loop that finds its latest
complete checkpoint under ctx.checkpoint itself, and savers, correct and broken.

Rank 0 writes the checkpoint (model.pt, optim.pt, meta.json last) while the other ranks wait
at a barrier; data is a function of the step, so the checkpoint is the whole state.
"""

import json
import os
import shutil
import sys
import threading
import time

import torch
import torch.distributed as dist

import pytest_resume_equiv as req


def latest(root, trust_pointer=False):
    """The newest complete checkpoint folder under `root`, or None."""
    pointer = os.path.join(root, "latest")
    if os.path.exists(pointer):
        with open(pointer) as f:
            name = f.read().strip()
        if name and (trust_pointer or os.path.exists(os.path.join(root, name, "meta.json"))):
            return os.path.join(root, name)
    if not os.path.isdir(root):
        return None
    done = [n for n in os.listdir(root) if n.startswith("step_")]
    done = [n for n in done if os.path.exists(os.path.join(root, n, "meta.json"))]
    return os.path.join(root, max(done, key=lambda n: int(n[5:]))) if done else None


def write_step(folder, step, model_state, optim_state):
    os.makedirs(folder, exist_ok=True)
    torch.save(model_state, os.path.join(folder, "model.pt"))
    torch.save(optim_state, os.path.join(folder, "optim.pt"))
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump({"step": step}, f)
        f.flush()
        os.fsync(f.fileno())


def point_to(root, name):
    with open(os.path.join(root, "latest.tmp"), "w") as f:
        f.write(name)
    os.replace(os.path.join(root, "latest.tmp"), os.path.join(root, "latest"))


def save_atomic(root, step, model, opt):
    tmp, final = os.path.join(root, f"tmp-step_{step}"), os.path.join(root, f"step_{step}")
    if os.path.isdir(tmp):  # what a crash left
        shutil.rmtree(tmp)
    write_step(tmp, step, model.state_dict(), opt.state_dict())
    if os.path.isdir(final):  # a resumed run saving where a crash left a complete one
        shutil.rmtree(final)
    os.replace(tmp, final)
    point_to(root, f"step_{step}")


class AsyncPointerFirst:
    """A background save whose `latest` pointer advances as soon as the save starts."""

    def __init__(self):
        self.thread = None

    def __call__(self, root, step, model, opt):
        self.wait()
        states = ({k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict())
        folder = os.path.join(root, f"step_{step}")
        self.thread = threading.Thread(target=write_step, args=(folder, step, *states))
        self.thread.start()
        os.makedirs(root, exist_ok=True)
        point_to(root, f"step_{step}")  # the bug: before the data is on disk

    def wait(self):
        if self.thread is not None:
            self.thread.join()


def find(ctx, root, trust_pointer=False, refuse=False, wait_for_torn=False):
    """Where to resume from (None: from the start); what a trainer does on a torn save."""
    torn = [n for n in os.listdir(root) if n.startswith("tmp-")] if os.path.isdir(root) else []
    found = latest(root, trust_pointer)
    if torn and refuse and found is None:
        sys.exit(f"refusing to start: {root}/{torn[0]} is an incomplete checkpoint")
    while torn and wait_for_torn and ctx.rank == 0:
        time.sleep(0.1)  # "another process is still writing it": it never finishes
    return found


def setup(ctx):
    ctx.init_process_group()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    req.watch(model=model, optimizer=opt)
    return dist.get_rank(), model, opt


def train_step(model, opt, step, rank):
    """One step on data that is a function of the step and the rank; recorded."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(10 * step + rank))
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    opt.step()
    req.record(step, loss=loss.item(), sample_ids=[10 * step + rank])


def load_folder(folder, model, opt):
    """Load the model and the optimizer from a folder's model.pt and optim.pt."""
    model.load_state_dict(torch.load(os.path.join(folder, "model.pt"), weights_only=True))
    opt.load_state_dict(torch.load(os.path.join(folder, "optim.pt"), weights_only=True))


def saved_step(folder):
    """The step a folder's meta.json says it holds."""
    with open(os.path.join(folder, "meta.json")) as f:
        return json.load(f)["step"]


def train_from(ctx, rank, model, opt, start, save_at):
    """The steps after `start`; at each split rank 0 saves (`save_at(step)`) and every rank
    waits for it."""
    for step in range(start + 1, ctx.steps + 1):
        train_step(model, opt, step, rank)
        if step in ctx.splits:
            if rank == 0:
                save_at(step)
            dist.barrier()


def train(ctx, save=save_atomic, **finding):
    rank, model, opt = setup(ctx)
    root = ctx.checkpoint if ctx.resuming else ctx.checkpoint_for(0)
    found = find(ctx, root, **finding)
    dist.barrier()  # a rank that waits for a torn save holds every rank here
    start = 0
    if found:
        load_folder(found, model, opt)
        start = saved_step(found)
    train_from(ctx, rank, model, opt, start, lambda step: save(root, step, model, opt))
    getattr(save, "wait", lambda: None)()
    dist.destroy_process_group()


def train_atomic(ctx):
    train(ctx)


def train_refuses(ctx):
    train(ctx, refuse=True)


def train_waits_for_torn(ctx):
    train(ctx, wait_for_torn=True)


def train_async_pointer_first(ctx):
    train(ctx, save=AsyncPointerFirst(), trust_pointer=True)


def train_dcp_async(ctx):
    """FSDP2 with DCP's async_save, as torchtitan saves: the writes run in DCP's executor
    thread, on a process group of their own, while training goes on; a save is waited for
    before the next one and at the end. A folder is complete once DCP wrote its .metadata."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6 keeps FSDP2 here
        from torch.distributed._composable.fsdp import fully_shard

    ctx.init_process_group()
    saves = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    req.watch(model=model, optimizer=opt)
    root = ctx.checkpoint if ctx.resuming else ctx.checkpoint_for(0)
    done = [n for n in os.listdir(root) if n.startswith("step_")] if os.path.isdir(root) else []
    done = [n for n in done if os.path.exists(os.path.join(root, n, ".metadata"))]
    start = max((int(n[5:]) for n in done), default=0)
    if start:
        model_state, opt_state = get_state_dict(model, opt)
        state = {"model": model_state, "optim": opt_state}
        dcp.load(state, checkpoint_id=os.path.join(root, f"step_{start}"))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    pending = None
    for step in range(start + 1, ctx.steps + 1):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(10 * step + dist.get_rank()))
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        req.record(step, loss=loss.item())
        if step in ctx.splits:
            if pending is not None:
                pending.result()
            model_state, opt_state = get_state_dict(model, opt)
            folder = os.path.join(root, f"step_{step}")
            state = {"model": model_state, "optim": opt_state}
            pending = dcp.async_save(state, checkpoint_id=folder, process_group=saves)
    if pending is not None:
        pending.result()
    dist.destroy_process_group()


def train_staging_race(ctx):
    """pytorch#144657: the background save copies the model but not the optimizer state, and
    writes once the next step has changed it: the checkpoint of step s holds step s+1's
    momentum beside step s's weights."""
    rank, model, opt = setup(ctx)
    start = 0
    if ctx.resuming:
        load_folder(ctx.checkpoint, model, opt)
        start = ctx.split
    staged = None
    for step in range(start + 1, ctx.steps + 1):
        train_step(model, opt, step, rank)
        if staged is not None:  # the write runs now, after this step changed the momentum
            write_step(*staged, opt.state_dict())
            staged = None
        if ctx.should_save(step) and rank == 0:
            model_copy = {k: v.clone() for k, v in model.state_dict().items()}
            staged = (ctx.checkpoint_for(step), step, model_copy)
        dist.barrier()
    dist.destroy_process_group()


# --- One checkpoint file, saved over at every save (issue 43) --------------------------------


def fsync_path(path):
    """Flush a file's or a folder's data to disk (a folder: the names it holds)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def one_file_state(step, model, opt):
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}


def save_over_in_place(root, step, model, opt):
    """The bug: torch.save straight over the one checkpoint file; a kill inside the write
    leaves it torn, and it was the only copy."""
    os.makedirs(root, exist_ok=True)
    torch.save(one_file_state(step, model, opt), os.path.join(root, "ckpt.pt"))


def save_over_by_replace(root, step, model, opt):
    """The control: into a temporary beside it, fsynced, os.replace'd onto it, and the folder
    fsynced: the file is either the old one or the new one, whole."""
    os.makedirs(root, exist_ok=True)
    tmp, final = os.path.join(root, "ckpt.pt.tmp"), os.path.join(root, "ckpt.pt")
    torch.save(one_file_state(step, model, opt), tmp)
    fsync_path(tmp)
    os.replace(tmp, final)
    fsync_path(root)


def train_one_file(ctx, save):
    """Resumes from `ckpt.pt` under the checkpoint root when there is one."""
    rank, model, opt = setup(ctx)
    root = ctx.checkpoint if ctx.resuming else ctx.checkpoint_for(0)
    path = os.path.join(root, "ckpt.pt")
    start = 0
    if os.path.exists(path):
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"]
    train_from(ctx, rank, model, opt, start, lambda step: save(root, step, model, opt))
    dist.destroy_process_group()


def train_saves_over_in_place(ctx):
    train_one_file(ctx, save_over_in_place)


def train_saves_over_by_replace(ctx):
    train_one_file(ctx, save_over_by_replace)


# --- A redone step's rename onto the folder the crash left (issue 43) ------------------------


def save_renamed_then_pointed(root, step, model, opt, clear=False):
    """tmp-step_k, fsync, os.replace to step_k, fsync the root, then move `latest`. Killed
    after the rename and before `latest` moves, a restarted job that resumes from `latest`
    redoes step k, and its os.replace onto the complete step_k fails: Directory not empty.
    `clear` (the control): remove a step_k a crash left before the rename."""
    tmp, final = os.path.join(root, f"tmp-step_{step}"), os.path.join(root, f"step_{step}")
    if os.path.isdir(tmp):
        shutil.rmtree(tmp)
    write_step(tmp, step, model.state_dict(), opt.state_dict())
    if clear and os.path.isdir(final):
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_path(root)
    point_to(root, f"step_{step}")


def save_renamed_then_pointed_clearing(root, step, model, opt):
    save_renamed_then_pointed(root, step, model, opt, clear=True)


def from_pointer(root):
    """The folder `latest` names when it is complete, else None: start over."""
    found = latest(root) if os.path.exists(os.path.join(root, "latest")) else None
    return found if found and os.path.basename(found) != "latest" else None


def train_from_pointer(ctx, save, one_root):
    """Resumes from the checkpoint root it is given (`{checkpoint}`) and saves under its own
    `{run_dir}`, as a trainer with --resume-from and --output-dir does; `one_root`: saves
    into the root it resumed from too."""
    rank, model, opt = setup(ctx)
    given = ctx.checkpoint if ctx.resuming else ctx.checkpoint_for(0)
    root = given if one_root else os.path.join(ctx.run_dir, "checkpoints")
    found = from_pointer(given)
    start = 0
    if found:
        load_folder(found, model, opt)
        start = saved_step(found)

    def save_at(step):
        os.makedirs(root, exist_ok=True)
        save(root, step, model, opt)

    train_from(ctx, rank, model, opt, start, save_at)
    dist.destroy_process_group()


def train_renames_onto_what_the_crash_left(ctx):
    train_from_pointer(ctx, save_renamed_then_pointed, one_root=False)


def train_renames_onto_what_the_crash_left_one_root(ctx):
    train_from_pointer(ctx, save_renamed_then_pointed, one_root=True)


def train_renames_after_clearing(ctx):
    train_from_pointer(ctx, save_renamed_then_pointed_clearing, one_root=False)


# --- Power loss: what was not fsynced is rolled back (issue 43) ------------------------------


def save_renamed_without_fsync(root, step, model, opt):
    """The bug: a temporary renamed onto the one checkpoint file, atomic against a kill, with
    no fsync of the file nor of its folder: after a power loss the rename is undone, and the
    file's data may never have reached the disk."""
    os.makedirs(root, exist_ok=True)
    tmp, final = os.path.join(root, "ckpt.pt.tmp"), os.path.join(root, "ckpt.pt")
    torch.save(one_file_state(step, model, opt), tmp)
    os.replace(tmp, final)


def train_renames_without_fsync(ctx):
    train_one_file(ctx, save_renamed_without_fsync)


def save_pointer_not_fsynced(root, step, model, opt):
    """Each step folder durable (its files and the folder fsynced, renamed into place, the
    root fsynced), then `latest` written and fsynced and os.replace'd into place, the bug:
    without an fsync of the root, then the older folders deleted. After a power loss the
    rename of `latest` is undone: it names the folder the save deleted."""
    tmp, final = os.path.join(root, f"tmp-step_{step}"), os.path.join(root, f"step_{step}")
    if os.path.isdir(tmp):
        shutil.rmtree(tmp)
    write_step(tmp, step, model.state_dict(), opt.state_dict())
    for name in ("model.pt", "optim.pt"):
        fsync_path(os.path.join(tmp, name))
    fsync_path(tmp)
    os.replace(tmp, final)
    fsync_path(root)
    with open(os.path.join(root, "latest.tmp"), "w") as f:
        f.write(f"step_{step}")
        f.flush()
        os.fsync(f.fileno())
    os.replace(os.path.join(root, "latest.tmp"), os.path.join(root, "latest"))
    for name in os.listdir(root):
        if name.startswith("step_") and name != f"step_{step}":
            shutil.rmtree(os.path.join(root, name))


def train_pointer_not_fsynced(ctx):
    train(ctx, save=save_pointer_not_fsynced, trust_pointer=True)


# --- A marker written last, in place or by rename (issue 43) ---------------------------------


def save_then_mark(root, step, model, opt, by_rename=False):
    """step_k/{model.pt, optim.pt}, then the marker `step` that names the newest, written
    last. The bug: written in place, it exists (empty) between open() and the write; the
    control (`by_rename`) writes it to step.tmp and os.replaces it."""
    folder = os.path.join(root, f"step_{step}")
    os.makedirs(folder, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
    torch.save(opt.state_dict(), os.path.join(folder, "optim.pt"))
    marker = os.path.join(root, "step")
    with open(marker + ".tmp" if by_rename else marker, "w") as f:
        f.write(str(step))
    if by_rename:
        os.replace(marker + ".tmp", marker)


def save_then_mark_by_rename(root, step, model, opt):
    save_then_mark(root, step, model, opt, by_rename=True)


def train_from_marker(ctx, save):
    """Resumes from the folder the marker `step` names, when there is a marker."""
    rank, model, opt = setup(ctx)
    root = ctx.checkpoint if ctx.resuming else ctx.checkpoint_for(0)
    marker = os.path.join(root, "step")
    start = 0
    if os.path.exists(marker):
        with open(marker) as f:
            start = int(f.read())
        load_folder(os.path.join(root, f"step_{start}"), model, opt)
    train_from(ctx, rank, model, opt, start, lambda step: save(root, step, model, opt))
    dist.destroy_process_group()


def train_marks_in_place(ctx):
    train_from_marker(ctx, save_then_mark)


def train_marks_by_rename(ctx):
    train_from_marker(ctx, save_then_mark_by_rename)


# --- The newest step folder, and A/B slots (issue 43) ----------------------------------------


def newest_folder(root, marked):
    """The step_k under `root` with the largest k; `marked`: only those whose meta.json is
    there (written last, by rename), else whatever the newest folder holds."""
    names = [n for n in os.listdir(root) if n.startswith("step_")] if os.path.isdir(root) else []
    if marked:
        names = [n for n in names if os.path.exists(os.path.join(root, n, "meta.json"))]
    return os.path.join(root, max(names, key=lambda n: int(n[5:]))) if names else None


def save_into_step_folder(root, step, model, opt):
    """step_k/{model.pt, optim.pt}, then meta.json by rename: a folder is complete once its
    meta.json is there."""
    folder = os.path.join(root, f"step_{step}")
    os.makedirs(folder, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
    torch.save(opt.state_dict(), os.path.join(folder, "optim.pt"))
    meta = os.path.join(folder, "meta.json")
    with open(meta + ".tmp", "w") as f:
        json.dump({"step": step}, f)
    os.replace(meta + ".tmp", meta)


def train_newest(ctx, marked):
    """Resumes from the newest step folder (`marked`: the newest with a meta.json): the bug
    resumes from one a crash left half written."""
    rank, model, opt = setup(ctx)
    root = ctx.checkpoint if ctx.resuming else ctx.checkpoint_for(0)
    found = newest_folder(root, marked)
    start = 0
    if found:
        load_folder(found, model, opt)
        start = int(os.path.basename(found)[5:])
    save_at = lambda step: save_into_step_folder(root, step, model, opt)  # noqa: E731
    train_from(ctx, rank, model, opt, start, save_at)
    dist.destroy_process_group()


def train_newest_folder(ctx):
    train_newest(ctx, marked=False)


def train_newest_marked_folder(ctx):
    train_newest(ctx, marked=True)


def save_to_slot(root, step, model, opt):
    """A/B slots: the slot `latest` does not name is written over in place (model.pt,
    optim.pt, meta.json, fsynced), then `latest` moves to it by rename: a kill inside the
    write tears only the slot no one reads."""
    pointer = os.path.join(root, "latest")
    current = open(pointer).read().strip() if os.path.exists(pointer) else "b"
    slot = os.path.join(root, "a" if current == "b" else "b")
    write_step(slot, step, model.state_dict(), opt.state_dict())
    for name in ("model.pt", "optim.pt"):
        fsync_path(os.path.join(slot, name))
    with open(pointer + ".tmp", "w") as f:
        f.write(os.path.basename(slot))
        f.flush()
        os.fsync(f.fileno())
    os.replace(pointer + ".tmp", pointer)
    fsync_path(root)


def train_ab_slots(ctx):
    """Resumes from the slot `latest` names."""
    rank, model, opt = setup(ctx)
    root = ctx.checkpoint if ctx.resuming else ctx.checkpoint_for(0)
    os.makedirs(root, exist_ok=True)
    pointer = os.path.join(root, "latest")
    start = 0
    if os.path.exists(pointer):
        slot = os.path.join(root, open(pointer).read().strip())
        load_folder(slot, model, opt)
        start = saved_step(slot)
    train_from(ctx, rank, model, opt, start, lambda step: save_to_slot(root, step, model, opt))
    dist.destroy_process_group()


# --- A resume bug that is no crash's (issue 43) ----------------------------------------------


def train_forgets_the_optimizer(ctx):
    """The atomic saver, and a resume that loads the model but not the optimizer: every
    point fails, the complete checkpoint's too, and no torn checkpoint is to blame."""
    rank, model, opt = setup(ctx)
    root = ctx.checkpoint if ctx.resuming else ctx.checkpoint_for(0)
    found = find(ctx, root)
    start = 0
    if found:
        model.load_state_dict(torch.load(os.path.join(found, "model.pt"), weights_only=True))
        start = saved_step(found)
    train_from(ctx, rank, model, opt, start, lambda step: save_atomic(root, step, model, opt))
    dist.destroy_process_group()
