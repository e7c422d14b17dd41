// The timeline's drawing on a 2D canvas: the track layout, the time axis, span rows,
// counter bands and flow lines, and the whole scene of a view (drawScene). Bundled with
// timeline.js into one module.

import { firstReaching } from "./timeline_data.js";

export const ROW_H = 14;
export const COUNTER_H = 34;
export const GUTTER = 160;
export const AXIS_H = 18;
export const PAD = 4;

export function hue(name) {
  let h = 0;
  for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) | 0;
  return Math.abs(h) % 360;
}

export function color(item, dim) {
  const light = item.c > 1 ? 62 : 70;
  return `hsla(${hue(item.n || "")}, 55%, ${light}%, ${dim ? 0.25 : 1})`;
}

export function fmtUs(us) {
  const a = Math.abs(us);
  if (a >= 1e6) return (us / 1e6).toFixed(a >= 1e7 ? 2 : 3) + " s";
  if (a >= 1e3) return (us / 1e3).toFixed(a >= 1e4 ? 1 : 2) + " ms";
  return us.toFixed(a >= 10 ? 1 : 2) + " µs";
}

// ``text`` cut to ``max`` characters, the last one an ellipsis.
export function ellipsis(text, max) {
  return text.length > max ? text.slice(0, max - 1) + "…" : text;
}

// A counter's value in its track's unit (Timeline.tracks' unit: bytes, %, W, or none).
export function fmtValue(track, v) {
  if (track.unit === "bytes") {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) [v, i] = [v / 1024, i + 1];
    return v.toFixed(i ? 1 : 0) + " " + units[i];
  }
  return (Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(1)) + (track.unit ? " " + track.unit : "");
}

// Track rows from the top of the canvas: spans get a row per depth, counters a band.
export function layout(tracks) {
  let y = AXIS_H;
  return tracks.map((t) => {
    const h = t.kind === "counter" ? COUNTER_H : (Math.max(0, t.max_depth) + 1) * ROW_H;
    const box = { ...t, y: y + PAD, h };
    y += h + 2 * PAD;
    return box;
  });
}

// The canvas's height (CSS pixels) for the boxes of layout(): the axis alone without tracks.
export function canvasHeight(boxes) {
  const last = boxes[boxes.length - 1];
  return last ? last.y + last.h + PAD : AXIS_H;
}

export function niceStep(span, target) {
  const raw = span / target;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}

// The axis's ticks for view ``v`` on a canvas ``width`` wide: times after v.origin, a nice
// step apart (about one per 110 px of the plot, at least 2 a view), those inside the view.
export function axisTicks(v, width) {
  const step = niceStep(v.end - v.start, Math.max(2, (width - GUTTER) / 110));
  const ticks = [];
  for (let t = Math.ceil((v.start - v.origin) / step) * step; t + v.origin <= v.end; t += step) ticks.push(t);
  return ticks;
}

export function drawAxis(ctx, v, width, x) {
  ctx.fillStyle = "#f6f6f6";
  ctx.fillRect(0, 0, width, AXIS_H);
  ctx.fillStyle = "#555";
  ctx.strokeStyle = "#ccc";
  for (const t of axisTicks(v, width)) {
    const px = x(t + v.origin);
    ctx.beginPath();
    ctx.moveTo(px + 0.5, AXIS_H - 5);
    ctx.lineTo(px + 0.5, AXIS_H);
    ctx.stroke();
    ctx.fillText(fmtUs(t), px + 3, AXIS_H - 6);
  }
}

export function drawSpans(ctx, box, rows, x, width, state) {
  let drawn = 0;
  for (let d = 0; d <= box.max_depth; d++) {
    const row = rows.get(box.track + ":" + d);
    if (!row) continue;
    const y = box.y + d * ROW_H;
    for (let i = firstReaching(row, state.view.start); i < row.length && row[i].s <= state.view.end; i++) {
      const it = row[i];
      const x0 = Math.max(GUTTER, x(it.s));
      const x1 = Math.min(width, x(it.e));
      const w = Math.max(1, x1 - x0);
      const dim = state.matches && !state.matches.has(it.n);
      ctx.fillStyle = color(it, dim);
      ctx.fillRect(x0, y, w, ROW_H - 1);
      drawn++;
      if (w > 36) {
        ctx.save();
        ctx.beginPath();
        ctx.rect(x0, y, w, ROW_H);
        ctx.clip();
        ctx.fillStyle = dim ? "#999" : "#111";
        ctx.fillText(it.c > 1 ? `${it.n} ×${it.c}` : it.n, x0 + 2, y + ROW_H - 4);
        ctx.restore();
      }
    }
  }
  return drawn;
}

