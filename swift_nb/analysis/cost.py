"""What a run costs: one formula per fact, each a pure function of the record.

Money is rent: ``price_per_hour`` (USD) for one device-hour, one device being a GPU the run
used, or the machine on a CPU run. A run's devices are its job's ranks (one GPU each), else
the GPUs its process allocated memory on (``devices_of``), else one machine.

- ``cost_usd``: the run's wall time × its devices × the price;
- ``cost_per_1k_steps_usd``: 1 000 median steps × its devices × the price (the steady rate,
  without the run's start and end);
- ``idle_cost_per_1k_steps_usd``: of that, the share the device idles (``device_idle_pct``
  of the trace's window), where the trace has device work;
- ``energy_cost_usd``: the energy the run measured (``energy_j``) at ``price_per_kwh``.

The price: the one given (``price_per_hour=`` of ``profile()``, ``report()``,
``import_trace()``, ``--price-per-hour``; kept in the run's context, so a later report
prices it alike), else ``$SWIFT_NB_PRICE_PER_HOUR``, else ``swift_nb.core.devices.PRICES_PER_HOUR``
by the GPU's name. A run with no price has no money keys (a CPU run without one given).
"""

from __future__ import annotations

import math
import os
from typing import Any

from swift_nb.core.devices import ENV_PRICE_PER_HOUR, ENV_PRICE_PER_KWH, check_price, price_of
from swift_nb.record import Run

J_PER_KWH = 3.6e6
#: the money keys a run's summary gets (``cost_summary``), in USD, and the price behind them
SUMMARY_KEYS = [
    "price_per_hour",
    "price_source",
    "priced_devices",
    "cost_usd",
    "cost_per_1k_steps_usd",
    "idle_cost_per_1k_steps_usd",
    "price_per_kwh",
    "energy_cost_usd",
]
#: a run's energy and money, as comparisons and diffs show them side by side
MONEY_COLUMNS = [
    "energy_j",
    "energy_per_step_j",
    "avg_power_w",
    "price_per_hour",
    "cost_usd",
    "cost_per_1k_steps_usd",
    "idle_cost_per_1k_steps_usd",
    "energy_cost_usd",
]
#: where a run keeps the prices it was given (its context), so any later report uses them
CONTEXT_KEYS = ("price_per_hour", "price_per_kwh")


def cost_usd(wall_s: float, devices: int, price_per_hour: float) -> float:
    """USD of renting ``devices`` for ``wall_s`` seconds at ``price_per_hour`` each."""
    return wall_s / 3600.0 * devices * price_per_hour


def cost_per_1k_steps_usd(step_s: float, devices: int, price_per_hour: float) -> float:
    """USD of 1 000 steps of ``step_s`` seconds on ``devices`` at ``price_per_hour`` each."""
    return cost_usd(1000.0 * step_s, devices, price_per_hour)


def idle_cost_per_1k_steps_usd(per_1k_steps_usd: float, idle_pct: float) -> float:
    """The part of ``per_1k_steps_usd`` paid while the device idles ``idle_pct`` % of the time."""
    return per_1k_steps_usd * idle_pct / 100.0


def energy_cost_usd(energy_j: float, price_per_kwh: float) -> float:
    """USD of ``energy_j`` joules at ``price_per_kwh``."""
    return energy_j / J_PER_KWH * price_per_kwh


def devices_of(run: Run) -> int:
    """The devices a run rents: a job's ranks; else the GPUs its process allocated on (a
    notebook on an 8-GPU machine training on one pays for one), or all it saw where the
    samples do not say; else one machine."""
    env = run.environment or {}
    world = int(env.get("world_size") or run.context.get("world_size") or 1)
    if world > 1:
        return world
    if env.get("device") != "cuda" or env.get("rank_device") is not None:
        return 1
    samples = run.samples
    allocated = [c for c in samples.columns if c.startswith("cuda") and c.endswith("_allocated_bytes")]
    if allocated and len(samples):
        used = sum(bool(finite(samples[c].max()) or 0) for c in allocated)
        if used:
            return used
    return max(1, len(env.get("devices") or ()))


