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

__all__ = ["scan_tile_bf16", "scan_tile_f32", "scan_rows", "exact_sq_distances"]


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
    """out[a, c] = ‖X[rows[a]] − X[cand[a, c]]‖², accumulated in float64 from the stored values."""
    m, kc = cand.shape
    d = X.shape[1]
    for a in range(m):
        i = rows[a]
        for c in range(kc):
            j = cand[a, c]
            s = 0.0
            for t in range(d):
                diff = np.float64(X[i, t]) - np.float64(X[j, t])
                s += diff * diff
            out[a, c] = s
