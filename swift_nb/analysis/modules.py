"""Where a recorded step goes by module: each module's forward and backward time, the
activations its forward keeps for backward, the parameters, gradients and optimizer state
it holds — a tree, one row per module (``module_table``) — and the finding that names a
block of a stack slower than its siblings (``slow_block_finding``).

What the capture left (``swift_nb.capture.memory.modules``): each module's forward as a named range
in the trace (``trace_names.MODULE_PREFIX`` + path) and ``run.context["modules"]``, its rows
(path, parent, class, depth, own parameter/gradient/state bytes, saved bytes per step).

Forward: a module's ranges on the training loop's thread (those inside a backward node are
a checkpoint's recomputation, which belongs to the backward). Backward: every backward
node of the trace (``autograd::engine::evaluate_function: …``) carries the autograd
sequence number of the forward op it differentiates; that op's innermost module range
names the module the node's time belongs to (its own time: the nodes run inside it, as a
reentrant checkpoint's, are theirs). On a GPU trace the times are the kernels' — each
kernel counted where the runtime call that launched it was made — and on a CPU trace the
host's. ``*_self_s`` is a module's own part, the others include its children; the bytes
columns include the children's, ``saved_self_bytes`` what its own ops saved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.trace.tables import Trace, cat_in, per_name
from swift_nb.core import trace_names as tn
from swift_nb.core.units import fmt_bytes
from swift_nb.record import MODULES_COLUMNS

COLUMNS = MODULES_COLUMNS
#: a block this many times its stack's median (forward + backward) is slow
SLOW_BLOCK_RATIO = 1.5
_NODE = tn.AUTOGRAD_PREFIX + ": "


def empty() -> pd.DataFrame:
    return pd.DataFrame(columns=COLUMNS)


def _innermost(spans: pd.DataFrame, points_ts: np.ndarray, points_end: np.ndarray) -> np.ndarray:
    """For each point (ts, end), the row index in ``spans`` (ts_us, end_us, sorted by
    start) of the innermost span holding it, -1 for none: a sweep with a stack of the
    spans open at each point's start."""
    out = np.full(len(points_ts), -1, dtype=np.int64)
    if not len(spans) or not len(points_ts):
        return out
    s_ts, s_end = spans["ts_us"].to_numpy(), spans["end_us"].to_numpy()
    order = np.argsort(points_ts, kind="stable")
    stack: list[int] = []
    i, n = 0, len(s_ts)
    for j in order:
        t, e = points_ts[j], points_end[j]
        while i < n and s_ts[i] <= t:
            while stack and s_end[stack[-1]] <= s_ts[i]:
                stack.pop()
            stack.append(i)
            i += 1
        while stack and s_end[stack[-1]] < e:
            stack.pop()
        if stack:
            out[j] = stack[-1]
    return out


def _own_time(nodes: pd.DataFrame) -> np.ndarray:
    """Each backward node's duration less the nodes run inside it (per thread)."""
    own = nodes["dur_us"].to_numpy(dtype=float).copy()
    for _, group in nodes.groupby("tid", sort=False):
        g = group.sort_values(["ts_us", "end_us"], ascending=[True, False])
        parent = _innermost_strict(g)
        idx = g.index.to_numpy()
        for k, p in enumerate(parent):
            if p >= 0:
                own[nodes.index.get_loc(idx[p])] -= g["dur_us"].iloc[k]
    return np.maximum(own, 0.0)


def _innermost_strict(g: pd.DataFrame) -> np.ndarray:
    """For spans sorted by start (longest first), the position of the span enclosing each
    one, -1 for none."""
    ts, end = g["ts_us"].to_numpy(), g["end_us"].to_numpy()
    out = np.full(len(ts), -1, dtype=np.int64)
    stack: list[int] = []
    for k in range(len(ts)):
        while stack and end[stack[-1]] <= ts[k]:
            stack.pop()
        if stack and end[k] <= end[stack[-1]]:
            out[k] = stack[-1]
        stack.append(k)
    return out


