"""Compiled inner loops of the neighbour search (numba, CPU, one thread, no GIL held).

They exist because the scan of a distance tile is one pass of compares with rare inserts: in torch it
takes several full passes (a row minimum, a column minimum, extraction, merges), each a parallel
region whose barrier costs most on a busy machine, and together they cost more than a bfloat16 tile
matmul. Here one pass reads each entry once and updates both its row's and its column's sorted
best lists. Every function is deterministic: ties keep the earlier-inserted candidate.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["scan_tile_bf16", "scan_tile_f32", "scan_offdiag_bf16", "scan_offdiag_f32", "scan_diag_bf16",
           "scan_diag_f32", "scan_rows", "exact_sq_distances"]


@njit(cache=True, nogil=True)
def _insert(bd, bi, i, v, j):
    """Insert candidate j at (approximate) squared distance v into point i's ascending best list."""
    kc = bd.shape[1]
    if not v < bd[i, kc - 1]:
        return
    p = kc - 1
    while p > 0 and bd[i, p - 1] > v:
        bd[i, p] = bd[i, p - 1]
        bi[i, p] = bi[i, p - 1]
        p -= 1
    bd[i, p] = v
    bi[i, p] = j


@njit(cache=True, nogil=True)
def scan_tile_bf16(D, lut, r0, c0, diag, bd, bi):
    """Tile ``D`` (bfloat16 bit patterns as uint16, rows r0.., columns c0..) into both lists.

    ``lut`` maps a bit pattern to its float32 value. On a diagonal tile only the pairs above the
    diagonal are read (each pair once, for both of its points)."""
    m, p = D.shape
    kc = bd.shape[1]
    tc = np.empty(p, np.float32)
    for b in range(p):
        tc[b] = bd[c0 + b, kc - 1]
    for a in range(m):
        i = r0 + a
        tr = bd[i, kc - 1]
        for b in range(a + 1 if diag else 0, p):
            v = lut[D[a, b]]
            if v < tr:
                _insert(bd, bi, i, v, c0 + b)
                tr = bd[i, kc - 1]
            if v < tc[b]:
                j = c0 + b
                _insert(bd, bi, j, v, i)
                tc[b] = bd[j, kc - 1]


@njit(cache=True, nogil=True)
def scan_tile_f32(D, r0, c0, diag, bd, bi):
    """As :func:`scan_tile_bf16` for a float32 tile."""
    m, p = D.shape
    kc = bd.shape[1]
    tc = np.empty(p, np.float32)
    for b in range(p):
        tc[b] = bd[c0 + b, kc - 1]
    for a in range(m):
        i = r0 + a
        tr = bd[i, kc - 1]
        for b in range(a + 1 if diag else 0, p):
            v = D[a, b]
            if v < tr:
                _insert(bd, bi, i, v, c0 + b)
                tr = bd[i, kc - 1]
            if v < tc[b]:
                j = c0 + b
                _insert(bd, bi, j, v, i)
                tc[b] = bd[j, kc - 1]


# Off-diagonal tiles. An off-diagonal tile's row points and column points are different points, so
# its row lists and column lists are disjoint, and a list's inserts depend only on that list and on
# the order its candidates arrive in (a row's in column order, a column's in row order). So:
# - each row of the tile is first compared, as integers, against integer keys of the thresholds
#   (a pass the compiler vectorises; ``_key``), giving a mask that holds every entry that can enter a
#   list (a superset: keys are conservative and thresholds only decrease); then only masked entries
#   get the exact float32 compare and insert, in the one-pass scan's order;
# - rows a0:a1 may be scanned for their row lists by one thread while another scans columns b0:b1
#   for their column lists.
# Either way every list receives the same candidates in the same order as in the one-pass scan
# (:func:`scan_tile_bf16`), so the result is the same bit for bit.


@njit(cache=True, nogil=True)
def _ordered16(x):
    """int16 bits of a bfloat16 mapped so that the integers order like the floats (negative floats'
    magnitude bits are flipped; -0.0 sorts just below +0.0)."""
    return x ^ ((x >> 15) & np.int16(0x7FFF))


@njit(cache=True, nogil=True)
def _ordered32(x):
    """As :func:`_ordered16` for the int32 bits of a float32."""
    return x ^ ((x >> 31) & np.int32(0x7FFFFFFF))


