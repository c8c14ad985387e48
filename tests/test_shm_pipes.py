"""A pipeline's sends and receives through this host's shared memory (``training.shm.pipes``): the
bytes arrive whole and in order, however small the ring; a peer out of step or gone is an
error, not a hang; a host without room falls back to gloo; nothing is left in /dev/shm."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_shm_collectives import left_behind

from ddlstudy.training.distributed import free_port
from ddlstudy.training.shm import file as shm_file
from ddlstudy.training.shm import pipes
from ddlstudy.training.shm.average import SHM_DIR

pytestmark = pytest.mark.skipif(pipes.usable() != "", reason=pipes.usable())


def _rank(rank, world, port, ring, mode, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    pipes.register()
    if mode == "fail1" and rank == 1:  # this rank cannot open the doorbells; rank 0 can
        def refuse(path, flags, *mode):
            if str(path).endswith(".bell"):
                raise PermissionError(13, "refused", str(path))
            return opened(path, flags, *mode)
        opened, shm_file.os.open = shm_file.os.open, refuse
    group = dist.new_group(list(range(world)), backend=pipes.BACKEND,
                           pg_options=pipes.PipesOptions(ring),
                           timeout=timedelta(seconds=3))
    peer = 1 - rank
    result = {"shared": isinstance(group, pipes.HostPipes)}
    try:
        if mode in ("stream", "fail1"):  # both send first: 12x the ring, then 3 smaller ones
            sizes = [3_000_000, 7, 1, 65_537]
            sends = [dist.isend(torch.arange(n, dtype=torch.float32) * (rank + 1), group=group,
                                group_dst=peer) for n in sizes]
            got = [torch.empty(n) for n in sizes]
            recvs = [dist.irecv(t, group=group, group_src=peer) for t in got]
            for w in sends + recvs:
                w.wait()
            result["ok"] = all(torch.equal(t, torch.arange(len(t), dtype=torch.float32)
                                           * (peer + 1)) for t in got)
        elif mode == "mismatch":  # rank 0 sends 5 floats where rank 1 expects 6
            if rank == 0:
                dist.isend(torch.ones(5), group=group, group_dst=1).wait()
            else:
                dist.irecv(torch.empty(6), group=group, group_src=0).wait()
        elif mode == "gone" and rank == 0:  # rank 1 never sends
            dist.irecv(torch.empty(4), group=group, group_src=1).wait()
    except RuntimeError as exc:
        result["error"] = str(exc)
    torch.save(result, out / f"{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def _spawn(tmp_path, ring, mode):
    before = set(SHM_DIR.glob("ddlstudy-pipes-*"))
    mp.start_processes(_rank, args=(2, free_port(), ring, mode, tmp_path), nprocs=2,
                       start_method="spawn")
    assert not left_behind(before, "ddlstudy-pipes-*")  # unlinked once opened
    return [torch.load(tmp_path / f"{r}.pt") for r in range(2)]


def test_messages_larger_than_the_ring_arrive_whole_and_in_order(tmp_path):
    results = _spawn(tmp_path, 1 << 20, "stream")
    assert all(r["shared"] and r["ok"] for r in results), results


def test_a_host_without_room_falls_back_to_gloo(tmp_path):
    results = _spawn(tmp_path, 1 << 52, "stream")  # 4 PiB a ring: no tmpfs holds that
    assert [r["shared"] for r in results] == [False, False]
    assert all(r["ok"] for r in results)


def test_one_rank_that_cannot_open_sends_every_rank_to_gloo(tmp_path):
    results = _spawn(tmp_path, 1 << 20, "fail1")
    assert [r["shared"] for r in results] == [False, False]
    assert all(r["ok"] for r in results)


def test_a_message_out_of_step_is_named(tmp_path):
    results = _spawn(tmp_path, 1 << 20, "mismatch")
    assert results[1]["error"] == ("rank 1 expected 24 bytes from rank 0 and was sent 20: "
                                   "the ranks' sends and receives are out of step")


def test_a_peer_that_never_sends_ends_the_wait_at_the_timeout(tmp_path):
    results = _spawn(tmp_path, 1 << 20, "gone")
    assert results[0]["error"].startswith("rank 0 waited 3 s for rank 1 to send")


def test_rings_join_neighbours_only():
    assert pipes.neighbours(2) == [(0, 1), (1, 0)]
    four = pipes.neighbours(4)
    assert len(four) == 8 and (0, 3) in four and (3, 0) in four and (0, 2) not in four


def test_ring_bytes_hold_the_messages_in_flight_within_bounds():
    assert pipes.ring_bytes(300_000, 5) == -(-5 * (300_000 + 64) // 4096) * 4096
    assert pipes.ring_bytes(10, 2) == 1 << 20
    assert pipes.ring_bytes(10**9, 5) == 1 << 26
