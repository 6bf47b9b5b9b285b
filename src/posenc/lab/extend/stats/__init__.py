"""Statistics of measured needles: rates with intervals (``rates``, ``confidence``: anytime-valid ones), a study's
rule for when a cell has enough samples (``sampling``), the deciding pick's race on documents of keys (``paired``:
clustered paired intervals at planned looks and the verdict) and the race of folders made before it (``race``)."""
