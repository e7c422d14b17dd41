// The viewer's state (static/timeline_state.js): the window's clamp, zoom, pan and padding
// arithmetic, the time ↔ pixel mapping, what is under the pointer, the search's matches and
// the texts shown.
import assert from "node:assert/strict";
import { test } from "node:test";

import { decode } from "../../swift_nb/render/timeline/static/timeline_data.js";
import { GUTTER } from "../../swift_nb/render/timeline/static/timeline_draw.js";
import {
  MIN_SPAN_US, applySearch, clampWindow, createState, detailText, detailTime, foundText, hitTest, nextMatch,
  paddedWindow, panWindow, pxToTime, rangeText, rankChoices, resetTrace, setWindow, startSearch, timeToPx, tipText,
  zoomWindow,
} from "../../swift_nb/render/timeline/static/timeline_state.js";
import { ORIGIN, payload } from "./fixtures.mjs";

const BOUNDS = { start: 1000, end: 2000 };
const close = (a, b, eps = 1e-9) => assert.ok(Math.abs(a - b) <= eps, `${a} ≉ ${b}`);

function state() {
  return createState({ ...payload(), initial: decode(payload()) });
}

test("clampWindow keeps a window inside the trace, its width where it fits", () => {
  assert.deepEqual(clampWindow(BOUNDS, 1200, 1300), { start: 1200, end: 1300 });
  assert.deepEqual(clampWindow(BOUNDS, 900, 1100), { start: 1000, end: 1200 }); // shifted right
  assert.deepEqual(clampWindow(BOUNDS, 1950, 2150), { start: 1800, end: 2000 }); // shifted left
  assert.deepEqual(clampWindow(BOUNDS, 500, 2500), BOUNDS); // wider than the trace: the trace
  const narrow = clampWindow(BOUNDS, 1500, 1500);
  close(narrow.end - narrow.start, MIN_SPAN_US);
  close((narrow.start + narrow.end) / 2, 1500); // the narrowest window, around the middle
});

test("zoomWindow keeps the anchor where it is; a zoom in and out again is the same window", () => {
  const view = { start: 1000, end: 2000 };
  const zoomed = zoomWindow(view, 0.5, 1250);
  assert.deepEqual(zoomed, { start: 1125, end: 1625 });
  // the anchor's share of the window is unchanged
  close((1250 - zoomed.start) / (zoomed.end - zoomed.start), (1250 - view.start) / (view.end - view.start));
  const back = zoomWindow(zoomed, 2, 1250);
  close(back.start, 1000);
  close(back.end, 2000);
});

test("panWindow moves by pixels of the plot, the span kept; the clamp stops it at the ends", () => {
  const view = { start: 1200, end: 1400 };
  const right = panWindow(view, 100, 1000); // 100 px of 1000: 10% of 200 µs
  close(right.start, 1220);
  close(right.end, 1420);
  assert.deepEqual(panWindow(view, -500, 1000), { start: 1100, end: 1300 });
  const s = createState({ start_us: 1000, end_us: 2000, tracks: [] });
  setWindow(s, 1200, 1400);
  const far = panWindow(s.view, 10_000, 1000); // far past the end
  setWindow(s, far.start, far.end);
  assert.deepEqual([s.view.start, s.view.end, s.view.origin], [1800, 2000, 1000]);
});

test("paddedWindow: 8% a side (at least 1 µs), none when exact", () => {
  const w = paddedWindow(1000, 1100);
  close(w.start, 992);
  close(w.end, 1108);
  assert.deepEqual(paddedWindow(1000, 1005), { start: 999, end: 1006 });
  assert.deepEqual(paddedWindow(1000, 1100, true), { start: 1000, end: 1100 });
});

test("timeToPx and pxToTime: the gutter is the view's start, the right edge its end", () => {
  const view = { start: 1000, end: 2000 };
  const width = GUTTER + 500;
  assert.equal(timeToPx(view, width, 1000), GUTTER);
  assert.equal(timeToPx(view, width, 2000), width);
  assert.equal(timeToPx(view, width, 1500), GUTTER + 250);
  for (const px of [GUTTER, GUTTER + 1, GUTTER + 333, width]) close(timeToPx(view, width, pxToTime(view, width, px)), px);
});

