"""A tiny phased mixture recipe (TOML text) over synthetic sources, for the plan and trainer tests."""

from __future__ import annotations

import json
from pathlib import Path

GBT = 512  # tokens per step: 16 × 32, then 8 × 64

# 512 tokens per step (16 × 32), then 1,024 (32 × 32: 2×), then 768 at seq 64 (12 × 64: 0.75× that)
BATCH_SCHEDULE = """
[[phase]]
name = "small"
steps = 4
seq_len = 32
mix = { web = 0.6, code = 0.3, math = 0.1 }
lr = { warmup_steps = 2, shape = "constant" }

[[phase]]
name = "big"
steps = 3
global_batch_tokens = 1024
seq_len = 32
mix = { web = 0.6, code = 0.3, math = 0.1 }
lr = { shape = "constant" }

[[phase]]
name = "long"
tokens = 3500
global_batch_tokens = 768
seq_len = 64
micro_batch = 2
mix = { web = 0.4, code = 0.4, math = 0.2 }
lr = { shape = "linear", to = 3e-4 }
"""


def recipe_toml(sources: dict[str, Path], run_dir: Path, *, phases: str = "", extra: str = "") -> str:
    """A 3-source (or fewer), 2-phase tiny recipe: 6 steps at seq 32, then 5 at seq 64."""
    src = "".join(
        f'[[data.sources]]\nname = "{n}"\ndataset = {json.dumps(str(p))}\n\n' for n, p in sources.items()
    )
    names = list(sources)
    mix1 = ", ".join(f"{n} = {w}" for n, w in zip(names, (0.6, 0.3, 0.1)))
    mix2 = ", ".join(f"{n} = {w}" for n, w in zip(names, (0.2, 0.4, 0.4)))
    phases = phases or (
        f'[[phase]]\nname = "main"\nsteps = 6\nseq_len = 32\nmix = {{ {mix1} }}\n'
        'lr = { warmup_steps = 2, shape = "constant" }\n\n'
        f'[[phase]]\nname = "long"\nsteps = 5\nseq_len = 64\nmix = {{ {mix2} }}\n'
        'lr = { shape = "linear", to = 3e-4 }\n\n'
    )
    return f"""
[model]
preset = "tiny"
[data]
global_batch_tokens = {GBT}
micro_batch = 4
val_fraction = 0.1
seed = 7
{src}{phases}
[optim]
lr = 3e-3
min_lr = 3e-4
[parallel]
param_dtype = "float32"
[run]
output_dir = {json.dumps(str(run_dir))}
log_every = 1
val_every = 6
val_batches = 1
threads = 1
device = "cpu"
[metrics]
tensorboard = false
{extra}
"""


def write_recipe(path: Path, *args, **kw) -> Path:
    path.write_text(recipe_toml(*args, **kw))
    return path
