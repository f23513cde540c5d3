"""The head unrolled over draft steps as it runs at inference ("training-time test", EAGLE-3), and its loss.

Entries: over a sequence x_0 .. x_{S-1}, entry p (p = 0 .. S-2, RoPE position p) reads token x_{p+1} and
predicts x_{p+2}, whose target distribution is the target's softmax at position p + 1.

- Step 0 reads the target's features g_p (fused by fc): the head's real entries, as prefill and draft-extend
  make them. Its queries see the step-0 keys at positions <= p (causal).
- Step j > 0 reads the head's own step j - 1 output at entry p - 1 (the feature a draft step gets). A query
  of step j at entry p sees what the same query sees at inference, where step j runs at position p after
  j - 1 earlier draft steps: the real entries at positions <= p - j, and the step-i entry at position
  p - j + i for i = 1 .. j (each earlier step's own key and value, one per step: a diagonal).

The loss of step j is the forward KL from the target distribution (cross-entropy against the soft target;
the entropy term is constant), over entries whose predicted token is an answer token and that have j
predecessors, weighted step_decay ** j.

Three implementations of the step-j attention compute the same thing (``ATTENTION``, ``train.attention``):
``ttt_attention`` (the reference: the [B, Hkv, g, L, L] fp32 scores, kept for backward),
``ttt_attention_masked`` (the default: one masked SDPA call over every step's keys) and ``ttt_attention_sdpa``
(``sink``: L + j keys per query through an exact sink merge; the H200 run that used it lost its gradients to
NaN at step 55, in backward only, most likely in cuDNN's attention backward (loop.sdpa_policy now keeps SDPA
off cuDNN), so it is no longer the default). The loss (loss.py) is computed in row chunks from the target's
p W, made once per batch; reference.py keeps the original per-step loss for the tests and the microbench.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnlab.models import rope


def _shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """x [B, L, ...] -> y with y[:, p] = x[:, p - n] (zeros for p < n)."""
    if n == 0:
        return x
    if n >= x.shape[1]:  # a sequence shorter than the shift (short batches, late steps)
        return torch.zeros_like(x)
    return torch.cat([x.new_zeros(x.shape[0], n, *x.shape[2:]), x[:, :-n]], dim=1)


def ttt_attention(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], scale: float) -> torch.Tensor:
    """Step j = len(ks) - 1. q [B, L, Hq, D]; ks, vs: per step [B, L, Hkv, D] -> [B, L, Hq, D]."""
    j = len(ks) - 1
    B, L, Hq, D = q.shape
    Hkv = ks[0].shape[2]
    g = Hq // Hkv
    qg = q.view(B, L, Hkv, g, D)
    s0 = torch.einsum("bphgd,bkhd->bhgpk", qg, ks[0]).float() * scale  # [B, Hkv, g, L, L]
    pos = torch.arange(L, device=q.device)
    s0 = s0.masked_fill(~(pos[None, :] <= pos[:, None] - j), float("-inf"))
    diag_k = [_shift(ks[i], j - i) for i in range(1, j + 1)]
    diag_v = [_shift(vs[i], j - i) for i in range(1, j + 1)]
    if diag_k:
        sd = torch.stack([torch.einsum("bphgd,bphd->bhgp", qg, k).float() for k in diag_k], dim=-1) * scale
        valid = torch.stack([pos >= j - i for i in range(1, j + 1)], dim=-1)  # [L, j]: the key exists
        sd = sd.masked_fill(~valid, float("-inf"))
        scores = torch.cat([s0, sd], dim=-1)
    else:
        scores = s0
    # every row sees at least its own step's key (the last diagonal, shift 0), or for step 0 itself
    w = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhgpk,bkhd->bphgd", w[..., :L].to(vs[0].dtype), vs[0])
    for i, v in enumerate(diag_v):
        out = out + w[..., L + i].permute(0, 3, 1, 2)[..., None].to(v.dtype) * v[:, :, :, None, :]
    return out.reshape(B, L, Hq, D)


SINK_PAD = 8  # extra head dims carrying the sink (one used): keeps the head dim a multiple of 8 for flash


def _rep(x: torch.Tensor, g: int) -> torch.Tensor:
    return x.repeat_interleave(g, dim=2) if g > 1 else x


def ttt_attention_sdpa(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], scale: float) -> torch.Tensor:
    """``ttt_attention`` without an L x L tensor: the step-0 keys through ``scaled_dot_product_attention``
    (flash / memory-efficient on GPU, the fused CPU kernel), the j diagonal keys merged exactly.

    Step 0 is plain causal SDPA. For j > 0, query p sees the step-0 keys at positions <= p - j and one
    diagonal key per earlier step. The merge needs the step-0 normaliser Z0 with its gradient, which SDPA does
    not return; a sink key gives it: one extra key (head dims widened by SINK_PAD, the sink's key and value a
    unit vector in the first extra dim) with score sigma_p per query (carried by the query's extra dim). The
    SDPA output then holds o' = Z0 o0 / (Z0 + e^sigma) and, in the extra dim, o_x = e^sigma / (Z0 + e^sigma), and

        out = (o' + sum_i c_i v_i) / (1 - o_x + sum_i c_i),   c_i = o_x e^(s_i - sigma)

    equals softmax attention over both key sets for any sigma (so sigma is detached: its gradient is exactly 0).
    sigma = the row's largest diagonal score keeps every term O(1) (no overflow, and 1 - o_x only matters
    where it is not cancelled). Queries p >= j - 1 run as a square causal SDPA over [sink, k0[:L-j]]
    (top-left causal: query p sees the sink and step-0 keys <= p - j); rows p < j - 1 see no step-0 key
    (o' = 0, o_x = 1)."""
    j = len(ks) - 1
    B, L, Hq, D = q.shape
    g = Hq // ks[0].shape[2]
    if j == 0:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), _rep(ks[0], g).transpose(1, 2),
                                             _rep(vs[0], g).transpose(1, 2), is_causal=True, scale=scale)
        return out.transpose(1, 2)
    pos = torch.arange(L, device=q.device)
    kd = torch.stack([_rep(_shift(ks[i], j - i), g) for i in range(1, j + 1)], dim=-2)  # [B, L, Hq, j, D]
    vd = torch.stack([_rep(_shift(vs[i], j - i), g) for i in range(1, j + 1)], dim=-2)
    fp32 = torch.autocast(q.device.type, enabled=False)  # the merge in fp32 (autocast would run it in bf16)
    with fp32:
        sd = torch.einsum("blhd,blhjd->blhj", q.float(), kd.float()) * scale
    valid = torch.stack([pos >= j - i for i in range(1, j + 1)], dim=-1)  # [L, j]; i = j is always valid
    sd = sd.masked_fill(~valid[None, :, None, :], float("-inf"))
    E = SINK_PAD
    sig_col = (sd.detach().amax(-1) / scale).to(q.dtype)  # [B, L, Hq]: sigma / scale, as the kernel reads it
    sigma = sig_col.float() * scale
    n = L - j + 1  # query rows p = j - 1 .. L - 1 go through SDPA
    ox_head = q.new_zeros(B, j - 1, Hq, D + E)
    ox_head[..., D] = 1  # rows p < j - 1: no step-0 key, o' = 0, o_x = 1
    if n > 0:
        qa = torch.cat([q[:, j - 1:], sig_col[:, j - 1:, :, None], q.new_zeros(B, n, Hq, E - 1)], dim=-1)
        unit = q.new_zeros(B, 1, Hq, D + E)
        unit[..., D] = 1
        k0 = torch.cat([_rep(ks[0][:, :L - j], g), ks[0].new_zeros(B, L - j, Hq, E)], dim=-1)
        v0 = torch.cat([_rep(vs[0][:, :L - j], g), vs[0].new_zeros(B, L - j, Hq, E)], dim=-1)
        ka = torch.cat([unit.to(k0.dtype), k0], dim=1)
        va = torch.cat([unit.to(v0.dtype), v0], dim=1)
        o = F.scaled_dot_product_attention(qa.transpose(1, 2), ka.transpose(1, 2), va.transpose(1, 2),
                                           is_causal=True, scale=scale).transpose(1, 2)
        o = torch.cat([ox_head.to(o.dtype), o], dim=1)
    else:
        o = ox_head[:, :L]
    with fp32:
        ox = o[..., D].float()  # [B, L, Hq]
        c = ox[..., None] * torch.exp(sd - sigma[..., None])  # [B, L, Hq, j]; masked keys: exp(-inf) = 0
        num = o[..., :D].float() + torch.einsum("blhj,blhjd->blhd", c, vd.float())
        den = 1 - ox + c.sum(-1)
        return (num / den[..., None]).to(vs[0].dtype)


