// The viewer's drawing helpers (static/timeline_draw.js): value and time formatting, the
// axis's ticks, the layout, and a scene drawn on a recording stand-in for a canvas.
import assert from "node:assert/strict";
import { test } from "node:test";

import { decode } from "../../swift_nb/render/timeline/static/timeline_data.js";
import {
  AXIS_H, COUNTER_H, GUTTER, PAD, ROW_H, axisTicks, canvasHeight, drawScene, ellipsis, fmtUs, fmtValue, layout,
  niceStep,
} from "../../swift_nb/render/timeline/static/timeline_draw.js";
import { createState, timeToPx } from "../../swift_nb/render/timeline/static/timeline_state.js";
import { ORIGIN, payload } from "./fixtures.mjs";

test("fmtUs: µs, ms and s, with fewer decimals as the number grows", () => {
  assert.equal(fmtUs(0), "0.00 µs");
  assert.equal(fmtUs(5), "5.00 µs");
  assert.equal(fmtUs(12.345), "12.3 µs");
  assert.equal(fmtUs(1234), "1.23 ms");
  assert.equal(fmtUs(12345), "12.3 ms");
  assert.equal(fmtUs(1_234_567), "1.235 s");
  assert.equal(fmtUs(12_345_678), "12.35 s");
  assert.equal(fmtUs(-1500), "-1.50 ms");
});

test("fmtValue: bytes in binary units, other units after the number", () => {
  const bytes = { unit: "bytes" };
  assert.equal(fmtValue(bytes, 512), "512 B");
  assert.equal(fmtValue(bytes, 2048), "2.0 KiB");
  assert.equal(fmtValue(bytes, 3.5 * 1024 ** 3), "3.5 GiB");
  assert.equal(fmtValue(bytes, 2 * 1024 ** 5), "2048.0 TiB"); // TiB is the largest
  assert.equal(fmtValue({ unit: "%" }, 42.25), "42.3 %");
  assert.equal(fmtValue({ unit: "W" }, 250.4), "250 W");
  assert.equal(fmtValue({ unit: null }, 3), "3.0");
});

test("niceStep: 1, 2 or 5 times a power of ten, at least span / target", () => {
  assert.equal(niceStep(1000, 10), 100);
  assert.equal(niceStep(1000, 7), 200);
  assert.equal(niceStep(1000, 3), 500);
  assert.equal(niceStep(0.03, 2), 0.02);
  assert.equal(niceStep(9000, 1), 10000);
});

test("axis ticks: nice multiples after the origin, inside the view, about one per 110 px", () => {
  const view = { start: ORIGIN, end: ORIGIN + 1000, origin: ORIGIN };
  const width = GUTTER + 1100; // 10 ticks' worth of plot
  assert.deepEqual(axisTicks(view, width), [0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]);
  // a zoomed view: ticks still count from the origin and stay inside the view
  const zoomed = { start: ORIGIN + 123, end: ORIGIN + 177, origin: ORIGIN };
  const ticks = axisTicks(zoomed, width);
  assert.deepEqual(ticks, [130, 140, 150, 160, 170]); // 54 µs over ~10 ticks: a 10 µs step
  for (const t of ticks) assert.ok(t + ORIGIN >= zoomed.start && t + ORIGIN <= zoomed.end);
  // a narrow canvas still gets at least 2 ticks' worth of step
  assert.equal(niceStep(1000, 2), 500);
  assert.deepEqual(axisTicks(view, GUTTER + 50), [0, 500, 1000]);
});

test("layout: a row per depth for spans, a band for counters, the canvas's height below", () => {
  const boxes = layout(payload().tracks);
  assert.equal(boxes[0].y, AXIS_H + PAD);
  assert.equal(boxes[0].h, 2 * ROW_H); // max_depth 1: two rows
  assert.equal(boxes[1].y, boxes[0].y + boxes[0].h + 2 * PAD);
  assert.equal(boxes[1].h, COUNTER_H);
  assert.equal(canvasHeight(boxes), boxes[1].y + COUNTER_H + PAD);
  assert.equal(canvasHeight([]), AXIS_H);
});

test("ellipsis cuts a label to its length, the last character an ellipsis", () => {
  assert.equal(ellipsis("short", 24), "short");
  assert.equal(ellipsis("x".repeat(24), 24), "x".repeat(24));
  const cut = ellipsis("y".repeat(30), 24);
  assert.equal(cut.length, 24);
  assert.ok(cut.endsWith("…"));
});

// A 2D context that records what is drawn.
function recordingContext() {
  const calls = [];
  const record = (name) => (...args) => calls.push([name, ...args]);
  const ctx = { calls };
  for (const m of ["fillRect", "strokeRect", "fillText", "beginPath", "moveTo", "lineTo", "stroke", "fill",
    "closePath", "save", "restore", "rect", "clip", "bezierCurveTo", "clearRect", "setTransform"]) {
    ctx[m] = record(m);
  }
  return ctx;
}

test("drawScene draws the spans in view, the labels, the counter's max and the axis", () => {
  const data = decode(payload());
  const state = createState({ ...payload(), initial: data });
  const width = GUTTER + 1000;
  const x = (t) => timeToPx(state.view, width, t);
  const ctx = recordingContext();
  assert.equal(drawScene(ctx, state, width, x), 4); // every span of the trace
  const texts = ctx.calls.filter((c) => c[0] === "fillText").map((c) => c[1]);
  assert.ok(texts.includes("CPU thread 1") && texts.includes("Memory"));
  assert.ok(texts.includes("max 30 B"));
  assert.ok(texts.includes("ProfilerStep#1")); // wide enough to be named
  assert.ok(texts.includes("0.00 µs"));
  // zoomed on [100, 130] µs: the step, mm and relu; add (300 µs) is out of view
  state.view.start = ORIGIN + 100;
  state.view.end = ORIGIN + 130;
  assert.equal(drawScene(recordingContext(), state, width, x), 3);
});
