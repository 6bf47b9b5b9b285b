"""Statistics of measured needles: rates with intervals (``rates``, ``confidence``: anytime-valid ones), a study's
rule for when a cell has enough samples (``sampling``), and the pick's race between models (``race``)."""
