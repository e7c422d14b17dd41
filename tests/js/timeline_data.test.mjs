// The viewer's data (static/timeline_data.js): the payload's decode, the binary search over a
// row, the report's own level of detail, the embedded source and the kernel's.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  decode, embeddedSource, finishRow, firstReaching, levelOfDetail, remoteSource,
} from "../../swift_nb/render/timeline/static/timeline_data.js";
import { ORIGIN, payload } from "./fixtures.mjs";

// n items of a row, each ``dur`` µs long, ``gap`` µs apart, starting at ``t0``.
function row(n, { t0 = 0, dur = 1, gap = 0, name = (i) => "op" + i, count = 1 } = {}) {
  const items = [];
  for (let i = 0; i < n; i++) {
    const s = t0 + i * (dur + gap);
    items.push({ t: "cpu:1", d: 0, s, e: s + dur, n: name(i), c: count });
  }
  finishRow(items);
  return items;
}

test("decode keys rows by track:depth, sorted by start, times on the trace's clock", () => {
  const data = decode(payload());
  assert.deepEqual([...data.rows.keys()].sort(), ["cpu:1:0", "cpu:1:1"]);
  const inner = data.rows.get("cpu:1:1");
  assert.deepEqual(inner.map((it) => it.n), ["aten::mm", "aten::relu", "aten::add"]);
  assert.deepEqual(inner.map((it) => [it.s, it.e]), [
    [ORIGIN + 100, ORIGIN + 110], [ORIGIN + 120, ORIGIN + 125], [ORIGIN + 300, ORIGIN + 310],
  ]);
  assert.deepEqual(inner.map((it) => [it.t, it.d, it.c]), [["cpu:1", 1, 1], ["cpu:1", 1, 4], ["cpu:1", 1, 1]]);
  assert.equal(data.rows.get("cpu:1:0")[0].n, "ProfilerStep#1");
  assert.equal(data.note, "a note");
  assert.equal(data.tracks.length, 2);
});

test("decode sorts each counter's series by time and keys it by track id", () => {
  const data = decode(payload());
  assert.deepEqual([...data.counters.keys()], ["mem"]);
  assert.deepEqual(data.counters.get("mem"), [[ORIGIN, 10], [ORIGIN + 250, 20], [ORIGIN + 500, 30]]);
});

test("decode of an empty payload: no rows, no counters, no note", () => {
  const data = decode({});
  assert.equal(data.rows.size, 0);
  assert.equal(data.counters.size, 0);
  assert.equal(data.note, null);
});

test("firstReaching finds the first item whose running end reaches t, a long one included", () => {
  const items = [
    { s: 0, e: 100 }, // long: reaches past the short ones after it
    { s: 10, e: 20 },
    { s: 30, e: 40 },
    { s: 200, e: 210 },
  ];
  finishRow(items);
  assert.deepEqual(items.map((it) => it.reach), [100, 100, 100, 210]);
  assert.equal(firstReaching(items, 50), 0); // the long item still covers t = 50
  assert.equal(firstReaching(items, 150), 3);
  assert.equal(firstReaching(items, 1000), 4); // nothing reaches: past the end
  assert.equal(firstReaching([], 5), 0);
});

test("level of detail merges touching sub-pixel events: counts summed, the longest's name", () => {
  // 100 events of 1 µs back to back over 100 µs drawn 10 px wide: 10 µs per pixel
  const items = row(100, { name: (i) => (i === 3 ? "longest" : "op" + i) });
  items[3].e += 0.5; // event 3 is the longest (1.5 µs)
  finishRow(items);
  const rows = new Map([["cpu:1:0", items]]);
  const merged = levelOfDetail(rows, 0, 100, 10).get("cpu:1:0");
  assert.ok(merged.length <= 2 * 10 && merged.length > 1, `${merged.length} items for 10 px`);
  assert.equal(merged.reduce((n, it) => n + it.c, 0), 100); // every event counted once
  assert.equal(merged[0].n, "longest");
  assert.equal(merged[0].s, 0);
  for (const it of merged) assert.ok(it.e > it.s);
  // sorted, with their running ends, for the viewer's binary search
  for (let i = 1; i < merged.length; i++) assert.ok(merged[i].s >= merged[i - 1].s);
  assert.ok(merged.every((it) => typeof it.reach === "number"));
});

