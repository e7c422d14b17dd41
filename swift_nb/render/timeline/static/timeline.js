// The swift_nb timeline: one canvas viewer for the notebook widget (anywidget: the default
// export's render) and for report.html (mountEmbedded), composed of its state
// (timeline_state.js), its input (timeline_input.js) and its drawing (timeline_draw.js). It
// draws what its source returns for the view: in a notebook the kernel's Timeline.query
// (level of detail done in Python, the trace never held here), in a report its own level of
// detail over the embedded items.
// Tests read its state from data attributes on the root (data-start-us, data-end-us,
// data-queries, data-answers: the queries drawn, data-settled, data-hover, data-selected,
// data-items), never from pixels.

import { decode, embeddedSource, remoteSource } from "./timeline_data.js";
import { canvasHeight, drawScene, ellipsis } from "./timeline_draw.js";
import {
  applySearch, createState, detailText, detailTime, foundText, hitTest, nextMatch, paddedWindow, panWindow,
  plotWidth, pxToTime, rangeText, rankChoices, resetTrace, setWindow, startSearch, tipText, timeToPx, zoomWindow,
} from "./timeline_state.js";
import { bindInput } from "./timeline_input.js";

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

// The viewer's elements, appended to ``host``: the bar (reset, search, its count, the rank
// selector where there are ranks, the places, Perfetto, the range), the canvas in its
// scroller, the tooltip, the detail panel, the note and the help line.
function buildDom(host, options) {
  // JupyterLab's and Notebook 7's command-mode keys (A, D D, S…) stay out of the viewer's W/A/S/D.
  const root = el("div", {
    class: "swift-tl", tabindex: "0", "data-queries": "0", "data-hover": "", "data-lm-suppress-shortcuts": "true",
  });
  const dom = {
    root,
    bar: el("div", { class: "swift-tl-bar" }),
    reset: el("button", { type: "button", title: "Whole trace" }, "Reset"),
    search: el("input", { type: "search", placeholder: "Search names…", class: "swift-tl-search" }),
    found: el("span", { class: "swift-tl-found" }),
    perfetto: el("button", { type: "button", class: "swift-tl-perfetto" }, "Open in Perfetto"),
    range: el("span", { class: "swift-tl-range" }),
    rankSelect: el("select", { class: "swift-tl-rank", title: "Rank" }),
    placeList: el("span", { class: "swift-tl-places" }),
    scroll: el("div", { class: "swift-tl-scroll" }),
    canvas: el("canvas"),
    tip: el("div", { class: "swift-tl-tip" }),
    detail: el("div", { class: "swift-tl-detail" }),
    note: el("div", { class: "swift-tl-note" }),
  };
  dom.bar.append(dom.reset, dom.search, dom.found);
  if ((options.ranks || []).length > 1) dom.bar.append(dom.rankSelect);
  dom.bar.append(dom.placeList, dom.perfetto, dom.range);
  dom.scroll.append(dom.canvas);
  const help = el("div", { class: "swift-tl-note swift-tl-help" },
    "wheel or pinch: zoom · drag: pan · W/S zoom, A/D pan · click: details and flows · Enter in search: next match");
  root.append(dom.bar, dom.scroll, dom.tip, dom.detail, dom.note, help);
  host.append(root);
  return dom;
}

// A viewer ``v``: its elements, options and state, and its time ↔ pixel mapping at the
// canvas's width now.
function viewerOf(dom, options) {
  const state = createState(options);
  const width = () => dom.canvas.clientWidth || dom.root.clientWidth;
  return {
    dom, options, state, width,
    x: (t) => timeToPx(state.view, width(), t),
    tAt: (px) => pxToTime(state.view, width(), px),
  };
}

function showNote(v, text) {
  v.dom.note.textContent = text || "";
}

