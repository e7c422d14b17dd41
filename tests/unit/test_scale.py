"""swift_nb.scale's parts on a recorded run and hand-built links: the links' α–β arithmetic
(nccl-tests' bus bandwidth), the gradients' ready order read from a real trace, DDP's
buckets and what the backward hides of them, FSDP's collectives, and every bad argument
refused before any work."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import swift_nb
from swift_nb.analysis import scale as scale_pkg
from swift_nb.analysis.scale import backward_of
from swift_nb.analysis.scale.backward import Backward, micro_batches
from swift_nb.analysis.scale.model import FIRST_BUCKET_BYTES, MIB, Basis, buckets, ddp, fsdp
from swift_nb.analysis.trace.tables import load_trace
from swift_nb.capture.resources.link import fit
from swift_nb.core.errors import ConfigError
from swift_nb.core.links import PRESETS, Fit, Link, check_link, hops, link_of, wire_bytes

COST_RUN = Path(__file__).parents[1] / "data" / "cost_run"


@pytest.fixture(scope="module")
def run() -> swift_nb.Run:
    return swift_nb.load_run(COST_RUN)


def _link(busbw: float, hop_s: float = 0.0, overlap: float = 1.0) -> Link:
    f = Fit(hop_s, busbw)
    return Link("test", {"all_reduce": f, "all_gather": f, "reduce_scatter": f}, overlap=overlap)


def _backward(sizes: list[float], ready: list[float], optimizer_share: float = 0.1) -> Backward:
    grads = pd.DataFrame({"bytes": sizes, "dtype_bytes": 4.0, "ready_share": ready})
    return Backward(grads, max(ready), optimizer_share, 1)


# -- links ---------------------------------------------------------------------------------


def test_wire_bytes_and_hops_are_the_ring_algorithms():
    assert wire_bytes("all_reduce", 100.0, 8) == pytest.approx(2 * 7 / 8 * 100)
    assert wire_bytes("all_gather", 100.0, 8) == pytest.approx(7 / 8 * 100)
    assert wire_bytes("reduce_scatter", 100.0, 4) == pytest.approx(3 / 4 * 100)
    assert wire_bytes("all_reduce", 100.0, 1) == 0.0
    assert (hops("all_reduce", 8), hops("all_gather", 8), hops("all_reduce", 1)) == (14, 7, 0)


def test_a_collective_costs_its_hops_latency_and_its_wire_bytes_over_the_bus_bandwidth():
    link = _link(busbw=1e9, hop_s=1e-5)
    # 8 ranks, 1 GB all-reduce: 14 hops × 10 µs + 1.75 GB / 1 GB/s
    assert link.seconds("all_reduce", 1e9, 8) == pytest.approx(14e-5 + 1.75)
    assert link.seconds("all_reduce", 1e9, 1) == 0.0


def test_presets_are_what_nccl_reaches_and_unknown_links_are_refused():
    assert set(PRESETS) == {"nvlink4", "nvlink5", "pcie4", "pcie5", "ib-ndr"}
    assert PRESETS["nvlink4"].busbw == pytest.approx(370e9)
    assert PRESETS["pcie4"].busbw < PRESETS["ib-ndr"].busbw < PRESETS["pcie5"].busbw
    assert link_of("NVLink4") is PRESETS["nvlink4"]
    with pytest.raises(ConfigError) as e:
        link_of("infiniband")
    assert e.value.param == "link" and "nvlink4" in str(e.value)


def test_a_job_across_nodes_runs_at_the_slower_link():
    both = PRESETS["nvlink4"].across(PRESETS["ib-ndr"])
    assert both.busbw == pytest.approx(45e9)
    assert both.fit("all_gather").hop_s == PRESETS["ib-ndr"].fit("all_gather").hop_s


def test_a_link_survives_its_dict():
    link = _link(3e9, 2e-5, overlap=0.0)
    back = Link.from_dict(link.to_dict())
    assert back == link and back.overlaps is False and back.overlap == 0.0
    # a run saved before links had a measured overlap said whether they overlapped at all
    old = {k: v for k, v in link.to_dict().items() if k != "overlap"}
    assert Link.from_dict({**old, "overlaps": True}).overlap == 1.0
    assert Link.from_dict({**old, "overlaps": False}).overlap == 0.0
    with pytest.raises(ConfigError, match="overlap"):
        check_link(replace(link, overlap=1.5))


def test_the_fit_recovers_latency_and_bandwidth_from_timed_collectives():
    hop, beta, n = 50e-6, 2e9, 2
    rows = [
        {
            "kind": "all_reduce",
            "bytes": b,
            "seconds": hops("all_reduce", n) * hop + wire_bytes("all_reduce", b, n) / beta,
        }
        for b in (2.5e5, 1e6, 4e6, 1.6e7, 6.4e7)
    ]
    got = fit(rows, n)["all_reduce"]
    assert got.hop_s == pytest.approx(hop, rel=1e-6) and got.busbw == pytest.approx(beta, rel=1e-6)


def test_timings_that_do_not_grow_with_the_size_still_give_a_usable_fit():
    """Two sizes the latency dominates, the larger timed faster (a busy machine): the line
    through them falls; the fit gives every second to the bandwidth, never a negative one."""
    rows = [
        {"kind": "all_reduce@bf16", "bytes": 1e5, "seconds": 6e-4},
        {"kind": "all_reduce@bf16", "bytes": 1e6, "seconds": 5e-4},
    ]
    got = fit(rows, 2)["all_reduce@bf16"]
    assert got.hop_s == 0 and got.busbw > 0
    check_link(Link("measured", {"all_reduce": got, "all_reduce@bf16": got}))


# -- the backward, from a real trace -----------------------------------------------------------


def test_every_trained_parameter_has_its_gradient_in_ready_order(run):
    b = backward_of(load_trace(run))
    assert b is not None and b.steps >= 2
    assert b.grad_bytes == run.context["params"] * 4  # fp32: every trained parameter, once
    shares = b.grads["ready_share"].to_numpy()
    assert np.all(np.diff(shares) >= -0.05)  # medians of steps: in order, nearly
    assert 0 < shares[0] < b.backward_end_share < 1 - b.optimizer_share + 1e-9
    assert 0 < b.optimizer_share < 1


def test_accumulation_is_told_by_the_count_of_parameters_not_by_repeated_shapes():
    layer = ["[[64]]", "[[64, 64]]"]
    assert micro_batches(layer * 4, elements=4 * 4160, params=4 * 4160) == 1  # four identical layers
    assert micro_batches(layer * 4, elements=4 * 4160, params=4160) == 4  # one layer, four micro-batches
    assert micro_batches(layer * 4, elements=4 * 4160, params=None) == 1  # no count: no accumulation said
    assert micro_batches(layer * 3, elements=3 * 4160, params=2 * 4160) == 1  # not a whole number of passes


# -- DDP ------------------------------------------------------------------------------------


def test_buckets_hold_one_mib_first_then_the_cap_in_ready_order():
    b = _backward(
        [0.5 * MIB, 0.75 * MIB, 10 * MIB, 10 * MIB, 10 * MIB, 1 * MIB], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    )
    plan = buckets(b, bucket_mb=25)
    assert [round(s / MIB, 2) for s, _ in plan] == [1.25, 30.0, 1.0]
    assert [r for _, r in plan] == [0.2, 0.5, 0.6]
    assert plan[0][0] >= FIRST_BUCKET_BYTES


def test_one_rank_is_the_measured_step_and_efficiency_one(run):
    t = swift_nb.scale(run, (1, 2), "pcie4", "ddp")
    one = t[t["world_size"] == 1].iloc[0]
    assert one["efficiency"] == 1.0
    assert one["step_s"] == run.summary["step_time_median_s"] and one["comm_s"] == 0.0


def test_a_link_that_overlaps_hides_what_the_backward_has_left_and_never_the_last_bucket():
    b = _backward([16 * MIB] * 4, [0.2, 0.3, 0.4, 0.5])
    basis = Basis(step_s=1.0, backward=b, units=5)
    link = _link(busbw=1e9)
    hidden = ddp(basis, link, 2, 25, None)
    each = 16 * MIB / 1e9  # 2 ranks: the wire is the payload
    assert hidden.comm_s == pytest.approx(4 * each, rel=1e-3)  # buckets of 16 MiB (1 MiB first)
    assert each * 0.99 <= hidden.exposed_comm_s < hidden.comm_s
    exposed = ddp(basis, _link(busbw=1e9, overlap=0.0), 2, 25, None)
    assert exposed.exposed_comm_s == pytest.approx(exposed.comm_s)
    assert exposed.step_s == pytest.approx(1.0 + exposed.comm_s + exposed.terms["bucket copies"])
    # a link compute runs under for 60 % of a collective: 40 % of it waited for whole
    part = ddp(basis, _link(busbw=1e9, overlap=0.6), 2, 25, None)
    want = 0.6 * hidden.exposed_comm_s + 0.4 * hidden.comm_s
    assert part.exposed_comm_s == pytest.approx(want)
    assert hidden.exposed_comm_s < part.exposed_comm_s < exposed.exposed_comm_s
    whole = fsdp(basis, _link(busbw=1e9, overlap=0.0), 2, None)
    assert fsdp(basis, _link(busbw=1e9, overlap=0.6), 2, None).exposed_comm_s == pytest.approx(
        0.6 * fsdp(basis, _link(busbw=1e9), 2, None).exposed_comm_s + 0.4 * whole.comm_s
    )


def test_ddp_copies_the_gradients_three_times_and_a_bf16_hook_once_more():
    b = _backward([64 * MIB], [0.5])
    basis = Basis(step_s=1.0, backward=b, units=1)
    slow = replace(_link(busbw=1e9, overlap=0.0), copy_bw=1e9)
    assert ddp(basis, slow, 2, 25, None).terms["bucket copies"] == pytest.approx(3 * 64 * MIB / 1e9)
    assert ddp(basis, slow, 2, 25, 2.0).terms["bucket copies"] == pytest.approx(4 * 64 * MIB / 1e9)
    assert ddp(basis, slow, 1, 25, None).step_s == 1.0  # one process copies nothing


def test_a_bf16_fit_prices_bf16_payloads_where_the_link_has_one():
    link = replace(_link(busbw=1e9), fits={"all_reduce": Fit(0, 1e9), "all_reduce@bf16": Fit(0, 0.5e9)})
    assert link.seconds("all_reduce", 1e9, 2, bf16=True) == pytest.approx(2.0)
    assert link.seconds("all_reduce", 1e9, 2) == pytest.approx(1.0)
    assert link.seconds("all_gather", 1e9, 2, bf16=True) == pytest.approx(0.5)  # all-reduce's fp32 stands in


def test_bf16_gradients_send_half_the_bytes():
    b = _backward([64 * MIB], [0.5])
    basis = Basis(step_s=1.0, backward=b, units=1)
    link = _link(busbw=1e9, overlap=0.0)
    assert ddp(basis, link, 4, 25, 2.0).comm_s == pytest.approx(ddp(basis, link, 4, 25, None).comm_s / 2)


# -- FSDP -----------------------------------------------------------------------------------


def test_fsdp_gathers_twice_scatters_once_and_shards_the_optimizer():
    b = _backward([100 * MIB], [0.6], optimizer_share=0.2)
    basis = Basis(step_s=1.0, backward=b, units=4)
    link = _link(busbw=1e9, overlap=0.0)
    s = fsdp(basis, link, 4, None)
    per = 3 / 4 * 100 * MIB / 1e9
    assert s.comm_s == pytest.approx(3 * per)
    copies = 3 * (1 + 1 / 4) * 100 * MIB / link.copy_bw  # shards in and out of each collective
    assert s.terms["shard copies"] == pytest.approx(copies)
    assert s.compute_s == pytest.approx(0.8 + 0.2 / 4 + copies)
    assert s.terms["parameter all-gathers"] == pytest.approx(2 * per)


# -- bad input, before any work ----------------------------------------------------------------


@pytest.fixture
def no_trace(monkeypatch):
    def started(*a, **k):
        raise AssertionError("the trace was read before the input was checked")

    monkeypatch.setattr(scale_pkg, "load_trace", started)


@pytest.mark.parametrize(
    ("kwargs", "param", "said"),
    [
        ({"world_sizes": (1, 0)}, "world_sizes", "at least 1"),
        ({"world_sizes": (2.5,)}, "world_sizes", "whole number"),
        ({"world_sizes": ()}, "world_sizes", "one or more"),
        ({"link": "ethernet"}, "link", "nvlink4"),
        ({"layouts": ("zero",)}, "layouts", "ddp"),
        ({"grad_dtype": "int8"}, "grad_dtype", "bf16"),
        ({"bucket_mb": 0}, "bucket_mb", "above 0"),
        ({"nodes": 2, "world_sizes": (3,)}, "world_sizes", "multiples of nodes=2"),
        ({"network": "ib-ndr"}, "network", "nodes="),
        ({"nodes": 0}, "nodes", "at least 1"),
    ],
)
def test_bad_arguments_are_refused_before_the_trace_is_read(run, no_trace, kwargs, param, said):
    with pytest.raises(ConfigError) as e:
        swift_nb.scale(run, **kwargs)
    assert e.value.param == param and said in str(e.value), str(e.value)


def test_a_run_without_a_step_time_is_refused(run, no_trace):
    bare = swift_nb.Run(id="bare")
    with pytest.raises(ConfigError) as e:
        swift_nb.scale(bare)
    assert e.value.param == "run" and "no step time" in str(e.value)
    with pytest.raises(ConfigError) as e:
        swift_nb.scale("runs/x")  # type: ignore[arg-type]
    assert e.value.param == "run"


def test_nodes_put_the_network_under_every_ring(run):
    inside = swift_nb.scale(run, (8,), "nvlink4", "ddp")
    across = swift_nb.scale(run, (16,), "nvlink4", "ddp", nodes=2)
    assert across["link"].iloc[0] == "nvlink4 + ib-ndr"
    assert across["comm_s"].iloc[0] > inside["comm_s"].iloc[0]
    assert not math.isnan(across["step_s"].iloc[0])


# -- compare(): runs at different world sizes ------------------------------------------------


def test_compare_says_the_scaling_efficiency_and_which_term_grew():
    from swift_nb.analysis.comparison.variants import scaling

    base = {"step_time_median_s": 0.100, "ranks": 1, "collective_share_max_rank": 0.0}
    comm = {"step_time_median_s": 0.160, "ranks": 2, "collective_share_max_rank": 0.375}  # 60 ms of it
    got = scaling(base, comm)
    assert got["scaling_efficiency"] == pytest.approx(0.625)
    assert got["grew"] == "communication +60.0 ms"
    compute = {"step_time_median_s": 0.130, "ranks": 2, "collective_share_max_rank": 0.05}
    assert scaling(base, compute)["grew"].startswith("compute +23.5 ms")
    assert scaling(base, {**comm, "ranks": 1}) == {}  # the same ranks: no scaling to tell


def test_synchronised_ranks_wait_for_the_slowest_of_their_steps():
    b = _backward([MIB], [0.5])
    basis = Basis(step_s=2.0, backward=b, units=1, steps=(1.0, 2.0, 3.0))
    # the largest of two draws from {1, 2, 3}: 1·1/9 + 2·3/9 + 3·5/9 = 22/9, less the median 2
    assert basis.slowest_wait(2) == pytest.approx(22 / 9 - 2)
    assert basis.slowest_wait(8) > basis.slowest_wait(2) > basis.slowest_wait(1) == 0.0
    steady = Basis(step_s=2.0, backward=b, units=1, steps=(2.0,) * 10)
    assert steady.slowest_wait(8) == 0.0  # no jitter, no wait
    link = _link(busbw=1e9, overlap=0.0)
    assert ddp(basis, link, 2, 25, None).terms["waiting for the slowest rank"] == pytest.approx(22 / 9 - 2)


def test_a_measured_link_answers_from_its_own_timings():
    fit = Fit(0.0, 1e9)
    points = [
        {"kind": "all_reduce", "bytes": 1e6, "seconds": 1e-3},
        {"kind": "all_reduce", "bytes": 4e6, "seconds": 10e-3},
    ]
    link = Link("m", {"all_reduce": fit}, measured={"world_size": 2, "points": points})
    assert link.seconds("all_reduce", 2.5e6, 2) == pytest.approx(5.5e-3)  # between two sizes: interpolated
    assert link.seconds("all_reduce", 8e6, 2) == pytest.approx(
        20e-3
    )  # beyond: the nearest, scaled by the fit
    # at 4 ranks: the fit's ratio of 4 ranks to 2 (wire 2·3/4 against 2·1/2 of the payload)
    assert link.seconds("all_reduce", 2.5e6, 4) == pytest.approx(5.5e-3 * 1.5)
    assert PRESETS["nvlink4"].across(link).measured == {}
