"""The rerun fork server's pure parts: which of a session's modules it imports ahead, whether
a process has loaded the CUDA driver, and which environments it counts as the same."""

from __future__ import annotations

from swift_nb.rerun import forkserver


def test_it_imports_the_sessions_training_libraries_in_their_order_and_nothing_else():
    session = dict.fromkeys(
        [
            "os",
            "numpy",
            "torch",
            "torch._inductor.codecache",
            "transformers",
            "transformers.models.llama.modeling_llama",
            "my_project.data",
            "peft.__about__",
            "peft",
            "transformersx",
        ]
    )
    assert forkserver.preloads(session) == [
        "numpy",
        "transformers",
        "transformers.models.llama.modeling_llama",
        "peft",
    ]


def test_the_cuda_driver_is_loaded_when_libcuda_is_mapped_not_the_runtime_or_nvml():
    runtime_only = (
        "7f00-7f10 r-xp 00000000 08:01 1 /usr/lib/libcudart.so.12.4.127\n"
        "7f10-7f20 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54\n"
        "7f20-7f30 r-xp 00000000 08:01 3 /opt/torch/lib/libtorch_cuda.so\n"
        "7ffd-7ffe rw-p 00000000 00:00 0 [stack]\n"
    )
    assert not forkserver.cuda_driver_loaded(runtime_only)
    driver = runtime_only + "7f30-7f40 r-xp 00000000 08:01 4 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15\n"
    assert forkserver.cuda_driver_loaded(driver)


def test_pytests_per_test_variable_does_not_make_another_environment():
    a = {"PATH": "/bin", "PYTEST_CURRENT_TEST": "t.py::a (call)"}
    assert forkserver._same(a, {**a, "PYTEST_CURRENT_TEST": "t.py::b (call)"})
    assert not forkserver._same(a, {**a, "OMP_NUM_THREADS": "1"})
