"""Where tokens come from: corpora, tokenizers and the token store, synthetic tasks.

Text and token corpora with their fingerprints (corpus), the token store that
tokenizes a corpus once per tokenizer and shares it between cells (tokenstore),
the validation text's fixed byte spans that val_bpb scores under every tokenizer
and the round-trip check of a tokenizer (spans), and the synthetic tasks with marked answer positions (tasks). May import
``abl.contracts``, ``abl.analysis`` and ``abl.kernels``.
"""
