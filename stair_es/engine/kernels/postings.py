"""Walking built postings: the merge of several segments' postings, postings back to CSR rows,
documents' rows, a term's documents, document frequencies."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def merge_postings(kstart, kend, keys_u, pair_block, pair_cnt, post_off, post_w, post_start, newdoc, doc_base, bshift_in, bshift):
    """Merge the postings of several segments term by term (streaming, no transposition).

    ``kstart[s, u]`` / ``kend[s, u]``: pair range of union key u in segment s (concatenated
    arrays; kstart = kend when absent); ``post_start[s, u]``: its first posting. Local doc
    d of segment s becomes ``newdoc[doc_base[s] + d]`` (-1 = deleted). Output as
    :func:`build_postings`.
    """
    S = kstart.shape[0]
    U = keys_u.size
    cnt_post = np.zeros(U, np.int64)
    cnt_pair = np.zeros(U, np.int64)
    for u in range(U):
        last = -1
        for s in range(S):
            q = post_start[s, u]
            for p in range(kstart[s, u], kend[s, u]):
                base = np.int64(pair_block[p]) << bshift_in
                for _ in range(np.int64(pair_cnt[p]) + 1):
                    nd = newdoc[doc_base[s] + base + post_off[q]]
                    q += 1
                    if nd >= 0:
                        cnt_post[u] += 1
                        b = nd >> bshift
                        if b != last:
                            cnt_pair[u] += 1
                            last = b
    T = 0
    for u in range(U):
        if cnt_post[u] > 0:
            T += 1
    keys = np.empty(T, np.uint32)
    post_ptr = np.zeros(T + 1, np.int64)
    pair_ptr = np.zeros(T + 1, np.int64)
    j = 0
    for u in range(U):
        if cnt_post[u] > 0:
            keys[j] = keys_u[u]
            post_ptr[j + 1] = post_ptr[j] + cnt_post[u]
            pair_ptr[j + 1] = pair_ptr[j] + cnt_pair[u]
            j += 1
    o_block = np.empty(pair_ptr[T], np.uint16)
    o_cnt = np.empty(pair_ptr[T], np.uint8)
    o_max = np.empty(pair_ptr[T], np.uint16)
    o_off = np.empty(post_ptr[T], np.uint8)
    o_w = np.empty(post_ptr[T], np.uint16)
    mask = (1 << bshift) - 1
    j = 0
    for u in range(U):
        if cnt_post[u] == 0:
            continue
        k = pair_ptr[j] - 1
        r = post_ptr[j]
        last = -1
        c = 0
        for s in range(S):
            q = post_start[s, u]
            for p in range(kstart[s, u], kend[s, u]):
                base = np.int64(pair_block[p]) << bshift_in
                for _ in range(np.int64(pair_cnt[p]) + 1):
                    nd = newdoc[doc_base[s] + base + post_off[q]]
                    w = post_w[q]
                    q += 1
                    if nd < 0:
                        continue
                    b = nd >> bshift
                    if b != last:
                        if k >= pair_ptr[j]:
                            o_cnt[k] = c - 1
                        k += 1
                        o_block[k] = b
                        o_max[k] = w
                        c = 0
                        last = b
                    elif w > o_max[k]:
                        o_max[k] = w
                    o_off[r] = nd & mask
                    o_w[r] = w
                    r += 1
                    c += 1
        o_cnt[k] = c - 1
        j += 1
    return keys, post_ptr, pair_ptr, o_block, o_cnt, o_max, o_off, o_w


@njit(cache=True)
def postings_to_csr(n_docs, keys, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, post_w, key_lo, key_hi, bshift, keep_map):
    """Term-major postings of keys in [key_lo, key_hi) -> doc-major CSR over kept docs.

    ``keep_map[d]`` is the new row of local doc d (-1 = dropped). Returns indptr, token ids
    (key - key_lo), fp16 weight bits; token ids within a row come out sorted.
    """
    n_out = 0
    for d in range(n_docs):
        if keep_map[d] >= 0:
            n_out += 1
    counts = np.zeros(n_out + 1, np.int64)
    for j in range(keys.size):
        if keys[j] < key_lo or keys[j] >= key_hi:
            continue
        q = post_ptr[j]
        for p in range(pair_ptr[j], pair_ptr[j + 1]):
            base = np.int64(pair_block[p]) << bshift
            for _ in range(np.int64(pair_cnt[p]) + 1):
                r = keep_map[base + post_off[q]]
                if r >= 0:
                    counts[r + 1] += 1
                q += 1
    indptr = np.cumsum(counts)
    pos = indptr[:-1].copy()
    ids = np.empty(indptr[n_out], np.int32)
    wb = np.empty(indptr[n_out], np.uint16)
    for j in range(keys.size):  # keys ascending -> ids ascending within each row
        if keys[j] < key_lo or keys[j] >= key_hi:
            continue
        tok = np.int32(keys[j] - key_lo)
        q = post_ptr[j]
        for p in range(pair_ptr[j], pair_ptr[j + 1]):
            base = np.int64(pair_block[p]) << bshift
            for _ in range(np.int64(pair_cnt[p]) + 1):
                r = keep_map[base + post_off[q]]
                if r >= 0:
                    ids[pos[r]] = tok
                    wb[pos[r]] = post_w[q]
                    pos[r] += 1
                q += 1
    return indptr, ids, wb


@njit(cache=True, nogil=True)  # a server's other searches run while hits are read back
def doc_rows(docs, keys, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, post_w, bshift):
    """All (position in ``docs``, key, fp16 bits) of the local docs ``docs`` (ascending, distinct),
    term by term (so keys ascend within each doc). One walk over each term's pairs serves every
    doc: a posting's place is the term's first posting plus the runs of the pairs before it, so
    the walk is what finds it, and walking once per doc cost ~7 ms per doc at 100k documents."""
    n = docs.size
    mask = (1 << bshift) - 1
    cap = min(n * keys.size, post_off.size)
    out_d = np.empty(cap, np.int32)
    out_k = np.empty(cap, np.uint32)
    out_w = np.empty(cap, np.uint16)
    m = 0
    if n == 0:
        return out_d[:0], out_k[:0], out_w[:0]
    last_block = docs[n - 1] >> bshift
    for j in range(keys.size):
        p = pair_ptr[j]
        end = pair_ptr[j + 1]
        q = post_ptr[j]
        i = 0
        while i < n and p < end:
            b = docs[i] >> bshift
            while p < end and pair_block[p] < b:
                q += np.int64(pair_cnt[p]) + 1
                p += 1
            if p == end or pair_block[p] > last_block:
                break
            if pair_block[p] == b:
                run = np.int64(pair_cnt[p]) + 1
                while i < n and (docs[i] >> bshift) == b:
                    off = docs[i] & mask
                    for qq in range(q, q + run):
                        if post_off[qq] == off:
                            out_d[m] = i
                            out_k[m] = keys[j]
                            out_w[m] = post_w[qq]
                            m += 1
                            break
                    i += 1
            else:
                while i < n and (docs[i] >> bshift) < pair_block[p]:
                    i += 1
    return out_d[:m], out_k[:m], out_w[:m]


@njit(cache=True)
def term_docs(j, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift, out_mask):
    """Set ``out_mask[d] = 1`` for every local doc in term j's postings."""
    q = post_ptr[j]
    for p in range(pair_ptr[j], pair_ptr[j + 1]):
        base = np.int64(pair_block[p]) << bshift
        for _ in range(np.int64(pair_cnt[p]) + 1):
            out_mask[base + post_off[q]] = 1
            q += 1


