# attn_model.py: a numpy model of runtime/cuda/attn.cu's loops (issue 22),
# to check the algorithm where no GPU is: the 64-row tiles of queries and
# keys, the causal tiles skipped, the forward's running max and sum, lse,
# the backward's two kernels (dk, dv a key tile over the query tiles; dq a
# query tile over the key tiles), delta = rowsum(do * o), and the operands
# rounded to bfloat16, or to tf32 (head dims up to 64), as the kernels
# round them; against float64 on opcheck's shapes. Not the kernels: their
# wmma layouts, shared memory and barriers only opcheck on a GPU proves.
#   python3 tests/gpu/attn_model.py   (numpy; exit 1 past the bound)
import sys

import numpy as np

R = 64
def bf(x):
    x = np.asarray(x, np.float32).copy()
    u = x.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7fff + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)
def tf32(x):  # wmma::__float_to_tf32: cvt.rna, 10 bits kept, ties away from zero
    x = np.asarray(x, np.float32).copy()
    u = x.view(np.uint32).astype(np.uint64)
    u = ((u + 0x1000) >> 13) << 13
    return u.astype(np.uint32).view(np.float32)
def load(x, r0, n, d, DP, rnd):
    t = np.zeros((R, DP), np.float32)
    rows = min(R, max(0, n - r0))
    t[:rows, :d] = x[r0:r0 + rows]
    return rnd(t)
