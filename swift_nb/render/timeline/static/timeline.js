// The swift_nb timeline: one canvas viewer for the notebook widget (anywidget: the default
// export's render) and for report.html (mountEmbedded). It draws what its source returns for
// the view: in a notebook the kernel's Timeline.query (level of detail done in Python, the
// trace never held here), in a report its own level of detail over the embedded items.
// Tests read its state from data attributes on the root (data-start-us, data-end-us,
// data-queries, data-answers: the queries drawn, data-hover, data-selected, data-items), never
// from pixels.

import { decode, embeddedSource, firstReaching, remoteSource } from "./timeline_data.js";
import { AXIS_H, GUTTER, PAD, ROW_H, drawAxis, drawCounter, drawFlows, drawSpans, fmtUs, fmtValue, layout } from "./timeline_draw.js";

const QUERY_DELAY_MS = 80;
const PERFETTO = "https://ui.perfetto.dev";

const CSS = `
.swift-tl { font: 12px system-ui, sans-serif; color: #222; position: relative; outline: none;
  border: 1px solid #ddd; border-radius: 4px; background: #fff; }
.swift-tl:focus { border-color: #4c72b0; }
.swift-tl-bar { display: flex; flex-wrap: wrap; gap: 6px; align-items: center; padding: 4px 6px;
  border-bottom: 1px solid #eee; }
.swift-tl-bar button, .swift-tl-bar select, .swift-tl-bar input { font: inherit; padding: 1px 6px; }
.swift-tl-range { color: #666; margin-left: auto; font-variant-numeric: tabular-nums; }
.swift-tl-scroll { max-height: 520px; overflow-y: auto; overflow-x: hidden; }
.swift-tl canvas { display: block; cursor: grab; }
.swift-tl canvas.dragging { cursor: grabbing; }
.swift-tl-tip { position: absolute; pointer-events: none; background: rgba(30,30,30,.92); color: #fff;
  padding: 3px 6px; border-radius: 3px; white-space: pre; display: none; z-index: 5; max-width: 480px;
  overflow: hidden; }
.swift-tl-detail { padding: 4px 8px; border-top: 1px solid #eee; white-space: pre-wrap; min-height: 1.4em;
  font-family: ui-monospace, monospace; font-size: 11px; max-height: 180px; overflow-y: auto; }
.swift-tl-note { color: #666; padding: 2px 8px; font-size: 11px; }
.swift-tl-help { color: #888; font-size: 11px; }
`;

function addStyle() {
  if (document.getElementById("swift-tl-style")) return;
  const style = document.createElement("style");
  style.id = "swift-tl-style";
  style.textContent = CSS;
  document.head.appendChild(style);
}

// ---- the viewer -------------------------------------------------------------------------

function el(tag, attrs = {}, text = "") {
  const node = document.createElement(tag);
  for (const [k, val] of Object.entries(attrs)) node.setAttribute(k, val);
  if (text) node.textContent = text;
  return node;
}

