"""The ``scale`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

from ..common import Ctx

TITLE = "will it scale on CUDA: a 1-GPU run priced at 8 × H100 NVLink, the link measured on this machine"

GPU_SIZES = {"width": 2048, "depth": 8, "batch": 64}
SMOKE_SIZES = {"width": 128, "depth": 2, "batch": 8}


def check(ctx: Ctx) -> None:
    """A residual MLP profiled on the device. On CUDA the gradients are accumulated on the
    autograd engine's device thread, whose ``AccumulateGrad`` ops ``scale()`` reads: every
    trained parameter's gradient must be found (bytes = 4 × parameters), in ready order
    inside the backward. Priced at 1, 2, 4, 8 ranks over nvlink4: efficiency 1 at one rank,
    non-increasing with N, the DDP all-reduce priced at 2(N−1)/N of the gradients over 370
    GB/s. ``measure_link()`` then runs on this machine (NCCL where there are two GPUs; with
    one, gloo between two processes): a bus bandwidth above 0 and the copy bandwidth of the
    device the link's ranks run on."""
    import torch
    from torch import nn

    import swift_nb
    from swift_nb.analysis.scale import basis_of
    from swift_nb.analysis.scale.model import buckets
    from swift_nb.core.links import PRESETS

    sizes = GPU_SIZES if ctx.cuda else SMOKE_SIZES
    w, depth, batch = sizes["width"], sizes["depth"], sizes["batch"]
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(w, w), nn.GELU()) for _ in range(depth))).to(ctx.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(batch, w, device=ctx.device)
    params = sum(p.numel() for p in model.parameters())

    def cell() -> None:
        for _ in range(ctx.sizes.steps):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()

    run = ctx.profiled("scale", cell, namespace={"model": model, "opt": opt})
    basis = basis_of(run)
    table = swift_nb.scale(run, (1, 2, 4, 8), "nvlink4", "ddp")
    eff = table["efficiency"].tolist()
    ctx.details.update(
        {
            "run": str(run.path),
            "params": params,
            "grad_bytes": basis.grad_bytes,
            "backward_end_share": basis.backward.backward_end_share,
            "step_ms": 1e3 * basis.step_s,
            "table": table.drop(columns=["why"]).to_dict("records"),
        }
    )
    ctx.expect("every trained parameter's gradient found (4 B each)", basis.grad_bytes == 4 * params)
    shares = basis.backward.grads["ready_share"]
    ctx.expect("gradients ready inside the step, in order", bool(shares.between(0, 1).all()))
    ctx.expect(
        "efficiency 1 at one rank, non-increasing with N", eff[0] == 1.0 and eff == sorted(eff, reverse=True)
    )
    two = table[table["world_size"] == 2].iloc[0]
    priced = sum(PRESETS["nvlink4"].seconds("all_reduce", b, 2) for b, _ in buckets(basis.backward, 25))
    ctx.expect(
        "the 2-rank all-reduce: the buckets priced at nvlink4's 370 GB/s", abs(two["comm_s"] - priced) < 1e-9
    )
    link = swift_nb.measure_link(sizes_mb=(1.0, 16.0), repeats=3, kinds=("all_reduce",))
    ctx.details["link"] = {k: v for k, v in link.to_dict().items() if k != "measured"}
    ctx.expect(
        "the measured link has a bus bandwidth and a copy bandwidth", link.busbw > 0 and link.copy_bw > 0
    )
