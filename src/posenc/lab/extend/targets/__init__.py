"""The models a study measures, behind one interface (``base.Target``, a typing Protocol): ``lab.LabTarget`` (a
byte-level lab GPT) and ``hf.HFTarget`` (a transformers causal LM); ``load.load_target`` picks one for a model, and
``cost`` and ``finetune`` are a forward's cost model and the fine-tuning loop."""