// The viewer inside ``host``. ``options``: tracks, start_us/end_us (the trace's bounds),
// source (query/detail/search/trace[/rank]), initial (a decoded first answer), places
// ([{id, title, start_us, end_us}]), ranks/rank, note, title; onRank, onTrackClick and onView
// (the window, each time it is asked for) callbacks. Returns {goto, setData, setPlaces, destroy}.
export function createViewer(host, options) {
  addStyle();
  // JupyterLab's and Notebook 7's command-mode keys (A, D D, S…) stay out of the viewer's W/A/S/D.
  const root = el("div", {
    class: "swift-tl", tabindex: "0", "data-queries": "0", "data-hover": "", "data-lm-suppress-shortcuts": "true",
  });
  const bar = el("div", { class: "swift-tl-bar" });
  const reset = el("button", { type: "button", title: "Whole trace" }, "Reset");
  const search = el("input", { type: "search", placeholder: "Search names…", class: "swift-tl-search" });
  const found = el("span", { class: "swift-tl-found" });
  const perfetto = el("button", { type: "button", class: "swift-tl-perfetto" }, "Open in Perfetto");
  const range = el("span", { class: "swift-tl-range" });
  bar.append(reset, search, found);
  const rankSelect = el("select", { class: "swift-tl-rank", title: "Rank" });
  if ((options.ranks || []).length > 1) bar.append(rankSelect);
  const placeList = el("span", { class: "swift-tl-places" });
  bar.append(placeList, perfetto, range);
  const scroll = el("div", { class: "swift-tl-scroll" });
  const canvas = el("canvas");
  scroll.append(canvas);
  const tip = el("div", { class: "swift-tl-tip" });
  const detail = el("div", { class: "swift-tl-detail" });
  const note = el("div", { class: "swift-tl-note" });
  const help = el("div", { class: "swift-tl-note swift-tl-help" },
    "wheel or pinch: zoom · drag: pan · W/S zoom, A/D pan · click: details and flows · Enter in search: next match");
  root.append(bar, scroll, tip, detail, note, help);
  host.append(root);

  const state = {
    source: options.source,
    bounds: { start: options.start_us, end: options.end_us },
    view: { start: options.start_us, end: options.end_us, origin: options.start_us },
    boxes: layout(options.tracks || []),
    data: options.initial || { rows: new Map(), counters: new Map() },
    queries: 0, seq: 0, timer: null, matches: null, hits: [], hit: -1, selected: null, hover: null,
    drag: null, width: 0,
  };

  const width = () => canvas.clientWidth || root.clientWidth;
  const x = (t) => GUTTER + ((t - state.view.start) / (state.view.end - state.view.start)) * (width() - GUTTER);
  const tAt = (px) => state.view.start + ((px - GUTTER) / (width() - GUTTER)) * (state.view.end - state.view.start);

  function showNote(text) {
    note.textContent = text || "";
  }
  showNote(options.note || (state.data && state.data.note));

  function paint() {
    const w = root.clientWidth;
    if (!w) return; // a hidden tab: painted when it is shown (ResizeObserver)
    const h = state.boxes.length ? state.boxes[state.boxes.length - 1].y + state.boxes[state.boxes.length - 1].h + PAD : AXIS_H;
    const dpr = window.devicePixelRatio || 1;
    canvas.style.width = w + "px";
    canvas.style.height = h + "px";
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    drawAxis(ctx, state.view, w, x);
    let drawn = 0;
    state.boxes.forEach((box, i) => {
      ctx.fillStyle = i % 2 ? "#fafafa" : "#fff";
      ctx.fillRect(0, box.y - PAD, w, box.h + 2 * PAD);
      let max = null;
      if (box.kind === "counter") max = drawCounter(ctx, box, state.data.counters.get(box.track), x, w, state.view);
      else drawn += drawSpans(ctx, box, state.data.rows, x, w, state);
      ctx.fillStyle = "#f0f0f0";
      ctx.fillRect(0, box.y - PAD, GUTTER - 4, box.h + 2 * PAD);
      ctx.fillStyle = "#333";
      ctx.fillText(box.label.length > 24 ? box.label.slice(0, 23) + "…" : box.label, 4, box.y + 11);
      if (max !== null) {
        ctx.fillStyle = "#777";
        ctx.fillText("max " + fmtValue(box, max), 4, box.y + 25);
      }
    });
    if (state.hover) {
      ctx.strokeStyle = "#000";
      const hv = state.hover;
      ctx.strokeRect(x(hv.item.s), hv.box.y + hv.item.d * ROW_H, Math.max(1, x(hv.item.e) - x(hv.item.s)), ROW_H - 1);
    }
    drawFlows(ctx, state, x, state.boxes);
    root.dataset.startUs = String(state.view.start);
    root.dataset.endUs = String(state.view.end);
    root.dataset.items = String(drawn);
    root.dataset.painted = "1";
    range.textContent = `${fmtUs(state.view.start - state.view.origin)} – ${fmtUs(state.view.end - state.view.origin)}` +
      ` (${fmtUs(state.view.end - state.view.start)})`;
  }

  function requery() {
    clearTimeout(state.timer);
    state.timer = setTimeout(async () => {
      if (options.onView) options.onView(state.view.start, state.view.end);
      const seq = ++state.seq;
      state.queries += 1;
      root.dataset.queries = String(state.queries);
      try {
        const data = await state.source.query(state.view.start, state.view.end, Math.max(1, width() - GUTTER));
        if (seq !== state.seq) return; // a newer view was asked for meanwhile
        state.data = data;
        root.dataset.answers = String(Number(root.dataset.answers || 0) + 1);
        paint();
      } catch (err) {
        showNote("This window could not be drawn (" + err.message + ").");
      }
    }, QUERY_DELAY_MS);
  }

  function setView(start, end) {
    const span = state.bounds.end - state.bounds.start;
    const minSpan = 0.01;
    let s = start;
    let e = end;
    if (e - s < minSpan) [s, e] = [(s + e) / 2 - minSpan / 2, (s + e) / 2 + minSpan / 2];
    if (e - s > span) [s, e] = [state.bounds.start, state.bounds.end];
    if (s < state.bounds.start) [s, e] = [state.bounds.start, state.bounds.start + (e - s)];
    if (e > state.bounds.end) [s, e] = [state.bounds.end - (e - s), state.bounds.end];
    state.view.start = s;
    state.view.end = e;
    paint();
    requery();
  }

  function zoom(factor, anchorT) {
    const { start, end } = state.view;
    setView(anchorT - (anchorT - start) * factor, anchorT + (end - anchorT) * factor);
  }

  function pan(dxPx) {
    const dt = (dxPx / (width() - GUTTER)) * (state.view.end - state.view.start);
    setView(state.view.start + dt, state.view.end + dt);
  }

  function goto(start, end, exact = false) {
    const margin = exact ? 0 : Math.max((end - start) * 0.08, 1);
    setView(start - margin, end + margin);
  }

  function hitAt(px, py) {
    const box = state.boxes.find((b) => py >= b.y && py < b.y + b.h);
    if (!box || box.kind === "counter" || px < GUTTER) return null;
    const depth = Math.floor((py - box.y) / ROW_H);
    const row = state.data.rows.get(box.track + ":" + depth);
    if (!row) return { box, depth, item: null };
    const t = tAt(px);
    const tol = 2 * ((state.view.end - state.view.start) / (width() - GUTTER));
    let best = null;
    for (let i = firstReaching(row, t - tol); i < row.length && row[i].s <= t + tol; i++) {
      if (row[i].e >= t - tol && (!best || Math.abs((row[i].s + row[i].e) / 2 - t) < Math.abs((best.s + best.e) / 2 - t))) best = row[i];
    }
    return { box, depth, item: best, t };
  }

  function showTip(hit, ev) {
    if (!hit || !hit.item) {
      tip.style.display = "none";
      state.hover = null;
      root.dataset.hover = "";
      paint();
      return;
    }
    const it = hit.item;
    state.hover = hit;
    root.dataset.hover = it.n;
    tip.textContent = `${it.n}\n${fmtUs(it.e - it.s)}` + (it.c > 1 ? ` · ${it.c} events merged` : "") +
      `\n${hit.box.label}`;
    const r = root.getBoundingClientRect();
    tip.style.left = Math.min(ev.clientX - r.left + 12, r.width - 200) + "px";
    tip.style.top = ev.clientY - r.top + 14 + "px";
    tip.style.display = "block";
    paint();
  }

  async function select(hit) {
    if (!hit || !hit.item) {
      state.selected = null;
      detail.textContent = "";
      paint();
      return;
    }
    const t = Math.min(Math.max(hit.t, hit.item.s), hit.item.e);
    const info = await state.source.detail(hit.box.track, hit.depth, t);
    if (!info) return;
    state.selected = { ...info, track: hit.box.track, depth: hit.depth };
    root.dataset.selected = info.name;
    const lines = [`${info.name}   ${fmtUs(info.dur_us)}   at ${fmtUs(info.start_us - state.view.origin)}`];
    if (info.count > 1) lines.push(`${info.count} events merged at this zoom: zoom in to see each`);
    if (info.shapes) lines.push(`shapes: ${info.shapes}`);
    if (info.types) lines.push(`types: ${info.types}`);
    if (info.stack && info.stack.length) lines.push(`stack: ${info.stack.join(" › ")}`);
    const launches = info.launches || [];
    if (launches.length) {
      lines.push(`launched ${launches.length}: ` + launches.slice(0, 8).map((k) => `${k.name} (${fmtUs(k.end_us - k.start_us)})`).join(", "));
    }
    if (info.launched_by) lines.push(`launched by: ${info.launched_by.name}`);
    detail.textContent = lines.join("\n");
    paint();
  }

  async function runSearch(text) {
    state.hits = [];
    state.hit = -1;
    if (!text) {
      state.matches = null;
      found.textContent = "";
      paint();
      return;
    }
    const hits = await state.source.search(text);
    if (search.value !== text) return;
    state.hits = hits || [];
    state.matches = new Set(state.hits.map((h) => h.name));
    found.textContent = state.hits.length ? `${state.hits.length}${state.hits.length >= 200 ? "+" : ""} found` : "none found";
    paint();
  }

  function nextHit() {
    if (!state.hits.length) return;
    state.hit = (state.hit + 1) % state.hits.length;
    const h = state.hits[state.hit];
    goto(h.start_us, h.end_us);
  }

  // Input: wheel and pinch (a trackpad's pinch arrives as a wheel event with ctrlKey) zoom
  // around the pointer, a horizontal swipe and a drag pan, W/S/A/D as in Perfetto.
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const r = canvas.getBoundingClientRect();
    if (Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) {
      pan(ev.deltaX);
      return;
    }
    const scale = ev.deltaMode === 1 ? 0.05 : 0.0015;
    zoom(Math.exp(ev.deltaY * scale * (ev.ctrlKey ? 4 : 1)), tAt(Math.max(GUTTER, ev.clientX - r.left)));
  }, { passive: false });
  canvas.addEventListener("mousedown", (ev) => {
    state.drag = { x: ev.clientX, y: ev.clientY, moved: false };
    canvas.classList.add("dragging");
    root.focus({ preventScroll: true });
  });
  const onMove = (ev) => {
    if (state.drag) {
      const dx = ev.clientX - state.drag.x;
      if (Math.abs(dx) > 2) state.drag.moved = true;
      if (state.drag.moved) {
        state.drag.x = ev.clientX;
        pan(-dx);
      }
    }
  };
  const onUp = (ev) => {
    if (!state.drag) return;
    const clicked = !state.drag.moved;
    state.drag = null;
    canvas.classList.remove("dragging");
    if (clicked && ev.target === canvas) {
      const r = canvas.getBoundingClientRect();
      const hit = hitAt(ev.clientX - r.left, ev.clientY - r.top);
      if (options.onTrackClick && hit) options.onTrackClick(hit.box.track);
      select(hit);
    }
  };
  window.addEventListener("mousemove", onMove);
  window.addEventListener("mouseup", onUp);
  canvas.addEventListener("mousemove", (ev) => {
    if (state.drag) return;
    const r = canvas.getBoundingClientRect();
    showTip(hitAt(ev.clientX - r.left, ev.clientY - r.top), ev);
  });
  canvas.addEventListener("mouseleave", () => showTip(null));
  root.addEventListener("keydown", (ev) => {
    if (ev.target === search) {
      if (ev.key === "Enter") nextHit();
      return;
    }
    const mid = (state.view.start + state.view.end) / 2;
    const anchor = state.hover ? state.hover.t || mid : mid;
    const step = (width() - GUTTER) * 0.15;
    const key = ev.key.toLowerCase();
    if (key === "w") zoom(0.8, anchor);
    else if (key === "s") zoom(1.25, anchor);
    else if (key === "a") pan(-step);
    else if (key === "d") pan(step);
    else return;
    ev.preventDefault();
  });
  reset.addEventListener("click", () => setView(state.bounds.start, state.bounds.end));
  let searchTimer = null;
  search.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => runSearch(search.value.trim()), 150);
  });
  perfetto.addEventListener("click", () => openInPerfetto(state.source, options.title || "swift_nb trace", showNote));

  function setPlaces(places) {
    placeList.replaceChildren();
    for (const p of places || []) {
      const label = p.title.length > 36 ? p.title.slice(0, 35) + "…" : p.title;
      const b = el("button", { type: "button", class: "swift-tl-place", "data-place": p.id, title: p.title }, "▸ " + label);
      b.addEventListener("click", () => goto(p.start_us, p.end_us));
      placeList.append(b);
    }
  }
  setPlaces(options.places);

  // Past 16 ranks the first choice is the overview (one summary track per rank: -1).
  function setRanks(ranks, rank) {
    const choices = ranks.length > 16 ? [-1, ...ranks] : ranks;
    rankSelect.replaceChildren(...choices.map((r) => el("option", { value: String(r) }, r < 0 ? "all ranks" : `rank ${r}`)));
    rankSelect.value = String(rank);
    root.dataset.rank = String(rank);
  }
  if ((options.ranks || []).length > 1) setRanks(options.ranks, options.rank);
  rankSelect.addEventListener("change", () => options.onRank && options.onRank(Number(rankSelect.value)));

  // A new trace (another rank): tracks, bounds, first answer (and source) replaced, the view reset.
  function setData(o) {
    state.boxes = layout(o.tracks);
    state.bounds = { start: o.start_us, end: o.end_us };
    state.view = { start: o.start_us, end: o.end_us, origin: o.start_us };
    state.data = o.initial || { rows: new Map(), counters: new Map() };
    state.selected = null;
    detail.textContent = "";
    showNote(o.note || "");
    if (o.source) state.source = o.source;
    if (o.ranks) setRanks(o.ranks, o.rank);
    paint();
    requery();
  }

  const resize = new ResizeObserver(() => {
    if (root.clientWidth && root.clientWidth !== state.width) {
      state.width = root.clientWidth;
      paint();
      requery();
    }
  });
  resize.observe(root);
  paint();
  if (!options.initial) requery();

  return {
    root, goto, setData, setPlaces,
    destroy() {
      resize.disconnect();
      clearTimeout(state.timer);
      window.removeEventListener("mousemove", onMove);
      window.removeEventListener("mouseup", onUp);
    },
  };
}

