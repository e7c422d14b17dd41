// The viewer's input as commands (static/timeline_input.js): the wheel and W/S/A/D keys.
import assert from "node:assert/strict";
import { test } from "node:test";

import { GUTTER } from "../../swift_nb/render/timeline/static/timeline_draw.js";
import { keyCommand, wheelCommand } from "../../swift_nb/render/timeline/static/timeline_input.js";

const wheel = (deltaY, more = {}) => ({ deltaX: 0, deltaY, deltaMode: 0, ctrlKey: false, ...more });

test("the wheel: down zooms out, up zooms in, a pinch 4 times as fast, a swipe pans", () => {
  assert.ok(wheelCommand(wheel(100)).zoom > 1);
  assert.ok(wheelCommand(wheel(-100)).zoom < 1);
  assert.equal(wheelCommand(wheel(100)).zoom, Math.exp(100 * 0.0015));
  assert.equal(wheelCommand(wheel(3, { deltaMode: 1 })).zoom, Math.exp(3 * 0.05)); // lines, not pixels
  assert.equal(wheelCommand(wheel(10, { ctrlKey: true })).zoom, Math.exp(10 * 0.0015 * 4));
  // zooming in and out by the same delta is the same window again
  assert.ok(Math.abs(wheelCommand(wheel(100)).zoom * wheelCommand(wheel(-100)).zoom - 1) < 1e-12);
  assert.deepEqual(wheelCommand(wheel(5, { deltaX: -40 })), { pan: -40 });
});

test("W/S zoom around the hovered time (else the middle), A/D pan 15% of the plot", () => {
  const view = { start: 1000, end: 2000 };
  const width = GUTTER + 1000;
  assert.deepEqual(keyCommand("w", view, null, width), { zoom: 0.8, anchor: 1500 });
  assert.deepEqual(keyCommand("S", view, { t: 1200 }, width), { zoom: 1.25, anchor: 1200 });
  assert.deepEqual(keyCommand("w", view, { t: undefined }, width), { zoom: 0.8, anchor: 1500 });
  assert.deepEqual(keyCommand("a", view, null, width), { pan: -150 });
  assert.deepEqual(keyCommand("D", view, null, width), { pan: 150 });
  assert.equal(keyCommand("x", view, null, width), null);
  assert.equal(keyCommand("Enter", view, null, width), null);
});
