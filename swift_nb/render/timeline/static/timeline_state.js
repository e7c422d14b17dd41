// The viewer's state, without the DOM: the trace's bounds, the view window (and its zoom, pan
// and clamp arithmetic), the time ↔ pixel mapping, what is under a pixel, the search's matches,
// and the texts the viewer shows. Bundled after timeline_draw.js into one module
// (render/timeline/view.py); every function here runs in Node as well (tests/js).

import { firstReaching } from "./timeline_data.js";
import { GUTTER, ROW_H, fmtUs, layout } from "./timeline_draw.js";

// The narrowest window (µs) a zoom reaches.
export const MIN_SPAN_US = 0.01;

export function emptyData() {
  return { rows: new Map(), counters: new Map() };
}

// A viewer's state from its options (createViewer's): the whole trace in view.
export function createState(options) {
  return {
    source: options.source,
    bounds: { start: options.start_us, end: options.end_us },
    view: { start: options.start_us, end: options.end_us, origin: options.start_us },
    boxes: layout(options.tracks || []),
    data: options.initial || emptyData(),
    queries: 0, seq: 0, timer: null, matches: null, hits: [], hit: -1, selected: null, hover: null,
    width: 0,
  };
}

// A new trace (another rank): its tracks, bounds, first answer (and source), the whole of it
// in view, nothing selected.
export function resetTrace(state, o) {
  state.boxes = layout(o.tracks);
  state.bounds = { start: o.start_us, end: o.end_us };
  state.view = { start: o.start_us, end: o.end_us, origin: o.start_us };
  state.data = o.initial || emptyData();
  state.selected = null;
  if (o.source) state.source = o.source;
}

// ---- the window ---------------------------------------------------------------------------

// The window [start, end] kept inside ``bounds``: at least ``minSpan`` wide (around its
// middle), at most the whole trace, shifted back inside where it overhangs an end.
export function clampWindow(bounds, start, end, minSpan = MIN_SPAN_US) {
  const span = bounds.end - bounds.start;
  let s = start;
  let e = end;
  if (e - s < minSpan) [s, e] = [(s + e) / 2 - minSpan / 2, (s + e) / 2 + minSpan / 2];
  if (e - s > span) [s, e] = [bounds.start, bounds.end];
  if (s < bounds.start) [s, e] = [bounds.start, bounds.start + (e - s)];
  if (e > bounds.end) [s, e] = [bounds.end - (e - s), bounds.end];
  return { start: s, end: e };
}

// The view shows [start, end], clamped to the trace (its origin kept).
export function setWindow(state, start, end) {
  const w = clampWindow(state.bounds, start, end);
  state.view.start = w.start;
  state.view.end = w.end;
  return state.view;
}

// ``view`` scaled by ``factor`` (< 1: zoom in) around the time ``anchorT``, which stays put.
export function zoomWindow(view, factor, anchorT) {
  return { start: anchorT - (anchorT - view.start) * factor, end: anchorT + (view.end - anchorT) * factor };
}

// ``view`` moved by ``dxPx`` pixels of a plot ``plotPx`` wide (> 0: later in time).
export function panWindow(view, dxPx, plotPx) {
  const dt = (dxPx / plotPx) * (view.end - view.start);
  return { start: view.start + dt, end: view.end + dt };
}

// The window that shows [start, end]: with a margin of 8% a side (at least 1 µs) unless exact.
export function paddedWindow(start, end, exact = false) {
  const margin = exact ? 0 : Math.max((end - start) * 0.08, 1);
  return { start: start - margin, end: end + margin };
}

// ---- pixels -------------------------------------------------------------------------------

// The plot's width: the canvas's, less the track labels' gutter.
export function plotWidth(width) {
  return width - GUTTER;
}

// The pixel (from the canvas's left) of time ``t`` in ``view`` on a canvas ``width`` wide.
export function timeToPx(view, width, t) {
  return GUTTER + ((t - view.start) / (view.end - view.start)) * plotWidth(width);
}

// The time at pixel ``px``: timeToPx's inverse.
export function pxToTime(view, width, px) {
  return view.start + ((px - GUTTER) / plotWidth(width)) * (view.end - view.start);
}

