"""The sequence_parallel toggle in real 2-process gloo jobs: training matches one process,
ranks keep identical weights, and a rerun launches its ranks through torch's elastic
launcher, with one job record, a failing rank's traceback and nothing left running (slow).
What the toggle runs on each rank from ``swift_nb.parallel`` (a model call split into its
shard, gradients bucketed) is pinned in process, without a job."""

from __future__ import annotations

import os
import queue
import time
from datetime import timedelta

import psutil
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support.common import free_port, rank_context

import swift_nb
from swift_nb.analysis.ranks import per_rank as rank_table
from swift_nb.core.errors import ConfigError
from swift_nb.parallel.gradients import BUCKET_ELEMENTS, _buckets
from swift_nb.parallel.inputs import IGNORE_INDEX, CallSplit
from swift_nb.rerun import Variant, Worker, parse_variants, run_variants
from swift_nb.toggles import get

CFG = dict(n_layer=2, n_head=4, d_model=64, seq_len=64, vocab_size=128)
STEPS = 20


def _train(toggle=None) -> tuple[list[float], torch.nn.Module]:
    """20 AdamW steps of the tiny demo GPT on fixed batches; the returned losses."""
    from swift_nb.demo import make_model

    torch.manual_seed(0)
    model = make_model(**CFG)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1)
    losses = []
    if toggle is not None:
        toggle.apply({"model": model, "opt": opt})
    try:
        for _ in range(STEPS):
            x = torch.randint(0, CFG["vocab_size"], (2, CFG["seq_len"] + 1), generator=data)
            loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    finally:
        if toggle is not None:
            toggle.undo()
    return losses, model


def _rank(rank: int, mode: str, port: int, out: mp.Queue) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    losses, model = _train(get("sequence_parallel", sp_mode=mode))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(2)]
    dist.all_gather(every, flat)
    errors = []
    toggle = get("sequence_parallel", sp_mode=mode)
    toggle.apply({"model": model})
    try:
        model(torch.zeros(1, 63, dtype=torch.long))
    except ConfigError as e:
        errors.append(str(e))
    finally:
        toggle.undo()
    if mode == "ulysses":
        from swift_nb.demo import make_model

        try:
            get("sequence_parallel").apply({"one_head": make_model(**{**CFG, "n_head": 1})})
        except ConfigError as e:
            errors.append(str(e))
    try:
        get("sequence_parallel", sp_size=4).apply({})
    except ConfigError as e:
        errors.append(str(e))
    out.put((rank, losses, bool(torch.equal(every[0], every[1])), errors))
    dist.destroy_process_group()


def _job(mode: str) -> dict[int, tuple]:
    ctx = rank_context()
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, mode, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + 120
    try:
        while len(results) < 2 and time.monotonic() < deadline:
            try:
                item = out.get(timeout=1)
                results[item[0]] = item[1:]
            except queue.Empty:
                assert all(p.is_alive() or p.exitcode == 0 for p in procs), "a rank died"
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    assert len(results) == 2, "the job did not finish"
    return results


@pytest.fixture(scope="module")
def baseline() -> list[float]:
    torch.set_num_threads(1)
    return _train()[0]


@pytest.mark.parametrize("mode", ["ulysses", "ring"])
def test_training_matches_one_process_and_ranks_keep_identical_weights(baseline, mode):
    results = _job(mode)
    for rank, (losses, same_weights, errors) in results.items():
        rel = max(abs(a - b) / abs(b) for a, b in zip(losses, baseline, strict=True))
        assert rel < 1e-4, (rank, losses, baseline)
        assert same_weights, "the ranks' weights differ after training"
        assert (
            "sequence_parallel sp_size must divide the sequence length of the model's input (63)"
            in (errors[0])
        )
        assert (
            "sequence_parallel sp_size must equal the number of processes of this job (2); got 4"
            in (errors[-1])
        )
        if mode == "ulysses":
            assert (
                "must divide the number of attention heads of `one_head` (1) with sp_mode=ulysses"
                in (errors[1])
            )


class _Plain(torch.nn.Module):
    def forward(self, idx, targets=None, position_ids=None):
        return idx


