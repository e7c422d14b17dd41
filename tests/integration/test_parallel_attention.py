"""Sequence-parallel attention against single-process SDPA, on real gloo process groups.

Four worker processes are spawned once for the module and reused by every case: P = 4 runs
on the default group, P = 2 on the subgroups {0, 1} and {2, 3} at once (so group ranks
differ from global ranks on the second pair), P = 1 on one-rank groups. Every rank builds
the same full q, k, v from one seed, computes the reference on the full sequence, runs the
distributed function on its shard and sends both back; the parent compares them per rank.
"""

from __future__ import annotations

import os
import queue
import socket
import time
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from support.common import rank_context

from swift_nb.parallel import gather_sequence, ring_attention, shard_sequence, ulysses_attention

WORLD = 4
CASE_TIMEOUT_S = 30.0
RTOL, ATOL = 1e-5, 1e-6


class WorkerDiedError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pool:
    """``world`` ranks of one gloo group, each running the cases it is sent until told to stop."""

    def __init__(self, world: int) -> None:
        ctx = rank_context()
        self.world, self.next_id, self.broken = world, 0, ""
        self.inboxes = [ctx.Queue() for _ in range(world)]
        self.results = ctx.Queue()
        port = _free_port()
        self.procs = [
            ctx.Process(target=_worker, args=(r, world, port, self.inboxes[r], self.results), daemon=True)
            for r in range(world)
        ]
        for p in self.procs:
            p.start()

    def run(self, **case) -> list[tuple]:
        """Every rank's result for ``case``, by rank: ("ok", value) or ("error", type, message)."""
        if self.broken:
            pytest.fail(f"the worker pool is unusable after an earlier case: {self.broken}")
        case["id"], self.next_id = self.next_id, self.next_id + 1
        for inbox in self.inboxes:
            inbox.put(case)
        results: dict[int, tuple] = {}
        deadline = time.monotonic() + CASE_TIMEOUT_S
        while len(results) < self.world:
            try:
                case_id, rank, result = self.results.get(timeout=0.2)
            except queue.Empty:
                dead = [
                    f"rank {r} (exit code {p.exitcode})" for r, p in enumerate(self.procs) if not p.is_alive()
                ]
                if dead:
                    self.broken = f"worker {', '.join(dead)} died during case {case}"
                    raise WorkerDiedError(self.broken) from None
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self.world)) - set(results))
                    self.broken = f"ranks {missing} gave no result within {CASE_TIMEOUT_S} s for case {case}"
                    pytest.fail(self.broken)
                continue
            assert case_id == case["id"], f"rank {rank} answered case {case_id} during case {case['id']}"
            results[rank] = result
        return [results[r] for r in range(self.world)]

    def close(self) -> None:
        """Stop the workers: politely if they are all waiting for a case, at once otherwise
        (after a death the others may be stuck in a collective until the gloo timeout)."""
        if not self.broken:
            for inbox in self.inboxes:
                inbox.put(None)
            deadline = time.monotonic() + 10
            for p in self.procs:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)


@pytest.fixture(scope="module")
def pools():
    """Holds the module's worker pool; stops it after the module's last test."""
    holder: dict[str, Pool] = {}
    yield holder
    if "pool" in holder:
        holder["pool"].close()


@pytest.fixture
def pool(pools: dict[str, Pool]) -> Pool:
    """The module's pool, started on first use and again after a case broke it."""
    if "pool" not in pools or pools["pool"].broken:
        if "pool" in pools:
            pools["pool"].close()
        pools["pool"] = Pool(WORLD)
    return pools["pool"]


# ---- worker side ----