@njit(cache=True)
def term_freqs(keys, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift, live, key_lo, key_hi, out):
    """Live document frequency per key in [key_lo, key_hi) added into out[key - key_lo]."""
    all_live = live.size == 0
    for j in range(keys.size):
        if keys[j] < key_lo or keys[j] >= key_hi:
            continue
        if all_live:
            out[keys[j] - key_lo] += post_ptr[j + 1] - post_ptr[j]
            continue
        q = post_ptr[j]
        c = 0
        for p in range(pair_ptr[j], pair_ptr[j + 1]):
            base = np.int64(pair_block[p]) << bshift
            for _ in range(np.int64(pair_cnt[p]) + 1):
                if live[base + post_off[q]]:
                    c += 1
                q += 1
        out[keys[j] - key_lo] += c


@njit(cache=True, nogil=True)
def merge_counts(kstart, kend, post_start, pair_block, pair_cnt, post_off, newdoc, doc_base, bshift_in, bshift):
    """The first pass of a streamed merge (:func:`merge_postings` without its outputs held in
    memory): per union key u, the postings and (term, block) pairs the merged segment will hold.

    ``pair_block``, ``pair_cnt``, ``post_off``: typed lists of each input segment's own arrays
    (memory-mapped: nothing is concatenated); ``kstart[s, u]`` / ``kend[s, u]`` / ``post_start[s,
    u]``: key u's pair range and first posting in segment s (local); doc mapping as
    :func:`merge_postings`."""
    S, U = kstart.shape
    cnt_post = np.zeros(U, np.int64)
    cnt_pair = np.zeros(U, np.int64)
    for u in range(U):
        last = -1
        for s in range(S):
            pb, pc, po = pair_block[s], pair_cnt[s], post_off[s]
            q = post_start[s, u]
            db = doc_base[s]
            for p in range(kstart[s, u], kend[s, u]):
                base = db + (np.int64(pb[p]) << bshift_in)
                for _ in range(np.int64(pc[p]) + 1):
                    nd = newdoc[base + po[q]]
                    q += 1
                    if nd >= 0:
                        cnt_post[u] += 1
                        b = nd >> bshift
                        if b != last:
                            cnt_pair[u] += 1
                            last = b
    return cnt_post, cnt_pair