// Perfetto's documented way in from another page: open it, PING until it answers PONG, then
// post the trace. A convenience that needs the network; everything else works without it.
async function openInPerfetto(source, title, showNote) {
  const win = window.open(PERFETTO);
  if (!win) {
    showNote("The browser blocked the Perfetto window: allow pop-ups, or open the trace file in ui.perfetto.dev.");
    return;
  }
  const buffer = await source.trace();
  if (!buffer) {
    showNote("The run's trace file is missing: there is nothing to open in Perfetto.");
    return;
  }
  const ping = setInterval(() => win.postMessage("PING", PERFETTO), 250);
  const onPong = (ev) => {
    if (ev.source !== win || ev.data !== "PONG") return;
    clearInterval(ping);
    window.removeEventListener("message", onPong);
    win.postMessage({ perfetto: { buffer, title, fileName: "trace.json.gz" } }, PERFETTO);
  };
  window.addEventListener("message", onPong);
  setTimeout(() => clearInterval(ping), 60000);
}

// ---- entry points -----------------------------------------------------------------------

// report.html: the embedded items, this page's own level of detail, and a "Show on
// timeline" link on each of the document's findings with a place in time. A job's report also
// carries its ranks' overview (one summary track per rank), a choice beside its own rank.
export function mountEmbedded(host, payload) {
  const own = {
    tracks: payload.tracks, start_us: payload.start_us, end_us: payload.end_us,
    source: embeddedSource(payload), note: payload.note,
  };
  const overview = payload.overview;
  const ranks = overview ? [payload.rank, -1] : [];
  const show = (rank) => viewer.setData(rank < 0 ? {
    tracks: overview.tracks, start_us: overview.start_us, end_us: overview.end_us,
    source: embeddedSource(overview), note: "Each rank's steps: busy, communicating or idle.", ranks, rank,
  } : { ...own, ranks, rank });
  const viewer = createViewer(host, {
    ...own, places: payload.places, title: payload.title, ranks, rank: payload.rank, onRank: show,
    onTrackClick: (track) => {
      if (track === `rank:${payload.rank}`) show(payload.rank);
      else if (typeof track === "string" && track.startsWith("rank:")) {
        host.querySelector(".swift-tl-note").textContent = `This report carries rank ${payload.rank}'s events; ` +
          `swift_nb.timeline(run, rank=${track.slice(5)}) in a notebook draws that rank.`;
      }
    },
  });
  // Each finding of the document with a place in time (.finding[data-finding]) gets its link.
  const byId = new Map((payload.places || []).map((p) => [p.id, p]));
  for (const finding of document.querySelectorAll(".finding[data-finding]")) {
    const place = byId.get(finding.dataset.finding);
    if (!place) continue;
    const link = el("a", { href: "#" + host.id, class: "show-on-timeline" }, "Show on timeline");
    link.addEventListener("click", (ev) => {
      ev.preventDefault();
      host.scrollIntoView({ behavior: "instant", block: "start" });
      if (overview) show(payload.rank);
      viewer.goto(place.start_us, place.end_us);
    });
    finding.append(link);
  }
  return viewer;
}

