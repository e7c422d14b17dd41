"""Time and memory by module, from a real profile of a Llama-shaped Hugging Face model:
the module scopes only inside the traced window, the forward and backward of the layers
adding up to the model's, the activations each layer keeps as a saved-tensors count of the
test's own says, the parameters exact, modules.csv written and read back, and the finding
that names a block slower than its siblings."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

import swift_nb
from swift_nb.analysis import analyze
from swift_nb.analysis.advisor import Thresholds
from swift_nb.analysis.modules import blocks
from swift_nb.analysis.timeline.places import places
from swift_nb.analysis.timeline.query import Timeline
from swift_nb.analysis.trace.tables import load_trace
from swift_nb.core import trace_names as tn

VOCAB, LAYERS, HIDDEN = 1024, 4, 256  # a vocabulary of 1024: its head is an LM head
BATCH, SEQ = 2, 128


def _model() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=4,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(cfg)


class Slower(nn.Module):
    """An MLP with extra matmuls: its layer costs more than its siblings."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.mlp = mlp
        self.w = nn.Parameter(torch.randn(HIDDEN, 4 * HIDDEN) / HIDDEN**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        extra = x
        for _ in range(6):
            extra = (extra @ self.w) @ self.w.T / HIDDEN
        return self.mlp(x) + 1e-6 * extra


def _train(model: nn.Module, out, steps: int = 6, hooks_seen: list | None = None) -> swift_nb.Run:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    with swift_nb.profile(out_dir=out, wait=1, warmup=1, active=3) as run:
        for _ in range(steps):
            if hooks_seen is not None:
                hooks_seen.append(len(nn.modules.module._global_forward_pre_hooks))
            logits = model(input_ids=ids).logits
            loss = nn.functional.cross_entropy(logits.view(-1, VOCAB), ids.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return run


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    seen: list[int] = []
    model = _model()
    run = _train(model, tmp_path_factory.mktemp("modules"), hooks_seen=seen)
    return model, swift_nb.load_run(run.path), seen


def test_scopes_are_on_only_in_the_recorded_steps(profiled):
    _, run, seen = profiled
    phases = run.steps["phase"].tolist()
    assert [n > 0 for n in seen] == [p == "active" for p in phases[: len(seen)]]
    assert not nn.modules.module._global_forward_pre_hooks and not nn.modules.module._global_forward_hooks


def test_the_layers_add_up_to_the_model(profiled):
    _, run, _ = profiled
    m = run.modules.set_index("path")
    parts = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(LAYERS)), "model.norm", "lm_head"]
    root = m[m["depth"] == 0].iloc[0]
    fwd = sum(m.at[p, "forward_s"] for p in parts)
    assert fwd == pytest.approx(root["forward_s"], rel=0.10)
    # every backward node of the step, whichever module it belongs to
    all_backward = root["backward_s"] + run.modules.attrs.get("unattributed_backward_s", 0.0)
    bwd = sum(m.at[p, "backward_s"] for p in parts)
    assert bwd == pytest.approx(root["backward_s"], rel=0.10)
    assert root["backward_s"] > 0.5 * all_backward or all_backward == 0
    assert (m.loc[parts, "calls"] == 1).all()
    assert (
        m.at["model.layers.0", "class"] == "LlamaDecoderLayer"
        and m.at["model.layers.0", "parent"] == "model.layers"
    )


def test_parameters_per_module_are_exact(profiled):
    model, run, _ = profiled
    m = run.modules.set_index("path")
    for path, module in model.named_modules():
        if path and path in m.index:
            want = sum(p.numel() * p.element_size() for p in module.parameters())
            assert m.at[path, "parameter_bytes"] == want, path
    total = sum(p.numel() * 4 for p in model.parameters())
    root = m[m["depth"] == 0].iloc[0]
    assert root["parameter_bytes"] == total and root["gradient_bytes"] == total
    # AdamW's two moments, and its step count: a one-element fp32 tensor per parameter
    assert root["state_bytes"] == 2 * total + 4 * len(list(model.parameters()))


def test_saved_bytes_per_layer_match_a_count_of_the_saved_tensors(profiled):
    model, run, _ = profiled
    own = {p.untyped_storage().data_ptr() for p in model.parameters()}
    own |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    layers = list(model.model.layers)
    current: list[int] = []
    counted: list[dict[int, int]] = [{} for _ in layers]

    def pack(t):
        if current and t.untyped_storage().data_ptr() not in own:
            counted[current[-1]][t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def enter(i: int):
        return lambda module, args: current.append(i)  # None: the input stays

    def leave(module, args, output) -> None:
        current.pop()

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(enter(i)))
        handles.append(layer.register_forward_hook(leave))
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids).logits.sum()
    for h in handles:
        h.remove()
    m = run.modules.set_index("path")
    for i in range(LAYERS):
        want = sum(counted[i].values())
        assert want > 0
        assert m.at[f"model.layers.{i}", "saved_bytes"] == pytest.approx(want, rel=0.10)


