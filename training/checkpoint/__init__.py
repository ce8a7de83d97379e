"""Checkpoints: what a run saves, how, and how it is read back.

- checkpointer.py  `Checkpointer`: DCP saves (sync or async), COMPLETE records, retention, resume
- io.py            reading a DCP checkpoint safely; DCP failures as gristmill errors
- staging.py       the host buffers an async save copies the state into
- state.py         the `Stateful` objects a checkpoint holds (`checkpointables`), the train state
- hf_export.py     a checkpoint as a Hugging Face `LlamaForCausalLM` directory (and back into the
                   model for eval); beside the checkpoints it reads
"""
