"""``posenc export``: one patched model written as a transformers folder or a GGUF file, no study
(``posenc.deploy.export``, imported in ``run`` only)."""

from __future__ import annotations

import argparse

from posenc import _argtypes as A
from posenc._dtypes import DTYPE_CHOICES
from posenc.cli.parsing import TENSOR_TYPES, Subparsers
from posenc.deploy.methods import check_export_method


def run(args: argparse.Namespace) -> int:
    check_export_method(args.method)
    from posenc.deploy import export as run_export

    run_export(
        args.model, args.method, args.factor, args.save, save_type=args.save_type, original_len=args.original_len,
        layer_type=args.layer_type, device=args.device, dtype=None if args.dtype == "auto" else args.dtype,
        progress=not args.quiet,
    )
    return 0


def add(sub: Subparsers) -> None:
    p = sub.add_parser(
        "export",
        help="write a pretrained model extended by one method as a transformers folder or a GGUF file (no study)",
        description="Load a pretrained model, extend its context with one method and factor, and write it: a "
        "transformers folder (a new or empty DIR; the extension in its config, so from_pretrained and vLLM load it "
        "extended) or, for a name ending in .gguf, a GGUF file llama.cpp runs with the extension (a Llama, Qwen2 or "
        "Gemma 3 GGUF source, its tensors copied; linear, ntk, yarn, and llama3 for Llama). The weights are written "
        "as the source holds them (see --dtype). The same checks as posenc extend --save, all before any weight is "
        "read; nothing else is written, nothing is overwritten, and an interrupted export leaves nothing behind. "
        "Seconds for SmolLM2-135M. It ends with posenc check's table: what transformers, vLLM, SGLang and llama.cpp "
        "run from what was written. To measure what a method does first: posenc extend MODEL --methods M --factors F "
        "(--plan to see its cost).",
    )
    p.add_argument(
        "model",
        help="a .gguf file or a folder holding one, a transformers folder (offline), or a packaged model: smollm2, "
        "gemma3-270m, qwen2.5-coder-0.5b (the models guide says how to get each)",
    )
    p.add_argument(
        "--method",
        "--methods",
        dest="method",
        required=True,
        help="the extension: yarn, linear, ntk, llama3, dynamic (folder only), dca_vllm (Qwen2/Qwen3 folder only, "
        "served by vLLM/SGLang); longrope needs per-frequency factors no option sets (posenc.hf.extend_context "
        "takes them)",
    )
    p.add_argument(
        "--factor",
        "--factors",
        dest="factor",
        required=True,
        type=A.at_least_one,
        help="context factor >= 1: new context = factor x the original (1: STRING only)",
    )
    p.add_argument("--save", required=True, metavar="DIR|FILE.gguf", help="a new or empty folder, or a new .gguf file")
    p.add_argument(
        "--save-type",
        choices=TENSOR_TYPES,
        default="source",
        help="tensor type of FILE.gguf: source (default) copies the source's tensors as they are; or one type for "
        "every matrix",
    )
    p.add_argument(
        "--original-len", type=A.positive_int, help="the model's original context length; default: read from its config"
    )
    p.add_argument(
        "--layer-type",
        help="per-layer-type RoPE (Gemma 3): the layer type to extend, or all; default full_attention (the only one "
        "a .gguf carries: llama.cpp runs Gemma 3's sliding layers unscaled)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:<index>, mps or auto, where the model is patched")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=list(DTYPE_CHOICES),
        help="the written weights' dtype; auto (default): the source's own (a transformers checkpoint's dtype; "
        "float32 for a GGUF, which holds its dequantized values exactly), so the weights are written unchanged and "
        "only the RoPE config changes; another dtype converts them (a .gguf output copies the source's tensors)",
    )
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.set_defaults(func=run)
