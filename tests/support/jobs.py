"""Jobs of many ranks built from the two real ranks of the 128-rank GPU job, renumbered;
one rank's clock stretched makes a straggler."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson

GPU = Path(__file__).parents[1] / "data" / "gpu"
SOURCES = [GPU / "gpu_128ranks_rank0.json.gz", GPU / "gpu_128ranks_rank1.json.gz"]


def write_job(folder: Path, n: int, slow: dict[int, float] | None = None) -> Path:
    """``n`` rank traces in ``folder``: the two real ranks in turn, renumbered; ``slow``:
    rank → factor its clock is stretched by (every span that much longer)."""
    docs = [orjson.loads(gzip.decompress(p.read_bytes())) for p in SOURCES]
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(n):
        doc = dict(docs[r % 2])
        doc["distributedInfo"] = {**doc["distributedInfo"], "rank": r, "world_size": n}
        factor = (slow or {}).get(r)
        if factor:
            t0 = min(e["ts"] for e in doc["traceEvents"] if "ts" in e)
            doc["traceEvents"] = [
                {
                    **e,
                    "ts": t0 + (e["ts"] - t0) * factor,
                    **({"dur": e["dur"] * factor} if "dur" in e else {}),
                }
                if "ts" in e
                else e
                for e in doc["traceEvents"]
            ]
        (folder / f"rank{r}.json.gz").write_bytes(gzip.compress(orjson.dumps(doc), compresslevel=1))
    return folder
