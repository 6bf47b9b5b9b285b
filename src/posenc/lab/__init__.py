"""The lab: tiny models trained with each encoding and measured past what they were trained on.

One package per study, over shared machinery; a newcomer finds any study in one folder::

    common/     the machinery every study uses: the training loop (train), checkpoints, data-parallel (dist),
                devices, run folders (runfiles), atomic files, progress bars, report pieces, figure helpers;
                and the byte-level language model two studies share: the GPT (gpt), its text corpora (corpus),
                its scoring (evaluate) and its context-extension patches (scaling)
    length/     ``posenc lab``: which encoding extrapolates past the training length L, and by how much
    vision/     ``posenc vision``: which 2-D encoding keeps a ViT's accuracy at resolutions it was not trained at
    extend/     ``posenc extend``: what each context-extension method rescues, on a lab run or a pretrained model
    bench.py    ``posenc bench``: a tool timing RoPE and bias attention
    figures.py  ``posenc figures``: a tool drawing explanatory pictures of the encodings

Each study package's ``__init__`` says what the study asks, its command, the files it writes, and which module holds
its model, data, evaluation and report.

Dependencies run one way: a study -> ``common`` -> ``posenc`` (the library). A study never imports another study,
``common`` imports no study, the tools import only ``common``, and nothing in the library imports the lab (the
command line, ``posenc.cli``, is where they meet). So a study can be read, changed or deleted without touching the
others, and ``common`` can be trusted to mean the same for all of them. What two studies need goes down into
``common``: ``posenc extend`` loads the GPT that ``posenc lab`` trains, reads the same corpora and scores them the
same way, so the GPT, the corpora, perplexity and the ``rope_scaling`` patches live in ``common``, not in
``length``. ``tests/test_layout.py`` checks all of this, and that no two modules import each other in a circle.
"""
