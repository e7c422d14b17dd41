// A small payload as Timeline.payload makes it (times in µs after origin_us, tracks and
// names by index), shared by the viewer's unit tests.

export const ORIGIN = 1_000_000;

export function payload() {
  return {
    origin_us: ORIGIN,
    start_us: ORIGIN,
    end_us: ORIGIN + 1000,
    tracks: [
      { track: "cpu:1", label: "CPU thread 1", kind: "cpu", max_depth: 1, unit: null },
      { track: "mem", label: "Memory", kind: "counter", max_depth: 0, unit: "bytes" },
    ],
    names: ["ProfilerStep#1", "aten::mm", "aten::relu", "aten::add"],
    items: {
      // deliberately out of order: decode sorts each row by start
      track: [0, 0, 0, 0],
      depth: [1, 0, 1, 1],
      start: [300, 0, 100, 120],
      end: [310, 1000, 110, 125],
      name: [3, 0, 1, 2],
      count: [1, 1, 1, 4],
    },
    counters: { track: [1, 1, 1], t: [500, 0, 250], value: [30, 10, 20] },
    note: "a note",
  };
}
