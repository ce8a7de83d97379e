"""CUDA paths of the trainer against their CPU / float32 references (skipped without a GPU).

Run on a GPU machine, in one command (training/ needs only torch, numpy, pyarrow; --confcutdir
keeps the data-pipeline fixtures of tests/conftest.py, which import datatrove, out):

    python -m pytest -q --confcutdir=tests/gpu tests/gpu

Tolerances are relative errors ‖x - ref‖ / ‖ref‖: bf16 operands land between 1e-3 and 1e-2 on a
whole tensor, so 3e-2 on gradients leaves room for accumulation order while still failing on a
wrong formula (those give errors of order 1); float32 references with TF32 off stay near 1e-5.
"""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from training.config import ParallelConfig  # noqa: E402
from training.loss import (  # noqa: E402
    _chunk_fn,
    _chunk_softmax_grad,
    chunked_linear_cross_entropy,
    linear_cross_entropy,
)
from training.model import ModelConfig, Transformer  # noqa: E402
from training.parallelize import autocast_context, parallelize  # noqa: E402

CUDA = torch.device("cuda")
SMALL = ModelConfig(
    dim=256,
    n_layers=4,
    n_heads=8,
    n_kv_heads=2,
    ffn_dim=704,
    vocab_size=4096,
    rope_theta=10000.0,
    max_seq_len=512,
    tie_embeddings=True,
)


