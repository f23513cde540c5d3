"""The decode's early first tile (attnlab.kernels.decode, EARLY_TILE) on any machine: its reads before the PDL wait
and its first tile's K / V from them act only with PDL on a Hopper GPU, so here they are forced on a launch without
PDL (no wait, no L2 prefetch; the Triton interpreter without a GPU). The kernel then runs the same path after the
"wait" as on the GPU, with every early value equal to its re-read: the output must be the same bits as without the
early tile, over empty splits, padding requests (one at the batch's end, whose page range ends the page table), page
sizes 1 / 3 / 16 / 128 (per-token gathers and whole-tile pages), GQA 1 / 3 / 4, head dims 64 / 128, the merge launch
and the fused merge. The race that makes a re-read differ is a GPU test (test_gpu_decode_prefetch.py)."""

import pytest
import torch

from attnlab.backends.registry import require_available
from attnlab.kernels import decode
from tests.backends.cases import make_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TritonBackend = require_available("triton")


def _outputs(case, early: bool, fused: bool, monkeypatch, num_splits: int = 8, preload: int = 0) -> torch.Tensor:
    be = TritonBackend(case.pool, case.num_q_heads, case.num_kv_heads, case.head_dim, case.scale, case.q.dtype,
                       decode_tiles="16x4x1", fused_merge=fused)
    be.num_splits = num_splits  # 8: 16-token splits of one 16-token tile at these lengths, several of them empty
    be.plan(case.meta)
    assert be.active_plan.params.num_stages == 1 and be.active_plan.params.block_n == 16
    forced = []

    def early_launch(q, k, params):
        forced.append(params)
        return params.num_stages, {"PREFETCH": 4, "LINE": 32, "EARLY_TILE": True, "PRELOAD": preload}

    with monkeypatch.context() as m:
        if early:
            m.setattr(decode, "early_launch", early_launch)
        out = torch.stack([be.run(case.q, layer) for layer in range(case.pool.num_layers)])
    assert len(forced) == (case.pool.num_layers if early else 0)  # the early launch ran, once a layer
    return out


