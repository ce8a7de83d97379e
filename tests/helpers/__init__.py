"""What tests share, in modules named for what they hold (test modules import these, never each other):

build_runs              runs of the data build: run_build, build_argv, one_error, assert_same_dataset
corpus                  the shared fixture corpus: texts, separator constants, tokenizer, build recipe
dist_parallelize_check  torchrun script: FSDP2 / HSDP parity with one process (test_parallelize runs it)
dup_corpus              the dedup tests' corpus of planted duplicates and its build recipe
forked                  `python -m MODULE` as a process forked from a server that imported torch, the trainer
forked_workers          the forked commands' torchrun workers, forked too (a second server; PYTHON_EXEC stub)
forkserver_trainer      `python -m training.train` with the forkserver start method set first (forkable)
fsize_limited           `python -m MODULE` under a file-size limit (`ulimit -f`), set in the process: forkable
frozen_preload          imported last by forked's server: its preloaded objects, out of the collector's walks
hub_server              a local stand-in for the Hugging Face hub's HTTP API
legacy_dataset          datasets in the shard layouts before /3 (/1, /2), for data convert's tests
light_trainer           torchrun workers without torch: what the launcher sees of exits, messages, signals
lock_holder             a lock held by another process (a running build's or conversion's .build.lock)
models                  small seeded models for tests that need real parameters but no run
mounts                  private mount namespaces (unshare -rm): sh quoting; `python -m MODULE` in one, forked
parquet_damage          a bit flipped inside a data page of a parquet file (not its footer)
no_dac                  `python -m MODULE` (or -c CODE) bound by file modes, as root too: forkable
no_accelerate           an entry point's main where accelerate cannot be imported (without the eval extra)
phased_recipe           a two-source, two-phase training recipe written for a test's datasets
pid_namespace           `python SCRIPT` as pid 1 of a pid namespace of its own (unshare --pid), forked
position_corpus         the loader tests' token-position corpus (token = 1 + doc·1000 + position)
preload_probe           a datatrove step saying which process imported its module (forkserver preload)
s3_server               moto's S3 server on loopback with a boto3 client, and the seeded fault-injecting proxy
signal_reentry          a second SIGTERM at each line of a first one's handling, and of a wait for data
shared                  artifacts built once per run under a file lock (datasets, reference runs), unchanged
small_blocks_cli        the CLI with small epoch groups, for a command in a process of its own (a namespace)
small_blocks_train      torchrun workers of training.train with small epoch groups, planning a step ahead
stop_release            a rank of a two-rank job with the c10d store in rank 0: a stop posted, heard, released
stop_stall              a rank whose c10d store (a server of its own) stops answering across its loop's end
tiers                   the two tiers (pytest.mark.process); modules kept on one worker (xdist_group)
train_data              a small learnable synthetic dataset for trainer tests
train_runs              runs of the tiny training recipe: overrides, metrics, waiting, comparing weights
worker_probe            torchrun script: what a worker sees of its start, then an exit, a death or signals
worker_stub             torchrun's PYTHON_EXEC in forked commands: asks forked_workers' server for the worker
"""
