"""Text to token ids, below pipelines/ (its tokenize-and-shard step stands on this package).

- separator.py     the separator contract: `DocumentEncoder`, the one place documents become token ids
- tokenizer_io.py  loading a tokenizer (tokenizer.json or a hub name) and training a byte-level BPE
"""