// What is at (px, py) of the canvas: null off the span tracks (counters, the gutter, the
// axis); else {box, depth, item, t}, item the drawn item within 2 px whose middle is nearest
// (null where none is).
export function hitTest(state, width, px, py) {
  const box = state.boxes.find((b) => py >= b.y && py < b.y + b.h);
  if (!box || box.kind === "counter" || px < GUTTER) return null;
  const depth = Math.floor((py - box.y) / ROW_H);
  const row = state.data.rows.get(box.track + ":" + depth);
  if (!row) return { box, depth, item: null };
  const t = pxToTime(state.view, width, px);
  const tol = 2 * ((state.view.end - state.view.start) / plotWidth(width));
  const off = (it) => Math.abs((it.s + it.e) / 2 - t);
  let best = null;
  for (let i = firstReaching(row, t - tol); i < row.length && row[i].s <= t + tol; i++) {
    if (row[i].e >= t - tol && (!best || off(row[i]) < off(best))) best = row[i];
  }
  return { box, depth, item: best, t };
}

// The time in a hit item at which to ask for its detail: the pointer's, inside the item.
export function detailTime(hit) {
  return Math.min(Math.max(hit.t, hit.item.s), hit.item.e);
}

// ---- search -------------------------------------------------------------------------------

// A search for ``text`` begins: no match to step through until it answers; an empty text is
// no search (nothing dimmed), another text keeps the last one's dimming meanwhile.
export function startSearch(state, text) {
  state.hits = [];
  state.hit = -1;
  if (!text) state.matches = null;
}

// A search's answer: its hits (at most 200, sorted by start), their names the ones not dimmed.
export function applySearch(state, hits) {
  state.hits = hits || [];
  state.matches = new Set(state.hits.map((h) => h.name));
}

// The next match (after the last one, the first again), or null without matches.
export function nextMatch(state) {
  if (!state.hits.length) return null;
  state.hit = (state.hit + 1) % state.hits.length;
  return state.hits[state.hit];
}

// ---- texts --------------------------------------------------------------------------------

// The bar's range: the view's ends after the trace's start, and its span.
export function rangeText(view) {
  return `${fmtUs(view.start - view.origin)} – ${fmtUs(view.end - view.origin)} (${fmtUs(view.end - view.start)})`;
}

// The tooltip of a hit item: its name, duration (and merged count), its track.
export function tipText(hit) {
  const it = hit.item;
  return `${it.n}\n${fmtUs(it.e - it.s)}` + (it.c > 1 ? ` · ${it.c} events merged` : "") + `\n${hit.box.label}`;
}

// The detail panel's text for a source's detail ``info``; times after ``origin``.
export function detailText(info, origin) {
  const lines = [`${info.name}   ${fmtUs(info.dur_us)}   at ${fmtUs(info.start_us - origin)}`];
  if (info.count > 1) lines.push(`${info.count} events merged at this zoom: zoom in to see each`);
  if (info.shapes) lines.push(`shapes: ${info.shapes}`);
  if (info.types) lines.push(`types: ${info.types}`);
  if (info.stack && info.stack.length) lines.push(`stack: ${info.stack.join(" › ")}`);
  const launches = info.launches || [];
  if (launches.length) {
    const named = launches.slice(0, 8).map((k) => `${k.name} (${fmtUs(k.end_us - k.start_us)})`);
    lines.push(`launched ${launches.length}: ` + named.join(", "));
  }
  if (info.launched_by) lines.push(`launched by: ${info.launched_by.name}`);
  return lines.join("\n");
}

// The search's count beside its box (a source answers at most 200).
export function foundText(hits) {
  return hits.length ? `${hits.length}${hits.length >= 200 ? "+" : ""} found` : "none found";
}

// The rank selector's choices: past 16 ranks the first one is the overview (one summary
// track per rank: -1).
export function rankChoices(ranks) {
  const choices = ranks.length > 16 ? [-1, ...ranks] : ranks;
  return choices.map((r) => ({ value: String(r), label: r < 0 ? "all ranks" : `rank ${r}` }));
}