@njit(cache=True, nogil=True)
def merge_range(u0, u1, cnt_post, kstart, kend, post_start, pair_block, pair_cnt, post_off, post_w, newdoc, doc_base,
                bshift_in, bshift, o_block, o_cnt, o_max, o_off, o_w):
    """The second pass of a streamed merge: the merged pairs and postings of union keys
    [u0, u1) (those with postings, in key order), written from the start of the ``o_*`` buffers
    (sized by :func:`merge_counts`' counts of that range). Inputs as :func:`merge_counts`; the
    same arrays as :func:`merge_postings` gives for those keys."""
    S = kstart.shape[0]
    mask = (1 << bshift) - 1
    k = -1
    r = 0
    for u in range(u0, u1):
        if cnt_post[u] == 0:
            continue
        k0 = k + 1
        last = -1
        c = 0
        for s in range(S):
            pb, pc, po, pw = pair_block[s], pair_cnt[s], post_off[s], post_w[s]
            q = post_start[s, u]
            db = doc_base[s]
            for p in range(kstart[s, u], kend[s, u]):
                base = db + (np.int64(pb[p]) << bshift_in)
                for _ in range(np.int64(pc[p]) + 1):
                    nd = newdoc[base + po[q]]
                    w = pw[q]
                    q += 1
                    if nd < 0:
                        continue
                    b = nd >> bshift
                    if b != last:
                        if k >= k0:
                            o_cnt[k] = c - 1
                        k += 1
                        o_block[k] = b
                        o_max[k] = w
                        c = 0
                        last = b
                    elif w > o_max[k]:
                        o_max[k] = w
                    o_off[r] = nd & mask
                    o_w[r] = w
                    r += 1
                    c += 1
        o_cnt[k] = c - 1
    return k + 1, r