@pytest.fixture(autouse=True)
def _no_tf32():
    """float32 references must be float32: TF32 matmuls would give ~1e-3 errors."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    assert torch.isfinite(x).all(), "non-finite values"
    return ((x - ref).norm() / ref.norm().clamp(min=1e-30)).item()


def tokens(cfg: ModelConfig, b: int, t: int, seed: int, documents: bool = False):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, cfg.vocab_size, (b, t + 1), generator=g)
    pos = None
    if documents:  # documents of 17..200 tokens, positions restarting at each start
        pos = torch.empty(b, t, dtype=torch.int64)
        for r in range(b):
            i = 0
            while i < t:
                n = min(int(torch.randint(17, 200, (1,), generator=g)), t - i)
                pos[r, i : i + n] = torch.arange(n)
                i += n
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous(), pos


def fresh_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg)  # float32, CPU, seeded


def loss_and_grads(model, x, y, pos, device, bf16: bool):
    model = model.to(device)
    model.zero_grad(set_to_none=True)
    pcfg = ParallelConfig(param_dtype="bfloat16" if bf16 else "float32")
    with autocast_context(pcfg, None, device.type):
        loss = model(x.to(device), labels=y.to(device), position_ids=None if pos is None else pos.to(device))
    loss.backward()
    grads = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()}
    return loss.detach().float().cpu(), grads


def assert_grads_close(grads, ref, tol):
    worst = max(((rel(grads[n], ref[n]), n) for n in ref), key=lambda t: t[0])
    assert worst[0] < tol, f"gradient of {worst[1]} off by {worst[0]:.2e} (tolerance {tol:g})"


def assert_cuda_matches_cpu(cfg, x, y, pos, loss_tol32: float, grad_tol32: float) -> torch.Tensor:
    """float32 and bf16 CUDA runs of `cfg` against the float32 CPU reference; returns its loss.
    bf16 tolerances are fixed (loss 5e-3, gradients 3e-2, see the module docstring)."""
    ref_loss, ref = loss_and_grads(fresh_model(cfg), x, y, pos, torch.device("cpu"), bf16=False)
    loss32, g32 = loss_and_grads(fresh_model(cfg), x, y, pos, CUDA, bf16=False)
    assert rel(loss32, ref_loss) < loss_tol32
    assert_grads_close(g32, ref, grad_tol32)
    loss16, g16 = loss_and_grads(fresh_model(cfg), x, y, pos, CUDA, bf16=True)
    assert rel(loss16, ref_loss) < 5e-3
    assert_grads_close(g16, ref, 3e-2)
    return ref_loss


# ------------------------------------------------------------------------------------------ model


def test_bf16_cuda_model_matches_float32_cpu():
    x, y, _ = tokens(SMALL, 4, 256, seed=1)
    assert_cuda_matches_cpu(SMALL, x, y, None, loss_tol32=1e-5, grad_tol32=1e-4)


@pytest.mark.parametrize("ac", ["none", "selective", "full"])
def test_compiled_blocks_match_eager(ac):
    x, y, _ = tokens(SMALL, 4, 256, seed=2)
    ref_loss, ref = loss_and_grads(fresh_model(SMALL), x, y, None, CUDA, bf16=True)
    model = parallelize(
        fresh_model(SMALL).to(CUDA), None, ParallelConfig(activation_checkpoint=ac, compile=True)
    )
    loss, grads = loss_and_grads(model, x, y, None, CUDA, bf16=True)
    torch._dynamo.reset()
    assert rel(loss, ref_loss) < 5e-3
    assert_grads_close(grads, ref, 3e-2)


def test_flex_document_mask_matches_dense_reference():
    cfg = SMALL.replace(document_mask=True)
    x, y, pos = tokens(cfg, 3, 384, seed=3, documents=True)
    # CPU takes the dense-mask SDPA path, CUDA the compiled FlexAttention BlockMask path.
    ref_loss = assert_cuda_matches_cpu(cfg, x, y, pos, loss_tol32=1e-4, grad_tol32=1e-3)
    # The mask matters: without it the same batch gives a different loss.
    nomask, _ = loss_and_grads(fresh_model(SMALL), x, y, None, CUDA, bf16=False)
    assert rel(nomask, ref_loss) > 1e-4


# ------------------------------------------------------------------------------------------- loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_fused_loss_matches_plain(dtype):
    g = torch.Generator().manual_seed(4)
    N, d, V = 3000, 256, 5003  # odd sizes: a short last chunk, V not a power of two
    h = (torch.randn(N, d, generator=g) * 2).to(CUDA, dtype).requires_grad_()
    w = (torch.randn(V, d, generator=g) * 0.05).to(CUDA, dtype).requires_grad_()
    y = torch.randint(0, V, (N,), generator=g).to(CUDA)
    y[::7] = -100
    plain = linear_cross_entropy(h, w, y)
    gh, gw = torch.autograd.grad(plain, (h, w))
    chunked = chunked_linear_cross_entropy(h, w, y, chunk=1024)
    ch, cw = torch.autograd.grad(chunked, (h, w))
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel(chunked, plain) < tol
    assert rel(ch, gh) < (1e-4 if dtype == torch.float32 else 2e-2)
    assert rel(cw, gw) < (1e-4 if dtype == torch.float32 else 2e-2)


def test_compiled_chunk_kernel_equals_eager():
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(512, 131072, generator=g) * 3).to(CUDA, torch.bfloat16)
    labels = torch.randint(0, 131072, (512,), generator=g).to(CUDA)
    kept = torch.rand(512, generator=g).to(CUDA) > 0.1
    scale = 1.0 / kept.sum().float()
    loss_e, g_e = _chunk_softmax_grad(logits, labels, kept, scale, True)
    loss_c, g_c = _chunk_fn(CUDA)(logits, labels, kept, scale, True)
    assert g_c.dtype == torch.bfloat16 and g_c.shape == logits.shape
    assert rel(loss_c, loss_e) < 1e-5
    assert rel(g_c, g_e) < 1e-2  # both round the same float32 values to bf16


# -------------------------------------------------------------------------------------- optimizer


def test_fused_adamw_matches_foreach():
    from training.config import OptimSection
    from training.optim import build_optimizer

    init = fresh_model(SMALL).state_dict()
    results = []
    for fused in (True, False):
        model = fresh_model(SMALL).to(CUDA)
        opt = build_optimizer(model, OptimSection(fused=fused), "cuda")
        g = torch.Generator(device="cuda").manual_seed(6)
        for _ in range(5):
            for p in model.parameters():
                p.grad = torch.randn(p.shape, device=CUDA, generator=g) * 1e-2
            opt.step()
        results.append({n: p.detach().cpu() for n, p in model.named_parameters()})
    fused_p, ref_p = results
    # Compare the updates, not the weights (which the initial values dominate).
    worst = max(rel(fused_p[n] - init[n], ref_p[n] - init[n]) for n in ref_p)
    assert worst < 1e-5


def test_adamw8bit_runs_when_installed():
    pytest.importorskip("bitsandbytes")
    from training.config import OptimSection
    from training.optim import build_optimizer

    model = fresh_model(SMALL).to(CUDA)
    opt = build_optimizer(model, OptimSection(name="adamw8bit"), "cuda")
    x, y, _ = tokens(SMALL, 2, 128, seed=7)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x.to(CUDA), labels=y.to(CUDA))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5


def test_float8_compiled_blocks_train_close_to_bf16():
    """model.float8 on an sm89+ GPU: torchao float8 block linears under per-block compile learn as
    the bf16 model does (the same batches, 30 steps: the losses within 2%), and the weights the
    optimizer holds stay plain fp32 tensors under the same names."""
    pytest.importorskip("torchao")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 matmuls need sm89+")
    from training.config import OptimSection
    from training.optim import ScheduledLR, build_optimizer
    from training.train import train_step

    x, y, _ = tokens(SMALL, 8, 256, seed=11)
    batch = [{"input_ids": x.to(CUDA), "labels": y.to(CUDA)}]
    pcfg = ParallelConfig(compile=True)
    amp = lambda: autocast_context(pcfg, None, "cuda")

    def run(float8: bool):
        cfg = SMALL.replace(float8=float8)
        model = parallelize(fresh_model(cfg).to(CUDA), None, pcfg)
        opt = build_optimizer(model, OptimSection(lr=1e-3), "cuda")
        sched = ScheduledLR(opt, lambda step: 1e-3)
        losses = [
            train_step(model, opt, sched, batch, grad_clip=1.0, amp=amp)["loss"].item() for _ in range(30)
        ]
        return losses, model.state_dict()

    plain, plain_state = run(False)
    float8, float8_state = run(True)
    torch._dynamo.reset()
    assert list(float8_state) == list(plain_state)
    assert all(type(t) is torch.Tensor and t.dtype == torch.float32 for t in float8_state.values())
    assert float8[-1] < float8[0] - 0.5  # it learns
    assert float8[-1] == pytest.approx(plain[-1], rel=0.02)


# ----------------------------------------------------------------------------- step, FSDP, trainer


def test_train_step_has_no_host_sync():
    """After warm-up, a non-logging train_step (compiled blocks, chunked loss, fused AdamW, clip)
    never synchronises the host with the GPU: torch raises on any synchronising call."""
    from training.config import OptimSection
    from training.optim import ScheduledLR, build_optimizer
    from training.run.verdict import NonFiniteGuard
    from training.train import train_step

    cfg = SMALL.replace(loss_chunk=512)
    pcfg = ParallelConfig(compile=True)
    model = parallelize(fresh_model(cfg).to(CUDA), None, pcfg)
    opt = build_optimizer(model, OptimSection(), "cuda")
    sched = ScheduledLR(opt, lambda step: 3e-4 * min(1.0, (step + 1) / 2))
    x, y, _ = tokens(cfg, 4, 256, seed=8)
    batches = [{"input_ids": x.to(CUDA), "labels": y.to(CUDA)}] * 2
    amp = lambda: autocast_context(pcfg, None, "cuda")
    for _ in range(3):
        train_step(model, opt, sched, batches, grad_clip=1.0, amp=amp)
    guard = NonFiniteGuard(CUDA)  # the non-finite check and its tally: on the device too
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = train_step(model, opt, sched, batches, grad_clip=1.0, amp=amp)
        guard.record(4, out["nonfinite"])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch._dynamo.reset()
    assert torch.isfinite(out["loss"]).item() and torch.isfinite(out["grad_norm"]).item()
    assert guard.read()["skipped"] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fsdp2_nccl_mixed_precision_matches_autocast():
    """FSDP2 over an NCCL mesh (one rank: one GPU here) with bf16 params / fp32 reduce follows the
    single-process bf16-autocast run: same losses and weights within bf16 tolerance."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from training.config import OptimSection
    from training.optim import ScheduledLR, build_optimizer
    from training.train import train_step

    x, y, _ = tokens(SMALL, 4, 256, seed=9)
    batch = [{"input_ids": x.to(CUDA), "labels": y.to(CUDA)}]

    def run(mesh):
        pcfg = ParallelConfig()
        model = parallelize(fresh_model(SMALL).to(CUDA), mesh, pcfg)
        opt = build_optimizer(model, OptimSection(lr=1e-3), "cuda", sharded=mesh is not None)
        sched = ScheduledLR(opt, lambda step: 1e-3)
        amp = lambda: autocast_context(pcfg, mesh, "cuda")
        losses = [
            train_step(model, opt, sched, batch, grad_clip=1.0, amp=amp)["loss"].item() for _ in range(4)
        ]
        state = {
            n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu()
            for n, p in model.named_parameters()
        }
        return losses, state

    ref_losses, ref_state = run(None)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0", "WORLD_SIZE": "1"}
    os.environ.update(env)
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    try:
        mesh = init_device_mesh("cuda", (1, 1), mesh_dim_names=("replicate", "shard"))
        losses, state = run(mesh)
    finally:
        dist.destroy_process_group()
        for k in env:
            os.environ.pop(k, None)
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) / abs(b) < 5e-3, (losses, ref_losses)
    init = fresh_model(SMALL).state_dict()
    assert state.keys() == ref_state.keys()
    # The two bf16 paths differ on purpose in detail (FSDP casts every parameter, norms included, to
    # bf16; autocast keeps norm weights float32), and Adam's normalised steps amplify such rounding
    # in tiny gradients: the updates agree to ~6% (measured 5.6% median, 8% worst with gloo on
    # CPU). A broken path (unsynchronised or mis-scaled gradients, wrong dtype) is off by ~100%.
    errs = sorted(rel(state[n] - init[n], ref_state[n] - init[n]) for n in ref_state)
    assert errs[len(errs) // 2] < 0.1 and errs[-1] < 0.25, errs


def test_trainer_end_to_end_on_cuda(tmp_path):
    """`training.train.train` on CUDA: meta init, compiled blocks, FlexAttention document mask,
    chunked loss, fused AdamW, pinned loader batches; the loss falls and MFU is reported."""
    from tests.helpers.train_data import make_dataset
    from training.config import TrainConfig
    from training.contract.config_loader import load_config
    from training.data.loader import dataset_loader
    from training.train import train

    data = make_dataset(tmp_path / "data", n_docs=400, vocab_size=256)
    run = tmp_path / "run"
    cfg = load_config(
        TrainConfig,
        None,
        [
            f"data.dataset={data}",
            f"run.output_dir={run}",
            "run.device=cuda",
            "model.preset=tiny",
            "model.document_mask=true",
            "model.loss_chunk=256",
            "parallel.compile=true",
            "data.seq_len=128",
            "data.global_batch_tokens=2048",
            "data.micro_batch=8",
            "schedule.steps=60",
            "schedule.warmup_steps=5",
            "optim.lr=3e-3",
            "run.log_every=20",
            "data.val_fraction=0.05",
            "run.val_every=30",
            "metrics.tensorboard=false",
        ],
    )
    summary = train(cfg)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert summary["final_loss"] < summary["first_loss"] - 1.5, summary
    assert all("mfu" in r and r["mfu"] > 0 for r in rows)
    assert rows[-1]["peak_memory_bytes"] > 0
    loader = dataset_loader(data, seq_len=128, global_batch=16, micro_batch=8, seed=0, pin_memory=True)
    mb = next(iter(loader))[0]
    assert mb["input_ids"].is_pinned()


# ------------------------------------------------------------------------------------ checkpoints


def three_async_saves(tmp_path, device: torch.device, mesh=None) -> None:
    """Train SMALL on `device` (FSDP2 over `mesh` if given) and save asynchronously after steps 1, 2
    and 3, each save followed at once by the next step, which changes the weights and AdamW moments
    while the copy may still run; then every checkpoint must hold exactly the state of its own
    step, and the three saves must have used the same host buffers (pinned on CUDA). A function, so
    that it also runs on CPU (gloo) where it is developed."""
    from torch.distributed.tensor import DTensor

    from training.checkpoint.checkpointer import Checkpointer
    from training.checkpoint.io import load
    from training.checkpoint.staging import state_dict_of, tensor_leaves
    from training.checkpoint.state import ModelState, OptimizerState, TrainState
    from training.config import CheckpointSection, OptimSection
    from training.contract.run_layout import checkpoint_dir
    from training.optim import build_optimizer

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    pcfg = ParallelConfig()
    model = parallelize(fresh_model(SMALL).to(device), mesh, pcfg)
    opt = build_optimizer(model, OptimSection(lr=1e-2), device.type, sharded=mesh is not None)
    states = {
        "model": ModelState(model),
        "optimizer": OptimizerState(model, opt),
        "train_state": TrainState(),
    }
    cfg = CheckpointSection(interval=1, async_=True, keep_last=0)
    ckpt = Checkpointer(cfg, tmp_path, states, rank=0, world_size=1, last_step=3, config_sha256="gpu",
                        estimate_bytes=0)  # fmt: skip
    x, y, _ = tokens(SMALL, 4, 128, seed=10)
    expected, buffers = {}, []
    for step in (1, 2, 3):
        opt.zero_grad(set_to_none=True)
        with autocast_context(pcfg, mesh, device.type):
            loss = model(x.to(device), labels=y.to(device))
        loss.backward()
        opt.step()
        expected[step] = {p: local(t).detach().cpu().clone() for p, t in tensor_leaves(state_dict_of(states))}
        ckpt.save(step, 0)
        buffers.append(
            {p: (local(b).data_ptr(), local(b).is_pinned()) for p, b in ckpt.staging.buffers.items()}
        )
    ckpt.close()
    assert buffers[0] == buffers[1] == buffers[2]  # one set of host buffers for the run
    assert all(pinned == (device.type == "cuda") for _, pinned in buffers[0].values())
    for step, want in expected.items():
        target = state_dict_of(states)
        for path, t in tensor_leaves(target):  # load into plain host tensors of the saved shapes
            parent = target
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = torch.zeros(t.shape, dtype=t.dtype)
        load(target, checkpoint_dir(tmp_path, step), no_dist=True)  # into plain host tensors
        got = dict(tensor_leaves(target))
        assert got.keys() == want.keys()
        for path, value in want.items():
            assert torch.equal(got[path], value), (step, path)


def test_pinned_staging_second_and_third_async_saves_round_trip_bit_identically(tmp_path):
    """The failure mode seen on torch 2.11 (DCP's reused pinned stager raised at the second save)
    and the overlap of the pinned copy with the next step, against the state at each save."""
    three_async_saves(tmp_path, CUDA)


def test_pinned_staging_of_fsdp2_dtensors_over_nccl(tmp_path):
    """The same with FSDP2 over an NCCL mesh (one rank: one GPU here): the shards are DTensors on
    a CUDA mesh, staged into host DTensors; the async write goes through its own gloo group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0", "WORLD_SIZE": "1"}
    os.environ.update(env)
    dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    try:
        three_async_saves(
            tmp_path, CUDA, init_device_mesh("cuda", (1, 1), mesh_dim_names=("replicate", "shard"))
        )
    finally:
        dist.destroy_process_group()
        for k in env:
            os.environ.pop(k, None)
