"""Small models for tests that need real parameters but no training run."""

from __future__ import annotations

import torch

from training.model import PRESETS, Transformer


def tiny_model(**changes) -> Transformer:
    """The tiny preset with a 64-token vocabulary (and `changes`), seeded, its weights initialised."""
    torch.manual_seed(0)
    model = Transformer(PRESETS["tiny"].replace(vocab_size=64, **changes))
    model.init_weights()
    return model