// A counter's series as a filled line scaled to its band; returns its highest value.
export function drawCounter(ctx, box, series, x, width, view) {
  if (!series || !series.length) return null;
  let max = 0;
  for (const [, val] of series) max = Math.max(max, val);
  const y = (val) => box.y + box.h - (max > 0 ? (val / max) * (box.h - 2) : 0);
  ctx.beginPath();
  ctx.moveTo(Math.max(GUTTER, x(series[0][0])), box.y + box.h);
  for (const [t, val] of series) {
    if (t < view.start && t !== series[0][0]) continue;
    ctx.lineTo(Math.min(width, Math.max(GUTTER, x(t))), y(val));
    if (t > view.end) break;
  }
  ctx.lineTo(Math.min(width, x(series[series.length - 1][0])), box.y + box.h);
  ctx.closePath();
  ctx.fillStyle = "rgba(76,114,176,.35)";
  ctx.strokeStyle = "#4c72b0";
  ctx.fill();
  ctx.stroke();
  return max;
}

export function drawFlows(ctx, state, x, boxes) {
  const sel = state.selected;
  if (!sel) return;
  const yOf = (track, depth) => {
    const b = boxes.find((bb) => bb.track === track);
    return b ? b.y + Math.min(depth, b.max_depth) * ROW_H + ROW_H / 2 : null;
  };
  const from = [x(sel.start_us), yOf(sel.track, sel.depth)];
  const targets = (sel.launches || []).concat(sel.launched_by ? [sel.launched_by] : []);
  ctx.strokeStyle = "#c0392b";
  ctx.lineWidth = 1.2;
  for (const k of targets) {
    const ty = yOf(k.track, k.depth || 0);
    if (ty === null || from[1] === null) continue;
    const tx = x(k.start_us);
    ctx.beginPath();
    ctx.moveTo(from[0], from[1]);
    ctx.bezierCurveTo(from[0], (from[1] + ty) / 2, tx, (from[1] + ty) / 2, tx, ty);
    ctx.stroke();
    ctx.fillStyle = "#c0392b";
    ctx.fillRect(tx - 2, ty - 2, 4, 4);
  }
  ctx.lineWidth = 1;
}

// One track's band: its stripe, its spans or counter, its label in the gutter; returns the
// spans drawn.
export function drawTrack(ctx, box, i, state, x, width) {
  ctx.fillStyle = i % 2 ? "#fafafa" : "#fff";
  ctx.fillRect(0, box.y - PAD, width, box.h + 2 * PAD);
  let max = null;
  let drawn = 0;
  if (box.kind === "counter") max = drawCounter(ctx, box, state.data.counters.get(box.track), x, width, state.view);
  else drawn = drawSpans(ctx, box, state.data.rows, x, width, state);
  ctx.fillStyle = "#f0f0f0";
  ctx.fillRect(0, box.y - PAD, GUTTER - 4, box.h + 2 * PAD);
  ctx.fillStyle = "#333";
  ctx.fillText(ellipsis(box.label, 24), 4, box.y + 11);
  if (max !== null) {
    ctx.fillStyle = "#777";
    ctx.fillText("max " + fmtValue(box, max), 4, box.y + 25);
  }
  return drawn;
}

// The view's whole scene on a cleared ``ctx`` ``width`` wide (CSS pixels): the axis, each
// track, the hovered item's outline, the selected item's flows; ``x`` maps a time to a
// pixel. Returns the number of spans drawn.
export function drawScene(ctx, state, width, x) {
  ctx.font = "11px system-ui, sans-serif";
  drawAxis(ctx, state.view, width, x);
  let drawn = 0;
  state.boxes.forEach((box, i) => {
    drawn += drawTrack(ctx, box, i, state, x, width);
  });
  if (state.hover) {
    const { box, item } = state.hover;
    ctx.strokeStyle = "#000";
    ctx.strokeRect(x(item.s), box.y + item.d * ROW_H, Math.max(1, x(item.e) - x(item.s)), ROW_H - 1);
  }
  drawFlows(ctx, state, x, state.boxes);
  return drawn;
}