// The canvas sized to the root's width and the tracks' height, the scene drawn, and what the
// tests read on the root (data-start-us, data-end-us, data-items, data-painted).
function paint(v) {
  const { root, canvas } = v.dom;
  const { state } = v;
  const w = root.clientWidth;
  if (!w) return; // hidden (another tab): painted when shown (createViewer's ResizeObserver)
  const h = canvasHeight(state.boxes);
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
  const drawn = drawScene(ctx, state, w, v.x);
  root.dataset.startUs = String(state.view.start);
  root.dataset.endUs = String(state.view.end);
  root.dataset.items = String(drawn);
  root.dataset.painted = "1";
  v.dom.range.textContent = rangeText(state.view);
}

// data-settled: "1" once what is drawn is the source's answer for the view (or its error),
// "0" while a query is due or in flight, "hidden" while it waits for the viewer to be shown.
function settle(v, settled) {
  v.dom.root.dataset.settled = settled;
}

// The source asked for the view once it has rested QUERY_DELAY_MS; only the latest answer
// drawn. A hidden viewer has no width to ask at: it asks when shown (the ResizeObserver).
function requery(v) {
  const { state, options, dom } = v;
  clearTimeout(state.timer);
  settle(v, "0");
  state.timer = setTimeout(async () => {
    if (!v.width()) {
      settle(v, "hidden");
      return;
    }
    if (options.onView) options.onView(state.view.start, state.view.end);
    const seq = ++state.seq;
    state.queries += 1;
    dom.root.dataset.queries = String(state.queries);
    try {
      const data = await state.source.query(state.view.start, state.view.end, Math.max(1, plotWidth(v.width())));
      if (seq !== state.seq) return; // a newer view was asked for meanwhile
      state.data = data;
      dom.root.dataset.answers = String(Number(dom.root.dataset.answers || 0) + 1);
      paint(v);
    } catch (err) {
      if (seq !== state.seq) return;
      showNote(v, "This window could not be drawn (" + err.message + ").");
    }
    settle(v, "1");
  }, QUERY_DELAY_MS);
}

// The view moved to ``w`` ({start, end}, clamped to the trace): drawn now, asked for soon.
function showWindow(v, w) {
  setWindow(v.state, w.start, w.end);
  paint(v);
  requery(v);
}

function showTip(v, hit, ev) {
  const { root, tip } = v.dom;
  if (!hit || !hit.item) {
    tip.style.display = "none";
    v.state.hover = null;
    root.dataset.hover = "";
    paint(v);
    return;
  }
  v.state.hover = hit;
  root.dataset.hover = hit.item.n;
  tip.textContent = tipText(hit);
  const r = root.getBoundingClientRect();
  tip.style.left = Math.min(ev.clientX - r.left + 12, r.width - 200) + "px";
  tip.style.top = ev.clientY - r.top + 14 + "px";
  tip.style.display = "block";
  paint(v);
}

// A click's item: its detail from the source (data-selected: its name) and its flows drawn;
// a click on nothing clears the selection.
async function selectHit(v, hit) {
  const { state, dom } = v;
  if (!hit || !hit.item) {
    state.selected = null;
    dom.detail.textContent = "";
    paint(v);
    return;
  }
  const info = await state.source.detail(hit.box.track, hit.depth, detailTime(hit));
  if (!info) return;
  state.selected = { ...info, track: hit.box.track, depth: hit.depth };
  dom.root.dataset.selected = info.name;
  dom.detail.textContent = detailText(info, state.view.origin);
  paint(v);
}

async function runSearch(v, text) {
  const { state, dom } = v;
  startSearch(state, text);
  if (!text) {
    dom.found.textContent = "";
    paint(v);
    return;
  }
  const hits = await state.source.search(text);
  if (dom.search.value !== text) return;
  applySearch(state, hits);
  dom.found.textContent = foundText(state.hits);
  paint(v);
}

function setPlaces(v, places) {
  v.dom.placeList.replaceChildren();
  for (const p of places || []) {
    const b = el("button", { type: "button", class: "swift-tl-place", "data-place": p.id, title: p.title },
      "▸ " + ellipsis(p.title, 36));
    b.addEventListener("click", () => showWindow(v, paddedWindow(p.start_us, p.end_us)));
    v.dom.placeList.append(b);
  }
}

