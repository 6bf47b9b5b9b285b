"""The retrieval tasks a study measures, needles in a haystack: the passkey (``passkey``), RULER through
lm-evaluation-harness (``ruler``), and the KV cache of a haystack shared by its needles (``shared_prefix``)."""