class _CausalLM(torch.nn.Module):
    """The call signature of a Hugging Face causal LM."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None, **kwargs):
        return input_ids


class _NoKwargsLM(torch.nn.Module):
    def forward(self, input_ids=None, labels=None):
        return input_ids


def test_a_plain_models_call_gives_each_rank_its_tokens_and_their_positions():
    ids = torch.arange(16).reshape(2, 8)
    for rank in (0, 1):
        args, kwargs = CallSplit(_Plain(), False, 2, rank)((ids,), {"targets": ids + 100})
        mine = torch.arange(4 * rank, 4 * rank + 4)
        assert args == ()
        assert torch.equal(kwargs["idx"], ids[:, mine]) and kwargs["idx"].is_contiguous()
        assert torch.equal(kwargs["targets"], ids[:, mine] + 100)
        assert torch.equal(kwargs["position_ids"], mine.unsqueeze(0))
    with pytest.raises(
        ConfigError, match=r"sp must divide the sequence length of the model's input \(7\); got 2"
    ):
        CallSplit(_Plain(), False, 2, 0, size_option="sp")((torch.zeros(1, 7, dtype=torch.long),), {})


def test_a_causal_lms_labels_are_shifted_before_the_split_and_count_the_whole_sequence():
    ids = torch.arange(8).unsqueeze(0)
    _, kwargs = CallSplit(_CausalLM(), True, 2, 1)(
        (), {"input_ids": ids, "labels": ids, "attention_mask": ids >= 0}
    )
    assert kwargs["input_ids"].tolist() == [[4, 5, 6, 7]]
    assert kwargs["position_ids"].tolist() == [[4, 5, 6, 7]]
    assert kwargs["labels"].tolist() == kwargs["shift_labels"].tolist() == [[5, 6, 7, IGNORE_INDEX]]
    assert kwargs["num_items_in_batch"].item() == 7 / 2  # 7 counted labels, over 2 ranks
    assert kwargs["attention_mask"] is None  # all ones: causal attention needs none
    with pytest.raises(ConfigError, match=r"sp needs a model whose forward passes \*\*kwargs"):
        CallSplit(_NoKwargsLM(), True, 2, 0, caller="sp")((), {"input_ids": ids, "labels": ids})


def test_gradients_are_bucketed_by_dtype_and_device_up_to_the_bucket_size():
    big, small, other, last = (
        torch.empty(BUCKET_ELEMENTS - 1),
        torch.empty(2),
        torch.empty(1, dtype=torch.float64),
        torch.empty(3),
    )
    buckets = _buckets([big, small, other, last])
    assert [[t.numel() for t in b] for b in buckets] == [[BUCKET_ELEMENTS - 1], [2, 3], [1]]


def test_bad_parameters_and_no_job_are_clear_errors():
    with pytest.raises(ConfigError, match="sequence_parallel sp_size must be ≥ 2; got 1"):
        get("sequence_parallel", sp_size=1)
    with pytest.raises(ConfigError, match="sp_mode must be one of ulysses, ring; got 'x'"):
        parse_variants("sequence_parallel(sp_mode=x)")
    with pytest.raises(ConfigError, match="ring_chunk_size must be ≥ 1"):
        get("sequence_parallel", ring_chunk_size=0)
    with pytest.raises(
        RuntimeError, match=r"sp_size worker processes \(--compare sequence_parallel\(sp_size=2\)\)"
    ):
        get("sequence_parallel").apply({})


SETUP = (
    "import torch\n"
    "torch.set_num_threads(1)\n"
    "from swift_nb.demo import make_model\n"
    "torch.manual_seed(0)\n"
    "model = make_model(n_layer=2, n_head=4, d_model=64, seq_len=64, vocab_size=128)\n"
    "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
)
TRAIN = (
    "for _ in range(5):\n"
    "    idx = torch.randint(0, 128, (2, 64))\n"
    "    model(idx, idx).backward()\n"
    "    opt.step(); opt.zero_grad()\n"
)
FLAGS = "--wait 0 --warmup 1 --active 2"


def _running(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def test_rerun_profiles_both_ranks_into_one_job_record(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    outcomes = run_variants(
        [SETUP], TRAIN, FLAGS, parse_variants("sequence_parallel(sp_size=2)"), tmp_path, timeout_s=240
    )
    assert [o.status for o in outcomes] == ["ok", "ok"], [(o.status, o.error) for o in outcomes]
    run = swift_nb.load_run(outcomes[1].run_path)
    per_rank = rank_table(run)
    assert sorted(per_rank["rank"]) == [0, 1]
    assert (per_rank["steps"] == 5).all() and per_rank["peak_mem_bytes"].notna().all()
    (report,) = [t for t in run.context["toggles"] if t["toggle"] == "sequence_parallel"]
    assert any("ulysses attention over 2 ranks" in c for c in report["changes"]), report
    assert run.context["variant"] == "sequence_parallel(sp_size=2)"
    table = swift_nb.rerun.comparison([(o, swift_nb.load_run(o.run_path)) for o in outcomes]).table
    row = table.set_index("variant").loc["sequence_parallel(sp_size=2)"]
    assert (
        row["status"] == "ok"
        and row["ranks"] == 2
        and row["peak_mem_max_rank_bytes"] > 0
        and row["collective_share_max_rank"] > 0
    )


def test_a_failing_rank_fails_the_rerun_with_its_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    fail = "import os\nif os.environ.get('RANK') == '1':\n    raise RuntimeError('boom on rank 1')\n"
    worker = Worker(
        [SETUP, fail], TRAIN, FLAGS, tmp_path, Variant("sp", [get("sequence_parallel")]), timeout_s=120
    )
    worker.start()
    out = worker.wait()
    assert out.status == "failed", out
    assert out.error.startswith("rank 1: replayed cell 2 raised") and "boom on rank 1" in out.error
    assert out.wall_s < 100
    assert not _running(str(worker.folder)), "a worker process was left running"


def test_a_hanging_rank_is_ended_with_the_whole_job_at_the_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    hanging = tmp_path / "hanging"
    hang = (
        "import os, time\nif os.environ.get('RANK') == '1':\n"
        f"    open({str(hanging)!r}, 'w').close()\n    time.sleep(600)\n"
    )
    worker = Worker(
        [SETUP, hang], TRAIN, FLAGS, tmp_path, Variant("sp", [get("sequence_parallel")]), timeout_s=120
    )
    worker.start()
    deadline = time.monotonic() + 120
    while not hanging.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert hanging.exists(), "rank 1 never reached its hang"
    worker.timeout_s = time.monotonic() - worker._t0 + 1.0  # the timeout falls while rank 1 hangs
    out = worker.wait()
    assert out.status == "timeout", out
    assert not _running(str(worker.folder)), "a rank was left running"
