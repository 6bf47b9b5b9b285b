"""What a ``posenc extend`` study is told, below everything that measures: its settings (``config``), the lengths they
take (``lengths``), composed method names (``composed``) and a model's label (``labels``)."""
