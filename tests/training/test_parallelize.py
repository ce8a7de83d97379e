"""FSDP2 / HSDP parity against single-process training (2 gloo ranks via torchrun), config checks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.helpers import forked
from training.config import ParallelConfig
from training.config_checks import check_parallel_section
from training.contract.config_loader import ConfigError
from training.contract.errors import GristmillError
from training.parallelize import build_mesh, parallelize

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_fsdp_and_hsdp_match_single_process_training():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("GRISTMILL_SKIP_NEGATIVE_CONTROL", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests" / "helpers" / "dist_parallelize_check.py")]  # fmt: skip
    proc = forked.run(cmd, cwd=ROOT, env=env, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "ALL CHECKS PASSED" in proc.stdout, out[-6000:]
    ok_lines = [line for line in proc.stdout.splitlines() if line.startswith("OK")]
    # 5 exact fp32 cases, 1 bf16 closeness case, 2 meta-init cases, 1 negative control.
    assert len(ok_lines) == 9, proc.stdout
    assert any("negative control" in line for line in ok_lines)


def test_build_mesh_single_process_and_errors():
    assert build_mesh(ParallelConfig(), 1, "cpu") is None
    with pytest.raises(GristmillError, match="world size is 4"):
        build_mesh(ParallelConfig(replicate=2, shard=3), 4, "cpu")
    with pytest.raises(GristmillError, match="not divisible"):
        build_mesh(ParallelConfig(replicate=3), 4, "cpu")
    with pytest.raises(GristmillError, match="single process"):
        build_mesh(ParallelConfig(replicate=2), 1, "cpu")


def test_parallel_config_validation():
    """check_config's [parallel] check, in the user's keys; a ParallelConfig built in code meets it in
    mesh_shape / build_mesh and parallelize."""
    with pytest.raises(ConfigError, match="parallel.activation_checkpoint = 'some' must be none, selective"):
        check_parallel_section(ParallelConfig(activation_checkpoint="some"))
    with pytest.raises(ConfigError, match="parallel.param_dtype = 'float16' must be bfloat16 or float32"):
        check_parallel_section(ParallelConfig(param_dtype="float16"))
    with pytest.raises(ConfigError, match=r"parallel.shard = 0 must be ≥ 1 or -1 \(= world_size"):
        check_parallel_section(ParallelConfig(shard=0))
    with pytest.raises(ConfigError, match="parallel.replicate = 0 must be ≥ 1"):
        build_mesh(ParallelConfig(replicate=0), 2, "cpu")
    with pytest.raises(ConfigError, match="parallel.reduce_dtype"):
        parallelize(torch.nn.Module(), None, ParallelConfig(reduce_dtype="float16"))


def test_autocast_context_only_without_mesh():
    from training.parallelize import autocast_context

    with autocast_context(ParallelConfig(), None, "cpu"):
        assert torch.is_autocast_enabled("cpu")
    with autocast_context(ParallelConfig(param_dtype="float32"), None, "cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast_context(ParallelConfig(), object(), "cpu"):  # any mesh: FSDP does mixed precision
        assert not torch.is_autocast_enabled("cpu")


def test_meta_init_on_cpu_with_several_processes_is_one_line_before_torchrun(tmp_path, capsys):
    """DTensor's sharded random init is CUDA-only: run.init_device = "meta" on CPU gave every rank the
    same random shard (each weight copies of one block; token i and i + V/2 one embedding)."""
    import json

    from pipelines.cli import main
    from tests.helpers.train_data import make_dataset
    from tests.helpers.train_runs import TINY

    dataset = make_dataset(tmp_path / "data", n_docs=50)
    run_dir = tmp_path / "run"
    sets = [f"data.dataset={json.dumps(str(dataset))}", f"run.output_dir={json.dumps(str(run_dir))}"]
    argv = ["train", "--config", TINY, "--nproc-per-node", "2", "--set", *sets, 'run.init_device="meta"']
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith('error: run.init_device = "meta" on cpu with 2 processes would give'), err
    assert len(err.splitlines()) == 1 and not run_dir.exists()
