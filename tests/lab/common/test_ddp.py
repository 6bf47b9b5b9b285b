"""Two CPU processes (gloo) train to the same weights as one process with the same global batch, also when a
signal stops them midway and they resume."""

import json
import os
import runpy
import socket
import subprocess
import sys
import textwrap

import torch

from posenc.lab.common import checkpoint as ckpt
from posenc.lab.common.gpt import GPT
from posenc.lab.common.train import CHECKPOINT_FILE, DONE_FILE, METRICS_FILE, load_checkpoint, train

# Run as a script by each rank, and loaded with runpy by the test for the single-process reference.
WORKER = textwrap.dedent(
    """
    import sys

    import torch

    from posenc.lab.common import dist
    from posenc.lab.common.gpt import GPT, ModelConfig
    from posenc.lab.common.train import TrainConfig, rank_rows, step_generator, train

    LENGTH, BATCH = 16, 6
    MODEL = ModelConfig(dim=32, n_layers=1, n_heads=2, max_len=LENGTH, encoding="alibi")
    CFG = TrainConfig(steps=6, batch_size=BATCH, length=LENGTH, lr=1e-2, warmup=1, log_every=3, checkpoint_every=3)


    def batch_fn(step, rank, world):
        g = step_generator(CFG.seed, step)
        seq = torch.randint(97, 105, (BATCH, LENGTH + 1), generator=g)  # (B, L + 1), the global batch
        # each row scores a different number of targets, so ranks hold unequal shares of the loss
        mask = torch.arange(LENGTH)[None, :] >= torch.arange(BATCH)[:, None] * 2  # (B, L)
        rows = rank_rows(BATCH, rank, world)
        return seq[rows, :-1], seq[rows, 1:], mask[rows]


    if __name__ == "__main__":
        torch.set_num_threads(1)
        train(GPT(MODEL, seed=CFG.seed).double(), batch_fn, CFG, sys.argv[1], progress=False)
        dist.cleanup()
    """
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    run_dir = tmp_path / "ddp"
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(run_dir)],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for r, (p, out) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, f"rank {r} failed:\n{out}"

    worker = runpy.run_path(str(script))  # not __main__: defines the same batch_fn and configs
    single = GPT(worker["MODEL"], seed=worker["CFG"].seed).double()
    summary = train(single, worker["batch_fn"], worker["CFG"], tmp_path / "single", progress=False)

    ddp = GPT(worker["MODEL"]).double()
    load_checkpoint(run_dir / CHECKPOINT_FILE, model=ddp, restore_rng=False)
    for name, value in single.state_dict().items():
        # gloo sums the ranks' gradients in another order than one process does, and Adam divides by sqrt(v) + eps:
        # a gradient that is only rounding noise gets a step of up to lr, in float32 on some CPUs. In float64 that
        # noise (~n u64 |g| ~ 1e-15 for gradients of order 1) stays far below eps (1e-8): a step differs by at most
        # lr 1e-15 / 1e-8 = 1e-9, six steps by 6e-9. Normalising the loss per rank instead of by the global count of
        # scored targets moves the weights by about 3e-2.
        torch.testing.assert_close(ddp.state_dict()[name], value, rtol=0, atol=1e-8, msg=name)
    assert not torch.allclose(GPT(worker["MODEL"]).double().blocks[0].attn.qkv.weight, single.blocks[0].attn.qkv.weight)
    for f in (CHECKPOINT_FILE, DONE_FILE, METRICS_FILE):
        assert (run_dir / f).is_file(), f
    ddp_lines = (run_dir / METRICS_FILE).read_text().splitlines()
    assert len(ddp_lines) == 2  # rank 0 alone writes metrics
    done = json.loads((run_dir / DONE_FILE).read_text())
    assert abs(done["final_loss"] - summary["final_loss"]) < 1e-5


def launch(script, run_dir, *args):
    """Both ranks of ``script run_dir *args``; returns ``[(returncode, output)]`` per rank."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
           "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(run_dir), *args],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, out) for p, out in zip(procs, outputs, strict=True)]


# Rank ``argv[2]`` alone gets SIGTERM while it makes the batch of step 1 (torchrun signals every rank; here the
# other must learn of it from the flag the ranks share at the next log step).
INTERRUPTED = WORKER.split('if __name__ == "__main__":')[0] + textwrap.dedent(
    """
    import dataclasses
    import os
    import signal


    def signalled(step, rank, world):
        if step == 1 and rank == int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGTERM)
        return batch_fn(step, rank, world)


    if __name__ == "__main__":
        torch.set_num_threads(1)
        try:
            cfg = dataclasses.replace(CFG, checkpoint_every=0)  # the checkpoint found is the signal's
            train(GPT(MODEL, seed=CFG.seed).double(), signalled, cfg, sys.argv[1], progress=False)
        except KeyboardInterrupt:
            print("stopped")
            sys.exit(130)
        print("finished")
    """
)


def test_a_signal_to_one_rank_stops_every_rank_at_the_same_log_step(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "interrupted.py").write_text(INTERRUPTED)
    run_dir = tmp_path / "ddp"
    for r, (code, out) in enumerate(launch(tmp_path / "interrupted.py", run_dir, "1")):
        assert code == 130 and "stopped" in out, f"rank {r}:\n{out}"
    assert int(ckpt.read_checkpoint(run_dir / CHECKPOINT_FILE)[0]["step"]) == 3  # log_every=3: the first log step
    assert not (run_dir / DONE_FILE).exists() and len((run_dir / METRICS_FILE).read_text().splitlines()) == 1

    for r, (code, out) in enumerate(launch(tmp_path / "worker.py", run_dir)):
        assert code == 0, f"rank {r} failed:\n{out}"
    worker = runpy.run_path(str(tmp_path / "worker.py"))
    single = GPT(worker["MODEL"], seed=worker["CFG"].seed).double()
    train(single, worker["batch_fn"], worker["CFG"], tmp_path / "single", progress=False)
    ddp = GPT(worker["MODEL"]).double()
    load_checkpoint(run_dir / CHECKPOINT_FILE, model=ddp, restore_rng=False)
    for name, value in ddp.state_dict().items():
        torch.testing.assert_close(value, single.state_dict()[name], rtol=0, atol=1e-8, msg=name)  # as above
    assert len((run_dir / METRICS_FILE).read_text().splitlines()) == 2
