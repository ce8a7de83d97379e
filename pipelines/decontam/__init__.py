"""Decontamination: training documents that quote an evaluation task's documents are dropped.

- ngram.py   the index's files (ngrams.npy, refs.npy, manifest.json), the text normaliser, n-gram
             hashing and lookup (`NgramIndex`); numpy only, so build workers never import lm-eval
- index.py   `gristmill data decontam-index`: the index built from lm-eval tasks (lm-eval imported
             inside its functions only), and the build driver's steps that stage the index before
             any task and install it into OUTPUT/decontam/
- filter.py  the build's `decontaminate` step (`DecontaminationFilter`) and dataset.json's
             "decontaminate" record (the documents removed per task)
"""
