"""The Llama-3 model: shapes and counts, HF equivalence, losses, AC, document masking, FLOPs."""

from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from training.checkpoint.hf_names import hf_name, hf_state_dict_names
from training.config import ParallelConfig
from training.loss import chunked_linear_cross_entropy, linear_cross_entropy
from training.model import (
    PRESETS,
    AttentionMask,
    Transformer,
    _repeat_kv,
    apply_rotary,
    build_block_mask,
    document_causal_mask,
    document_ids,
    flops_per_token,
    num_params,
    rope_cos_sin,
)
from training.parallelize import parallelize

TINY = PRESETS["tiny"]


def tiny_model(seed: int = 0, **changes) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(TINY.replace(**changes))


def batch(B=2, T=32, vocab=TINY.vocab_size, seed=1):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (B, T + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


# ------------------------------------------------------------------------------------ counts


def test_llama3_1b_parameter_count_on_meta():
    with torch.device("meta"):
        model = Transformer(PRESETS["llama3-1b"])
    assert num_params(model) == 1_241_581_568
    # The tied 131072 x 2048 matrix is counted once and excluded once.
    assert num_params(model, exclude_embeddings=True) == 1_241_581_568 - 131072 * 2048
    assert model.output.weight is model.tok_embeddings.weight


def test_llama3_8b_parameter_count_on_meta():
    with torch.device("meta"):
        model = Transformer(PRESETS["llama3-8b"])
    assert num_params(model) == 8_030_261_248  # Meta-Llama-3-8B
    assert num_params(model, exclude_embeddings=True) == 8_030_261_248 - 128256 * 4096  # LM head stays


@pytest.mark.parametrize("tied", [False, True])
def test_meta_init_then_materialise(tied):
    with torch.device("meta"):
        model = Transformer(TINY.replace(n_layers=4, dim=128, ffn_dim=512, tie_embeddings=tied))
    model.to_empty(device="cpu")
    # nn.Module._apply gives each module its own new tensor off the meta device; the tie must survive.
    assert (model.output.weight is model.tok_embeddings.weight) == tied
    model.init_weights()
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), name
    std = 0.02
    assert abs(model.layers["0"].attention.wq.weight.std().item() - std) < 0.002
    # Output projections are scaled by 1/sqrt(2 * n_layers) = 1/sqrt(8).
    assert abs(model.layers["3"].feed_forward.w2.weight.std().item() - std / 8**0.5) < 0.001
    assert torch.equal(model.norm.weight, torch.ones(128))
    x, y = batch(T=16)
    assert torch.isfinite(model(x, y))


def test_flops_per_token_hand_count():
    # llama3-1b at T=2048, by hand: per layer q,o = 2048*2048 each, k,v = 2048*512 each,
    # w1,w2,w3 = 2048*8192 each; LM head 131072*2048; attention 12 * L * d * T.
    per_layer = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192
    n_matmul = 16 * per_layer + 131072 * 2048
    attention = 12 * 16 * 2048 * 2048
    cfg = PRESETS["llama3-1b"]
    assert flops_per_token(cfg, 2048) == 6 * n_matmul + attention == 8_254_390_272
    assert flops_per_token(cfg, 2048, include_lm_head=False) == 6 * 16 * per_layer + attention
    # N_matmul is the parameter count minus the norms (the tied matrix counted once, as the head).
    with torch.device("meta"):
        model = Transformer(cfg)
    norms = 16 * 2 * 2048 + 2048
    assert n_matmul == num_params(model) - norms


# ------------------------------------------------------------------------------ HF equivalence


def test_rope_matches_transformers():
    tr = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = PRESETS["llama3-1b"]
    hf_cfg = tr.LlamaConfig(
        hidden_size=cfg.dim, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_seq_len,
    )  # fmt: skip
    rotary = LlamaRotaryEmbedding(config=hf_cfg)
    pos = torch.tensor([[0, 1, 2, 3, 100, 2047], [5, 0, 1, 7, 1000, 3]])
    q = torch.randn(2, cfg.n_heads, 6, cfg.head_dim)
    k = torch.randn(2, cfg.n_kv_heads, 6, cfg.head_dim)
    hf_cos, hf_sin = rotary(q, pos)
    cos, sin = rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta, q.dtype)
    torch.testing.assert_close(cos, hf_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, hf_sin, rtol=0, atol=1e-6)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, hf_cos, hf_sin)
    torch.testing.assert_close(apply_rotary(q, cos, sin), hf_q, rtol=0, atol=1e-5)
    torch.testing.assert_close(apply_rotary(k, cos, sin), hf_k, rtol=0, atol=1e-5)


