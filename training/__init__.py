"""The trainer: a Llama-3-style model trained on the data plan with FSDP2, checkpointed and checked.
It imports only torch, numpy, pyarrow and the standard library (tests/test_layering.py).

- train.py          `python -m training.train`: setup / train_step / the loop (the step's order)
- launch.py         `gristmill train`: in this process or through torchrun, the config checked first
- config.py         the recipe's schema: `TrainConfig`, one documented field each
- config_checks.py  each section's checks that need only the config ([model], [parallel], [optim], …)
- model.py          the Llama-3 transformer, its presets and FLOPs per token
- loss.py           cross-entropy of the LM head, chunked
- optim.py          AdamW (and 8-bit), the plan's LR schedule, gradient clipping
- muon.py           Muon for the blocks' matrices, AdamW for the rest
- merge.py          weights averaged in the loop ([merge]): a window's mean or an EMA, checkpointed
- parallelize.py    activation checkpointing, torch.compile, FSDP2 / HSDP, float8
- metrics.py        MFU, the update ratio, metrics rows, metrics.jsonl and loss.png, the summary
- trackers.py       tensorboard, Weights & Biases, trackio
- plotting.py       matplotlib for the PNGs gristmill writes
- console.py        the run's one printer: rank 0's lines, safe against a reader that goes away
- run/              the run's own machinery: setup, the step's verdict, the timeline, rewind, …
- checkpoint/       DCP checkpoints, the train state, HF import and export
- data/             the dataset reader, sample order, the data plan, the loader
- mix/              `gristmill mix propose`: a mixture chosen from proxy training runs, gated
- contract/         what every package shares: errors, config loading, the formats, the run layout
"""

# First, before torch and multiprocessing register theirs: errors.py's atexit callback then runs after
# every other, so the decided exit's handler covers them all (a SIGTERM there is a note and the status
# decided) and only the interpreter's finalization, where no handler runs, has SIGTERM ignored.
from training.contract import errors as _errors  # noqa: E402, F401