function setRanks(v, ranks, rank) {
  const { rankSelect, root } = v.dom;
  rankSelect.replaceChildren(...rankChoices(ranks).map((c) => el("option", { value: c.value }, c.label)));
  rankSelect.value = String(rank);
  root.dataset.rank = String(rank);
}

// A new trace (another rank): tracks, bounds, first answer (and source) replaced, the view reset.
function setData(v, o) {
  resetTrace(v.state, o);
  v.dom.detail.textContent = "";
  showNote(v, o.note || "");
  if (o.ranks) setRanks(v, o.ranks, o.rank);
  paint(v);
  requery(v);
}

// What the input does to viewer ``v``.
function actionsOf(v) {
  const { state, options } = v;
  return {
    zoom: (factor, anchorT) => showWindow(v, zoomWindow(state.view, factor, anchorT)),
    pan: (dxPx) => showWindow(v, panWindow(state.view, dxPx, plotWidth(v.width()))),
    hover: (px, py, ev) => showTip(v, hitTest(state, v.width(), px, py), ev),
    leave: () => showTip(v, null),
    click: (px, py) => {
      const hit = hitTest(state, v.width(), px, py);
      if (options.onTrackClick && hit) options.onTrackClick(hit.box.track);
      selectHit(v, hit);
    },
    reset: () => showWindow(v, state.bounds),
    search: (text) => runSearch(v, text),
    next: () => {
      const h = nextMatch(state);
      if (h) showWindow(v, paddedWindow(h.start_us, h.end_us));
    },
    perfetto: () => openInPerfetto(state.source, options.title || "swift_nb trace", (text) => showNote(v, text)),
    rank: (rank) => options.onRank && options.onRank(rank),
  };
}

// The viewer inside ``host``. ``options``: tracks, start_us/end_us (the trace's bounds),
// source (query/detail/search/trace[/rank]), initial (a decoded first answer), places
// ([{id, title, start_us, end_us}]), ranks/rank, note, title; onRank, onTrackClick and onView
// (the window, each time it is asked for) callbacks. Returns {goto, setData, setPlaces, destroy}.
export function createViewer(host, options) {
  addStyle();
  const v = viewerOf(buildDom(host, options), options);
  const { root } = v.dom;
  showNote(v, options.note || (v.state.data && v.state.data.note));
  const unbind = bindInput(v, actionsOf(v));
  setPlaces(v, options.places);
  if ((options.ranks || []).length > 1) setRanks(v, options.ranks, options.rank);
  // Drawn and asked again when the width changes, hidden (0) to shown included: what moved
  // while the viewer was hidden in another tab (a goto from the kernel) is drawn once shown.
  const resize = new ResizeObserver(() => {
    if (root.clientWidth === v.state.width) return;
    v.state.width = root.clientWidth;
    if (!v.state.width) return;
    paint(v);
    requery(v);
  });
  resize.observe(root);
  paint(v);
  if (options.initial) settle(v, "1");
  else requery(v);
  return {
    root,
    goto: (start, end, exact = false) => showWindow(v, paddedWindow(start, end, exact)),
    setData: (o) => setData(v, o),
    setPlaces: (places) => setPlaces(v, places),
    destroy() {
      resize.disconnect();
      clearTimeout(v.state.timer);
      unbind();
    },
  };
}

// Perfetto's documented way in from another page: open it, PING until it answers PONG, then
// post the trace (``tell``: what went wrong, for the viewer's note). A convenience that needs the
// network; everything else works without it.
async function openInPerfetto(source, title, tell) {
  const win = window.open(PERFETTO);
  if (!win) {
    tell("The browser blocked the Perfetto window: allow pop-ups, or open the trace file in ui.perfetto.dev.");
    return;
  }
  const buffer = await source.trace();
  if (!buffer) {
    tell("The run's trace file is missing: there is nothing to open in Perfetto.");
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
  // So does any other element naming a place (the Modules section: [data-timeline-place]).
  for (const finding of document.querySelectorAll(".finding[data-finding], [data-timeline-place]")) {
    const place = byId.get(finding.dataset.finding || finding.dataset.timelinePlace);
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
