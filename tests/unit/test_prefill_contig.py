"""The contiguous causal prefill kernel (kernels/prefill_contig.py) against a per-request causal SDPA reference with
GQA: varlen batches with requests of 0, 1 and tile-crossing lengths, head dims 64 and 128, GQA ratios 1 and 3, tiles
smaller than the requests, K / V as slices of one fused qkv tensor (strided rows). CPU under the interpreter (fp32
dots), bf16 on the GPU."""

import pytest
import torch
import torch.nn.functional as F

from attnlab.kernels.prefill_contig import prefill_contig, tiles

CUDA = torch.cuda.is_available()


def reference(q, k, v, q_lens, scale):
    out, start = torch.zeros_like(q, dtype=torch.float32), 0
    group = q.shape[1] // k.shape[1]
    for n in q_lens:
        if n:
            qq, kk, vv = (t[start:start + n].float().transpose(0, 1) for t in (q, k, v))
            kk, vv = kk.repeat_interleave(group, 0), vv.repeat_interleave(group, 0)
            out[start:start + n] = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True,
                                                                  scale=scale).transpose(0, 1)
        start += n
    return out


@pytest.mark.parametrize("device,dtype", [("cpu", torch.float32), pytest.param("cuda", torch.bfloat16, marks=[
    pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")])])
@pytest.mark.parametrize("head_dim,hkv,group", [(64, 2, 3), (128, 1, 1)])
@pytest.mark.parametrize("q_lens,block_m,block_n", [([37, 0, 1, 16], 16, 16), ([5, 50], 32, 16)])
def test_matches_causal_reference(device, dtype, head_dim, hkv, group, q_lens, block_m, block_n):
    g = torch.Generator().manual_seed(sum(q_lens) + head_dim)
    T, hq = sum(q_lens), hkv * group
    if device == "cuda":  # the GPU's tiles: the launch the bench sweeps
        block_m, block_n = 128, 64
    qkv = torch.randn(T, hq + 2 * hkv, head_dim, generator=g).to(device, dtype)  # one fused projection output
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    req, q0 = (torch.tensor(x, dtype=torch.int32, device=device) for x in tiles(q_lens, block_m))
    scale = head_dim ** -0.5
    out = prefill_contig(q, k, v, cu, req, q0, scale=scale, block_m=block_m, block_n=block_n)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-4
    torch.testing.assert_close(out.float(), reference(q, k, v, q_lens, scale), atol=tol, rtol=tol)


def test_tiles_heaviest_first_and_complete():
    req, q0 = tiles([70, 0, 20, 129], 32)
    assert sorted(zip(req, q0)) == [(0, 0), (0, 32), (0, 64), (2, 0), (3, 0), (3, 32), (3, 64), (3, 96), (3, 128)]
    work = [min(s + 32, [70, 0, 20, 129][r]) for r, s in zip(req, q0)]
    assert work == sorted(work, reverse=True)


def test_bad_layouts_say_what_is_wrong():
    q = torch.zeros(4, 3, 48)
    with pytest.raises(ValueError, match="head_dim 48"):
        prefill_contig(q, q[:, :1], q[:, :1], torch.tensor([0, 4], dtype=torch.int32),
                       torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), scale=1.0)
    q = torch.zeros(4, 2, 64).transpose(0, 1)  # heads outermost: a token's row is not contiguous
    with pytest.raises(ValueError, match="contiguous"):
        prefill_contig(q, q[:, :1], q[:, :1], torch.tensor([0, 2], dtype=torch.int32),
                       torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), scale=1.0)
