"""The split (few rows, many programs per row) top-k path of indexer_topk.py against the float32 reference.

Interpreter tier: small rows (N <= 4096) with small chunks, so every row runs over many programs
and each path of the radix select is taken: the threshold bucket ranked pairwise after level 1, 2
or 3, or refined to one exact score at level 4, exact score ties resolved in index order, rows without valid scores, k >= N. Each case
asserts the same indices in the same order as `topk_select_ref` (torch's stable descending sort)
and, where it matters, which path the row took (the kernel's state: shift 24 / 16 / 8 = stopped after level 1 / 2 / 3,
0 = one exact score; every call also checks it against the same radix select recomputed in PyTorch). The interpreter runs the six-launch form (its programs run one
after another, so the one-launch form's grid barriers would never open). GPU tier: the same cases through
both forms (one launch with grid barriers, and six launches), and the decode shapes (top-512 of 131,072
scores, top-2048 of 16,384 pinned block maxima) at S = 1 and 4, also replayed from a CUDA graph.
"""
import pytest
import torch

from dsv41c.codegen.triton import indexer_topk as tk
from dsv41c.codegen.triton.arrival import counters

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _radix_path(row, k, cap, pin=-1):
    """The radix select's end state for one row, recomputed in PyTorch: (prefix, shift, above, h) of the
    level at which the threshold bucket first holds <= cap keys (or the last level, or no valid score)."""
    x = row.detach().double().cpu().float().clone()
    if pin >= 0:
        x[pin] = float("inf")
    valid = x != float("-inf")
    x = torch.where(x == 0, torch.zeros_like(x), x)
    u = x.view(torch.int32).long()
    key = u ^ ((u >> 31) & 0x7FFFFFFF)
    ku = (key & 0xFFFFFFFF) ^ 0x80000000  # the kernel's unsigned order key
    kk = min(int(valid.sum()), k)
    above, prefix, bits = 0, 0, tk._BITS
    for level in range(1, 32 // bits + 1):
        lo = 32 - bits * level
        m = valid if level == 1 else valid & ((ku >> (lo + bits)) == prefix)
        h = torch.bincount(((ku >> lo) & ((1 << bits) - 1))[m], minlength=1 << bits)
        suf = h.flip(0).cumsum(0).flip(0)
        d = int(torch.nonzero(suf >= kk - above).max())
        hd = int(h[d])
        above += int(suf[d]) - hd
        prefix = (prefix << bits) | d
        if hd <= cap or level == 32 // bits or kk == 0:  # the kernel's state: (prefix as int32, shift, above, h)
            return (prefix - (1 << 32) if prefix >= 1 << 31 else prefix), lo, above, hd


def _split(s, k, pin=None, **kw):
    state = torch.empty((s.shape[0], 8), dtype=torch.int32, device=s.device)
    a = tk.topk_select_split(s, k, pin, state=state, **kw)
    b = tk.topk_select_ref(s, k, pin)
    assert a.dtype == torch.int32 and a.shape == b.shape
    if not torch.equal(a, b):
        bad = (a != b).nonzero()[:8].tolist()
        raise AssertionError(f"split top-{k} differs from the reference at {bad}; state {state.tolist()}")
    for r in range(s.shape[0]):  # the path each row took: the level it stopped at, keys above, bucket size
        want = _radix_path(s[r], k, kw.get("cap", tk.SPLIT_CAP), -1 if pin is None else int(pin[r]))
        assert tuple(state[r, :4].tolist()) == want, (r, state[r].tolist(), want)
    # the kernels leave their workspace zeroed for the next launch / graph replay
    fused = kw.get("fused")
    share, pool = kw.get("share", 1), kw.get("pool", "split")
    if fused is None:
        chunk = kw.get("chunk") or tk.split_chunk(s.shape[1], s.shape[0], s.device, share)
        fused = tk.fused_for(s.device, s.shape[0] * -(-s.shape[1] // chunk) * share)
    hist, slots = tk._split_workspace(s.device, s.shape[0], tk._LEVELS if fused else 1, pool)
    assert int(hist.abs().sum()) == 0 and int(slots.abs().sum()) == 0
    assert int(counters(s.device, s.shape[0], pool=pool).abs().sum()) == 0
    # the same selection as a set (mask=True: no rank of the sure keys): the reference's indices as flags
    m = tk.topk_select_split(s, k, pin, mask=True, **kw)
    want = tk.ids_to_mask(b, s.shape[1])
    assert m.dtype == torch.uint8 and m.shape == want.shape
    if not torch.equal(m, want):
        bad = (m != want).nonzero()[:8].tolist()
        raise AssertionError(f"split top-{k} as a mask differs from the reference at {bad}; state {state.tolist()}")
    assert int(hist.abs().sum()) == 0 and int(slots.abs().sum()) == 0
    assert int(counters(s.device, s.shape[0], pool=pool).abs().sum()) == 0
    return a, state


def _ties(S, N, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(S, N, generator=g).round(decimals=1)  # many exact ties
    s[:, ::5] = 0.0
    s[:, 2::7] = -0.0
    return s


@pytest.mark.parametrize("S,N,k,chunk", [(1, 4096, 64, 256), (2, 4096, 512, 512), (3, 3000, 100, 128)])
def test_split_random_rows_level1(S, N, k, chunk):
    s = torch.randn(S, N, generator=torch.Generator().manual_seed(N + k)).to(DEV)
    _, st = _split(s, k, chunk=chunk, cap=4096)
    assert (st[:, 1] == 24).all() and (st[:, 5] == 1).all()  # the first level's bucket was small enough


@pytest.mark.parametrize("cap", [64, 0])
def test_split_refines_full_buckets(cap):
    # scores inside [1, 1.25): one first-level bucket holds the whole row, so it is refined
    g = torch.Generator().manual_seed(cap)
    s = (1.0 + 0.25 * torch.rand(2, 4096, generator=g)).to(DEV)
    s[1, 100:3000] = 1.24  # row 1: a long run of one score at the threshold
    _, st = _split(s, 300, chunk=256, cap=cap)
    assert 0 < int(st[0, 1]) < 24 if cap else int(st[0, 1]) == 0, st.tolist()  # refined / cap 0: to one score
    assert int(st[1, 1]) == 0, st.tolist()  # the tied run: exact ties in index order


@pytest.mark.slow
def test_split_ties_masked_rows_and_pin():
    S, N, k = 3, 4096, 256
    s = _ties(S, N, seed=7)
    s[0, N // 2:] = float("-inf")  # masked half row
    s[1] = 1.0  # one value: the first k indices
    s[2, :] = float("-inf")
    s[2, 4000:] = 3.0  # fewer valid than k
    s = s.to(DEV)
    pin = torch.tensor([N - 1, 17, -1], dtype=torch.int32, device=DEV)
    for p in (None, pin):
        a, st = _split(s, k, p, chunk=256, cap=1024)
        assert int(st[1, 1]) == 0  # the all-equal row (> cap ties): exact ties in index order
        a, st = _split(s, k, p, chunk=256, cap=4096)
        assert int(st[1, 1]) == 24  # <= cap ties: ranked pairwise on the unique (score, index) keys
    a, _ = _split(s, k, chunk=256)
    assert torch.equal(a[1], torch.arange(k, dtype=torch.int32, device=DEV))
    assert (a[2, 96:] == -1).all()


def test_split_pin_over_existing_inf_and_duplicates():
    N, k = 2048, 64
    s = _ties(2, N, seed=9)
    s[:, 500] = float("inf")
    s[:, 1500] = float("inf")
    s = s.to(DEV)
    for pin_at in (1000, 500, 2047):  # between, on and after the +inf scores
        _split(s, k, torch.tensor([pin_at, -1], dtype=torch.int32, device=DEV), chunk=128)


@pytest.mark.parametrize("N,k", [(300, 512), (1000, 1000), (1000, 1), (130, 2048)])
def test_split_k_edges(N, k):
    s = _ties(2, N, seed=N)
    s[1, ::3] = float("-inf")
    a, _ = _split(s.to(DEV), k, chunk=128)
    if k >= N:
        assert (a[:, N:] == -1).all()


def test_split_no_valid_scores_and_strided_rows():
    big = _ties(2, 5000, seed=3)
    big[0] = float("-inf")
    s = big[:, :4096].to(DEV)  # rows with stride 5000
    a, st = _split(s, 64, chunk=512)
    assert (a[0] == -1).all() and int(st[0, 4]) == 0


def test_split_repeated_calls_leave_workspace_clean():
    # the same buffers serve later calls: histogram, slots and arrival counters must come back zeroed
    s = _ties(1, 4096, seed=1).to(DEV)
    for k in (16, 512, 64):
        _split(s, k, chunk=256, cap=8 if k > 16 else 0)


def test_split_own_pool_and_half_the_sms():
    # the side-stream selection of indexer_topk: its own workspace / counters (pool), a grid planned for half
    # the SMs (share=2: a chunk twice as long); same indices, and its pool comes back zeroed too
    s = _ties(2, 8192, seed=3).to(DEV)
    assert tk.split_chunk(8192, 2, s.device, share=2) == min(4096, 2 * tk.split_chunk(8192, 2, s.device))
    _split(s, 300, pool="test_side", share=2)
    _split(s, 300, pin=torch.tensor([5, -1], dtype=torch.int32, device=DEV), pool="test_side", share=2, cap=64)
    _split(s, 300)  # the default pool too
    for lv in (1, tk._LEVELS):  # the two pools are different buffers
        a, b = tk._split_workspace(s.device, 2, lv), tk._split_workspace(s.device, 2, lv, "test_side")
        assert a[0].data_ptr() != b[0].data_ptr() and a[1].data_ptr() != b[1].data_ptr()
    assert counters(s.device, 2).data_ptr() != counters(s.device, 2, pool="test_side").data_ptr()
    with pytest.raises(ValueError, match="share"):
        tk.topk_select_split(s, 8, share=0)


def test_dispatch_uses_split_for_few_long_rows():
    s = torch.randn(1, tk.SPLIT_MIN_N, generator=torch.Generator().manual_seed(2)).to(DEV)
    assert torch.equal(tk.topk_select(s, 128), tk.topk_select_ref(s, 128))
    assert torch.equal(tk.topk_select(s, 128), tk.topk_select_chunked(s, 128))


def test_select_as_mask_both_paths():
    """topk_select(as_mask=True): the selected set as uint8 flags, on the split path (few long rows) and the
    chunked one (many rows: the ids scattered), equal to the reference's indices as flags; pinned and tied."""
    for S, N, k in ((1, 8192, 300), (6, 3000, 200)):
        s = _ties(S, N, seed=S).to(DEV)
        pin = torch.arange(S, dtype=torch.int32, device=DEV) * 7
        want = tk.ids_to_mask(tk.topk_select_ref(s, k, pin), N)
        got = tk.topk_select(s, k, pin, chunk=1024, as_mask=True)
        assert tk.split_path(S, N, k) == (S == 1)
        assert torch.equal(got, want) and int(got.sum()) == S * k
        assert torch.equal(tk.topk_select_ref(s, k, pin, as_mask=True), want)


def test_split_rejects_bad_input():
    s = torch.randn(1, 64, device=DEV)
    with pytest.raises(ValueError, match="float32"):
        tk.topk_select_split(s.double(), 8)
    with pytest.raises(ValueError, match="pin"):
        tk.topk_select_split(s, 8, torch.zeros(2, dtype=torch.int32, device=DEV))


# ============================================================================ GPU tier (real sizes)


@pytest.mark.gpu
@pytest.mark.parametrize("S", [1, 4])
def test_gpu_split_decode_sizes(S):
    g = torch.Generator(device="cuda").manual_seed(S)
    T, NB = 131072, 16384
    sc = torch.randn(S, T, device="cuda", generator=g)
    sc[:, T - 1000:] = float("-inf")  # not yet visible
    sc[:, 5000:5100] = sc[:, 4000:4001]  # a run of exact ties
    bm = sc.view(S, NB, 8).amax(-1)
    pin = torch.full((S,), NB - 126, dtype=torch.int32, device="cuda")
    cases = ((sc, 512, None), (bm, 2048, pin), (sc.round(decimals=1), 512, None), (bm.round(decimals=1), 2048, pin))
    assert tk.fused_for(sc.device, S * (T // tk.split_chunk(T, S, sc.device)))  # the default here: one launch
    for x, k, p in cases:
        a = tk.topk_select_split(x, k, p)
        assert torch.equal(a, tk.topk_select_ref(x, k, p))
        assert torch.equal(tk.topk_select(x, k, p), a)
        assert torch.equal(tk.topk_select_split(x, k, p, fused=False), a)
    # replayed from a CUDA graph: the workspace comes back zeroed, so every replay is exact
    x = sc.clone()
    tk.topk_select(x, 512)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tk.topk_select(x, 512)
    for seed in range(3):
        x.copy_(torch.randn(S, T, device="cuda", generator=g).round(decimals=seed))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, tk.topk_select_ref(x, 512))


@pytest.mark.gpu
def test_gpu_split_two_selections_at_once():
    """indexer_topk's overlap: top-512 on the main stream and candidate-2048 on the side stream, each with
    share=2 (both one-launch grids resident together) and its own pool; eagerly and from one CUDA graph."""
    g = torch.Generator(device="cuda").manual_seed(9)
    T, NB = 131072, 16384
    sc = torch.randn(1, T, device="cuda", generator=g)
    sc[:, 3000:3300] = sc[:, 10:11]  # exact ties
    bm = sc.view(1, NB, 8).amax(-1)
    pin = torch.tensor([NB - 1], dtype=torch.int32, device="cuda")
    assert tk.fused_for(sc.device, 2 * (T // tk.split_chunk(T, 1, sc.device, share=2)))
    assert tk.fused_for(sc.device, 2 * (NB // tk.split_chunk(NB, 1, sc.device, share=2)))
    side = torch.cuda.Stream()

    def both():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            c = tk.topk_select(bm, 2048, pin, pool="test_side", share=2)
        i = tk.topk_select(sc, 512, share=2)
        torch.cuda.current_stream().wait_stream(side)
        return i, c

    for _ in range(3):
        i, c = both()
        assert torch.equal(i, tk.topk_select_ref(sc, 512)) and torch.equal(c, tk.topk_select_ref(bm, 2048, pin))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        i, c = both()
    for seed in range(3):
        sc.copy_(torch.randn(1, T, device="cuda", generator=g).round(decimals=seed))
        bm.copy_(sc.view(1, NB, 8).amax(-1))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(i, tk.topk_select_ref(sc, 512)) and torch.equal(c, tk.topk_select_ref(bm, 2048, pin))


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
def test_gpu_split_paths_both_forms(fused):
    """The interpreter tier's paths on the GPU, in the one-launch form (grid barriers between the phases)
    and in the six-launch form: refinement to levels 2 and 3, exact ties, pins, masked rows, k >= N."""
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(5)
    s = (1.0 + 0.25 * torch.rand(2, 4096, generator=g))
    s[1, 100:3000] = 1.24
    for cap in (64, 0):
        _, st = _split(s.to(dev), 300, chunk=256, cap=cap, fused=fused)
        assert (0 < int(st[0, 1]) < 24 if cap else int(st[0, 1]) == 0) and int(st[1, 1]) == 0, st.tolist()
    t = _ties(3, 4096, seed=7)
    t[0, 2048:] = float("-inf")
    t[1] = 1.0
    t[2, :] = float("-inf")
    t[2, 4000:] = 3.0
    pin = torch.tensor([4095, 17, -1], dtype=torch.int32, device=dev)
    for p in (None, pin):
        _, st = _split(t.to(dev), 256, p, chunk=256, cap=1024, fused=fused)
        assert int(st[1, 1]) == 0
        _, st = _split(t.to(dev), 256, p, chunk=256, cap=4096, fused=fused)
        assert int(st[1, 1]) == 24
        _split(t.to(dev), 256, p, chunk=256, fused=fused)
    for N, k in ((300, 512), (1000, 1000), (1000, 1), (130, 2048)):
        _split(_ties(2, N, seed=N).to(dev), k, chunk=128, fused=fused)
    big = torch.randn(4, 131072, generator=g).to(dev)
    for k, cap in ((16, 0), (512, 8), (64, 8), (2048, 512)):  # repeated calls: the workspace and the barrier
        _split(big, k, chunk=4096, cap=cap, fused=fused)  # counters come back zeroed
