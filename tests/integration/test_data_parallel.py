"""The fsdp and ddp toggles in real 2-process gloo jobs: training matches one process on
the same samples, ranks keep identical weights, each rank reads its share of a DataLoader,
and undo gives back the original, whole parameters; a rerun of ``--compare
fsdp(world_size=2),ddp(world_size=2)`` makes one job record per variant, with per-rank
memory by category against the forecast's sharding prediction (slow)."""

from __future__ import annotations

import os
import queue
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support.common import free_port, rank_context

import swift_nb
from swift_nb.analysis.comparison.variants import rank_memory
from swift_nb.core.errors import ConfigError
from swift_nb.render.comparison.page import rank_memory_table
from swift_nb.rerun import parse_variants, run_variants
from swift_nb.toggles import get

CFG = dict(n_layer=2, n_head=2, d_model=32, seq_len=16, vocab_size=64)
STEPS = 4


def _batches(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, CFG["vocab_size"], (4, CFG["seq_len"] + 1), generator=g) for _ in range(n)]


def _train(model, opt, batches) -> list[float]:
    losses = []
    for x in batches:
        loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _model():
    from swift_nb.demo import make_model

    torch.manual_seed(0)
    model = make_model(**CFG)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _rank(rank: int, toggle_id: str, port: int, out: mp.Queue) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    model, opt = _model()
    params = list(model.parameters())
    shapes = [p.shape for p in params]
    # each rank trains on its half of every global batch: the job sees one process's batches
    batches = [x[2 * rank : 2 * rank + 2] for x in _batches(STEPS)]
    loader = torch.utils.data.DataLoader(list(range(10)), batch_size=2, shuffle=False)
    toggle = get(toggle_id)
    shuffled = torch.utils.data.DataLoader(list(range(10)), batch_size=5, shuffle=True)
    ns = {"model": model, "opt": opt, "loader": loader, "shuffled": shuffled}
    toggle.apply(ns)
    try:
        types = {type(p).__name__ for p in model.parameters()}
        seen = [int(i) for b in loader for i in b]
        passes = [[int(i) for b in shuffled for i in b] for _ in range(2)]
        losses = _train(model, opt, batches)
    finally:
        report = toggle.undo()
    same_objects = all(a is b for a, b in zip(model.parameters(), params, strict=True))
    whole = [p.shape for p in model.parameters()] == shapes and type(model).__name__ == "GPT"
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(2)]
    dist.all_gather(every, flat)
    x = _batches(1)[0]
    after = model(x[:, :-1], x[:, 1:]).item()  # eager again, on the whole trained weights
    errors = []
    try:
        get(toggle_id, world_size=4).apply({})
    except ConfigError as e:
        errors.append(str(e))
    late = get(toggle_id)
    late.apply({})
    try:
        _model()[0](x[:, :-1])
    except RuntimeError as e:
        errors.append(str(e))
    finally:
        late.undo()
    if toggle_id == "fsdp":  # an optimizer that stepped before the wrap is left alone, and refused
        again = get(toggle_id)
        notes = again.apply({"model": model, "opt": opt}).notes
        try:
            opt.step()
        except ConfigError as e:
            errors.append(f"{notes[0]} | {e}")
        finally:
            again.undo()
    out.put(
        (
            rank,
            losses,
            types,
            (seen, passes),
            same_objects,
            whole,
            bool(torch.equal(every[0], every[1])),
            after,
            errors,
            report.to_dict(),
            [len(s) for s in opt.state.values()][:1],
        )
    )
    dist.destroy_process_group()


def _job(toggle_id: str) -> dict[int, tuple]:
    ctx = rank_context()
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, toggle_id, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + 180
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