def test_rope_reference_formula():
    # Rotate-half layout: dims i and i + D/2 form a pair rotated by angle pos * theta^(-2i/D).
    D, theta = 8, 10000.0
    x = torch.randn(1, 1, 3, D)
    pos = torch.tensor([[0, 1, 5]])
    cos, sin = rope_cos_sin(pos, D, theta, x.dtype)
    out = apply_rotary(x, cos, sin)
    for t, p in enumerate(pos[0].tolist()):
        for i in range(D // 2):
            a = p * theta ** (-2 * i / D)
            x1, x2 = x[0, 0, t, i].item(), x[0, 0, t, i + D // 2].item()
            c, s = torch.tensor(a, dtype=torch.float64).cos().item(), torch.tensor(a).sin().item()
            assert abs(out[0, 0, t, i].item() - (x1 * c - x2 * s)) < 1e-5
            assert abs(out[0, 0, t, i + D // 2].item() - (x2 * c + x1 * s)) < 1e-5


@pytest.mark.parametrize("tied", [False, True])
def test_logits_match_hf_llama_after_rename(tied):
    tr = pytest.importorskip("transformers")
    model = tiny_model(tie_embeddings=tied).eval()
    cfg = model.cfg
    hf = tr.LlamaForCausalLM(
        tr.LlamaConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_dim,
            num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
            num_key_value_heads=cfg.n_kv_heads, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.norm_eps,
            tie_word_embeddings=cfg.tie_embeddings, max_position_embeddings=cfg.max_seq_len,
        )
    ).eval()  # fmt: skip
    names = hf_state_dict_names(cfg)
    ours = model.state_dict()
    assert set(names) == set(ours) - ({"output.weight"} if tied else set())
    result = hf.load_state_dict({names[k]: ours[k] for k in names}, strict=False)
    assert not result.unexpected_keys
    assert set(result.missing_keys) <= ({"lm_head.weight"} if tied else set())
    if tied:
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    x, _ = batch(T=40)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(x).logits, rtol=1e-5, atol=1e-5)
    assert hf_name("layers.3._checkpoint_wrapped_module.feed_forward.w3.weight") == (
        "model.layers.3.mlp.up_proj.weight"
    )


# ------------------------------------------------------------------------------------ training


def test_tiny_model_overfits_a_fixed_batch():
    model = tiny_model()
    x, _ = batch(B=2, T=32)
    y = torch.roll(x, -1, dims=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _step in range(300):
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if loss.item() < 0.1:
            break
    assert loss.item() < 0.1


def _loss_and_grads(model, x, y, chunk, amp=contextlib.nullcontext):
    model = copy.deepcopy(model)
    model.cfg = model.cfg.replace(loss_chunk=chunk)
    with amp():
        loss = model(x, y)
    loss.backward()
    return loss.detach(), grads(model)


@pytest.mark.parametrize("tied", [False, True])
def test_chunked_loss_equals_plain_loss(tied):
    model = tiny_model(tie_embeddings=tied)
    x, y = batch(B=3, T=20)
    y = y.clone()
    y[0, :7] = -100  # ignored labels are skipped by both
    plain, g_plain = _loss_and_grads(model, x, y, 0)
    expected = torch.nn.functional.cross_entropy(model(x).reshape(-1, TINY.vocab_size), y.reshape(-1))
    torch.testing.assert_close(plain, expected.detach(), rtol=1e-6, atol=1e-6)
    for chunk in (7, 16, 60, 1000):  # 60 = B*T exactly; 7 leaves a ragged last chunk
        chunked, g_chunked = _loss_and_grads(model, x, y, chunk)
        # float32: only the summation order differs (per chunk vs at once).
        torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-6)
        for name in g_plain:
            torch.testing.assert_close(g_chunked[name], g_plain[name], rtol=1e-5, atol=1e-7, msg=name)


def test_chunked_loss_under_bf16_autocast_matches_plain():
    model = tiny_model()
    x, y = batch(B=2, T=32)

    def amp():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    plain, g_plain = _loss_and_grads(model, x, y, 0, amp)
    chunked, g_chunked = _loss_and_grads(model, x, y, 16, amp)
    # Same bf16 logits upcast to float32; the weight gradient is accumulated over chunks in float32
    # here but in bf16 by the plain path, hence bf16-level tolerance on gradients.
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-5)
    for name in g_plain:
        torch.testing.assert_close(g_chunked[name], g_plain[name], rtol=2e-2, atol=2e-4, msg=name)


def test_chunked_loss_edge_cases():
    h = torch.randn(10, 8, requires_grad=True)
    w = torch.randn(16, 8, requires_grad=True)
    labels = torch.full((10,), -100)
    assert chunked_linear_cross_entropy(h, w, labels, 4).item() == 0.0  # all ignored: 0, not nan
    assert linear_cross_entropy(h, w, labels).item() == 0.0
    labels = torch.randint(0, 16, (10,))
    with torch.no_grad():  # evaluation: value only, no gradient work
        v = chunked_linear_cross_entropy(h, w, labels, 3)
    assert not v.requires_grad
    torch.testing.assert_close(v, linear_cross_entropy(h, w, labels).detach())
    with pytest.raises(ValueError):
        chunked_linear_cross_entropy(h, w, labels, 0)


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def test_activation_checkpointing_modes_give_identical_gradients_and_recompute():
    base = tiny_model()
    x, y = batch(B=2, T=24)
    results = {}
    for mode in ("none", "selective", "full"):
        model = parallelize(copy.deepcopy(base), None, ParallelConfig(activation_checkpoint=mode))
        assert list(model.state_dict()) == list(base.state_dict())  # FQNs unchanged by AC
        loss = model(x, y)
        with _CountOps() as counter:
            loss.backward()
        results[mode] = (loss.detach(), grads(model), counter.counts)
    loss0, g0, c0 = results["none"]
    for mode in ("selective", "full"):
        loss, g, _ = results[mode]
        assert torch.equal(loss, loss0)
        for name in g0:
            assert torch.equal(g[name], g0[name]), (mode, name)
    # What runs again in backward: none recomputes nothing, selective only elementwise ops (SiLU
    # and the RMSNorm rsqrt, once per layer) but no matmul, full the whole block including matmuls.
    layers = TINY.n_layers
    assert c0.get("silu", 0) == 0 and c0.get("rsqrt", 0) == 0
    sel, full = results["selective"][2], results["full"][2]
    assert sel.get("silu", 0) == layers and full.get("silu", 0) == layers
    assert sel.get("rsqrt", 0) == 2 * layers
    assert sel.get("mm", 0) == c0.get("mm", 0)
    assert full.get("mm", 0) > c0.get("mm", 0)


# ---------------------------------------------------------------------------- document masking


def test_document_ids_and_dense_mask():
    pos = torch.tensor([[3, 4, 0, 1, 2, 0, 0, 1]])
    assert document_ids(pos).tolist() == [[0, 0, 1, 1, 1, 2, 3, 3]]
    mask = document_causal_mask(document_ids(pos))[0, 0]
    assert mask[4].tolist() == [False, False, True, True, True, False, False, False]
    assert mask[7].tolist() == [False] * 6 + [True, True]


def test_packed_documents_match_running_each_document_alone():
    model = tiny_model(document_mask=True).eval()
    d1 = torch.randint(0, TINY.vocab_size, (1, 13))
    d2 = torch.randint(0, TINY.vocab_size, (1, 19))
    packed = torch.cat([d1, d2], dim=1)
    pos = torch.cat([torch.arange(13), torch.arange(19)])[None]
    with torch.no_grad():
        logits = model(packed, position_ids=pos)
        alone1, alone2 = model(d1), model(d2)
        unmasked = tiny_model(document_mask=False).eval()(packed, position_ids=pos)
    torch.testing.assert_close(logits[:, 13:], alone2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[:, :13], alone1, rtol=1e-5, atol=1e-5)
    # Without the mask document 2 sees document 1: different logits (and position_ids are ignored).
    assert not torch.allclose(unmasked[:, 13:], alone2, atol=1e-3)
    torch.testing.assert_close(unmasked[:, :13], alone1, rtol=1e-5, atol=1e-5)


def test_flex_block_mask_matches_dense_reference():
    # The GPU path's BlockMask, run through eager FlexAttention on CPU, against the SDPA reference.
    from torch.nn.attention.flex_attention import flex_attention

    pos = torch.cat([torch.arange(5), torch.arange(40), torch.arange(19)])[None].repeat(2, 1)
    pos[1] = torch.cat([torch.arange(30), torch.arange(34)])
    doc = document_ids(pos)
    q = torch.randn(2, 4, 64, 16)
    k, v = torch.randn(2, 2, 64, 16), torch.randn(2, 2, 64, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        out = flex_attention(q, k, v, block_mask=build_block_mask(doc), enable_gqa=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, _repeat_kv(k, 2), _repeat_kv(v, 2), attn_mask=document_causal_mask(doc)
    )
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert AttentionMask("causal").kind == "causal"