def module_table(
    trace: Trace | None, captured: Sequence[Mapping[str, Any]], peak_bytes: float | None = None
) -> pd.DataFrame:
    """One row per module of ``captured`` (``run.context["modules"]``), times per recorded
    step (see the module docstring); empty when the run recorded no module scopes."""
    if not captured or trace is None or trace.empty:
        return empty()
    rows = pd.DataFrame(list(captured))
    for text in ("role", "dtype"):  # captured before the modules had them
        if text not in rows.columns:
            rows[text] = ""
    ev = trace.events
    recorded = ev["step"].to_numpy() >= 0
    n_steps = max(1, trace.steps["step"].nunique())
    loop_tid = trace.steps["tid"].mode().iloc[0]
    is_scope = (cat_in(ev, "user_annotation")) & per_name(
        trace, lambda n: str(n).startswith(tn.MODULE_PREFIX)
    )
    is_node = per_name(trace, lambda n: str(n).startswith(_NODE)) & recorded
    scopes = ev[is_scope & recorded & (ev["tid"] == loop_tid).to_numpy()]
    if scopes.empty:
        return empty()
    scopes = scopes.sort_values(["ts_us", "end_us"], ascending=[True, False]).reset_index(drop=True)
    scope_path = scopes["name"].str.slice(len(tn.MODULE_PREFIX)).to_numpy()
    nodes = ev[is_node]
    # a scope inside a backward node is a checkpoint's recomputation, part of the backward
    on_loop = nodes[nodes["tid"] == loop_tid].sort_values("ts_us").reset_index(drop=True)
    in_node = _innermost(on_loop, scopes["ts_us"].to_numpy(), scopes["end_us"].to_numpy()) >= 0
    device = _device_time(trace)

    # forward: each module's own ranges
    fwd = scopes[~in_node]
    forward_total = _per_path(scope_path[~in_node], _weights(fwd, device)) / n_steps
    calls = pd.Series(scope_path[~in_node]).value_counts() / n_steps

    # backward: each node to the module its forward op ran in
    ops = ev[(ev["seq"].to_numpy() >= 0) & ~is_node & recorded & (ev["tid"] == loop_tid).to_numpy()]
    where = _innermost(scopes, ops["ts_us"].to_numpy(), ops["end_us"].to_numpy())
    seq_path = dict(zip(ops["seq"].to_numpy()[where >= 0], scope_path[where[where >= 0]], strict=True))
    node_path = np.array([seq_path.get(s) for s in nodes["seq"].to_numpy()], dtype=object)
    own = _own_time(nodes) if device is None else _node_device_time(trace, nodes, device)
    known = np.array([p is not None for p in node_path], dtype=bool)
    backward_self = _per_path(node_path[known], own[known]) / n_steps

    table = rows.set_index("path")
    table["calls"] = calls.reindex(table.index).fillna(0.0)
    table["forward_s"] = forward_total.reindex(table.index).fillna(0.0) / 1e6
    table["backward_self_s"] = backward_self.reindex(table.index).fillna(0.0) / 1e6
    table["saved_self_bytes"] = table["saved_self_bytes"].astype(float)
    table["saved_bytes"] = table["saved_bytes"].astype(float)  # the subtree's, each storage once
    for own_col, total_col in (
        ("backward_self_s", "backward_s"),
        ("parameter_bytes", "parameter_bytes"),
        ("gradient_bytes", "gradient_bytes"),
        ("state_bytes", "state_bytes"),
    ):
        table[total_col] = _subtree_sum(table, own_col)
    # a container never called (a ModuleList) runs its children's forwards
    for path in table[table["calls"] == 0].sort_values("depth", ascending=False).index:
        table.at[path, "forward_s"] = table.loc[table["parent"] == path, "forward_s"].sum()
    children_fwd = table.groupby("parent")["forward_s"].sum()
    table["forward_self_s"] = (table["forward_s"] - children_fwd.reindex(table.index).fillna(0.0)).clip(
        lower=0
    )
    table["total_s"] = table["forward_s"] + table["backward_s"]
    step_s = float(np.mean(trace.steps["dur_us"].to_numpy())) / 1e6  # the times are means per step
    table["step_share"] = table["total_s"] / step_s if step_s > 0 else np.nan
    held = table["saved_bytes"] + table["parameter_bytes"] + table["gradient_bytes"] + table["state_bytes"]
    table["peak_share"] = held / peak_bytes if peak_bytes else np.nan
    out = table.reset_index()[COLUMNS]
    out.attrs["time_source"] = "device" if device is not None else "host"
    out.attrs["steps"] = n_steps
    out.attrs["unattributed_backward_s"] = float(own[~known].sum()) / n_steps / 1e6
    out.attrs["blocks"] = stack_summary(out)
    out.attrs["adapters"] = adapters_summary(out)
    return out