@njit(cache=True, nogil=True)
def _key(t, bf16, scratch):
    """Key ``K`` of a float32 threshold ``t`` such that every tile value ``v < t`` has ordered bits
    (:func:`_ordered16` / :func:`_ordered32`) ``≤ K``: the ordered float32 bits of ``t``, shifted to
    bfloat16's top half (a floor, so still an upper bound). ``t = -inf`` admits nothing (the list is
    not scanned). ``scratch``: a float32 array of one element (a scalar's bits are read through it)."""
    if t == -np.inf:
        return -32768 if bf16 else -2147483648
    scratch[0] = t
    bits = np.int64(scratch.view(np.int32)[0])
    if bits < 0:
        bits = bits ^ 0x7FFFFFFF
    return bits >> 16 if bf16 else bits


@njit(cache=True, nogil=True)
def _mask16(row, rk, tk, rows, cols, M):
    """M[b] = whether entry b may enter the row list (key rk) or column b's list (key tk[b])."""
    if rows and cols:
        for b in range(row.shape[0]):
            x = _ordered16(row[b])
            M[b] = (x <= rk) | (x <= tk[b])
    elif rows:
        for b in range(row.shape[0]):
            M[b] = _ordered16(row[b]) <= rk
    else:
        for b in range(row.shape[0]):
            M[b] = _ordered16(row[b]) <= tk[b]


@njit(cache=True, nogil=True)
def _mask32(row, rk, tk, rows, cols, M):
    """As :func:`_mask16` for float32 tiles."""
    if rows and cols:
        for b in range(row.shape[0]):
            x = _ordered32(row[b])
            M[b] = (x <= rk) | (x <= tk[b])
    elif rows:
        for b in range(row.shape[0]):
            M[b] = _ordered32(row[b]) <= rk
    else:
        for b in range(row.shape[0]):
            M[b] = _ordered32(row[b]) <= tk[b]


_SEGMENT = 256  # columns per mask pass (a multiple of 8: the mask is read 8 bytes at a time)