def test_modules_csv_is_written_and_read_back(profiled):
    _, run, _ = profiled
    assert (run.path / "modules.csv").exists() and run.files["modules"] == "modules.csv"
    assert list(run.modules.columns) == swift_nb.record.MODULES_COLUMNS
    assert run.modules.loc[run.modules["depth"] == 0, "parent"].tolist() == [""]
    assert len(blocks(run.modules)) == LAYERS
    html = (run.path / "report.html").read_text()
    assert "Time and memory by module" in html and "model.layers.0" in html


def test_a_slower_block_is_named(tmp_path):
    model = _model()
    model.model.layers[2].mlp = Slower(model.model.layers[2].mlp)
    run = swift_nb.load_run(_train(model, tmp_path).path)
    reported = swift_nb.report(run)
    found = [f for f in reported.analysis.findings if f.id == "slow_block"]
    assert len(found) == 1 and found[0].evidence["block"] == "model.layers.2"
    assert "model.layers.2" in found[0].title
    assert found[0].evidence["ops_that_differ"]
    stack = reported.analysis.modules.attrs["blocks"]
    assert (
        stack["count"] == LAYERS
        and stack["slowest"] == "model.layers.2"
        and stack["parent"] == "model.layers"
    )
    assert (
        "The stack model.layers holds 4 blocks of class LlamaDecoderLayer"
        in (run.path / "report.html").read_text()
    )


