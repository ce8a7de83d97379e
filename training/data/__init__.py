"""The data side of training: from a dataset directory to this rank's micro-batches.

- reader.py   one split of a dataset directory opened and checked (`DocumentTable`); tokens read at
              the index's byte offsets
- order.py    the sample order of one source's epoch (`EpochOrder`): a pure function of the
              document lengths, the seed and the epoch
- cache.py    tables every rank derives identically, computed once per node and memory-mapped
- plan.py     the data plan (`Plan`: sources, phases, mix, LR pieces): which windows each global
              step takes; its resume rules
- spec.py     the recipe resolved once (`RunSpec`: sources, phases, seq_lens, cache), each phase's
              batch shape, every check before any work (`check_config`); what config.toml records
- recipe.py   the plan of a train config: sources opened, the plan built, printed, plotted, and
              consumption.parquet
- loader.py   `TokenLoader`: the plan's steps read and cut into this rank's micro-batches
- remote.py   a dataset in an s3:// bucket read through its copy in the cache: dataset.json fetched at
              each open, every other file on need, each checked by sha256 before it gets its name
- block_cache.py  a bucket's dataset read by range: the loader's blocks fetched in the plan's order
              (`Prefetcher`) into the node's bounded, shared cache, every document checked by sha256
              when fetched and by xxh3 whenever it is read
- open_maps.py  the memory maps a process's readers keep (an epoch group's files), within one budget
              under the open-file limit, raised to the hard one
- inspect.py  `gristmill data inspect`: what the model saw at a step, rebuilt from the config
"""