@njit(cache=True, nogil=True)
def _scan_masked(D, Di, bf16, diag, r0, c0, a0, a1, b0, b1, rows, cols, bd, bi):
    """The masked scan. ``diag``: a diagonal tile (r0 == c0, all columns, rows and cols): row a
    reads only columns > a, each pair once for both of its points, as :func:`scan_tile_bf16` does;
    row a's list is read fresh at its row (it took column inserts from the rows above), and the
    column thresholds of columns > a are only changed by this scan, so the cached ones stay exact."""
    kc = bd.shape[1]
    w = b1 - b0
    scratch = np.empty(1, np.float32)
    tc = np.empty(w, np.float32)
    tk = np.empty(w, Di.dtype)
    for b in range(w):
        tc[b] = bd[c0 + b0 + b, kc - 1] if cols else -np.inf
        tk[b] = _key(tc[b], bf16, scratch)
    M = np.zeros(_SEGMENT, np.uint8)
    W = M.view(np.uint64)
    one = np.empty(1, np.uint32)
    onef = one.view(np.float32)
    rkey = np.empty(1, Di.dtype)  # the row threshold's key, typed like the tile's integers
    for a in range(a0, a1):
        i = r0 + a
        tr = bd[i, kc - 1] if rows else np.float32(-np.inf)
        for s in range(a + 1 if diag else 0, w, _SEGMENT):  # mask per segment, from the current keys
            e = min(s + _SEGMENT, w)
            rkey[0] = _key(tr, bf16, scratch)
            row = Di[a, b0 + s : b0 + e]
            if bf16:
                _mask16(row, rkey[0], tk[s:e], rows, cols, M)
            else:
                _mask32(row, rkey[0], tk[s:e], rows, cols, M)
            for q in range((e - s + 7) // 8):
                if W[q] == 0:
                    continue
                for b in range(s + 8 * q, min(s + 8 * q + 8, e)):
                    if M[b - s] == 0:
                        continue
                    if bf16:  # bfloat16 -> float32: the same bits in the top half (exact)
                        one[0] = np.uint32(D[a, b0 + b]) << 16
                        v = onef[0]
                    else:
                        v = D[a, b0 + b]
                    if v < tr:
                        _insert(bd, bi, i, v, c0 + b0 + b)
                        tr = bd[i, kc - 1]
                    if v < tc[b]:
                        j = c0 + b0 + b
                        _insert(bd, bi, j, v, i)
                        tc[b] = bd[j, kc - 1]
                        tk[b] = _key(tc[b], bf16, scratch)


@njit(cache=True, nogil=True)
def scan_offdiag_bf16(D, r0, c0, a0, a1, b0, b1, rows, cols, bd, bi):
    """Off-diagonal tile ``D`` (bfloat16 bit patterns as uint16, rows r0.., columns c0..): rows
    a0:a1 into their row lists (if ``rows``), columns b0:b1 into their column lists (if ``cols``;
    then a0:a1 must be all rows). ``rows and cols`` over the whole tile equals :func:`scan_tile_bf16`."""
    _scan_masked(D, D.view(np.int16), True, False, r0, c0, a0, a1, b0, b1, rows, cols, bd, bi)


@njit(cache=True, nogil=True)
def scan_offdiag_f32(D, r0, c0, a0, a1, b0, b1, rows, cols, bd, bi):
    """As :func:`scan_offdiag_bf16` for a float32 tile."""
    _scan_masked(D, D.view(np.int32), False, False, r0, c0, a0, a1, b0, b1, rows, cols, bd, bi)


@njit(cache=True, nogil=True)
def scan_diag_bf16(D, r0, bd, bi):
    """Diagonal tile ``D`` (bfloat16 bit patterns, rows and columns r0..): the masked scan, equal
    bit for bit to ``scan_tile_bf16(D, lut, r0, r0, True, bd, bi)``."""
    m = D.shape[0]
    _scan_masked(D, D.view(np.int16), True, True, r0, r0, 0, m, 0, m, True, True, bd, bi)


@njit(cache=True, nogil=True)
def scan_diag_f32(D, r0, bd, bi):
    """As :func:`scan_diag_bf16` for a float32 tile."""
    m = D.shape[0]
    _scan_masked(D, D.view(np.int32), False, True, r0, r0, 0, m, 0, m, True, True, bd, bi)


@njit(cache=True, nogil=True)
def scan_rows(D, rows, c0, bd, bi):
    """Rows-against-all tile: row a of ``D`` is point ``rows[a]`` (list ``a`` of ``bd``), columns c0..;
    a point is never its own neighbour."""
    m, p = D.shape
    kc = bd.shape[1]
    for a in range(m):
        i = rows[a]
        tr = bd[a, kc - 1]
        for b in range(p):
            j = c0 + b
            if j == i:
                continue
            v = D[a, b]
            if v < tr:
                _insert(bd, bi, a, v, j)
                tr = bd[a, kc - 1]


@njit(cache=True, nogil=True)
def exact_sq_distances(X, rows, cand, out):
    """out[a, c] = ‖X[rows[a]] − X[cand[a, c]]‖², accumulated in float64 from the stored values,
    coordinate by coordinate in order. Four candidates share each pass over the point's row (four
    independent sums, each in the same order as alone, so the values do not depend on the grouping)."""
    m, kc = cand.shape
    d = X.shape[1]
    for a in range(m):
        xi = X[rows[a]]
        c = 0
        while c + 4 <= kc:
            x0, x1, x2, x3 = X[cand[a, c]], X[cand[a, c + 1]], X[cand[a, c + 2]], X[cand[a, c + 3]]
            s0 = s1 = s2 = s3 = 0.0
            for t in range(d):
                v = np.float64(xi[t])
                e0 = v - np.float64(x0[t])
                e1 = v - np.float64(x1[t])
                e2 = v - np.float64(x2[t])
                e3 = v - np.float64(x3[t])
                s0 += e0 * e0
                s1 += e1 * e1
                s2 += e2 * e2
                s3 += e3 * e3
            out[a, c], out[a, c + 1], out[a, c + 2], out[a, c + 3] = s0, s1, s2, s3
            c += 4
        while c < kc:
            xj = X[cand[a, c]]
            s0 = 0.0
            for t in range(d):
                e0 = np.float64(xi[t]) - np.float64(xj[t])
                s0 += e0 * e0
            out[a, c] = s0
            c += 1


# Preparation passes: each reads the points once (instead of a torch op per step, each a parallel
# region whose barrier costs a scheduler slice on a busy machine).


@njit(cache=True, nogil=True)
def hash_rows(Xi, w, sign, hashes, finite):
    """Per row of ``Xi`` (the points' bits as int64 / int32, one row per point): the 64-bit hash
    of :func:`geometry.neighbors.row_hashes` (sum of bits · w, wrapping; ``-0.0`` counted as
    ``0.0``: bits equal to ``sign``, the sign bit alone, count as 0) and whether every value is
    finite (exponent bits not all ones)."""
    n, d = Xi.shape
    expo = np.int64(0x7FF0000000000000) if Xi.itemsize == 8 else np.int64(0x7F800000)
    for i in range(n):
        h = np.int64(0)
        bad = np.int64(0)
        for t in range(d):
            b = np.int64(Xi[i, t])
            if b == sign:
                b = np.int64(0)
            h += b * w[t]
            bad |= np.int64((b & expo) == expo)
        hashes[i] = h
        finite[i] = bad == 0


@njit(cache=True, nogil=True)
def _to_bf16(v, f, u):
    """float32 ``v`` -> bfloat16 bits, rounded to nearest even as torch rounds finite values.
    ``f``/``u``: a one-element float32 array and its uint32 view (a scalar's bits are read through it)."""
    f[0] = v
    x = u[0]
    return np.uint16((x + np.uint32(0x7FFF) + ((x >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


@njit(cache=True, nogil=True)
def _from_bf16(h, f, u):
    u[0] = np.uint32(h) << np.uint32(16)
    return f[0]


@njit(cache=True, nogil=True)
def centre_and_operands(X, mean, f32_mean, three, Xs, sq, norms, A, B):
    """One pass over the points: the centred float32 copy ``Xs`` of ``X``, its squared norms ``sq``
    (summed in float64, rounded once), float64 norms, and the bfloat16 search operands ``A``/``B``
    (bits as uint16) exactly as :func:`geometry.neighbors._operands` builds them in torch:
    ``three`` (bfloat16x3): A = [xh, xh, xl, hi, lo, 1, 1], B = [-2xh, -2xl, -2xh, 1, 1, hi, lo]
    with xh = bf16(x), xl = bf16(x - xh), hi/lo the same split of ‖x‖²; else (bfloat16)
    A = [x, hi, lo, 1, 1], B = [-2x, 1, 1, hi, lo], each rounded once to bfloat16.
    ``f32_mean``: float32 input, centred in float32; else centred in float64, rounded once."""
    n, d = X.shape
    f = np.empty(1, np.float32)
    u = f.view(np.uint32)
    one = np.uint16(0x3F80)  # bfloat16 1.0
    m2 = np.float32(-2.0)
    for i in range(n):
        s = 0.0
        for t in range(d):
            if f32_mean:
                v = np.float32(np.float32(X[i, t]) - np.float32(mean[t]))
            else:
                v = np.float32(np.float64(X[i, t]) - mean[t])
            Xs[i, t] = v
            s += np.float64(v) * np.float64(v)
            h = _to_bf16(v, f, u)
            if three:
                hf = _from_bf16(h, f, u)
                lo = _to_bf16(np.float32(v - hf), f, u)
                h2 = _to_bf16(m2 * hf, f, u)
                A[i, t] = h
                A[i, d + t] = h
                A[i, 2 * d + t] = lo
                B[i, t] = h2
                B[i, d + t] = _to_bf16(m2 * _from_bf16(lo, f, u), f, u)
                B[i, 2 * d + t] = h2
            else:
                A[i, t] = h
                B[i, t] = _to_bf16(m2 * v, f, u)
        q = np.float32(s)
        sq[i] = q
        norms[i] = np.sqrt(s)
        qh = _to_bf16(q, f, u)
        ql = _to_bf16(np.float32(q - _from_bf16(qh, f, u)), f, u)
        e = A.shape[1] - 4
        A[i, e] = qh
        A[i, e + 1] = ql
        A[i, e + 2] = one
        A[i, e + 3] = one
        B[i, e] = one
        B[i, e + 1] = one
        B[i, e + 2] = qh
        B[i, e + 3] = ql