@pytest.mark.parametrize("preload", [0, 1, 2], ids=["after-wait", "preload-k", "preload-kv"])
@pytest.mark.parametrize("fused", [False, True], ids=["merge-launch", "fused"])
@pytest.mark.parametrize("page_size,gqa,head_dim", [(1, 3, 64), (3, 4, 64), (16, 1, 128), (128, 3, 64)])
def test_early_first_tile_changes_no_bit(page_size, gqa, head_dim, fused, preload, monkeypatch):
    """``preload``: the tile's K (1) or K and V (2) rows before the "wait" but the current token's, that row after it
    (PRELOAD). With 16-token splits that row is the fifth split's sixth at 70 tokens, the third split's first at 33
    and the first split's only at 1: each in its split's first tile, as every early tile is."""
    case = make_case(kv_lens=[70, 0, 33, 1, 0], q_lens=[1, 0, 1, 1, 0], page_size=page_size, num_kv_heads=2, gqa=gqa,
                     head_dim=head_dim, dtype=torch.float32, device=DEVICE, seed=page_size + gqa, spare_pages=0)
    ref = _outputs(case, False, fused, monkeypatch)
    out = _outputs(case, True, fused, monkeypatch, preload=preload)
    assert torch.equal(out, ref), (out - ref).abs().max().item()
    torch.testing.assert_close(ref, case.reference(), atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("preload", [0, 1, 2], ids=["after-wait", "preload-k", "preload-kv"])
@pytest.mark.parametrize("fused", [False, True], ids=["merge-launch", "fused"])
@pytest.mark.parametrize("page_size,gqa,head_dim", [(3, 3, 64), (16, 4, 128)])
def test_early_first_tile_changes_no_bit_with_an_fp8_kv(page_size, gqa, head_dim, fused, preload, monkeypatch):
    """The same with an e4m3 KV pool (bf16 q): the early tile's loads dequantize as the loop's do. At head dim 128 its
    rows are whole L2 lines, where the early tile applies on a GPU (Llama-8B's two-tile rule's tile since the gate
    went to 128 x 128, 2026-12-07)."""
    case = make_case(kv_lens=[70, 0, 33, 1, 0], q_lens=[1, 0, 1, 1, 0], page_size=page_size, num_kv_heads=2, gqa=gqa,
                     head_dim=head_dim, dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fn, device=DEVICE,
                     seed=page_size + gqa, spare_pages=0)
    ref = _outputs(case, False, fused, monkeypatch)
    out = _outputs(case, True, fused, monkeypatch, preload=preload)
    assert torch.equal(out, ref), (out.float() - ref.float()).abs().max().item()
    torch.testing.assert_close(ref.float(), case.reference().float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("early", [False, True], ids=["loop", "early-tile"])
@pytest.mark.parametrize("page_size,gqa,head_dim", [(1, 3, 64), (16, 4, 128)])
def test_v_first_changes_no_bit(page_size, gqa, head_dim, early, monkeypatch):
    """One-stage launches with V's load before K's (decode.set_v_first(1), the bench arm ``+vfirst1``; K first by
    default): in the split loop (paged.attend_tile's V_FIRST, several tiles a split here) and in the early first tile.
    Only the order the loads are issued in changes: the same bits as K first."""
    case = make_case(kv_lens=[70, 0, 33, 1], q_lens=[1, 0, 1, 1], page_size=page_size, num_kv_heads=2, gqa=gqa,
                     head_dim=head_dim, dtype=torch.float32, device=DEVICE, seed=page_size + gqa, spare_pages=0)
    outs = []
    for on in (0, 1):
        with decode.v_first_order(on):
            # one 16-token tile in each of 8 splits (the early tile forced), or a loop over up to three in each of 2
            outs.append(_outputs(case, early, True, monkeypatch, num_splits=8 if early else 2))
    assert decode.v_first() == 0
    assert torch.equal(outs[0], outs[1]), (outs[0] - outs[1]).abs().max().item()
    torch.testing.assert_close(outs[1], case.reference(), atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("early", [False, True], ids=["loop", "early-tile"])
@pytest.mark.parametrize("fused", [False, True], ids=["merge-launch", "fused"])
@pytest.mark.parametrize("page_size,gqa,head_dim", [(1, 3, 64), (3, 4, 64), (16, 1, 128), (128, 3, 64)])
def test_page_ahead_changes_no_bit(page_size, gqa, head_dim, fused, early, monkeypatch):
    """The split loop's page ids a tile ahead (decode.set_page_ahead(1), the bench arm ``+ahead1``; in their own tile by
    default): 2 splits of up to three 16-token tiles, looped from their first tile, or (the early tile forced) from
    their second (the page ids before the loop are the loop's first tile's, not the split's); empty splits, a padding
    request last (its page range ends the page table), per-token gathers and whole-tile pages. Only when each tile's
    page ids are loaded changes: the same bits."""
    case = make_case(kv_lens=[70, 0, 33, 1, 0], q_lens=[1, 0, 1, 1, 0], page_size=page_size, num_kv_heads=2, gqa=gqa,
                     head_dim=head_dim, dtype=torch.float32, device=DEVICE, seed=page_size + gqa, spare_pages=0)
    outs = []
    for on in (0, 1):
        with decode.page_ahead_order(on):
            outs.append(_outputs(case, early, fused, monkeypatch, num_splits=2))
    assert decode.page_ahead() == 0
    assert torch.equal(outs[0], outs[1]), (outs[0] - outs[1]).abs().max().item()
    torch.testing.assert_close(outs[1], case.reference(), atol=2e-4, rtol=2e-4)


def test_page_ahead_switch_refuses_what_is_not_0_or_1():
    for bad in (2, -1, True, 1.0, "1"):
        with pytest.raises(ValueError, match="page ids ahead"):
            decode.set_page_ahead(bad)
    assert decode.page_ahead() == 0


def test_v_first_switch_refuses_what_is_not_0_or_1():
    for bad in (2, -1, True, 1.0, "1"):
        with pytest.raises(ValueError, match="V-first order"):
            decode.set_v_first(bad)
    assert decode.v_first() == 0


@pytest.mark.parametrize("level,small,large", [(2, 2, 1), (1, 1, 1), (0, 0, 0)])
def test_the_preload_is_k_and_v_on_small_tiles_and_k_past_them(level, small, large):
    """``early_launch``'s cap, compiled for a GPU on any machine (pdl.forced_for_compile): the default (2) preloads K
    and V on early tiles of at most 128 x 64 elements (SmolLM2's 128-token tile at head dim 64, 4 warps), K only past
    that (Llama-8B's 128 x 128 tile of 8 warps, where K and V spilled); 1 caps both at K, 0 preloads nothing; a launch
    without the early tile preloads nothing."""
    from attnlab.kernels import pdl
    from attnlab.kernels.heuristics import decode_params

    def preload(head_dim: int, group: int, kv_heads: int, splits: int | None = None) -> tuple[bool, int]:
        params = decode_params(batch=1, num_kv_heads=kv_heads, group=group, head_dim=head_dim, max_kv_len=4096,
                               sms=132, num_splits=splits)
        q = torch.zeros(1, group * kv_heads, head_dim, dtype=torch.bfloat16)
        k = torch.zeros(16, kv_heads, head_dim, dtype=torch.bfloat16)
        with pdl.forced_for_compile(), decode.early_preloading(level):
            early = decode.early_launch(q, k, params)[1]
        return (params.block_n * params.block_d, early["EARLY_TILE"]), early["PRELOAD"]

    assert decode.early_preload() == decode.EARLY_PRELOAD == 2
    assert preload(64, 3, 3) == ((128 * 64, True), small)  # SmolLM2's batch 1 x 4k
    assert preload(128, 4, 8) == ((128 * 128, True), large)  # Llama-8B's
    assert preload(128, 4, 8, splits=4) == ((64 * 128, False), 0)  # splits of several tiles: no early tile
