"""Checking what the pipeline and the trainer made: the dataset validator, the audit, the evals.

- validate.py       `gristmill data validate`: every shard re-read against the dataset contract
- audit.py          `gristmill data audit`: SQL over a dataset's manifest, exclusions, stats (duckdb)
- audit_views.py    the audit's duckdb views over one or more dataset directories
- audit_reports.py  the audit's preset reports and plots, plain SQL over those views
- verify_run.py     `gristmill verify`: a run's checkpoints and exports against their checksums
- eval.py           `gristmill eval`: lm-evaluation-harness on a run's HF exports
- eval_model.py     the lm-eval model classes: one separator before every text
- eval_data.py      the eval tasks: the local ones shipped in eval_tasks/, their data, hub availability
- eval_output.py    lm-eval's, transformers' and datasets' own output to a log file
- eval_results.py   results.json and eval.parquet on disk, the decontamination marks, eval.png
- train_eval.py     eval during training (`[eval] interval = N`)
"""

# First, before torch registers its atexit callbacks (`python -m validation.train_eval`, a torchrun
# worker): see training/__init__.py.
from training.contract import errors as _errors  # noqa: E402, F401
