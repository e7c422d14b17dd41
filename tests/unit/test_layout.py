"""Every module of swift_nb has tests a newcomer can find (tests/README.md says how).

A module ``swift_nb.<...>.<name>`` is covered by the first of these that exists:

1. ``tests/test_<name>.py`` (for a package's ``__init__.py``, ``<name>`` is the package's;
   leading underscores are dropped: ``_comm`` → ``test_comm.py``);
2. an entry for the module in ``MAPPING`` below;
3. the same for each package around it, up to the nearest layer in ``LAYERS``: a package is
   one unit whose tests are ``tests/test_<package>.py``, a ``tests/<package>/`` folder or a
   ``MAPPING`` entry, so a new file in ``analysis/forecast/`` needs no new line here.

The modules of a layer (``swift_nb`` itself, ``analysis``, ``capture``, ``notebook``,
``render``) are each their own unit: a new module there needs its own test module or a
``MAPPING`` line. A layer's ``__init__.py`` that only imports needs neither.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "swift_nb"
TESTS = ROOT / "tests"

#: Packages whose modules are tested one by one: the layers of the flow capture → record →
#: analysis → render → front, and the package root. Any other package is one unit.
#: the test tiers, one folder each (tests/README.md)
TIERS = ("unit", "integration", "notebook", "browser")

LAYERS = ("swift_nb", "swift_nb.analysis", "swift_nb.capture", "swift_nb.notebook", "swift_nb.render")

#: Modules and packages whose tests are not named after them → the test modules that cover
#: them. Keep in step with the table in tests/README.md (a test below checks the keys).
MAPPING: dict[str, tuple[str, ...]] = {
    "swift_nb.core": ("test_trace_names.py", "test_options.py", "test_forecast.py", "test_gc_pause.py"),
    "swift_nb.capture.fake_step": ("test_forecast_from_model.py",),
    "swift_nb.model_forecast": ("test_forecast_from_model.py",),
    "swift_nb.importing": (
        "test_import.py",
        "test_gpu_traces.py",
        "test_import_cluster.py",
        "test_rank_figures.py",
    ),
    "swift_nb.trackers": ("test_export.py",),
    "swift_nb.analysis.comparison": ("test_diff.py", "test_rerun.py", "test_data_parallel.py"),
    "swift_nb.analysis.trace": ("test_trace_decode.py", "test_analysis_pure.py", "test_run_data.py"),
    "swift_nb.capture.memory": ("test_step_memory.py", "test_oom.py", "test_cost_equivalence.py"),
    "swift_nb.capture.resources": ("test_sampler.py", "test_energy.py", "test_alerts.py"),
    "swift_nb.render.comparison": ("test_rerun.py", "test_diff.py", "test_data_parallel.py"),
    "swift_nb.render.figure_cache": ("test_helper.py", "test_report.py"),
    "swift_nb.render.value_text": ("test_labels.py",),
    "swift_nb": ("test_magic.py", "test_notebook.py"),
    "swift_nb.api": ("test_profile.py", "test_report.py", "test_widgets.py"),
    "swift_nb.demo": ("test_toggles.py", "test_advisor.py"),
    "swift_nb.core.devices": ("test_forecast.py", "test_throughput.py"),
    "swift_nb.core.errors": ("test_options.py", "test_damaged_records.py"),
    "swift_nb.importing.rank": ("test_import.py", "test_gpu_traces.py"),
    "swift_nb.importing.assembly": ("test_import.py", "test_gpu_traces.py", "test_import_cluster.py"),
    "swift_nb.reporting": ("test_report.py", "test_import.py", "test_rerun.py"),
    "swift_nb.core.units": ("test_report.py", "test_forecast.py"),
    "swift_nb.analysis.breakdown": ("test_analysis.py", "test_analysis_pure.py"),
    "swift_nb.analysis.comm": ("test_analysis_pure.py", "test_gpu_traces.py", "test_ranks.py"),
    "swift_nb.analysis.comparison.variants": (
        "test_rerun.py",
        "test_data_parallel.py",
        "test_torch_compile.py",
    ),
    "swift_nb.analysis.device": ("test_gpu_traces.py",),
    "swift_nb.analysis.advisor.findings": ("test_advisor.py", "test_report.py"),
    "swift_nb.analysis.memory": ("test_analysis.py", "test_step_memory.py"),
    "swift_nb.analysis.trace.shapes": ("test_throughput.py",),
    "swift_nb.analysis.timeline.counters": ("test_timeline.py",),
    "swift_nb.analysis.timeline.places": ("test_timeline.py",),
    "swift_nb.analysis.timeline.ranks": ("test_timeline.py",),
    "swift_nb.analysis.timeline.tracks": ("test_timeline.py",),
    "swift_nb.analysis.trace.tables": ("test_analysis_pure.py", "test_analysis.py", "test_trace_decode.py"),
    "swift_nb.capture.compile": ("test_compile_capture.py",),
    "swift_nb.capture.digest": ("test_helper.py", "test_cost_equivalence.py", "test_ranks.py"),
    "swift_nb.capture.dist": ("test_ranks.py",),
    "swift_nb.capture.environment": ("test_profile.py", "test_import.py"),
    "swift_nb.capture.flops": ("test_throughput.py", "test_magic.py"),
    "swift_nb.capture.frameworks": ("test_trainers.py", "test_advisor.py", "test_lightning.py"),
    "swift_nb.capture.job": ("test_ranks.py",),
    "swift_nb.capture.models": ("test_finetune.py", "test_oom.py", "test_stale_models.py"),
    "swift_nb.capture.job_rank": ("test_ranks.py",),
    "swift_nb.capture.journal": ("test_durability.py",),
    "swift_nb.capture.resources.link": ("test_scale_integration.py", "test_scale.py"),
    "swift_nb.render.modules_figure": ("test_modules.py",),
    "swift_nb.analysis.module_findings": ("test_modules.py",),
    "swift_nb.capture.memory.categories": ("test_analysis.py", "test_cost_equivalence.py"),
    "swift_nb.capture.memory.logits": ("test_logits_identity.py", "test_tokens.py"),
    "swift_nb.capture.memory.peak_tracker": ("test_forecast_from_model.py", "test_logits_identity.py"),
    "swift_nb.capture.memory.snapshots": ("test_step_memory.py", "test_cost_equivalence.py"),
    "swift_nb.capture.resources.rss": ("test_sampler.py", "test_profile.py"),
    "swift_nb.capture.session": ("test_profile.py",),
    "swift_nb.capture.signals": ("test_durability.py",),
    "swift_nb.capture.torch_profiler": ("test_profile.py", "test_steps.py"),
    "swift_nb.notebook.variants_view": ("test_rerun.py",),
    "swift_nb.notebook.forecast_form": ("test_forecast.py",),
    "swift_nb.notebook.live": ("test_widgets.py",),
    "swift_nb.notebook.panel": ("test_widgets.py",),
    "swift_nb.notebook.rerun_panel": ("test_rerun.py",),
    "swift_nb.parallel": ("test_parallel_attention.py", "test_sequence_parallel.py"),
    "swift_nb.render.comparison.page": (
        "test_rerun.py",
        "test_data_parallel.py",
        "test_torch_compile.py",
        "test_fonts.py",
    ),
    "swift_nb.render.document": ("test_report.py", "test_gpu_traces.py"),
    "swift_nb.render.figures": ("test_report.py", "test_fonts.py"),
    "swift_nb.render.html": ("test_report.py", "test_rerun.py"),
    "swift_nb.render.sections": ("test_report.py", "test_widgets.py"),
    "swift_nb.render.tables": ("test_report.py", "test_cli.py"),
    "swift_nb.render.timeline.view": ("test_timeline_widget.py", "test_timeline_browser.py"),
}


def modules() -> list[str]:
    """Every module of the package, dotted; a package's ``__init__.py`` as the package."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def is_package(module: str) -> bool:
    return (ROOT / module.replace(".", "/") / "__init__.py").is_file()