def adapter_roots(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the peft adapters' outermost modules (``lora_A``, ``lora_B``, …: their
    sums hold the rest of the adapter), empty without adapters."""
    if "role" not in table.columns or table.empty:
        return table.iloc[0:0]
    role = table.set_index("path")["role"].astype(str)
    is_adapter = table["role"].astype(str) == "adapter"
    parent_adapter = table["parent"].map(role).fillna("") == "adapter"
    return table[is_adapter & ~parent_adapter]


def adapters_summary(table: pd.DataFrame) -> dict[str, Any] | None:
    """The peft adapters apart from the base model: how many modules, their time per step
    and share of it, the activations they keep and the parameters they train; None
    without adapters."""
    roots = adapter_roots(table)
    if roots.empty:
        return None
    seconds = float(roots["total_s"].sum())
    share = roots["step_share"].astype(float).sum()
    return {
        "modules": int((table["role"].astype(str) == "adapter").sum()),
        "seconds": seconds,
        "step_share": float(share) if np.isfinite(share) else None,
        "saved_bytes": float(roots["saved_bytes"].sum()),
        "parameter_bytes": float(roots["parameter_bytes"].sum()),
        "gradient_bytes": float(roots["gradient_bytes"].sum()),
    }


def stack_summary(table: pd.DataFrame) -> dict[str, Any] | None:
    """The stack of blocks (``blocks``): where, how many, their mean time per step, their
    spread ((slowest − fastest) / mean) and the slowest; None without one."""
    stack = blocks(table)
    if len(stack) < 2:
        return None
    t = stack["total_s"].astype(float)
    mean = float(t.mean())
    return {
        "parent": str(stack["parent"].iloc[0]),
        "class": str(stack["class"].iloc[0]),
        "count": len(stack),
        "mean_s": mean,
        "spread": float((t.max() - t.min()) / mean) if mean > 0 else None,
        "slowest": str(stack.loc[t.idxmax(), "path"]),
    }


def _per_path(paths: np.ndarray, weights: np.ndarray) -> pd.Series:
    if not len(paths):
        return pd.Series(dtype=float)
    return pd.Series(weights, index=pd.Index(paths)).groupby(level=0).sum()


def _subtree_sum(table: pd.DataFrame, column: str) -> pd.Series:
    """Each module's ``column`` plus its descendants' (deepest first)."""
    total = table[column].astype(float).copy()
    for path in table.sort_values("depth", ascending=False).index:
        parent = table.at[path, "parent"]
        if parent in total.index and parent != path:
            total[parent] += total[path]
    return total


def _device_time(trace: Trace) -> pd.DataFrame | None:
    """The kernels with the host time of the runtime call that launched each (None: a
    trace without kernels, timed by the host)."""
    ev = trace.events
    kernels = ev[np.isin(ev["cat"].to_numpy(), tn.DEVICE_WORK)]
    if kernels.empty:
        return None
    calls = ev[np.isin(ev["cat"].to_numpy(), tn.LAUNCH_CATEGORIES) & (ev["correlation"].to_numpy() >= 0)]
    launch = calls.drop_duplicates("correlation").set_index("correlation")
    k = kernels[kernels["correlation"].isin(launch.index)]
    return pd.DataFrame(
        {
            "ts_us": launch.loc[k["correlation"], "ts_us"].to_numpy(),
            "tid": launch.loc[k["correlation"], "tid"].to_numpy(),
            "dur_us": k["dur_us"].to_numpy(),
        }
    )


def _weights(spans: pd.DataFrame, device: pd.DataFrame | None) -> np.ndarray:
    """Each span's time: its duration on the host, or the kernels launched inside it."""
    if device is None:
        return spans["dur_us"].to_numpy(dtype=float)
    return _launched_in(spans, device)