test("level of detail keeps events a pixel wide or more, and events with a gap, apart", () => {
  const rows = new Map([["cpu:1:0", row(10, { dur: 10 })]]);
  // 100 µs over 1000 px: each event is 100 px wide
  const wide = levelOfDetail(rows, 0, 100, 1000).get("cpu:1:0");
  assert.equal(wide.length, 10);
  assert.ok(wide.every((it) => it.c === 1));
  // a wide event right after a sub-pixel one is not swallowed by it
  const mixed = [{ t: "a", d: 0, s: 0, e: 0.1, n: "tiny", c: 1 }, { t: "a", d: 0, s: 0.1, e: 50, n: "wide", c: 1 }];
  finishRow(mixed);
  const drawn = levelOfDetail(new Map([["a:0", mixed]]), 0, 100, 100).get("a:0");
  assert.deepEqual(drawn.map((it) => [it.n, it.c]), [["tiny", 1], ["wide", 1]]);
  // sub-pixel events 5 px apart are not merged either
  const sparse = new Map([["cpu:1:0", row(10, { dur: 0.1, gap: 49.9 })]]);
  assert.equal(levelOfDetail(sparse, 0, 500, 50).get("cpu:1:0").length, 10);
});

test("level of detail answers only the window: items reaching into it, not those outside", () => {
  const items = [{ t: "a", d: 0, s: 0, e: 500, n: "long", c: 1 }, ...row(3, { t0: 600, dur: 10, gap: 90 })];
  finishRow(items);
  const rows = new Map([["a:0", items], ["b:0", row(2, { t0: 5000 })]]);
  const out = levelOfDetail(rows, 400, 750, 1000);
  assert.deepEqual(out.get("a:0").map((it) => it.n), ["long", "op0", "op1"]); // op2 starts at 800
  assert.equal(out.has("b:0"), false); // a row with nothing in view is left out
});

test("the embedded source: its level of detail, an item's stack, a case-blind search", async () => {
  const source = embeddedSource(payload());
  const answer = await source.query(ORIGIN, ORIGIN + 1000, 1000);
  assert.equal(answer.rows.get("cpu:1:1").length, 3);
  assert.equal(answer.counters.get("mem").length, 3);
  const detail = await source.detail("cpu:1", 1, ORIGIN + 122);
  assert.deepEqual(
    { name: detail.name, dur: detail.dur_us, count: detail.count, stack: detail.stack },
    { name: "aten::relu", dur: 5, count: 4, stack: ["ProfilerStep#1"] },
  );
  assert.equal(await source.detail("cpu:1", 1, ORIGIN + 200), null); // between items
  const hits = await source.search("ATEN::");
  assert.deepEqual(hits.map((h) => h.name), ["aten::mm", "aten::relu", "aten::add"]);
  assert.deepEqual(hits[0], { track: "cpu:1", name: "aten::mm", start_us: ORIGIN + 100, end_us: ORIGIN + 110, depth: 1 });
});

test("the embedded source's Chrome trace for Perfetto: one X event per item, thread names", async () => {
  const trace = JSON.parse(new TextDecoder().decode(await embeddedSource(payload()).trace()));
  const spans = trace.traceEvents.filter((e) => e.ph === "X");
  const names = trace.traceEvents.filter((e) => e.ph === "M").map((e) => e.args.name);
  assert.equal(spans.length, 4);
  assert.deepEqual(names, ["CPU thread 1", "Memory"]);
  assert.ok(spans.every((e) => e.tid === 1 && e.dur >= 0));
});

// A widget model as anywidget hands it to each view: every view's listeners hear every custom
// message; the kernel answers each request with its id (TimelineWidget.answer).
function fakeModel() {
  const listeners = new Set();
  const sent = [];
  return {
    sent,
    on: (name, cb) => name === "msg:custom" && listeners.add(cb),
    off: (name, cb) => listeners.delete(cb),
    send: (content) => sent.push(content),
    answer: (content) => listeners.forEach((cb) => cb(content, [])),
  };
}

test("two views of one widget: each gets the answer to its own request, not the other's", async () => {
  const model = fakeModel();
  const [first, second] = [remoteSource(model), remoteSource(model)];
  const asked = [first.search("mm"), second.search("relu")];
  const [a, b] = model.sent;
  assert.notEqual(a.id, b.id);
  model.answer({ id: b.id, op: "search", results: ["relu"] });
  model.answer({ id: a.id, op: "search", results: ["mm"] });
  assert.deepEqual(await Promise.all(asked), [["mm"], ["relu"]]);
  model.answer({ id: a.id, op: "search", results: ["again"] }); // answered once: ignored
  const failed = first.detail("cpu:1", 0, 5);
  model.answer({ id: model.sent[2].id, op: "detail", error: "KeyError: 'cpu:1'" });
  await assert.rejects(failed, /KeyError/);
  first.close();
  second.close();
});
