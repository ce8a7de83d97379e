"""The data pipeline: source documents → filtered, deduplicated, decontaminated → token shards
(datatrove steps), and the `gristmill` command line.

- cli.py                the `gristmill` entry point (pyproject's console script): the command table
                        `COMMANDS`, which names each subcommand's module by string
- demo.py               `gristmill demo`: the whole system offline on the demo corpus, build → validate
                        → audit → train → export → eval
- demo_corpus.py        the embedded demo corpora: prose and code every Python installation carries
- config.py             the data build recipe (configs/data/*.toml) as dataclasses; the build identity
- build.py              `gristmill data build`: prepare → pipeline → run → finalize (then validation)
- build_identity.py     what a build records in its output and what a rerun checks against it
- build_logs.py         datatrove's logs under OUTPUT/logs/ instead of the terminal
- progress.py           per-task progress files, summed by the driver
- sources.py            the document sources as datatrove readers (FineWeb-Edu on the hub, parquet, jsonl)
- download.py           `gristmill data download`: pre-fetch a FineWeb-Edu subset for offline nodes
- filters.py            the recipe's filters as datatrove steps; every drop recorded in OUTPUT/excluded/
- dedup.py              `[dedup]`: deduplication across the whole build, stages before the build's pass
- decontam/             `[decontaminate]`: the eval-task n-gram index and the filter (its own index)
- tokenize_shard.py     the tokenize-and-shard step: kept documents → token ids → shuffled tars
- shard_writer.py       the only writer of the dataset contract: tar shards, manifest rows, dataset.json
- data_index.py         `gristmill data index`: the loader index of a dataset built without one
- dataset_lock.py       one writer of a dataset directory at a time (a build, `data index`)
- convert.py            `gristmill data convert`: a legacy-layout dataset rewritten in the current one
- upload.py             `gristmill data upload` and an s3:// build's last step: every file checked by
                        sha256, one PUT each, dataset.json last
- task_upload.py        an s3:// build's tasks upload their own output, each committed by a record in
                        the bucket; the driver's check of every object against the records
- local_s3.py           moto's S3 server on loopback, for the demo's bucket stage, the bench and tests
- tokenizer_train.py    `gristmill tokenizer train`: a byte-level BPE on a sample of the source
- synthetic_dataset.py  a dataset of given token sequences, through the build's own writer (tests, bench)
- local_executor.py     datatrove's local executor, watched: a dead worker stops the stage
- slurm_executor.py     `build.executor = "slurm"`: an array job for the tasks, a dependent finalize job
- ray_executor.py       `build.executor = "ray"`: the tasks on a Ray cluster
- faults.py             faults tests inject into a real build through the environment (tests only)
"""
