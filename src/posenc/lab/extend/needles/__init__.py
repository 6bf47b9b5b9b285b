"""The retrieval tasks a study measures, needles in a haystack: the passkey (``passkey``), many keys in one document
scored in one forward (``keys``), RULER through lm-evaluation-harness (``ruler``), and the KV cache of a haystack
shared by its needles (``shared_prefix``)."""
