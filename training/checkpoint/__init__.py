"""Checkpoints: what a run saves, how, and how it is read back.

- checkpointer.py  `Checkpointer`: DCP saves (sync or async), COMPLETE records, retention, resume
- io.py            reading a DCP checkpoint safely; DCP failures as gristmill errors
- record.py        a checkpoint's COMPLETE record read back, and the model it holds (no DCP import)
- staging.py       the host buffers an async save copies the state into
- state.py         the `Stateful` objects a checkpoint holds (`checkpointables`), the train state
- hf_export.py     a checkpoint as a Hugging Face `LlamaForCausalLM` directory (and back into the
                   model for eval); beside the checkpoints it reads
- export_advice.py how to write an export again, in a refusal's words (export_fix: moved aside, never
                   deleted)
- hf_import.py     a Hugging Face Llama as a run's start (`[model] init_from`): its shape, its weights
- hf_names.py      the gristmill ↔ Hugging Face tensor names and safetensors dtype codes
- model_config.py  the model a run builds: preset, [model] overrides, a base's shape, the vocabulary
- base_source.py   where init_from's files are: a directory, or a hub id pinned to its commit
- base_record.py   RUN/base/: the base a run started from (identity, weights' sha256, small files)
"""