def _worker(rank: int, world: int, port: int, inbox, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    # new_group is collective: every rank creates every group, in the same order.
    singles = [dist.new_group([r]) for r in range(world)]
    groups = {1: singles[rank], world: None}
    others = {}
    if world == 4:
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        groups[2], others[2] = pairs[rank // 2], pairs[1 - rank // 2]
    while (case := inbox.get()) is not None:
        try:
            result = ("ok", CASES[case["kind"]](case, groups, others))
        except Exception as e:
            result = ("error", type(e).__name__, str(e))
        results.put((case["id"], rank, result))
    dist.destroy_process_group()
    # The parent has every result already; skipping the interpreter's teardown of torch saves
    # seconds per worker on a busy 2-core machine.
    os._exit(0)


FUNCS = {"ulysses": ulysses_attention, "ring": ring_attention}


def _compare(case: dict, groups: dict, others: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(distributed, reference) for this rank's output and gradient shards and the gathered output."""
    b, h, s, d = case["shape"]
    causal, group = case["causal"], groups[case["p"]]
    kwargs = {"causal": causal, "scale": case.get("scale")}
    if "chunk_size" in case:
        kwargs["chunk_size"] = case["chunk_size"]
    gen = torch.Generator().manual_seed(1234)  # the same full tensors on every rank
    q, k, v, dout = (torch.randn(b, h, s, d, generator=gen) for _ in range(4))

    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, is_causal=causal, scale=kwargs["scale"])
    ref.backward(dout)

    local = [shard_sequence(t, group).clone().requires_grad_() for t in (q, k, v)]
    out = FUNCS[case["fn"]](*local, group=group, **kwargs)
    out.backward(shard_sequence(dout, group))

    pairs = {"out": (out, shard_sequence(ref, group)), "gathered out": (gather_sequence(out, group), ref)}
    for name, mine, theirs in zip(("dq", "dk", "dv"), local, full, strict=True):
        pairs[name] = (mine.grad, shard_sequence(theirs.grad, group))
    return {name: (a.detach().numpy(), b.detach().numpy()) for name, (a, b) in pairs.items()}


def _bad_call(case: dict, groups: dict, others: dict) -> None:
    """Call with the bad argument named by ``case["bad"]``; returning means nothing was raised."""
    group = groups[case.get("p", WORLD)]
    shape = case.get("shape", (1, 4, 8, 4))
    q, k, v = (torch.randn(shape) for _ in range(3))
    fn = FUNCS[case["fn"]]
    kwargs = {}
    match case["bad"]:
        case "heads":
            pass
        case "shape":
            k = torch.randn(1, 4, 6, 4)
        case "dtype":
            v = v.double()
        case "device":
            k = k.to("meta")
        case "ndim":
            q, k, v = q[0], k[0], v[0]
        case "chunk_size":
            kwargs["chunk_size"] = case["value"]
        case "not_member":
            group = others[2]
        case "shard":
            shard_sequence(torch.randn(1, 4, 30, 4), group)
            return
    fn(q, k, v, group=group, **kwargs)


def _exit(case: dict, groups: dict, others: dict) -> None:
    """Rank ``case["rank"]`` dies; the others wait for it in a barrier."""
    if dist.get_rank() == case["rank"]:
        os._exit(3)
    dist.barrier()


CASES = {"compare": _compare, "bad": _bad_call, "exit": _exit}


# ---- parent side ----


def _compare_cases():
    for p in (2, 4):
        for causal in (False, True):
            for s in (32, 64):
                shape = (2, 4, s, 16)
                yield {"fn": "ulysses", "p": p, "causal": causal, "shape": shape}
                yield {"fn": "ring", "p": p, "causal": causal, "shape": shape}
                yield {"fn": "ring", "p": p, "causal": causal, "shape": shape, "chunk_size": 4}
            # Ragged last chunk (shard 24 or 12, chunk 5); 2 heads, fewer than ranks for P = 4.
            yield {"fn": "ring", "p": p, "causal": causal, "shape": (3, 2, 48, 8), "chunk_size": 5}
    for fn in FUNCS:
        yield {"fn": fn, "p": 1, "causal": True, "shape": (2, 4, 32, 16)}
        yield {"fn": fn, "p": 4, "causal": True, "shape": (2, 4, 32, 16), "scale": 0.3}
        yield {"fn": fn, "p": 2, "causal": False, "shape": (1, 4, 16, 16), "scale": 0.3}


def _case_id(case: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in case.items()).replace(" ", "")


@pytest.mark.parametrize("case", list(_compare_cases()), ids=_case_id)
def test_matches_single_process_sdpa(pool: Pool, case: dict) -> None:
    for rank, result in enumerate(pool.run(kind="compare", **case)):
        assert result[0] == "ok", f"rank {rank} raised {result[1]}: {result[2]}"
        for name, (got, want) in result[1].items():
            torch.testing.assert_close(
                torch.from_numpy(got),
                torch.from_numpy(want),
                rtol=RTOL,
                atol=ATOL,
                msg=lambda m, rank=rank, name=name: f"rank {rank}, {name}: {m}",
            )


BAD = [
    (
        {"fn": "ulysses", "bad": "heads", "shape": (1, 6, 8, 4)},
        "ValueError",
        "ulysses_attention: the number of heads (6) must be divisible by the group size (4); "
        "use ring_attention or a group size that divides 6",
    ),
    (
        {"fn": "ring", "bad": "shape"},
        "ValueError",
        "ring_attention: q, k and v must have the same shape; got q=(1, 4, 8, 4), k=(1, 4, 6, 4), v=(1, 4, 8, 4)",
    ),
    (
        {"fn": "ulysses", "bad": "dtype"},
        "ValueError",
        "ulysses_attention: q, k and v must have the same dtype; got q=torch.float32, k=torch.float32, v=torch.float64",
    ),
    (
        {"fn": "ring", "bad": "device"},
        "ValueError",
        "ring_attention: q, k and v must have the same device; got q=cpu, k=meta, v=cpu",
    ),
    (
        {"fn": "ulysses", "bad": "ndim"},
        "ValueError",
        "ulysses_attention: q must be 4-D [batch, heads, seq_shard, head_dim]; got shape (4, 8, 4)",
    ),
    (
        {"fn": "ring", "bad": "chunk_size", "value": 0},
        "ConfigError",
        "chunk_size must be a positive number of tokens, or None for the whole shard; got 0",
    ),
    (
        {"fn": "ring", "bad": "chunk_size", "value": 2.5},
        "ConfigError",
        "chunk_size must be a positive number of tokens, or None for the whole shard; got 2.5",
    ),
    (
        {"fn": "ring", "bad": "chunk_size", "value": True},
        "ConfigError",
        "chunk_size must be a positive number of tokens, or None for the whole shard; got True",
    ),
    (
        {"fn": "ring", "bad": "not_member"},
        "ValueError",
        "ring_attention: this process (global rank {rank}) is not a member of `group`",
    ),
    (
        {"fn": "ring", "bad": "shard"},
        "ValueError",
        "shard_sequence: the sequence length (30) must be divisible by the group size (4); pad the sequence to a multiple of 4",
    ),
]


@pytest.mark.parametrize(("case", "kind", "message"), BAD, ids=[f"{c['fn']}-{c['bad']}" for c, _, _ in BAD])
def test_bad_call_raises_on_every_rank(pool: Pool, case: dict, kind: str, message: str) -> None:
    for rank, result in enumerate(pool.run(kind="bad", **case)):
        assert result[0] == "error", f"rank {rank} raised nothing"
        assert result[1] == kind, f"rank {rank} raised {result[1]}: {result[2]}"
        assert result[2].startswith(message.format(rank=rank)), f"rank {rank}: {result[2]}"
    # No rank entered a collective before raising: the group still works.
    sanity = {"fn": case["fn"], "p": WORLD, "causal": True, "shape": (1, 4, 8, 4)}
    assert all(r[0] == "ok" for r in pool.run(kind="compare", **sanity))


def test_not_initialised_says_how_to_initialise() -> None:
    if dist.is_initialized():
        pytest.skip("this process has a default process group")
    q = torch.randn(1, 2, 4, 4)
    for fn, name in ((ulysses_attention, "ulysses_attention"), (ring_attention, "ring_attention")):
        with pytest.raises(ValueError, match=rf"^{name}: torch.distributed is not initialised: call "):
            fn(q, q, q)


def test_a_dead_worker_fails_the_case_instead_of_hanging(pool: Pool) -> None:
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=r"rank 1 \(exit code 3\)"):
        pool.run(kind="exit", rank=1)
    assert time.monotonic() - start < CASE_TIMEOUT_S
    pool.close()
    assert not any(p.is_alive() for p in pool.procs)