test("hitTest: the nearest item within 2 px, nothing off the span tracks", () => {
  const s = state();
  const width = GUTTER + 1000; // the whole trace: 1 µs a pixel
  const [cpu, mem] = s.boxes;
  const rowY = (d) => cpu.y + d * 14 + 5;
  const at = (t, d) => hitTest(s, width, timeToPx(s.view, width, ORIGIN + t), rowY(d));
  assert.equal(at(105, 1).item.n, "aten::mm");
  assert.equal(at(126, 1).item.n, "aten::relu"); // 1 px past its end: within the tolerance
  assert.equal(at(200, 1).item, null); // nothing within 2 px
  assert.equal(at(200, 1).box.track, "cpu:1");
  assert.equal(at(500, 0).item.n, "ProfilerStep#1");
  assert.equal(at(115, 1).depth, 1);
  assert.equal(hitTest(s, width, GUTTER - 10, rowY(0)), null); // the gutter
  assert.equal(hitTest(s, width, GUTTER + 500, mem.y + 5), null); // a counter
  assert.equal(hitTest(s, width, GUTTER + 500, 2), null); // the axis
  const hit = at(105, 1);
  close(hit.t, ORIGIN + 105, 1e-6);
  close(detailTime({ ...hit, t: ORIGIN + 90 }), ORIGIN + 100); // clamped into the item
});

test("resetTrace: another trace's tracks and bounds, all of it in view, nothing selected", () => {
  const s = state();
  s.selected = { name: "x" };
  setWindow(s, ORIGIN + 100, ORIGIN + 200);
  const other = { tracks: [{ track: "r", label: "rank 1", kind: "steps", max_depth: 0 }], start_us: 5, end_us: 50 };
  resetTrace(s, other);
  assert.deepEqual(s.view, { start: 5, end: 50, origin: 5 });
  assert.deepEqual(s.bounds, { start: 5, end: 50 });
  assert.equal(s.boxes.length, 1);
  assert.equal(s.selected, null);
  assert.equal(s.data.rows.size, 0);
  assert.equal(s.source, undefined); // kept: neither had one
});

test("search: matches dim the rest, Enter steps through them and round again", () => {
  const s = state();
  startSearch(s, "aten");
  assert.equal(s.matches, null);
  applySearch(s, [{ name: "aten::mm", start_us: 1, end_us: 2 }, { name: "aten::add", start_us: 5, end_us: 6 }]);
  assert.deepEqual([...s.matches], ["aten::mm", "aten::add"]);
  assert.equal(nextMatch(s).name, "aten::mm");
  assert.equal(nextMatch(s).name, "aten::add");
  assert.equal(nextMatch(s).name, "aten::mm");
  startSearch(s, "relu"); // a new search: its matches kept until it answers, no step meanwhile
  assert.equal(s.matches.size, 2);
  assert.equal(nextMatch(s), null);
  startSearch(s, "");
  assert.equal(s.matches, null);
  applySearch(s, null);
  assert.equal(s.hits.length, 0);
});

test("texts: the range, the tooltip, the detail, the search's count, the rank choices", () => {
  assert.equal(rangeText({ start: 2000, end: 3500, origin: 1000 }), "1.00 ms – 2.50 ms (1.50 ms)");
  const hit = { box: { label: "CPU thread 1" }, item: { n: "aten::mm", s: 0, e: 12, c: 3 } };
  assert.equal(tipText(hit), "aten::mm\n12.0 µs · 3 events merged\nCPU thread 1");
  assert.equal(tipText({ ...hit, item: { ...hit.item, c: 1 } }), "aten::mm\n12.0 µs\nCPU thread 1");
  const info = {
    name: "aten::linear", dur_us: 1500, start_us: 3000, count: 1, shapes: "[[32, 64]]", stack: ["step", "fwd"],
    launches: [{ name: "gemm", start_us: 3100, end_us: 3150 }], launched_by: null,
  };
  assert.equal(detailText(info, 1000),
    "aten::linear   1.50 ms   at 2.00 ms\nshapes: [[32, 64]]\nstack: step › fwd\nlaunched 1: gemm (50.0 µs)");
  assert.match(detailText({ ...info, count: 7, launches: [] }, 1000), /\n7 events merged at this zoom/);
  assert.equal(foundText([]), "none found");
  assert.equal(foundText([1, 2]), "2 found");
  assert.equal(foundText(new Array(200).fill(0)), "200+ found");
  assert.deepEqual(rankChoices([0, 1]).map((c) => c.label), ["rank 0", "rank 1"]);
  const many = rankChoices([...Array(17).keys()]);
  assert.deepEqual(many[0], { value: "-1", label: "all ranks" });
  assert.equal(many.length, 18);
});