def _launched_in(spans: pd.DataFrame, device: pd.DataFrame) -> np.ndarray:
    out = np.zeros(len(spans))
    for tid, group in spans.groupby("tid", sort=False):
        k = device[device["tid"] == tid].sort_values("ts_us")
        if k.empty:
            continue
        csum = np.concatenate([[0.0], np.cumsum(k["dur_us"].to_numpy())])
        lo = np.searchsorted(k["ts_us"].to_numpy(), group["ts_us"].to_numpy(), side="left")
        hi = np.searchsorted(k["ts_us"].to_numpy(), group["end_us"].to_numpy(), side="right")
        out[[spans.index.get_loc(i) for i in group.index]] = csum[hi] - csum[lo]
    return out


def _node_device_time(trace: Trace, nodes: pd.DataFrame, device: pd.DataFrame) -> np.ndarray:
    """Each backward node's kernels, less those of the nodes inside it."""
    inclusive = _launched_in(nodes, device)
    own = inclusive.copy()
    for _, group in nodes.groupby("tid", sort=False):
        g = group.sort_values(["ts_us", "end_us"], ascending=[True, False])
        parent = _innermost_strict(g)
        pos = [nodes.index.get_loc(i) for i in g.index]
        for k, p in enumerate(parent):
            if p >= 0:
                own[pos[p]] -= inclusive[pos[k]]
    return np.maximum(own, 0.0)


# -- the stack of blocks ---------------------------------------------------------------------


def blocks(table: pd.DataFrame) -> pd.DataFrame:
    """The largest stack of same-class siblings (the transformer blocks): their rows, by
    path, empty when the model has none."""
    if table.empty:
        return table
    best = None
    for (_, _), group in table[table["depth"] > 0].groupby(["parent", "class"], sort=False):
        if len(group) < 2:
            continue
        if best is None or group["parameter_bytes"].sum() > best["parameter_bytes"].sum():
            best = group
    return best if best is not None else table.iloc[0:0]


def slow_block_finding(table: pd.DataFrame, ops: Mapping[str, pd.Series] | None = None) -> Finding | None:
    """A block of the stack whose forward and backward take over ``SLOW_BLOCK_RATIO`` × its
    siblings' median; ``ops``: each block's operator time by name (``block_ops``), to
    say what it runs that the others do not."""
    stack = blocks(table)
    if len(stack) < 3:
        return None
    median = float(stack["total_s"].median())
    slowest = stack.loc[stack["total_s"].idxmax()]
    if not median > 0 or slowest["total_s"] < SLOW_BLOCK_RATIO * median:
        return None
    differ = ""
    if ops is not None and slowest["path"] in ops:
        others = [ops[p] for p in stack["path"] if p != slowest["path"] and p in ops]
        if others:
            typical = pd.concat(others, axis=1).fillna(0.0).median(axis=1)
            extra = (ops[slowest["path"]] - typical.reindex(ops[slowest["path"]].index).fillna(0.0)).nlargest(
                3
            )
            extra = extra[extra > 0]
            differ = ", ".join(f"{name} +{v * 1e3:.2f} ms" for name, v in extra.items())
    ratio = slowest["total_s"] / median
    return Finding(
        id="slow_block",
        title=f"{slowest['path']} takes {ratio:.1f}× the time of the other {slowest['class']} blocks",
        evidence={
            "block": slowest["path"],
            "block_s": float(slowest["total_s"]),
            "median_block_s": median,
            "blocks": len(stack),
            "ops_that_differ": differ or None,
        },
        suggestion=(
            f"Look at what {slowest['path']} runs that its siblings do not"
            + (f" ({differ} per step beyond the median block)" if differ else "")
            + ": an extra layer, another attention kernel, a dtype or a shape of its own. Blocks of a stack "
            "are meant to cost the same."
        ),
        predicted_effect=f"−{(slowest['total_s'] - median) * 1e3:.1f} ms per step if it ran as its siblings do",
        formula="block time − the stack's median block time (forward + backward, per recorded step)",
        severity="warning",
    )


