"""The methods ``posenc export`` writes, and why it refuses the others: checked before anything is imported (no torch),
so a misspelt ``--method`` is refused at once and the list in the message is what export accepts. A remapping or
composed method (``self_extend``, ``yarn+string``) passes here: ``study.run.check_save`` refuses it once the model is
read, with the Python that rebuilds the model posenc extend measures."""

from __future__ import annotations

from posenc._fail import fail

#: What export writes from a factor alone: the frequency methods a saved config runs as posenc measures them
#: (``dynamic`` to a folder only; a ``.gguf`` file takes linear, ntk, yarn, llama3) and ``dca_vllm`` (vLLM's and
#: SGLang's Dual Chunk Attention, a Qwen2/Qwen3 folder only); each one's model and path are checked later
#: (``study.run.check_save``).
EXPORT_METHODS = ("yarn", "linear", "ntk", "llama3", "dynamic", "dca_vllm")

#: ``posenc.hf.extend.METHODS``, mirrored here (no torch; tests/test_cli_startup.py checks it): every method name.
KNOWN_METHODS = (
    "linear", "ntk", "dynamic", "yarn", "longrope", "llama3", "self_extend", "dca", "dca_vllm", "rerope",
    "leaky_rerope", "lm_infinite", "string", "streaming_llm", "drope",
)  # fmt: skip

#: Methods posenc extend measures that export refuses whatever the model, and why.
REFUSED = {
    "none": "an extension method: export writes an extended model (the source itself is the unextended one)",
    "drope": "a method export can make from a factor alone: DroPE has no factor, and RoPE-trained weights without "
    "RoPE are not a DroPE model until recalibrated (its authors fine-tune every parameter at the original context), "
    "so there is nothing to export before that fine-tune; posenc extend MODEL --methods drope --finetune-steps N "
    "--save DIR recalibrates it and writes it through posenc.hf.save_pretrained (posenc.hf.load_causal_lm loads it "
    "back as DroPE; GGUF cannot hold it)",
    "longrope": "a method export can make from a factor alone: LongRoPE's per-frequency long_factor comes from a "
    "search (no option sets it); in Python, posenc.hf.extend_context(model, 'longrope', F, long_factor=[...]) then "
    "posenc.hf.save_pretrained (or save_gguf) writes it",
}


def check_export_method(method: object) -> str:
    """``method`` unless export refuses it whatever the model: the standard ``ValueError`` naming what it accepts (a
    method it knows but never writes: why)."""
    accepted = f"one of {list(EXPORT_METHODS)}"
    if not isinstance(method, str) or not method:
        fail("method", method, accepted)
    if "," in method:
        fail("method", method, "one method: export writes one model (posenc extend measures several)")
    for part in method.split("+"):
        if part in REFUSED:
            fail("method", part if "+" in method else method, REFUSED[part])
    for part in method.split("+"):
        if part not in KNOWN_METHODS:
            fail("method", part, accepted)  # the misspelt part of a composed one ('yarm' of 'yarm+string')
    return method