@pytest.mark.parametrize("toggle_id", ["fsdp", "ddp"])
def test_training_on_two_ranks_matches_one_process_and_undo_gives_the_model_back(toggle_id):
    torch.set_num_threads(1)
    model, opt = _model()
    baseline = _train(model, opt, _batches(STEPS))
    results = _job(toggle_id)
    orders = {rank: result[2][1] for rank, result in results.items()}
    # a shuffled loader: each rank reads half, the halves make the dataset, each pass a new order
    for one_pass in range(2):
        assert sorted(orders[0][one_pass] + orders[1][one_pass]) == list(range(10))
    assert orders[0][0] != orders[0][1] and len(orders[0][0]) == 5
    for rank, (
        losses,
        types,
        (seen, _),
        same,
        whole,
        identical,
        _after,
        errors,
        report,
        state,
    ) in results.items():
        # the loss printed on each rank is its half's; their mean is the whole batch's
        assert len(losses) == STEPS
        assert same and whole, "undo did not put the original parameters back"
        assert identical, "the ranks' weights differ after training"
        assert state == [3], "the optimizer state was not moved back onto the original parameters"
        assert seen == list(range(rank, 10, 2)), seen
        assert (
            f"{toggle_id} world_size must equal the number of processes of this job (2); got 4" in errors[0]
        )
        assert (
            f"{toggle_id} wraps the models that exist before the profiled cell; GPT was built inside it"
            in (errors[1])
        )
        if toggle_id == "fsdp":
            assert errors[2] == (
                "`opt` (AdamW) has stepped already: left on the whole parameters (an optimizer built in the "
                "profiled cell trains the shards) | fsdp cannot step `opt`: it stepped before the model was "
                "wrapped and its state is per whole parameter; build the optimizer in the profiled cell "
                "(opt = torch.optim.AdamW(model.parameters())); got 'AdamW'"
            )
        assert report["details"]["world_size"] == 2 and report["details"]["sharded_loaders"] == 2
        if toggle_id == "fsdp":
            assert types == {"DTensor"} or types == {"Parameter"}, types
            assert any(
                "2 Block blocks in `model.blocks` and the root sharded" in c for c in report["changes"]
            )
        else:
            assert any("DistributedDataParallel over 2 ranks" in c for c in report["changes"])
    mean = [(a + b) / 2 for a, b in zip(results[0][0], results[1][0], strict=True)]
    assert max(abs(a - b) / abs(b) for a, b in zip(mean, baseline, strict=True)) < 1e-4, (mean, baseline)
    x = _batches(1)[0]
    trained = model(x[:, :-1], x[:, 1:]).item()
    assert abs(results[0][6] - trained) / trained < 1e-4 and results[0][6] == results[1][6]


def test_bad_parameters_and_no_job_are_clear_errors():
    with pytest.raises(ConfigError, match=r"fsdp world_size must be ≥ 2; got 1"):
        get("fsdp", world_size=1)
    with pytest.raises(ConfigError, match=r"ddp world_size must be an integer; got 'two'"):
        parse_variants("ddp(world_size=two)")
    with pytest.raises(
        RuntimeError, match=r"--compare ddp\(world_size=2\)\); torch.distributed is not initialised"
    ):
        get("ddp").apply({})
    assert get("fsdp", ws=4).processes == 4


SETUP = (
    "import torch\n"
    "torch.set_num_threads(1)\n"
    "from swift_nb.demo import make_model\n"
    "torch.manual_seed(0)\n"
    "model = make_model(n_layer=2, n_head=2, d_model=64, seq_len=32, vocab_size=128)\n"
    "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
)
TRAIN = (
    "for _ in range(5):\n"
    "    idx = torch.randint(0, 128, (2, 32))\n"
    "    model(idx, idx).backward()\n"
    "    opt.step(); opt.zero_grad()\n"
)


def test_compare_fsdp_and_ddp_shows_each_ranks_memory_against_the_forecast(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    variants = parse_variants("fsdp(world_size=2),ddp(world_size=2)")
    outcomes = run_variants(
        [SETUP], TRAIN, "--wait 0 --warmup 1 --active 3", variants, tmp_path, timeout_s=300
    )
    assert [o.status for o in outcomes] == ["ok"] * 3, [(o.status, o.error) for o in outcomes]
    compared = swift_nb.rerun.comparison([(o, swift_nb.load_run(o.run_path)) for o in outcomes])
    table = compared.table.set_index("variant")
    assert list(table["ranks"]) == [1, 2, 2]
    assert "every rank ran the same batches" in table.loc["fsdp(world_size=2)", "notes"]

    shown = rank_memory_table(compared.runs)
    fsdp = shown[shown["variant"] == "fsdp(world_size=2)"]
    assert sorted(set(fsdp["rank"])) == [0, 1]
    held = fsdp[fsdp["category"].isin(["parameters", "gradients", "optimizer state"])]
    assert len(held) == 6 and held["error"].str.endswith("✓").all(), held.to_string()
    ddp = shown[shown["variant"] == "ddp(world_size=2)"]
    assert (
        ddp[ddp["category"].isin(["parameters", "gradients", "optimizer state"])]["error"]
        .str.endswith("✓")
        .all()
    )

    # the numbers behind them: each FSDP rank holds half the baseline's parameters, gradients
    # and optimizer state (d_model 64: every parameter splits evenly, no padding)
    numbers = rank_memory(compared.runs).set_index(["variant", "rank", "category"])
    for category in ("parameters", "gradients", "optimizer_state"):
        base = numbers.loc[("baseline", 0, category), "held_bytes"]
        for rank in (0, 1):
            row = numbers.loc[("fsdp(world_size=2)", rank, category)]
            assert row["forecast_held_bytes"] == base / 2
            assert abs(row["error_pct"]) <= 10.0, (category, rank, row.to_dict())
            assert numbers.loc[("ddp(world_size=2)", rank, category), "held_bytes"] == base
    page = compared.html_path.read_text()
    assert "Memory per rank against the forecast" in page and "fsdp(world_size=2)" in page
