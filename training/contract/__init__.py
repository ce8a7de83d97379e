"""The contract every package shares: what a dataset directory and a run directory are, how configs
load, the errors every stage raises, and the checksums of the files a run trusts.

    errors         GristmillError (one line, no traceback) and its exit codes
    config_loader  dataclass configs from TOML + dotted --set overrides; unknown keys are errors
    dataset_format dataset.json, the fingerprint, shard and manifest names, the dtype rule
    dataset_index  the loader index (index/*.bin): its derivation from the manifest, writer, reader
    heldout        which rows are held out (the seed-independent hash) and heldout.bin, sorted by it
    run_layout     names inside a training run directory (checkpoints/, exports/, eval/, COMPLETE …)
    eval_table     RUN/eval/step-N/results.json read and RUN/eval.parquet built from them
    batch_record   RUN/batches.bin: each trained step's batch digest, 44 bytes a step (verify reads it)
    integrity      file checksums (CRC-32 for checkpoints, SHA-256 for exports) and their check
    atomic_write   write_atomic / atomic_path: a file is replaced whole (temporary name, fsync, rename)
    file_lock      an exclusive flock for a node's processes and a process's threads (the cache, eval)
    disk_space     free_bytes, the free-disk check (DiskFullError) and fmt_bytes, for build, download
                   and checkpoints
    separator_check the separator rule (one per document, first or last), for tokenizer, validator, loader
    lifetime       exit_with: a process the command started kills itself when that command dies;
                   signal_at_parent_death: the same for a child asking the kernel (PR_SET_PDEATHSIG)
    hub_cache      a Hugging Face hub cache file held to its blob's name (the hub's sha256 or git sha1)
    object_store   s3:// URLs and the one S3 client (boto3, imported inside its functions): one request
                   per call, retries with backoff, counted (COUNTS)
    transfer       download_twice: a download checked against its recorded sha256, fetched again when
                   it differs; two fetches that differ are the transfer's damage (DamagedInTransit)

The rule, enforced by tests/test_layering.py: standard library, numpy and pyarrow only (boto3 only
inside object_store's functions) — nothing
from torch, datatrove, duckdb, tokenizers or lm-eval, and nothing from training/ outside
contract/ — so the data pipeline, the validator and a GPU box's trainer can all stand on it.
"""