def only_imports(module: str) -> bool:
    """A package's ``__init__.py`` with nothing but a docstring, imports and ``__all__``."""
    tree = ast.parse((ROOT / module.replace(".", "/") / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            continue
        return False
    return True


def units(module: str) -> list[str]:
    """The module, then each package around it up to (not including) the nearest layer."""
    out = [module]
    parts = module.split(".")
    for i in range(len(parts) - 1, 0, -1):
        package = ".".join(parts[:i])
        if package in LAYERS:
            break
        out.append(package)
    return out


def covering_tests(unit: str) -> list[str]:
    """Test modules that cover ``unit`` by name or by MAPPING (paths relative to tests/)."""
    name = unit.rsplit(".", 1)[-1].lstrip("_")
    found = [p.relative_to(TESTS).as_posix() for p in TESTS.rglob(f"test_{name}.py")]
    if is_package(unit) and unit not in LAYERS and (TESTS / name).is_dir():
        found += [p.relative_to(TESTS).as_posix() for p in (TESTS / name).rglob("test_*.py")]
    return found + list(MAPPING.get(unit, ()))


def untested() -> list[str]:
    out = []
    for module in modules():
        if module in LAYERS and is_package(module) and only_imports(module):
            continue
        if not any(covering_tests(unit) for unit in units(module)):
            out.append(module)
    return out


def test_every_module_has_a_test_module_named_after_it_or_a_mapping_entry():
    missing = untested()
    assert not missing, (
        "modules without tests a newcomer can find: "
        + ", ".join(missing)
        + ". Add tests/test_<module>.py (for a package: tests/test_<package>.py or tests/<package>/), "
        "or name the test modules that cover it in MAPPING in tests/test_layout.py and in tests/README.md"
    )


def test_the_mapping_names_modules_and_test_files_that_exist():
    known = set(modules())
    stale = [m for m in MAPPING if m not in known]
    assert not stale, f"MAPPING names modules that do not exist: {stale}"
    gone = sorted({t for tests in MAPPING.values() for t in tests if not list(TESTS.rglob(t))})
    assert not gone, f"MAPPING names test files that do not exist: {gone}"


def test_the_readme_lists_every_mapping_entry():
    readme = (TESTS / "README.md").read_text()
    listed = set(re.findall(r"`(swift_nb(?:\.\w+)*)`", readme))
    missing = [m for m in MAPPING if m not in listed]
    assert not missing, f"tests/README.md does not list {missing}"


def test_every_test_module_lives_in_a_tier_whose_conftest_marks_it():
    """Where a test lives says how slow it is: tests/<tier>/ for unit, integration, notebook
    and browser, each with a conftest that marks its tests; no test module at the top."""
    assert not list(TESTS.glob("test_*.py"))
    for tier in TIERS:
        conftest = (TESTS / tier / "conftest.py").read_text()
        assert f"pytest.mark.{tier}" in conftest
    found = {p.parent.name for p in TESTS.rglob("test_*.py") if "js" not in p.parts}
    assert found <= set(TIERS), found - set(TIERS)


#: what a test of the fast tier never does: a kernel or browser fixture, a process, a
#: profiled block
HEAVY = re.compile(
    r"subprocess\.(?:run|Popen|check_output|check_call)\(|ProcessPoolExecutor\(|nbclient|"
    r"with swift_nb\.profile\(|\bprof\.start\(|\bdef \w+\([^)]*\b(?:kernel|browser|page|demo_gpt)\b"
)


def test_a_unit_test_starts_no_kernel_browser_or_process():
    """The fast tier stays fast: no unit test's body starts a kernel, a browser, a process
    or a profiled block (a module may keep the script that regenerates its fixture)."""
    offenders = []
    for path in sorted((TESTS / "unit").glob("test_*.py")):
        text = path.read_text()
        for node in ast.parse(text).body:
            is_test = isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
            if is_test and HEAVY.search(ast.get_source_segment(text, node) or ""):
                offenders.append(f"{path.name}::{node.name}")
    assert not offenders, offenders


def test_a_new_file_in_a_package_is_covered_by_the_packages_tests():
    assert units("swift_nb.analysis.forecast.growth") == [
        "swift_nb.analysis.forecast.growth",
        "swift_nb.analysis.forecast",
    ]
    assert "unit/test_forecast.py" in covering_tests("swift_nb.analysis.forecast")
    assert units("swift_nb.parallel._comm") == ["swift_nb.parallel._comm", "swift_nb.parallel"]
    assert units("swift_nb.analysis.effects") == ["swift_nb.analysis.effects"]
