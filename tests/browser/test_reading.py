"""report.html and compare.html of profiled runs, read as text by someone who did not write
the code: no table heading is a Python identifier, no cell runs over ``CELL_CHARS``, every
figure has its alternative text, and the advice names no device the run did not use.

Two models, each profiled as it is and with flash_attention, then compared: swift_nb's demo
GPT (the quickstart's: explicit attention over 1024 tokens) and a Hugging Face Llama built
from a config with random weights (eager attention; nothing is downloaded)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

import swift_nb
from swift_nb.demo import GPT, quickstart_config
from swift_nb.record import Run
from swift_nb.render.html import CELL_CHARS
from swift_nb.render.labels import LABELS

#: ``step_s``, ``score_tensors_kept_at_peak``: a key as the code spells it
IDENTIFIER = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)+")
#: what advice for a GPU says, in a run that had none
GPU_WORDS = re.compile(r"cuda|gpu|nvml|flash_attention_2|tensor cores", re.IGNORECASE)
#: the sections whose text is advice
ADVICE = ("Verdict", "Findings")


class Page(HTMLParser):
    """A document as a reader meets it: each ``h2`` section's text, every table heading and
    cell, every image's alt text."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, list[str]] = {"": []}
        self.headings: list[str] = []
        self.cells: list[str] = []
        self.alts: list[str | None] = []
        self._section = ""
        self._open: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("h2", "th", "td"):
            self._open, self._text = tag, []
        elif tag == "img":
            self.alts.append(dict(attrs).get("alt"))

    def handle_endtag(self, tag):
        if tag != self._open:
            return
        text = re.sub(r"\s+", " ", "".join(self._text)).strip()
        if tag == "h2":
            self._section = text
            self.sections.setdefault(text, [])
        else:
            (self.headings if tag == "th" else self.cells).append(text)
        self._open = None

    def handle_data(self, data):
        if self._open is not None:
            self._text.append(data)
        if not self.lasttag or self.lasttag not in ("style", "script"):
            self.sections[self._section].append(data)

    def text(self, *sections: str) -> str:
        return re.sub(r"\s+", " ", " ".join(" ".join(self.sections.get(s, [])) for s in sections))


def read(path: Path) -> Page:
    page = Page()
    page.feed(unescape(path.read_text("utf-8")))
    return page


def _profile(out: Path, make: Callable[[], torch.nn.Module], loss, label: str, toggles=()) -> Run:
    """Five steps of ``loss(model)`` (wait 1, warmup 1, active 2), under ``toggles``."""
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with swift_nb.profile(
            out_dir=out,
            label=label,
            wait=1,
            warmup=1,
            active=2,
            toggles=list(toggles),
            namespace={"model": model, "opt": opt},
            context={"variant": label},
        ) as run:
            for _ in range(5):
                loss(model).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    assert run.status == "ok", run.summary.get("traceback")
    return swift_nb.load_run(run.path)


def _demo() -> tuple[Callable[[], torch.nn.Module], Callable]:
    cfg = quickstart_config()
    x = torch.randint(0, cfg.vocab_size, (1, cfg.seq_len))
    return (lambda: GPT(cfg)), (lambda model: model(x, x))


def _llama() -> tuple[Callable[[], torch.nn.Module], Callable]:
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    x = torch.randint(0, cfg.vocab_size, (1, 1024))

    def make() -> torch.nn.Module:
        return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="eager")

    return make, (lambda model: model(input_ids=x, labels=x).loss)


@pytest.fixture(scope="module", params=["demo", "llama"])
def pages(request, tmp_path_factory) -> tuple[Page, Page, Run]:
    """The baseline's report.html and the comparison's compare.html, read, and the baseline."""
    make, loss = _demo() if request.param == "demo" else _llama()
    out = tmp_path_factory.mktemp(request.param)
    base = _profile(out, make, loss, "baseline")
    flash = _profile(out, make, loss, "flash_attention", toggles=["flash_attention"])
    swift_nb.compare(base, flash, html=True)
    assert base.path is not None
    return read(base.path / "report.html"), read(base.path / "compare.html"), base


def _key_not_words(heading: str) -> bool:
    """A key whose label is other words than the key itself (``h2d`` for "Host-to-device
    copies"; "variant" is the word its label capitalises)."""
    return heading in LABELS and LABELS[heading].text.lower() != heading.lower()


def test_no_heading_is_an_identifier(pages):
    report, compare, _ = pages
    for page in (report, compare):
        keys = [h for h in page.headings if IDENTIFIER.fullmatch(h) or _key_not_words(h)]
        assert not keys, keys
    # the verdict's and the findings' evidence is among what was read
    assert "Step time, traced (profiler on)" in report.headings and "Peak tensor memory" in report.headings


def test_no_cell_is_over_the_limit(pages):
    report, compare, _ = pages
    for page in (report, compare):
        long = [c for c in page.cells if len(c) > CELL_CHARS]
        assert not long, long
    assert any(c.startswith("predicted ") and " · measured " in c for c in compare.cells), compare.cells


def test_every_figure_says_what_it_shows(pages):
    for page in pages[:2]:
        assert page.alts and all(alt and alt.strip() for alt in page.alts), page.alts


def test_the_advice_names_only_the_device_the_run_used(pages):
    report, compare, run = pages
    assert run.environment.get("device") == "cpu"
    advice = report.text(*ADVICE)
    assert "Explicit attention at sequence length 1024" in advice  # the finding the models are made for
    said = GPU_WORDS.findall(advice + " " + compare.text(""))
    assert not said, said