def ttt_mask(L: int, j: int, device) -> torch.Tensor:
    """[L, (j + 1) L] bool: which keys query p of step j sees among [k_0; k_1; ..; k_j] (each [L] long): the
    step-0 keys at positions <= p - j, and the step-i key at position p - j + i (a diagonal per step)."""
    p = torch.arange(L, device=device)[:, None]
    t = torch.arange(L, device=device)[None, :]
    return torch.cat([t <= p - j] + [t == p - j + i for i in range(1, j + 1)], dim=1)


def ttt_attention_masked(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], scale: float) -> torch.Tensor:
    """``ttt_attention`` as one ``scaled_dot_product_attention`` call over every step's keys with a boolean
    mask (``ttt_mask``): no L x L tensor kept for backward, no sink, no merge, and a kernel every library
    trains with (memory-efficient on GPU: flash takes no mask). It reads (j + 1) L keys per query where
    the sink merge reads L + j, which costs little beside the LM head; what it buys is robustness: the
    gradient comes straight from the SDPA kernel's own backward (the default, ``train.attention=masked``)."""
    j = len(ks) - 1
    L, Hq = q.shape[1], q.shape[2]
    g = Hq // ks[0].shape[2]
    k = _rep(torch.cat(ks, dim=1) if j else ks[0], g).transpose(1, 2)
    v = _rep(torch.cat(vs, dim=1) if j else vs[0], g).transpose(1, 2)
    if j == 0:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True, scale=scale)
    else:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=ttt_mask(L, j, q.device),
                                             scale=scale)
    return out.transpose(1, 2)


