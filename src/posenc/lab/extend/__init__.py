"""``posenc extend``: patch a trained model's positions for a longer context; what does each method rescue?

For each method (linear / PI, NTK, dynamic NTK, YaRN, Llama 3; ALiBi slope interpolation) and factor, a fresh copy
of the model is patched and measured at lengths up to past its original context: perplexity over whole windows and
past the original context, passkey retrieval over a length x depth grid and, with ``--task ruler``, lm-eval's RULER
tasks (pretrained models), every retrieval score a rate with a Wilson interval; the unpatched model is measured the
same way, and ``--finetune-steps`` adds Position Interpolation's short fine-tune. The model is a ``posenc lab`` run
folder, a pretrained model (a GGUF file, a transformers folder, ``smollm2``), or ``new`` (``--task passkey``: a fresh
lab GPT trained on the passkey task first). Every setting is checked against the model and the machine before any
weight is loaded.

Command: ``posenc extend MODEL [--methods yarn,dynamic] [--factors 2,4] [--task ruler --ruler-tasks niah_single_1]
[--out OUT] [--resume] [--save DIR] [--plan]``; ``posenc extend MODEL --pick --target T [--budget 2h]`` picks the
method for a length (``pick.run``); ``posenc export MODEL --method M --factor F --save PATH`` writes one
(``posenc.deploy``).

Files in ``OUT``:
    extend.json         the settings (``ExtendConfig``, the plan's defaults filled in), checked on ``--resume``
    results.csv         one row per measurement, upserted as each finishes (``study.run.COLUMNS``)
    extend.png          perplexity against length, one line per method and factor (task ``lm``)
    passkey.png         passkey heatmaps, length x depth, keys found / tried per cell
    rates.png           passkey and RULER rates vs length per method, Wilson 95% intervals
    report.md           tables, figures, findings, configuration and environment
    runs/               training and fine-tuning runs of lab models

Where to change what (folders import one way: ``settings`` below all, ``needles`` and ``stats`` below ``targets``,
``targets`` below ``study``, ``study`` below ``pick``):
    ``settings/``   what a study is told
        ``config``      the settings (``ExtendConfig``) and their checks that need no model
        ``lengths``     the lengths ``--lengths``, ``--target`` and the like take
        ``composed``    composed methods, ``FREQUENCY+REMAP`` (``yarn+string``)
        ``labels``      a model's name in tables, plots and files; the length axis
    ``study/``      the study itself
        ``run``         the command: load, plan, patch, measure, write (``run_extend``)
        ``plan``        the defaults by model kind and device, and every check against the model and the machine
        ``report``      the tables, the findings and ``report.md``
        ``plot``        ``extend.png`` and ``passkey.png``
    ``targets/``    the models, behind one interface: load, patch, perplexity, passkey, fine-tune
        ``base``        the interface (``Target``, ``PretrainedTarget``: typing Protocols) and what both targets share
        ``lab``         ``LabTarget``: a lab GPT
        ``hf``          ``HFTarget``: a transformers model (transformers folder, GGUF, ``smollm2``)
        ``load``        ``load_target``: which target a model is
        ``cost``        a forward's cost (``ModelDims``, ``forward_cost``) and its calibration from timed forwards
        ``finetune``    fine-tuning in a short window (plain, PoSE, random positions) and its training loop
    ``needles/``    the retrieval tasks
        ``passkey``     the passkey prompt, for byte-level and tokenized models
        ``ruler``       RULER through lm-evaluation-harness: task checks, documents per length, the truncation guard
        ``shared_prefix``   needles sharing their haystack (a prefix KV cache; off by default)
    ``stats/``      rates, intervals and when to stop sampling
        ``rates``       hits of n with Wilson intervals, pooled over depths; ``rates.png``
        ``confidence``  anytime-valid intervals (confidence sequences)
        ``sampling``    sample until the answer is clear: rounds per cell, stopped once decided
        ``race``        the race at the target: paired elimination, the verdict, the pick and how sure
    ``pick/``       ``--pick``
        ``rules``       ``--pick``'s rules: candidates, screening, the budget's cap, the pick (pure functions of rows)
        ``plan``        ``--pick``'s plan (``PickPlan``): candidates, the stages' settings, the cap, the estimate
        ``run``         ``--pick``'s run: three studies in one folder, the decision, the save
        ``report``      ``--pick``'s text: the plan as printed, the summary, ``pick.md``
        ``racing``      ``--pick``'s rounds: screening and the race as ``run_extend`` round policies
    ``posenc export`` is ``posenc.deploy`` (one extended model written, nothing measured: no target, no study);
    a lab model's GPT, corpus, scoring and RoPE patches are ``posenc.lab.common`` (``gpt``, ``corpus``,
    ``evaluate``, ``scaling``); transformers models are patched by ``posenc.hf``.
"""
