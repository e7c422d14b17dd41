"""The ``cuda_oom`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

from dataclasses import asdict

from ..common import Ctx, mib, train

TITLE = "a CUDA out-of-memory post-mortem under torch.cuda.set_per_process_memory_fraction"


def check(ctx: Ctx) -> None:
    """A batch too large for a memory fraction fails inside ``swift_nb.profile``: the run is
    saved as ``oom`` with its post-mortem, and ``diagnosis_of`` lists fixes."""
    import torch

    import swift_nb
    from swift_nb.analysis.oom import diagnosis_of

    limit = ctx.sizes.oom_limit_bytes
    # set_per_process_memory_fraction takes an index or an indexed device, never plain 'cuda'
    index = torch.cuda.current_device() if ctx.device.index is None else ctx.device.index
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(limit / total, index)
    raised = None
    try:
        cfg = ctx.config()
        model, opt = ctx.model_and_optimizer(cfg)
        small = ctx.batch(cfg, 2)
        big = ctx.batch(cfg, ctx.sizes.oom_batch)
        prof = swift_nb.profile(out_dir=ctx.runs, label="cuda-oom")
        try:
            with prof:
                train(model, opt, *small, 2)  # two steps fit; the third asks for too much
                train(model, opt, *big, 1)
        except torch.OutOfMemoryError as e:
            raised = f"{type(e).__name__}: {str(e)[:300]}"
        del model, opt, small, big
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
        torch.cuda.empty_cache()
    restored = torch.empty(2 * limit, dtype=torch.uint8, device=ctx.device).numel() == 2 * limit
    run = swift_nb.load_run(prof.run.path)
    o, diagnosis = run.oom, diagnosis_of(run)
    ctx.details.update(
        run=str(run.path),
        fraction=limit / total,
        limit_mib=mib(limit),
        raised=raised,
        status=run.status,
        oom={k: v for k, v in asdict(o).items() if k != "top_tensors"} if o else None,
        top_tensors=o.top_tensors[:3] if o else None,
        # the post-mortem's capacity is the device's: it does not know the fraction
        capacity_is_the_fraction=bool(
            o and o.capacity_bytes and abs(o.capacity_bytes - limit) < 0.05 * limit
        ),
        diagnosis=None
        if diagnosis is None
        else {
            "need_mib": mib(diagnosis.need_bytes),
            "room_mib": mib(diagnosis.room_bytes),
            "formula": diagnosis.formula,
            "fixes": [
                {"toggle": f.toggle, "change": f.change, "need_mib": mib(f.need_bytes), "fits": f.fits}
                for f in diagnosis.fixes
            ],
            "compare_line": diagnosis.compare_line,
        },
    )
    ctx.expect("the cell raised torch.OutOfMemoryError", raised)
    ctx.expect("the run's status is oom", run.status == "oom")
    ctx.expect("run.oom is filled, on the CUDA device", o is not None and o.device.startswith("cuda"))
    ctx.expect(
        "run.oom says the request, the step, the phase and the module",
        o is not None and o.requested_bytes and o.step == 2 and o.phase and o.module,
    )
    ctx.expect(
        "run.oom has the allocator's reserved and allocated bytes",
        o and o.reserved_bytes and o.allocated_bytes,
    )
    ctx.expect("diagnosis_of(run) lists fixes", diagnosis is not None and len(diagnosis.fixes) > 0)
    ctx.expect("the memory fraction was restored (twice the limit allocates)", restored)
