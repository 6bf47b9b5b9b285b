"""``posenc.hf.save_gguf`` from Qwen2 and Gemma 3 GGUFs: the source's tensors copied byte for byte, the RoPE keys
rewritten, and what each runtime runs from the file (``posenc check``).

References: llama.cpp's per-layer RoPE from a file's keys, written out from its source (``tests/reference/
llamacpp_rope.llamacpp_layers``: Gemma 3's sliding layers at ``rope.freq_base_swa`` unscaled) against the extended
model's own rotary module per layer type; posenc's loader on the written files (logits of the extended model). Llama
files: ``test_gguf_export.py``; the real models end to end: ``tests/deploy/test_export_real.py``.
"""

from __future__ import annotations

import math

import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers' GGUF loader needs it

from hf.tiny import ORIGINAL, logits, tiny_model  # noqa: E402 - after the skips
from hf.tiny_gguf import GEMMA3_LAYERS, edited_copy, tiny_gemma3, write_gemma3, write_llama  # noqa: E402
from posenc.gguf import llama as gguf_llama  # noqa: E402
from posenc.gguf.header import read_gguf_header  # noqa: E402
from posenc.hf import extend_context, load_causal_lm, save_gguf  # noqa: E402
from posenc.runtimes.check import check  # noqa: E402
from reference.llamacpp_rope import llamacpp_layers  # noqa: E402
from tolerances import ulps  # noqa: E402

FULL, SLIDING = "full_attention", "sliding_attention"
# (method, options): what llama.cpp expresses for qwen2 and gemma3 (no factor tensors: no llama3, no longrope)
QWEN2 = [("none", {}), ("linear", {}), ("ntk", {}), ("yarn", {}), ("yarn", {"attention_factor": 1.3})]
GEMMA3 = [("none", {}), ("linear", {}), ("ntk", {}), ("yarn", {})]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """``{arch: gguf path}``: F32 files as llama.cpp's converters write them (Gemma 3: norms + 1, 6 layers, full at
    layer 5 as llama.cpp's default pattern)."""
    folder = tmp_path_factory.mktemp("sources")
    return {
        "qwen2": write_llama(folder / "qwen2.gguf", tiny_model("qwen2"), weights="f32", arch="qwen2"),
        "gemma3": write_gemma3(folder / "gemma3.gguf", tiny_gemma3()),
    }


def _extended(path, method, options, factor=4.0, **where):
    """The model of ``path`` extended; ``layer_type="all"``: every layer type, as ``posenc export --layer-type all``."""
    model, tokenizer = load_causal_lm(path)
    types = [FULL, SLIDING] if where.get("layer_type") == "all" else [where.get("layer_type")]
    for layer_type in types if method != "none" else []:
        extend_context(model, method, factor, **({} if layer_type is None else {"layer_type": layer_type}), **options)
    return model, tokenizer


def _where(arch: str) -> dict:
    return {"layer_type": FULL} if arch == "gemma3" else {}


def _rotary_per_layer(model) -> list[tuple[torch.Tensor, float]]:
    """The extended model's own rotary module: each decoder layer's inverse frequencies and cos/sin scale (Gemma 3:
    per layer type)."""
    rotary = model.model.rotary_emb
    types = getattr(model.config, "layer_types", None)
    if types is None or not hasattr(rotary, f"{FULL}_inv_freq"):
        return [(rotary.inv_freq.double(), float(rotary.attention_scaling))] * model.config.num_hidden_layers
    return [(getattr(rotary, f"{t}_inv_freq").double(), float(getattr(rotary, f"{t}_attention_scaling")))
            for t in types]


def _same_tensors(src, dst) -> None:
    a_header, b_header = read_gguf_header(src), read_gguf_header(dst)
    assert [t.name for t in b_header.tensors] == [t.name for t in a_header.tensors]  # none added, none dropped
    with open(src, "rb") as a, open(dst, "rb") as b:
        for t, u in zip(a_header.tensors, b_header.tensors, strict=True):
            a.seek(t.offset), b.seek(u.offset)
            assert (u.ggml_type, u.shape) == (t.ggml_type, t.shape) and a.read(t.n_bytes) == b.read(u.n_bytes), t.name


@pytest.mark.parametrize(("arch", "method", "options"),
                         [("qwen2", m, o) for m, o in QWEN2] + [("gemma3", m, o) for m, o in GEMMA3])
