// The viewer's input: wheel and pinch (a trackpad's pinch arrives as a wheel event with
// ctrlKey) zoom around the pointer, a horizontal swipe and a drag pan, W/S/A/D as in
// Perfetto, a click selects, the pointer hovers; the bar's reset, search, Perfetto and rank
// controls. Events become calls of the viewer's actions (``on``); what they mean in time is
// wheelCommand's and keyCommand's, which run in Node as well (tests/js). Bundled after
// timeline_state.js into one module (render/timeline/view.py).

import { GUTTER } from "./timeline_draw.js";
import { plotWidth } from "./timeline_state.js";

const SEARCH_DELAY_MS = 150;
// A press that moves further than this (px) is a drag, not a click.
const DRAG_PX = 2;

// A wheel event ({deltaX, deltaY, deltaMode, ctrlKey}) as {pan: px} (a horizontal swipe) or
// {zoom: factor} (> 1: out), around the pointer; a pinch zooms 4 times as fast.
export function wheelCommand(ev) {
  if (Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) return { pan: ev.deltaX };
  const scale = ev.deltaMode === 1 ? 0.05 : 0.0015;
  return { zoom: Math.exp(ev.deltaY * scale * (ev.ctrlKey ? 4 : 1)) };
}

// A key in the view (any case) as {zoom: factor, anchor: t} (W in, S out, around the hovered
// time or else the view's middle) or {pan: px} (A left, D right, 15% of the plot), else null.
export function keyCommand(key, view, hover, width) {
  const mid = (view.start + view.end) / 2;
  const anchor = hover ? hover.t || mid : mid;
  const step = plotWidth(width) * 0.15;
  switch (key.toLowerCase()) {
    case "w": return { zoom: 0.8, anchor };
    case "s": return { zoom: 1.25, anchor };
    case "a": return { pan: -step };
    case "d": return { pan: step };
    default: return null;
  }
}

// The pointer's position on the canvas.
function canvasPoint(canvas, ev) {
  const r = canvas.getBoundingClientRect();
  return [ev.clientX - r.left, ev.clientY - r.top];
}

// The view's input on ``v`` ({dom, state, width(), tAt(px)}), as calls of ``on``: zoom(factor,
// anchorT), pan(dxPx), hover(px, py, ev), leave(), click(px, py), reset(), search(text), next(),
// perfetto(), rank(r). Returns what undoes the listeners outside the viewer's own elements.
export function bindInput(v, on) {
  bindWheel(v, on);
  const unbindPointer = bindPointer(v, on);
  bindKeys(v, on);
  bindControls(v, on);
  return unbindPointer;
}

function bindWheel(v, on) {
  const { canvas } = v.dom;
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const command = wheelCommand(ev);
    if (command.pan !== undefined) on.pan(command.pan);
    else on.zoom(command.zoom, v.tAt(Math.max(GUTTER, canvasPoint(canvas, ev)[0])));
  }, { passive: false });
}

// A press on the canvas drags (anywhere in the window until released) or, unmoved, clicks;
// the pointer over the canvas, not dragging, hovers.
function bindPointer(v, on) {
  const { root, canvas } = v.dom;
  let drag = null;
  canvas.addEventListener("mousedown", (ev) => {
    drag = { x: ev.clientX, y: ev.clientY, moved: false };
    canvas.classList.add("dragging");
    root.focus({ preventScroll: true });
  });
  const onMove = (ev) => {
    if (!drag) return;
    const dx = ev.clientX - drag.x;
    if (Math.abs(dx) > DRAG_PX) drag.moved = true;
    if (drag.moved) {
      drag.x = ev.clientX;
      on.pan(-dx);
    }
  };
  const onUp = (ev) => {
    if (!drag) return;
    const clicked = !drag.moved;
    drag = null;
    canvas.classList.remove("dragging");
    if (clicked && ev.target === canvas) on.click(...canvasPoint(canvas, ev));
  };
  window.addEventListener("mousemove", onMove);
  window.addEventListener("mouseup", onUp);
  canvas.addEventListener("mousemove", (ev) => {
    if (!drag) on.hover(...canvasPoint(canvas, ev), ev);
  });
  canvas.addEventListener("mouseleave", () => on.leave());
  return () => {
    window.removeEventListener("mousemove", onMove);
    window.removeEventListener("mouseup", onUp);
  };
}

// W/S/A/D in the viewer; Enter in the search box steps to the next match.
function bindKeys(v, on) {
  const { root, search } = v.dom;
  root.addEventListener("keydown", (ev) => {
    if (ev.target === search) {
      if (ev.key === "Enter") on.next();
      return;
    }
    const command = keyCommand(ev.key, v.state.view, v.state.hover, v.width());
    if (!command) return;
    if (command.pan !== undefined) on.pan(command.pan);
    else on.zoom(command.zoom, command.anchor);
    ev.preventDefault();
  });
}

function bindControls(v, on) {
  const { reset, search, perfetto, rankSelect } = v.dom;
  reset.addEventListener("click", () => on.reset());
  let searchTimer = null;
  search.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => on.search(search.value.trim()), SEARCH_DELAY_MS);
  });
  perfetto.addEventListener("click", () => on.perfetto());
  rankSelect.addEventListener("change", () => on.rank(Number(rankSelect.value)));
}
