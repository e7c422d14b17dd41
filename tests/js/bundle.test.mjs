// The viewer as view.py ships it: the files of SOURCES, in that order, with their local
// imports taken out, are one ES module that loads (in Node: nothing touches the DOM until a
// viewer is made) and exports the entry points; each file imports only from files before it.
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { test } from "node:test";

const TIMELINE = new URL("../../swift_nb/render/timeline/", import.meta.url);
const STATIC = new URL("static/", TIMELINE);
// view.py's _LOCAL_IMPORT
const LOCAL_IMPORT = /^import \{[^}]*\} from "\.\/timeline_\w+\.js";\n/gm;

function sources() {
  const viewPy = readFileSync(new URL("view.py", TIMELINE), "utf-8");
  const line = viewPy.match(/^SOURCES = \(([^)]*)\)/m);
  assert.ok(line, "view.py names its SOURCES");
  return [...line[1].matchAll(/"([^"]+)"/g)].map((m) => m[1]);
}

test("SOURCES lists every viewer file, each after the files it imports from", () => {
  const names = sources();
  const files = readdirSync(STATIC).filter((f) => f.endsWith(".js")).sort();
  assert.deepEqual([...names].sort(), files);
  names.forEach((name, i) => {
    const text = readFileSync(new URL(name, STATIC), "utf-8");
    for (const m of text.matchAll(/from "\.\/(timeline_\w+\.js)"/g)) {
      assert.ok(names.indexOf(m[1]) >= 0 && names.indexOf(m[1]) < i, `${name} imports ${m[1]} from later`);
    }
  });
});

test("the joined files are one module with the entry points, no local import left", async () => {
  const js = sources().map((name) => readFileSync(new URL(name, STATIC), "utf-8").replace(LOCAL_IMPORT, "")).join("\n");
  assert.ok(!js.includes("./timeline_"));
  assert.ok(!/^import /m.test(js));
  const bundle = await import("data:text/javascript;base64," + Buffer.from(js).toString("base64"));
  assert.equal(typeof bundle.default.render, "function");
  assert.equal(typeof bundle.createViewer, "function");
  assert.equal(typeof bundle.mountEmbedded, "function");
});