def test_an_extended_model_is_copied_with_new_rope_keys(sources, tmp_path, arch, method, options):
    model, tokenizer = _extended(sources[arch], method, options, **_where(arch))
    out = tmp_path / "extended.gguf"
    written = save_gguf(model, out, source=sources[arch], check=False)
    assert written["weights"] == "copied" and written["bytes"] == out.stat().st_size
    _same_tensors(sources[arch], out)

    # llama.cpp's per-layer reading of the written keys (the reference) against the model's own rotary module
    header = read_gguf_header(out)
    meta = dict(header.metadata)
    assert meta[f"{arch}.context_length"] == model.config.max_position_embeddings
    read = llamacpp_layers(meta, {k: list(v) for k, v in gguf_llama.rope_tensors(header).items()})
    ours = _rotary_per_layer(model)
    assert len(read) == len(ours) == model.config.num_hidden_layers
    for il, ((angles, mscale, _), (inv_freq, scale)) in enumerate(zip(read, ours, strict=True)):
        # float32 on both sides: transformers' float32 inv_freq (a pow and a few ops) and the float32 keys
        torch.testing.assert_close(torch.tensor(angles, dtype=torch.float64), inv_freq, **ulps(16), msg=f"layer {il}")
        assert math.isclose(mscale, scale, rel_tol=4 * torch.finfo(torch.float32).eps), (il, mscale, scale)
    if arch == "gemma3":  # the full layer scaled, the sliding ones at 10000 unscaled, as transformers runs them
        assert [il for il in range(GEMMA3_LAYERS) if model.config.layer_types[il] == FULL] == [5]
        torch.testing.assert_close(ours[0][0], 1.0 / 10000.0 ** (torch.arange(0, 8, 2).double() / 8), **ulps(16))

    # posenc's loader: the recorded config and bit-equal logits past the original context
    back, back_tokenizer = load_causal_lm(out)
    assert back.config.rope_parameters == model.config.rope_parameters
    assert back.config.max_position_embeddings == model.config.max_position_embeddings
    ids = torch.randint(0, 64, (2, 3 * ORIGINAL), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(logits(back, ids), logits(model, ids), rtol=0, atol=0)
    assert back_tokenizer("ab a")["input_ids"] == tokenizer("ab a")["input_ids"]

    # what each runtime runs from the file, against posenc's record
    rows = {row.runtime: row for row in check(out)}
    assert rows["llamacpp"].status == "same", rows["llamacpp"].verdict
    assert rows["vllm"].status == "cannot run this" and "no GGUF loader" in rows["vllm"].verdict
    assert rows["llamacpp"].reference.startswith("posenc's posenc.rope record in the GGUF")
    if method in ("none", "ntk"):  # no scaling key: ntk's new base is rope.freq_base, which transformers reads
        assert rows["transformers"].status == "same", rows["transformers"].verdict
    else:
        assert rows["transformers"].status == "differs"
        assert f"load it with posenc.hf.load_causal_lm({str(out)!r})" in rows["transformers"].verdict


def test_transformers_alone_loads_the_weights_unscaled(sources, tmp_path):
    """What the check's transformers row says: its GGUF loader drops rope.scaling.* (Gemma 3 and Qwen2 alike), so it
    loads the exported file's weights with the unextended RoPE; posenc's loader reads the record."""
    import transformers

    model, _ = _extended(sources["gemma3"], "linear", {}, **_where("gemma3"))
    out = save_gguf(model, tmp_path / "g.gguf", source=sources["gemma3"], check=False)["path"]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out.parent, gguf_file=out.name).eval()
    assert theirs.config.rope_parameters[FULL].get("rope_type", "default") == "default"
    for key, value in model.state_dict().items():
        torch.testing.assert_close(theirs.state_dict()[key], value, rtol=0, atol=0, msg=key)


# -- refused, before anything is written ----------------------------------------------------------------------------


def _refused(tmp_path, call, message: str) -> None:
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=message):
        call()
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    ("method", "options", "layer_type", "message"),
    [
        ("linear", {}, SLIDING, r"rotates the sliding_attention layers at rope.freq_base_swa \(10000\) unscaled.*"
                                r"\(rope_type 'linear'\) would run them unscaled"),
        ("yarn", {}, "all", r"\(rope_type 'yarn'\) would run them unscaled"),
        ("ntk", {}, SLIDING, r"at base 10000 .*not \d+ \(a new base there, ntk, is not carried\)"),
        # rope.scaling.attn_factor = 1.3 / (1 + 0.1 ln 4) = 1.14172, which llama.cpp multiplies into every layer's
        ("yarn", {"attention_factor": 1.3}, FULL, r"would scale their cos/sin by 1.14172 where transformers does by 1"),
        ("llama3", {}, FULL, "needs per-frequency factor tensors"),
        ("dynamic", {}, FULL, "dynamic NTK changes its frequencies"),
    ],
)
def test_gemma3_rope_llamacpp_would_not_run_is_refused(sources, tmp_path, method, options, layer_type, message):
    """llama.cpp's gemma3 rotates the sliding layers at rope.freq_base_swa with freq_scale 1 and hands them the
    full layers' attn_factor: a model extended there (Gemma 3 is extended on full_attention only), or whose YaRN
    attention factor would reach them, is refused."""
    model, _ = _extended(sources["gemma3"], method, options, layer_type=layer_type)
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=sources["gemma3"]), message)