ATTENTION = {"masked": ttt_attention_masked, "sink": ttt_attention_sdpa, "reference": ttt_attention}


def unroll(head, ids: torch.Tensor, feats: torch.Tensor, steps: int, attention=ttt_attention_masked) -> list[torch.Tensor]:
    """ids [B, S], feats [B, S, F] (target features) -> the pre-norm outputs a_j [B, S-1, H], j < steps.
    ``attention``: one of ATTENTION's (masked: what training runs by default; reference: the L x L one)."""
    L = ids.shape[1] - 1
    tok = ids[:, 1:]
    f = head.fuse(feats[:, :L].to(head.dtype))
    cos, sin = rope.cos_sin(torch.arange(L, device=ids.device), head.inv_freq, f.dtype)
    scale = head.config.head_dim ** -0.5
    ks, vs, outs = [], [], []
    for _ in range(steps):
        q, k, v = head.pre_attention(tok, f, cos, sin)
        ks.append(k)
        vs.append(v)
        a = head.post_attention(f, attention(q, ks, vs, scale))
        outs.append(a)
        f = _shift(a, 1)  # step j + 1 at entry p reads this step's output at entry p - 1
    return outs


@dataclass
class StepStats:
    loss: list[float]  # per step
    top1: list[float]  # per step: head argmax == target argmax, over the step's loss entries
    entries: list[int]


def entry_mask(answer: torch.Tensor, lengths_ok: torch.Tensor | None = None) -> torch.Tensor:
    """answer [B, S] bool (answer tokens) -> [B, S-1]: entry p predicts x_{p+2}, an answer token (an entry
    at the last position predicts past the sequence: excluded)."""
    m = torch.zeros_like(answer[:, 1:])
    m[:, :-1] = answer[:, 2:]
    return m


