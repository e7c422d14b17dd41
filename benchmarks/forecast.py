"""How close ``swift_nb.analysis.forecast`` comes to the peak it forecasts, on CPU where the
peak by category is measured exactly (the profiler's allocations replayed).

For each model a run is profiled at batch B and sequence T; the peak is forecast at 4B
and at 2T, from that run alone and with a calibration run (2B for the batch forecast,
3T/2 for the sequence one), and each forecast size is then profiled too. For the eager
models, flash_attention and grad_checkpointing are also forecast and then measured with
the toggles on; for the demo, bf16 parameters; for the Llama model, SGD with momentum.
Every cell is forecast / measured (error %); the error of the total is
(forecast − measured) / measured.

Models (fp32, AdamW, random weights, synthetic tokens):
  demo     swift_nb.demo GPT, 2 layers, d_model 128, SDPA attention, B=4, T=128
  llama    transformers LlamaForCausalLM from a config (hidden 64, 2 layers, 4 heads,
           intermediate 128, vocab 256), SDPA attention, B=4, T=128
  eager    swift_nb.demo.quickstart_config() (eager attention, [B, 4, T, T] scores), B=1, T=512
  llama-eager  the llama model with eager attention ([B, 1, T, T] float mask), B=2, T=256

    python benchmarks/forecast.py [--steps 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import swift_nb
from swift_nb.analysis.forecast import forecast, measure
from swift_nb.core.units import fmt_bytes
from swift_nb.demo import make_model, quickstart_config
from swift_nb.record import MEMORY_CATEGORIES


@dataclass
class Case:
    name: str
    build: Callable[[int], torch.nn.Module]  # max sequence length → model
    vocab: int
    batch: int
    seq: int


def demo_model(max_seq: int) -> torch.nn.Module:
    return make_model(n_layer=2, d_model=128, n_head=4, vocab_size=1024, seq_len=max_seq, attn_impl="sdpa")


def eager_model(max_seq: int) -> torch.nn.Module:
    return make_model(**{**quickstart_config().__dict__, "seq_len": max_seq})


def llama_model(max_seq: int, attention: str = "sdpa") -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=128,
        vocab_size=256,
        max_position_embeddings=max_seq,
    )
    cfg._attn_implementation = attention
    return LlamaForCausalLM(cfg)


def llama_eager_model(max_seq: int) -> torch.nn.Module:
    return llama_model(max_seq, "eager")


CASES = [
    Case("demo", demo_model, 1024, 4, 128),
    Case("llama", llama_model, 256, 4, 128),
    Case("eager", eager_model, quickstart_config().vocab_size, 1, 512),
    Case("llama-eager", llama_eager_model, 256, 2, 256),
]


def profile(case: Case, batch: int, seq: int, root: str, steps: int, **variant):
    """A run of ``case`` at ``batch`` × ``seq`` (``variant``: toggles, dtype, optimizer)."""
    torch.manual_seed(0)
    model = case.build(2 * case.seq)
    dtype = variant.get("dtype", torch.float32)
    model = model.to(dtype)
    if variant.get("optimizer") == "SGD":
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, case.vocab, (batch, seq))
    hf = not isinstance(model, swift_nb.demo.GPT)

    def loss():
        return model(input_ids=x, labels=x).loss if hf else model(x, x)

    prof = swift_nb.profile(
        out_dir=root,
        wait=1,
        warmup=1,
        active=2,
        profile_memory=True,
        report=False,
        context={"batch_size": batch, "seq_len": seq},
        toggles=variant.get("toggles", []),
        namespace={"model": model, "opt": opt},
    )
    with contextlib.redirect_stdout(io.StringIO()), prof as run:
        for _ in range(steps):
            loss().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return swift_nb.load_run(run.path)


def cell(forecast_bytes: float, measured_bytes: float) -> str:
    err = 100.0 * (forecast_bytes - measured_bytes) / measured_bytes if measured_bytes else 0.0
    return f"{fmt_bytes(forecast_bytes)} / {fmt_bytes(measured_bytes)} ({err:+.1f} %)"


def row(case: str, target: str, how: str, f, measured) -> tuple[str, float]:
    m = measured.categories
    cats = " | ".join(cell(f.categories[c], m[c]) for c in MEMORY_CATEGORIES)
    err = 100.0 * (f.total_bytes - measured.total) / measured.total
    line = (
        f"| {case} | {target} | {how} | {cats} | {fmt_bytes(f.total_bytes)} | {fmt_bytes(measured.total)} | "
        f"{err:+.1f} % |"
    )
    return line, err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="steps per run; 2 are recorded (≥ 4)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    names = " | ".join(c.replace("_", " ") for c in MEMORY_CATEGORIES)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; cells: forecast / measured (error)\n"
    )
    print(f"| model | target | forecast from | {names} | total forecast | total measured | error |")
    print("|---" * (6 + len(MEMORY_CATEGORIES)) + "|")
    errors: dict[str, list[float]] = {"one run": [], "calibrated": [], "toggle": []}
    with tempfile.TemporaryDirectory() as root:
        for case in CASES:
            b, t = case.batch, case.seq
            base = measure(profile(case, b, t, root, args.steps))
            targets = [
                (f"batch {4 * b}", {"batch_size": 4 * b}, (4 * b, t), (2 * b, t)),
                (f"seq {2 * t}", {"seq_len": 2 * t}, (b, 2 * t), (b, 3 * t // 2)),
            ]
            for label, kwargs, size, cal_size in targets:
                measured = measure(profile(case, *size, root, args.steps))
                cal = measure(profile(case, *cal_size, root, args.steps))
                for how, calibration in (("one run", None), (f"+ run at {cal_size[0]}×{cal_size[1]}", cal)):
                    f = forecast(base, "H100-80GB", calibration=calibration, **kwargs)
                    line, err = row(case.name, label, how, f, measured)
                    errors["one run" if calibration is None else "calibrated"].append(abs(err))
                    print(line, flush=True)
            toggles = [(t, {"toggles": [t]}) for t in ("flash_attention", "grad_checkpointing")]
            variants = {
                "eager": toggles,
                "llama-eager": toggles,
                "demo": [("dtype bf16", {"dtype": torch.bfloat16})],
                "llama": [("optimizer SGD", {"optimizer": "SGD"})],
            }[case.name]
            for label, variant in variants:
                measured = measure(profile(case, b, t, root, args.steps, **variant))
                kwargs = {"toggles": variant.get("toggles", ())}
                if "dtype" in variant:
                    kwargs["dtype"] = "bf16"
                if "optimizer" in variant:
                    kwargs["optimizer"] = variant["optimizer"]
                f = forecast(base, "H100-80GB", **kwargs)
                line, err = row(case.name, label, "one run", f, measured)
                errors["toggle"].append(abs(err))
                print(line, flush=True)
    print()
    for how, errs in errors.items():
        if errs:
            print(f"{how}: worst |error| of the total {max(errs):.1f} %, mean {sum(errs) / len(errs):.1f} %")
    print(f"wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
