"""model.float8: torchao's float8 linears as a compute-only switch.

The float8 matmuls themselves need an sm89+ GPU (tests/gpu and bench/gpu_session.sh measure them);
here, on CPU, the run is refused in one line before any work, and the conversion is checked for
what the rest of gristmill relies on: the same parameter names, dtypes and values (so checkpoints,
exports and the optimizer see the usual weights), only the blocks' linears converted, and a model
that still trains (torchao emulates the float8 matmul on CPU).
"""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from tests.helpers.models import tiny_model
from tests.helpers.train_data import make_dataset
from tests.helpers.train_runs import TINY
from training.config import OptimSection, ParallelConfig
from training.optim import ScheduledLR, build_optimizer
from training.parallelize import convert_to_float8, float8_or_refuse, parallelize
from training.train import main, train_step


def test_a_float8_run_on_cpu_is_one_line_before_any_work(tmp_path, capsys):
    dataset = make_dataset(tmp_path / "data", n_docs=50)
    run_dir = tmp_path / "run"
    sets = [f"data.dataset={json.dumps(str(dataset))}", f"run.output_dir={json.dumps(str(run_dir))}"]
    assert main(["--config", TINY, "--set", *sets, "model.float8=true"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: model.float8 = true needs a CUDA GPU with float8 tensor cores (sm89+: Ada, Hopper, "
        "Blackwell); this run is on cpu: set model.float8 = false"
    )
    assert not run_dir.exists()  # refused before the run directory was touched
    with pytest.raises(Exception, match="set model.float8 = false"):
        float8_or_refuse(torch.device("cpu"))


def test_conversion_keeps_the_weights_and_converts_only_the_block_linears():
    from torchao.float8.float8_linear import Float8Linear  # here: 1.1 s to import, one test

    plain = tiny_model(dim=64, ffn_dim=192)
    model = tiny_model(dim=64, ffn_dim=192)
    convert_to_float8(model, sharded=False)
    before, after = plain.state_dict(), model.state_dict()
    assert list(before) == list(after)  # checkpoints and the HF export keep their keys
    for name, tensor in after.items():
        assert type(tensor) is torch.Tensor and tensor.dtype == before[name].dtype, name
        assert torch.equal(tensor, before[name]), name
    converted = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
    linears = {n for n, m in plain.named_modules() if isinstance(m, torch.nn.Linear)}
    assert converted == {n for n in linears if n.startswith("layers.")} and converted
    assert "output" in linears and "output" not in converted  # the LM head stays in the compute dtype
    through_parallelize = parallelize(tiny_model(dim=64, ffn_dim=192, float8=True), None, ParallelConfig())
    assert {n for n, m in through_parallelize.named_modules() if isinstance(m, Float8Linear)} == converted


def test_a_float8_model_trains_close_to_the_plain_one():
    """Three optimizer steps on the same batch: float8 rounding moves the loss a little, never far."""
    torch.manual_seed(1)
    x = torch.randint(0, 64, (4, 33))
    batch = [{"input_ids": x[:, :-1], "labels": x[:, 1:]}]

    def losses(float8: bool) -> list[float]:
        model = tiny_model(dim=64, ffn_dim=192)
        if float8:
            convert_to_float8(model, sharded=False)
        opt = build_optimizer(model, OptimSection(lr=3e-3), "cpu")
        sched = ScheduledLR(opt, lambda step: 3e-3)
        steps = [
            train_step(model, opt, sched, batch, grad_clip=1.0, amp=contextlib.nullcontext) for _ in range(3)
        ]
        return [float(out["loss"]) for out in steps]

    plain, float8 = losses(False), losses(True)
    assert all(torch.isfinite(torch.tensor(float8)))
    assert float8 == pytest.approx(plain, rel=0.02)