// A payload's bounds and tracks as the viewer's options.
function fromPayload(payload) {
  return {
    tracks: payload.tracks, start_us: payload.start_us, end_us: payload.end_us,
    initial: decode(payload), note: payload.note,
  };
}

// The notebook widget (swift_nb.notebook.timeline_widget.TimelineWidget): its first view
// comes with the model (``initial``), every later one from the kernel. A job's ranks: the
// selector, or a click on a rank's summary track (``rank:<r>``), asks for that rank.
function render({ model, el: host }) {
  const source = remoteSource(model);
  const switchRank = (rank) =>
    source.rank(rank).then((o) => viewer.setData({ ...fromPayload(o.initial), rank: o.rank, ranks: model.get("ranks") }));
  const viewer = createViewer(host, {
    ...fromPayload(model.get("initial")), source, places: model.get("places"),
    ranks: model.get("ranks"), rank: model.get("rank"), title: model.get("title"), onRank: switchRank,
    onView: (start, end) => {
      model.set("view", { start_us: start, end_us: end });
      model.save_changes();
    },
    onTrackClick: (track) => {
      if (typeof track === "string" && track.startsWith("rank:")) switchRank(Number(track.slice(5)));
    },
  });
  const onGoto = () => {
    const g = model.get("goto");
    if (g && g.end_us > g.start_us) viewer.goto(g.start_us, g.end_us, g.exact);
  };
  model.on("change:goto", onGoto);
  onGoto(); // a window asked for before the view was drawn
  model.on("change:places", () => viewer.setPlaces(model.get("places")));
  return () => {
    model.off("change:goto", onGoto);
    source.close();
    viewer.destroy();
  };
}

export default { render };
