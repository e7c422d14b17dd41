"""What the browser tests wait for, each a state the page shows, and the bounds of the waits.

A timeline viewer's state is read from its root's data attributes (``VIEWER_STATE``), never
from pixels: ``settled`` is true once what it draws is its source's answer for its view,
``waiting`` while, hidden, it waits to be shown to ask for it.
"""

from __future__ import annotations

from typing import Any

#: what one action leads to: a click's effect, a kernel's answer drawn (s)
ACTION_S = 45
#: JupyterLab answering, and a notebook open with its kernel idle (s)
SERVER_START_S = 120
#: a notebook's cells, run all (s): the quickstart profiles, reruns and compares on the CPU
CELLS_S = 240

#: a viewer's root as the tests read it
VIEWER_STATE = """r => ({
  start: Number(r.dataset.startUs), end: Number(r.dataset.endUs), items: Number(r.dataset.items),
  queries: Number(r.dataset.queries), answers: Number(r.dataset.answers || 0),
  settled: r.dataset.settled === '1', waiting: r.dataset.settled === 'hidden', painted: r.dataset.painted === '1', rank: r.dataset.rank,
  hover: r.dataset.hover, selected: r.dataset.selected,
})"""

# Pixels of the canvas that are neither white nor the background stripes' grey.
INKED = """canvas => {
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let n = 0;
  for (let i = 0; i < data.length; i += 4) if (Math.min(data[i], data[i + 1], data[i + 2]) < 235) n++;
  return n;
}"""

# True once the element's box has not moved for 5 frames in a row (the outputs around it
# may still be laid out).
STILL = """el => {
  const r = el.getBoundingClientRect();
  const box = [r.x, r.y, r.width, r.height].join();
  el.__stillFrames = el.__stillBox === box ? (el.__stillFrames || 0) + 1 : 0;
  el.__stillBox = box;
  return el.__stillFrames >= 5;
}"""

# The first point of the canvas (from its top left, px) whose hover names an item starting
# with ``prefix``: pointer moves down each column (``columns``: shares of the plot's width,
# after the labels' gutter) in turn, dispatched in one go so that nothing moves the canvas
# between them. The hover is cleared afterwards.
POINT_AT = """([root, prefix, columns, gutter]) => {
  const canvas = root.querySelector('canvas');
  const move = (type, x, y) => {
    const r = canvas.getBoundingClientRect();
    canvas.dispatchEvent(new MouseEvent(type, {clientX: r.left + x, clientY: r.top + y, bubbles: true}));
  };
  const height = Math.min(canvas.clientHeight, 400);
  for (const share of columns) {
    const x = gutter + (canvas.clientWidth - gutter) * share;
    for (let y = 20; y < height; y += 7) {
      move('mousemove', x, y);
      if ((root.dataset.hover || '').startsWith(prefix)) {
        const name = root.dataset.hover;
        move('mouseleave', x, y);
        return {x, y, name};
      }
    }
  }
  move('mouseleave', 0, 0);
  return {x: null, y: null, name: ''};
}"""
#: the track labels' width, timeline_draw.js's GUTTER (px)
GUTTER_PX = 160
#: where POINT_AT looks first: the view's middle (a search's match, centred by Enter), then out
COLUMNS = (0.5, 0.35, 0.65, 0.2, 0.8, 0.1, 0.9)


#: wait_viewer's predicate for a view moved since ``v``: either end (a window clamped to the
#: trace keeps its start, or its end, where it reaches the trace's)
MOVED = "(s.start !== v.start || s.end !== v.end)"


def viewer_state(root) -> dict[str, Any]:
    return root.evaluate(VIEWER_STATE)


def wait_viewer(page, root, predicate: str, then: dict[str, Any] | None = None) -> dict[str, Any]:
    """Wait until ``predicate`` holds for the viewer ``root`` (a JS expression over its state
    ``s``, VIEWER_STATE's, and ``v``: ``then``, a state read before the action); returns the
    state that met it."""
    return page.wait_for_function(
        f"([r, v]) => {{ const s = ({VIEWER_STATE})(r); return ({predicate}) && s; }}",
        arg=[root.element_handle(), then or {}],
    ).json_value()


def still_box(page, locator) -> dict[str, float]:
    """``locator``'s box, scrolled into view, once it has stopped moving."""
    locator.scroll_into_view_if_needed()
    element = locator.element_handle()
    element.evaluate("el => { el.__stillBox = null; }")  # frames counted from now
    page.wait_for_function(STILL, arg=element, polling="raf")
    return locator.bounding_box()


def hover_op(page, root, prefix: str) -> str:
    """Hover the first item of the viewer ``root`` whose name starts with ``prefix`` (found
    column by column from the middle) with the mouse; returns what the viewer then names
    (data-hover), the mouse left on it."""
    canvas = root.locator("canvas")
    still_box(page, canvas)
    point = root.evaluate(f"(r, a) => ({POINT_AT})([r, ...a])", [prefix, list(COLUMNS), GUTTER_PX])
    if not point["name"]:
        return ""
    box = still_box(page, canvas)
    page.mouse.move(box["x"] + point["x"], box["y"] + point["y"])
    return root.get_attribute("data-hover") or ""


# Done when every code cell has run and the kernel is idle, or as soon as a cell failed.
ALL_CELLS_RAN = """() => {
  const nb = window.jupyterapp.shell.currentWidget;
  const cells = nb.content.widgets.filter(c => c.model.type === 'code');
  if (cells.some(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'))) {
    return 'error';
  }
  const done = cells.every(c => c.model.executionCount !== null);
  return done && nb.sessionContext.session.kernel.status === 'idle' ? 'done' : false;
}"""

# True once the kernel has acknowledged every change the notebook's widgets sent it
# (ipywidgets' own count of changes in flight, and the changes it holds back meanwhile).
WIDGETS_SYNCED = """async () => {
  const nb = window.jupyterapp.shell.currentWidget;
  const renderer = nb.content.rendermime.createRenderer('application/vnd.jupyter.widget-view+json');
  const manager = await renderer._manager.promise;
  for (const pending of Object.values(manager._models)) {
    const model = await pending;
    if (model._pending_msgs || model._msg_buffer) return false;
  }
  return true;
}"""

NOTEBOOK_READY = """name => {
  const nb = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const kernel = nb && nb.sessionContext && nb.sessionContext.session && nb.sessionContext.session.kernel;
  return !!(kernel && nb.context.path.endsWith(name) && kernel.status === 'idle' && nb.content.widgets.length > 0);
}"""


def open_notebook(page, lab: tuple, name: str) -> None:
    """Open notebook ``name`` of the ``lab`` fixture's server in ``page``, its kernel idle."""
    base, token, _ = lab
    page.goto(f"{base}/lab/tree/{name}?token={token}", timeout=SERVER_START_S * 1000)
    page.wait_for_function(NOTEBOOK_READY, arg=name, timeout=SERVER_START_S * 1000, polling=250)


def run_all(page, started: bool = False) -> str:
    """Run every cell of the open notebook (``started``: already asked to): ``done`` once
    they have, or ``error`` as soon as a cell failed."""
    if not started:
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    return page.wait_for_function(ALL_CELLS_RAN, polling=500, timeout=CELLS_S * 1000).json_value()