def fwd(q, k, v, scale, causal, DP, rnd):
    t, d = q.shape; s = k.shape[0]
    o = np.zeros_like(q); lse = np.zeros(t, np.float32)
    for qt in range((t + R - 1) // R):
        q0 = qt * R; qs = load(q, q0, t, d, DP, rnd)
        m = np.full(R, -np.inf, np.float32); l = np.zeros(R, np.float32); O = np.zeros((R, DP), np.float32)
        tiles = (s + R - 1) // R
        if causal and q0 // R + 1 < tiles: tiles = q0 // R + 1
        for j in range(tiles):
            s0 = j * R; ks = load(k, s0, s, d, DP, rnd); vs = load(v, s0, s, d, DP, rnd)
            S = qs @ ks.T
            qi = q0 + np.arange(R)[:, None]; kj = s0 + np.arange(R)[None, :]
            on = (kj < s) & ~((kj > qi) if causal else False)
            x = np.where(on, S * scale, -np.inf)
            mn = np.maximum(m, x.max(1)); base = np.where(mn == -np.inf, 0, mn)
            alpha = np.exp(m - base); e = np.exp(x - base[:, None])
            l = l * alpha + e.sum(1); m = mn
            O = O * alpha[:, None] + rnd(e) @ vs
        rows = min(R, t - q0)
        o[q0:q0 + rows] = (O / l[:, None])[:rows, :d]; lse[q0:q0 + rows] = (m + np.log(l))[:rows]
    return o, lse
def bwd(do, q, k, v, o, lse, scale, causal, DP, rnd):
    t, d = q.shape; s = k.shape[0]
    dq = np.zeros_like(q); dk = np.zeros_like(k); dv = np.zeros_like(v)
    def queries(q0):
        qs = load(q, q0, t, d, DP, rnd); dos = load(do, q0, t, d, DP, rnd)
        rows = min(R, t - q0); L = np.full(R, np.inf, np.float32); De = np.zeros(R, np.float32)
        L[:rows] = lse[q0:q0 + rows]; De[:rows] = (do[q0:q0 + rows] * o[q0:q0 + rows]).sum(1)
        return qs, dos, L, De
    for kt in range((s + R - 1) // R):  # dkdv kernel
        s0 = kt * R; ks = load(k, s0, s, d, DP, rnd); vs = load(v, s0, s, d, DP, rnd)
        dK = np.zeros((R, DP), np.float32); dV = np.zeros((R, DP), np.float32)
        for i in range(s0 // R if causal else 0, (t + R - 1) // R):
            q0 = i * R; qs, dos, L, De = queries(q0)
            St = ks @ qs.T; dPt = vs @ dos.T
            kj = s0 + np.arange(R)[:, None]; qi = q0 + np.arange(R)[None, :]
            on = (qi < t) & (kj < s) & ~((kj > qi) if causal else False)
            p = np.where(on, np.exp(St * scale - L[None, :]), 0)
            ds = p * (dPt - De[None, :])
            dV += rnd(p) @ dos; dK += rnd(ds) @ qs
        rows = min(R, s - s0)
        dk[s0:s0 + rows] = (dK * scale)[:rows, :d]; dv[s0:s0 + rows] = dV[:rows, :d]
    for qt in range((t + R - 1) // R):  # dq kernel
        q0 = qt * R; qs, dos, L, De = queries(q0); dQ = np.zeros((R, DP), np.float32)
        tiles = (s + R - 1) // R
        if causal and q0 // R + 1 < tiles: tiles = q0 // R + 1
        for j in range(tiles):
            s0 = j * R; ks = load(k, s0, s, d, DP, rnd); vs = load(v, s0, s, d, DP, rnd)
            S = qs @ ks.T; dP = dos @ vs.T
            qi = q0 + np.arange(R)[:, None]; kj = s0 + np.arange(R)[None, :]
            on = (qi < t) & (kj < s) & ~((kj > qi) if causal else False)
            p = np.where(on, np.exp(S * scale - L[:, None]), 0)
            dQ += rnd(p * (dP - De[:, None])) @ ks
        rows = min(R, t - q0)
        dq[q0:q0 + rows] = (dQ * scale)[:rows, :d]
    return dq, dk, dv
def ref(q, k, v, do, scale, causal):
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    S = q @ k.T * scale
    if causal: S = np.where(np.arange(k.shape[0])[None, :] > np.arange(q.shape[0])[:, None], -np.inf, S)
    m = S.max(1, keepdims=True); P = np.exp(S - m); z = P.sum(1, keepdims=True); P /= z
    o = P @ v; lse = (m + np.log(z))[:, 0]
    dv = P.T @ do; dP = do @ v.T; dS = P * (dP - (dP * P).sum(1, keepdims=True)) * scale
    return o, lse, dS @ k, dS.T @ q, dv
def nerr(a, b): return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)
rng = np.random.default_rng(0)
worst = {"bf16": 0.0, "tf32": 0.0}
for (t, s, hd, causal) in [(64, 64, 64, 1), (200, 200, 64, 1), (200, 200, 64, 0), (16, 16, 8, 1),
                           (130, 70, 32, 0), (300, 300, 128, 1)]:
    DP = 16 if hd <= 16 else 32 if hd <= 32 else 64 if hd <= 64 else 128
    q = rng.uniform(-2, 2, (t, hd)).astype(np.float32)
    k = rng.uniform(-2, 2, (s, hd)).astype(np.float32)
    v = rng.uniform(-1, 1, (s, hd)).astype(np.float32)
    do = rng.uniform(-1, 1, (t, hd)).astype(np.float32)
    sc = np.float32(1 / np.sqrt(hd))
    ro, rl, rdq, rdk, rdv = ref(q, k, v, do, sc, causal)
    for prec, rnd in (("bf16", bf), ("tf32", tf32)):
        if prec == "tf32" and hd > 64:
            continue  # (kdcc fuses tf32 up to head dim 64)
        o, lse = fwd(q, k, v, sc, causal, DP, rnd)
        dq, dk, dv = bwd(do, q, k, v, ro.astype(np.float32), rl.astype(np.float32), sc, causal,
                         DP, rnd)
        errs = [("o", nerr(o, ro)), ("lse", nerr(lse, rl)), ("dq", nerr(dq, rdq)),
                ("dk", nerr(dk, rdk)), ("dv", nerr(dv, rdv))]
        worst[prec] = max([worst[prec]] + [e for _, e in errs])
        print("attn_model: %s t %d s %d hd %d causal %d: " % (prec, t, s, hd, causal) +
              " ".join("%s %.1e" % x for x in errs))
# bf16 operands: about 5e-3 (opcheck's bf16 bound is 3e-2); tf32: about 1e-3
print("attn_model: worst bf16 %.1e (bound 1.5e-2), tf32 %.1e (bound 2e-3)" %
      (worst["bf16"], worst["tf32"]))
sys.exit(0 if worst["bf16"] < 1.5e-2 and worst["tf32"] < 2e-3 else 1)