def price_per_hour_of(run: Run, given: float | None = None) -> tuple[float, str] | None:
    """(USD per device-hour, where it comes from) for ``run``; None when nothing prices it."""
    if given is not None:
        return given, "given"
    kept = run.context.get("price_per_hour")
    if kept is not None:
        return float(kept), "given"
    env = check_price(ENV_PRICE_PER_HOUR, os.environ.get(ENV_PRICE_PER_HOUR) or None)
    if env is not None:
        return env, f"${ENV_PRICE_PER_HOUR}"
    if (run.environment or {}).get("device") == "cuda":
        for name in run.environment.get("devices") or ():
            price = price_of(str(name))
            if price is not None:
                return price.usd_per_hour, f"{name}: {price.source} ({price.as_of})"
    return None


def price_per_kwh_of(run: Run, given: float | None = None) -> float | None:
    """USD per kWh for ``run``: given, kept in its context, or ``$SWIFT_NB_PRICE_PER_KWH``."""
    if given is not None:
        return given
    kept = run.context.get("price_per_kwh")
    if kept is not None:
        return float(kept)
    return check_price(ENV_PRICE_PER_KWH, os.environ.get(ENV_PRICE_PER_KWH) or None)


def finite(value: Any) -> float | None:
    """``value`` as a float, None where it is missing, not a number or not finite."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def cost_summary(
    run: Run, price_per_hour: float | None = None, price_per_kwh: float | None = None
) -> dict[str, Any]:
    """The money keys of ``run``'s summary (``SUMMARY_KEYS``, USD), from its wall time, its
    median step, its device's idle share and its energy where the summary has them; empty
    when no price applies and no energy price is given."""
    s = run.summary
    out: dict[str, Any] = {}
    price = price_per_hour_of(run, price_per_hour)
    if price is not None:
        usd, source = price
        devices = devices_of(run)
        out.update(price_per_hour=usd, price_source=source, priced_devices=devices)
        if run.wall_s:
            out["cost_usd"] = cost_usd(float(run.wall_s), devices, usd)
        step_s = finite(s.get("step_time_median_s"))
        if step_s is not None:
            out["cost_per_1k_steps_usd"] = per_1k = cost_per_1k_steps_usd(step_s, devices, usd)
            idle = finite(s.get("device_idle_pct"))
            if idle is not None:
                out["idle_cost_per_1k_steps_usd"] = idle_cost_per_1k_steps_usd(per_1k, idle)
    kwh = price_per_kwh_of(run, price_per_kwh)
    if kwh is not None:
        out["price_per_kwh"] = kwh
        energy = finite(s.get("energy_j"))
        if energy is not None:
            out["energy_cost_usd"] = energy_cost_usd(energy, kwh)
    return out


def price(run: Run, price_per_hour: float | None = None, price_per_kwh: float | None = None) -> Run:
    """Keep the prices given in ``run``'s context and put its money keys in its summary
    (those of an earlier pricing are replaced). Returns ``run``."""
    for key, value in zip(CONTEXT_KEYS, (price_per_hour, price_per_kwh), strict=True):
        if value is not None:
            run.context[key] = value
    for key in SUMMARY_KEYS:
        run.summary.pop(key, None)
    run.summary.update(cost_summary(run))
    return run


def fmt_usd(usd: float) -> str:
    """``$2.31``; three significant digits under a dollar (``$0.0042``), none past 1 000."""
    if usd >= 1000:
        return f"${usd:,.0f}"
    if usd >= 1 or usd == 0:
        return f"${usd:,.2f}"
    return f"${usd:.2g}" if usd < 0.01 else f"${usd:.3g}"


def usd_per_1k_steps(step_s: float, run: Run) -> float | None:
    """USD of 1 000 steps of ``step_s`` seconds at ``run``'s price and devices (None: no
    price), for predictions: a finding's predicted step time, a forecast's step."""
    price = price_per_hour_of(run)
    if price is None:
        return None
    return cost_per_1k_steps_usd(step_s, devices_of(run), price[0])


def money_columns(run: Run) -> dict[str, float | None]:
    """``MONEY_COLUMNS`` of ``run``: its summary's energy, and its money keys priced now, as
    ``cost_summary`` prices it (a run recorded before it was priced reads alike); None
    where the run has no figure."""
    priced = {**run.summary, **cost_summary(run)}
    return {c: finite(priced.get(c)) for c in MONEY_COLUMNS}