@pytest.mark.parametrize("method", ["llama3", "longrope"])
def test_qwen2_factor_tensor_methods_are_refused(sources, tmp_path, method):
    options = {"long_factor": [1.0, 1.5, 2.0, 4.0]} if method == "longrope" else {}
    model, _ = _extended(sources["qwen2"], method, options)
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=sources["qwen2"]),
             rf"rope_type '{method}' needs per-frequency factor tensors .* qwen2 runs \['default', 'linear', 'yarn'\]")


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_changed_weights_or_a_tensor_type_are_refused(sources, tmp_path, arch):
    """Writing tensors into a Qwen2 / Gemma 3 file is not built (their sources are K-quants gguf cannot quantize):
    a fine-tuned model, or a tensor type asked for, is refused naming the converter path instead."""
    model, _ = _extended(sources[arch], "linear", {}, **_where(arch))
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=sources[arch], tensor_type="Q8_0"),
             "tensor_type='Q8_0' is invalid: expected unchanged weights of the .* convert_hf_to_gguf.py")
    with torch.no_grad():
        next(iter(model.parameters())).add_(1e-3)
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=sources[arch]),
             r"model=\"with weights that differ from its source's \(fine-tuned\)\" is invalid")


def test_a_norm_off_by_the_converter_shift_is_a_change(sources, tmp_path):
    """The weights are compared as transformers' loader reads them (Gemma's norms minus 1): a model whose norm is
    the file's raw value (the +1 left in) differs, and is refused."""
    model, _ = _extended(sources["gemma3"], "linear", {}, layer_type=FULL)
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=sources["gemma3"]), "fine-tuned")


def test_a_layer_pattern_llamacpp_reads_otherwise_is_refused(tmp_path):
    """A Gemma 3 source whose attention.sliding_window_pattern (3: full at layers 2, 5) is not the model's layer
    types (full at 5): llama.cpp would run other layers as sliding than posenc measured."""
    source = write_gemma3(tmp_path / "src" / "g.gguf", tiny_gemma3(), **{"gemma3.attention.sliding_window_pattern": 3})
    model, _ = _extended(source, "linear", {}, layer_type=FULL)
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=source),
             r"the sliding pattern llama.cpp runs from the source's keys \(6 layers, full ones at \[2, 5\]; differing "
             r"at layers \[2\]\)")


def test_another_model_than_the_sources_is_refused(sources, tmp_path):
    model, _ = _extended(sources["qwen2"], "linear", {})
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=sources["gemma3"]),
             "model='qwen2' is invalid: expected a model of the source's architecture 'gemma3'")
    other = write_llama(tmp_path / "o" / "q.gguf", tiny_model("qwen2", intermediate_size=96), weights="f32",
                        arch="qwen2")
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=other),
             "intermediate_size: model 64, file qwen2.feed_forward_length 96")


def test_keys_edited_after_the_export_are_not_loaded_as_the_record(sources, tmp_path):
    """posenc's loader reads the record only while the llama.cpp keys still say the same: a file whose scaling keys
    were dropped loads as the keys say (unextended), and one whose factor was changed is refused (transformers would
    drop the scaling it still has)."""
    model, _ = _extended(sources["qwen2"], "yarn", {})
    out = save_gguf(model, tmp_path / "q.gguf", source=sources["qwen2"], check=False)["path"]
    scaling = tuple(k for k in read_gguf_header(out).metadata if k.startswith("qwen2.rope.scaling."))
    dropped = edited_copy(out, tmp_path / "dropped.gguf", drop=scaling)
    back, _ = load_causal_lm(dropped)
    assert back.config.rope_parameters.get("rope_type", "default") == "default"
    edited = edited_copy(out, tmp_path / "edited.gguf", put={"qwen2.rope.scaling.factor": (2.0, "FLOAT32")})
    with pytest.raises(ValueError, match="transformers' GGUF loader drops it"):
        load_causal_lm(edited)