def _chain_accepts(matches: list[torch.Tensor], valid: torch.Tensor, k: int):
    """-> (accepted [B, E] long, ok_start [B, E] bool), E = L - k + 1, or None when L < k: a chain of k drafts
    starting at entry e takes draft j (1..k) from step j - 1 at entry e + j - 1 and accepts its leading matches;
    a start counts when its k entries are all answer entries (``valid``)."""
    if k > len(matches):
        raise ValueError(f"simulated tau at k={k} needs >= {k} unrolled steps (have {len(matches)})")
    B, L = valid.shape
    if L < k:
        return None
    E = L - k + 1
    ok = torch.ones(B, E, dtype=torch.bool, device=valid.device)
    ok_start = torch.ones(B, E, dtype=torch.bool, device=valid.device)
    accepted = torch.zeros(B, E, dtype=torch.long, device=valid.device)
    for j in range(1, k + 1):
        ok = ok & matches[j - 1][:, j - 1:j - 1 + E]
        ok_start = ok_start & valid[:, j - 1:j - 1 + E]
        accepted += ok.long()
    return accepted, ok_start


def simulated_tau(matches: list[torch.Tensor], valid: torch.Tensor, k: int) -> tuple[float, int]:
    """Expected tokens per verify pass of greedy chain drafting with k drafts, from teacher-forced matches:
    starting at entry e, draft j (1..k) comes from step j - 1 at entry e + j - 1 and is accepted if it and
    every earlier draft matched. Starts whose k entries are all answer entries count. -> (mean tau, starts).
    Every start counts once: where hard tokens cluster that over-estimates real decoding (``walked_tau``)."""
    chains = _chain_accepts(matches, valid, k)
    if chains is None:
        return float("nan"), 0
    accepted, ok_start = chains
    n = int(ok_start.sum())
    if n == 0:
        return float("nan"), 0
    return 1.0 + float(accepted[ok_start].float().mean()), n


def walk_passes(matches: list[torch.Tensor], valid: torch.Tensor, k: int) -> list[list[int]]:
    """Per sequence, the tokens per verify pass (a + 1) of greedy chain decoding with k drafts, walked over the
    teacher-forced matches as the engine decodes (``simulated_tau``'s chains, at the engine's starts only):

    - the first pass starts at the second entry of the answer: the first answer entry predicts the answer's first
      token, which the target's prefill emits (never drafted); the engine's first draft reads that token. In
      general a start reads an answer token (entry e reads x_{e+1}: ``valid[e - 1]``) and has k answer entries;
    - a pass at entry e that accepts a drafts emits a + 1 tokens (the last one the target's), so the next pass
      reads x_{e+a+2}: it starts at entry e + a + 1; where that is no start, at the next one;
    - the walk ends when no start remains: the engine's last passes, whose drafts run past the answer, are not
      walked (a request's accept_lens begin with its walk)."""
    chains = _chain_accepts(matches, valid, k)
    if chains is None:
        return [[] for _ in range(valid.shape[0])]
    accepted, start = chains
    E = accepted.shape[1]
    start = start.clone()
    start[:, 0] = False  # entry 0 reads x_1, never an answer token (a sequence starts with its prompt)
    start[:, 1:] &= valid[:, :E - 1]
    pos = torch.arange(E, device=valid.device).expand_as(accepted)
    nxt = torch.where(start, pos, E).flip(1).cummin(1).values.flip(1)  # [B, E]: the first start >= e (E: none)
    out = []
    for acc, first in zip(accepted.tolist(), nxt.tolist()):  # one host copy per batch: the walk is sequential
        row, e = [], first[0]
        while e < E:
            row.append(acc[e] + 1)
            e += acc[e] + 1
            if e < E:
                e = first[e]
        out.append(row)
    return out


def walked_tau(matches: list[torch.Tensor], valid: torch.Tensor, k: int) -> tuple[float, int]:
    """The mean tokens per verify pass over ``walk_passes`` (greedy decoding's own starts) -> (mean tau, passes).
    A run of matched entries is visited once per pass and a run of misses at every entry, so where hard tokens
    follow hard tokens this is below ``simulated_tau``'s all-starts mean, as the engine's measured tau is."""
    passes = [t for row in walk_passes(matches, valid, k) for t in row]
    if not passes:
        return float("nan"), 0
    return sum(passes) / len(passes), len(passes)