def block_ops(trace: Trace, table: pd.DataFrame) -> dict[str, pd.Series]:
    """Each block's operator time by name (s per step): the ops inside its forward ranges."""
    stack = blocks(table)
    if stack.empty:
        return {}
    ev = trace.events
    n_steps = max(1, trace.steps["step"].nunique())
    loop_tid = trace.steps["tid"].mode().iloc[0]
    on_loop = ev[(ev["tid"] == loop_tid).to_numpy() & (ev["step"].to_numpy() >= 0)]
    wanted = {tn.MODULE_PREFIX + p: p for p in stack["path"]}
    spans = on_loop[on_loop["name"].isin(list(wanted)).to_numpy()].sort_values("ts_us").reset_index(drop=True)
    ops = on_loop[(cat_in(on_loop, "cpu_op"))]
    where = _innermost(spans, ops["ts_us"].to_numpy(), ops["end_us"].to_numpy())
    span_block = spans["name"].map(wanted).to_numpy()  # each span's block, by position
    inside = ops[where >= 0].assign(block=span_block[where[where >= 0]])
    # the top-level ops of each block (an op's children are in its time)
    out = {}
    for path, group in inside.groupby("block"):
        g = group.sort_values(["ts_us", "end_us"], ascending=[True, False])
        top = g[_innermost_strict(g) < 0]
        out[str(path)] = top.groupby("name")["dur_us"].sum() / n_steps / 1e6
    return out


def describe(table: pd.DataFrame, n: int = 5) -> str:
    """A few lines: the modules that take the most time and hold the most memory."""
    if table.empty:
        return "no module scopes were recorded"
    adapters = table.attrs.get("adapters")
    leaves = table[(table["depth"] > 0) & (table["role"].astype(str) != "adapter")]
    lines = ["by time:"]
    for _, r in leaves.nlargest(n, "total_s").iterrows():
        lines.append(
            f"  {r['path']} ({r['class']}): {r['total_s'] * 1e3:.2f} ms, {r['step_share']:.0%} of the step"
        )
    lines.append("by saved activations:")
    for _, r in leaves.nlargest(n, "saved_bytes").iterrows():
        lines.append(f"  {r['path']} ({r['class']}): {fmt_bytes(r['saved_bytes'])}")
    if adapters:
        lines.append(f"adapters (peft), apart from the above: {adapters_line(adapters)}")
    return "\n".join(lines)


def adapters_line(a: Mapping[str, Any]) -> str:
    """``adapters_summary`` in words."""
    share = f" ({a['step_share']:.0%} of the step)" if a.get("step_share") is not None else ""
    return (
        f"{a['modules']} modules, {a['seconds'] * 1e3:.2f} ms per step{share}, "
        f"{fmt_bytes(a['saved_bytes'])} of activations kept, {fmt_bytes(a['parameter_bytes'])} of parameters "
        f"({fmt_bytes(a['gradient_bytes'])} trained)"
    )
