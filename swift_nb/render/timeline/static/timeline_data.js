// The timeline's data: payloads decoded into sorted rows, the report's own level of detail,
// and the two sources a viewer asks (the kernel through the widget's messages, or the items
// embedded in report.html). Bundled before timeline.js into one module (render/timeline_view.py).

// A payload (Timeline.payload: times in µs after origin_us, tracks and names by index) as
// rows keyed "track:depth", each sorted by start, with a running maximum of ends so that the
// first item reaching into a view is a binary search away.
export function decode(p) {
  const tracks = p.tracks || [];
  const id = (t) => (tracks[t] || {}).track;
  const names = p.names || [];
  const it = p.items || {};
  const origin = p.origin_us || 0;
  const rows = new Map();
  for (let i = 0; i < (it.start || []).length; i++) {
    const item = {
      t: id(it.track[i]), d: it.depth[i], s: origin + it.start[i], e: origin + it.end[i],
      n: String(names[it.name[i]]), c: it.count[i],
    };
    const key = item.t + ":" + item.d;
    let row = rows.get(key);
    if (!row) rows.set(key, (row = []));
    row.push(item);
  }
  for (const row of rows.values()) finishRow(row);
  const counters = new Map();
  const c = p.counters || {};
  for (let i = 0; i < (c.t || []).length; i++) {
    const key = id(c.track[i]);
    let series = counters.get(key);
    if (!series) counters.set(key, (series = []));
    series.push([origin + c.t[i], c.value[i]]);
  }
  for (const series of counters.values()) series.sort((a, b) => a[0] - b[0]);
  return { tracks: p.tracks, rows, counters, note: p.note || null };
}

export function finishRow(row) {
  row.sort((a, b) => a.s - b.s);
  let reach = -Infinity;
  for (const item of row) item.reach = reach = Math.max(reach, item.e);
}

export function firstReaching(row, t) {
  let lo = 0;
  let hi = row.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (row[mid].reach < t) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The report's level of detail: in each row, items under a pixel that touch are merged into
// one (count summed, the longest one's name), so a view never draws more than ~2 per pixel.
export function levelOfDetail(rows, s, e, widthPx) {
  const k = widthPx / Math.max(e - s, 1e-9);
  const out = new Map();
  for (const [key, row] of rows) {
    const res = [];
    let cur = null;
    for (let i = firstReaching(row, s); i < row.length && row[i].s <= e; i++) {
      const it = row[i];
      const x0 = (it.s - s) * k;
      const x1 = (it.e - s) * k;
      if (cur && x1 - x0 < 1 && x0 - cur.x1 < 1 && cur.x1 - cur.x0 < 2) {
        cur.c += it.c;
        if (it.e - it.s > cur.longest) [cur.longest, cur.n] = [it.e - it.s, it.n];
        cur.e = Math.max(cur.e, it.e);
        cur.x1 = Math.max(cur.x1, x1);
        continue;
      }
      cur = { ...it, x0, x1, longest: it.e - it.s };
      res.push(cur);
    }
    if (res.length) {
      finishRow(res);
      out.set(key, res);
    }
  }
  return out;
}

// What an embedded report answers with: its items at the view's level of detail, an item's
// enclosing names, names that match a search; a Chrome trace of the items for Perfetto.
export function embeddedSource(payload) {
  const full = decode(payload);
  const at = (track, depth, t) => {
    const row = full.rows.get(track + ":" + depth) || [];
    for (let i = firstReaching(row, t); i < row.length && row[i].s <= t; i++) {
      if (row[i].e >= t) return row[i];
    }
    return null;
  };
  return {
    async query(s, e, w) {
      return { rows: levelOfDetail(full.rows, s, e, w), counters: full.counters };
    },
    async detail(track, depth, t) {
      const it = at(track, depth, t);
      if (!it) return null;
      const stack = [];
      for (let d = 0; d < depth; d++) {
        const outer = at(track, d, t);
        if (outer) stack.push(outer.n);
      }
      return { name: it.n, start_us: it.s, end_us: it.e, dur_us: it.e - it.s, count: it.c, stack, launches: [] };
    },
    async search(text) {
      const needle = text.toLowerCase();
      const hits = [];
      for (const row of full.rows.values()) {
        for (const it of row) {
          if (it.n && it.n.toLowerCase().includes(needle)) hits.push(it);
        }
      }
      hits.sort((a, b) => a.s - b.s);
      return hits.slice(0, 200).map((h) => ({ track: h.t, name: h.n, start_us: h.s, end_us: h.e, depth: h.d }));
    },
    async trace() {
      const events = [];
      const tids = new Map((payload.tracks || []).map((t, i) => [t.track, i + 1]));
      for (const row of full.rows.values()) {
        for (const it of row) {
          events.push({ ph: "X", name: it.n, ts: it.s, dur: it.e - it.s, pid: 1, tid: tids.get(it.t) || 0 });
        }
      }
      const meta = (payload.tracks || []).map((t, i) => ({
        ph: "M", name: "thread_name", pid: 1, tid: i + 1, args: { name: t.label },
      }));
      return new TextEncoder().encode(JSON.stringify({ traceEvents: meta.concat(events) })).buffer;
    },
  };
}

// What the kernel answers with, through the widget's custom messages (TimelineWidget.answer).
// Every view of a model hears every answer: a request's id carries its view's own tag.
export function remoteSource(model) {
  const tag = Math.random().toString(36).slice(2, 10);
  let next = 1;
  const pending = new Map();
  const onMessage = (msg, buffers) => {
    const waiting = msg && pending.get(msg.id);
    if (!waiting) return;
    pending.delete(msg.id);
    if (msg.error) waiting.reject(new Error(msg.error));
    else waiting.resolve({ msg, buffers: buffers || [] });
  };
  model.on("msg:custom", onMessage);
  const ask = (op, args) =>
    new Promise((resolve, reject) => {
      const id = `${tag}:${next++}`;
      pending.set(id, { resolve, reject });
      model.send({ op, id, ...args });
    });
  return {
    query: (s, e, w) =>
      ask("query", { start_us: s, end_us: e, width_px: Math.round(w) }).then(({ msg }) => decode(msg.payload)),
    detail: (track, depth, t) => ask("detail", { track, depth, t_us: t }).then(({ msg }) => msg.detail),
    search: (text) => ask("search", { text }).then(({ msg }) => msg.results),
    trace: () =>
      ask("trace", {}).then(({ buffers }) => {
        const b = buffers[0];
        return b ? b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength) : null;
      }),
    rank: (rank) => ask("rank", { rank }).then(({ msg }) => msg),
    close: () => model.off("msg:custom", onMessage),
  };
}