def test_a_run_reported_later_gets_its_modules_then(tmp_path):
    """A record saved without its report (or by a version without modules) loads with an
    empty table; ``swift_nb.report`` writes modules.csv from the trace and the capture."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with swift_nb.profile(out_dir=tmp_path, report=False, wait=0, warmup=1, active=2) as run:
        for _ in range(4):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    loaded = swift_nb.load_run(run.path)
    assert loaded.modules.empty and list(loaded.modules.columns) == swift_nb.record.MODULES_COLUMNS
    assert "modules" not in loaded.files
    swift_nb.report(loaded)
    again = swift_nb.load_run(run.path)
    assert again.modules["path"].tolist()[0] == "model" and set(again.modules["path"]) == {
        "model",
        "0",
        "1",
        "2",
    }
    assert (again.modules.set_index("path").loc[["0", "2"], "forward_s"] > 0).all()


def test_flash_attention_changes_the_attention_modules_activations_and_not_the_mlps(tmp_path):
    """Baseline (eager attention) against the flash_attention toggle, module by module: the
    attention modules keep less for backward (no T×T scores), the MLPs exactly as much."""
    runs = []
    for label, toggles in (("baseline", []), ("flash_attention", ["flash_attention"])):
        torch.manual_seed(0)
        model = _model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ))
        with swift_nb.profile(
            out_dir=tmp_path,
            label=label,
            wait=1,
            warmup=1,
            active=2,
            toggles=toggles,
            namespace={"model": model, "opt": opt},
            context={"variant": label},
        ) as run:
            for _ in range(5):
                logits = model(input_ids=ids).logits
                nn.functional.cross_entropy(logits.view(-1, VOCAB), ids.view(-1)).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        runs.append(swift_nb.load_run(run.path))
    d = swift_nb.diff(*runs)
    m = d.modules.set_index("path")
    for i in range(LAYERS):
        attn, mlp = m.loc[f"model.layers.{i}.self_attn"], m.loc[f"model.layers.{i}.mlp"]
        assert attn["delta_saved_bytes"] < -0.2 * attn["a_saved_bytes"], attn
        assert mlp["b_saved_bytes"] == mlp["a_saved_bytes"] > 0
    assert d.modules["path"].iloc[0].endswith("self_attn")  # ranked by the change in activations
    assert any("self_attn" in s and "activations kept" in s for s in d.sentences)


def test_roles_dtypes_and_the_modules_track(profiled):
    _, run, _ = profiled
    m = run.modules.set_index("path")
    assert m.at["lm_head", "role"] == "lm_head"  # the model's output embeddings
    assert set(m["role"]) == {"", "lm_head"}
    assert m.at["model.layers.0.mlp.up_proj", "dtype"] == "float32" and m.at["model.layers", "dtype"] == ""
    # the scopes are a track of their own, under the steps, and on no thread's
    trace = load_trace(run)
    tl = Timeline.of_trace(trace)
    labels = tl.tracks["label"].tolist()
    assert labels[:2] == ["Steps", "Modules"]
    scopes = trace.events[trace.events["name"].str.startswith(tn.MODULE_PREFIX)]
    hits = tl.query(float(scopes["ts_us"].min()), float(scopes["end_us"].max()))
    on = hits.loc[hits["name"].str.startswith(tn.MODULE_PREFIX), "track"]
    assert set(on) == {"modules"}, set(on)
    # the model's longest forward is a place the Modules tab links to
    where = places(run, analyze(run).findings, trace)["modules"]
    root = scopes.loc[scopes["dur_us"].idxmax()]
    assert (
        where[0] < root["ts_us"]
        and where[1] > root["end_us"]
        and root["name"] == tn.MODULE_PREFIX + "model (root)"
    )


def test_the_activations_and_logits_findings_name_their_modules(profiled):
    _, run, _ = profiled
    analysis = analyze(run, thresholds=Thresholds(activation_share=0.01, logits_share=0.001))
    found = {f.id: f for f in analysis.findings}
    act = found["activations"].evidence
    assert act["saved_by"] == "model.layers.0 … model.layers.3 (4 blocks of class LlamaDecoderLayer)"
    m = run.modules.set_index("path")
    layers = sum(m.at[f"model.layers.{i}", "saved_bytes"] for i in range(LAYERS))
    assert act["saved_by_bytes"] == layers
    assert act["saved_by_share"] == pytest.approx(layers / m.at["model (root)", "saved_bytes"], abs=1e-3)
    assert "model.layers.0 … model.layers.3" in found["activations"].predicted_effect
    logits = found["logits"]
    assert logits.evidence["lm_head"] == "lm_head" and "By module: lm_head and the loss" in logits.suggestion
    head_s = m.at["lm_head", "total_s"] + analysis.modules.attrs["unattributed_backward_s"]
    assert logits.evidence["lm_head_loss_s"] == pytest.approx(head_s)


def _small_llama(vocab: int, hidden: int = 64) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    return transformers.LlamaForCausalLM(cfg)


def _profile(model: nn.Module, out, vocab: int, autocast: bool = False) -> swift_nb.Run:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = torch.randint(0, vocab, (2, 64))
    with swift_nb.profile(out_dir=out, wait=0, warmup=1, active=2) as run:
        for _ in range(3):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(input_ids=ids).logits
                loss = nn.functional.cross_entropy(logits.float().view(-1, vocab), ids.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return swift_nb.load_run(run.path)


def test_an_fp32_norm_in_a_bf16_model_and_a_costly_head(tmp_path):
    """A bf16 model whose final norm and embedding stay fp32 (under autocast, as a
    half-converted checkpoint runs); its head (4096 tokens × 64) is most of the step."""
    vocab = 4096
    model = _small_llama(vocab).to(torch.bfloat16)
    model.model.norm.float()
    model.model.embed_tokens.float()
    run = _profile(model, tmp_path, vocab, autocast=True)
    m = run.modules.set_index("path")
    assert (
        m.at["model.norm", "dtype"] == "float32"
        and m.at["model.layers.0.input_layernorm", "dtype"] == "bfloat16"
    )
    found = {f.id: f for f in analyze(run).findings}
    fp32 = found["fp32_module"]
    assert fp32.evidence["count"] == 2 and fp32.evidence["model_dtype"] == "bfloat16"
    assert "model.norm (LlamaRMSNorm)" in fp32.evidence["modules"]
    assert "model.embed_tokens (Embedding)" in fp32.evidence["modules"]
    want = m.at["model.norm", "parameter_bytes"] + m.at["model.embed_tokens", "parameter_bytes"]
    assert fp32.evidence["fp32_parameter_bytes"] == want == (64 + vocab * 64) * 4
    # the head and its loss: a finding of their own when the logits' is not made
    alone = {f.id: f for f in analyze(run, thresholds=Thresholds(logits_share=1.0)).findings}
    head = alone["lm_head"]
    assert head.evidence["lm_head"] == "lm_head" and head.toggle == "fused_ce"
    assert head.evidence["lm_head_loss_share"] >= 0.25
    step_s = float(run.steps.loc[run.steps["phase"] == "active", "duration_s"].mean())
    assert head.evidence["lm_head_loss_share"] == pytest.approx(
        head.evidence["lm_head_loss_s"] / step_s, rel=0.05
    )
    # the same model all in bf16 has no fp32 module
    same = _small_llama(vocab).to(torch.bfloat16)
    assert "fp32_module" not in {
        f.id for f in analyze(_profile(same, tmp_path, vocab, autocast=True)).findings
    }


def test_peft_adapters_are_shown_apart_from_the_base(tmp_path):
    import peft

    vocab = 1024
    model = peft.get_peft_model(
        _small_llama(vocab), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    run = _profile(model, tmp_path, vocab)
    m = run.modules
    adapters = m[m["role"] == "adapter"]
    assert (
        len(adapters) and adapters["path"].str.contains(r"\.lora_(?:A|B|dropout|embedding|magnitude)").all()
    )
    named = {p for p, _ in model.named_modules() if ".lora_A" in p or ".lora_B" in p or ".lora_dropout" in p}
    assert named and named <= set(adapters["path"].str.removeprefix("model (root)."))
    summary = swift_nb.report(run).analysis.modules.attrs["adapters"]
    trained = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "lora_" in n)
    assert summary["parameter_bytes"] == summary["gradient_bytes"] == trained
    assert summary["modules"] == len(adapters) and summary["seconds"] > 0
    html = (run.path / "report.html").read_text()
    assert "The peft adapters, apart from the base model" in html and "<h4>Adapters</h4>" in html
