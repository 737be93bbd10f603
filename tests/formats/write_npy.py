#!/usr/bin/env python3
"""Write token arrays as .npy files with a header, in every header variant a reader meets.

Uses numpy's own writers (numpy.lib.format): `np.save` (format 1.0, the common case),
`write_array(..., version=(2, 0))` and `version=(3, 0)` (4-byte header length; 3.0 is UTF-8),
and `open_memmap` (what streaming writers use). One file is written with the header layout of
older numpy releases (padded to a multiple of 16 bytes, no spare room for growing the shape),
which numpy still reads: a reader must take the data offset from the header length field, never
assume 64 or 128. Also written: a 2-D (rows, T) array (e.g. pre-windowed rows), a big-endian
array and a Fortran-order 2-D array, which a reader must either handle or refuse by name.

Usage: write_npy.py OUT_DIR [--tokens N]
Prints one JSON line: each file with its variant and the token ids in C order.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from numpy.lib import format as npf

from common import emit


def legacy_16(path: str, arr: np.ndarray) -> None:
    """Header as numpy < 1.? wrote it: dict literal + spaces + '\\n', total a multiple of 16."""
    d = npf.header_data_from_array_1_0(arr)
    header = "{" + "".join(f"'{k}': {repr(v)}, " for k, v in sorted(d.items())) + "}"
    hb = header.encode("latin1")
    hlen = len(hb) + 1
    pad = 16 - ((6 + 2 + 2 + hlen) % 16)
    if pad == 16:
        pad = 0
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + (hlen + pad).to_bytes(2, "little") + hb + b" " * pad + b"\n")
        f.write(arr.tobytes("C"))


def write(out_dir: str, n_tokens: int = 3000, seed: int = 6) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    u2 = rng.integers(0, 50257, size=n_tokens, dtype=np.uint16)
    u4 = rng.integers(65536, 200000, size=n_tokens, dtype=np.uint32)
    i8 = rng.integers(0, 150000, size=n_tokens, dtype=np.int64)
    files = []

    def rec(name, variant, arr):
        files.append({"path": os.path.join(out_dir, name), "variant": variant,
                      "dtype": arr.dtype.str, "shape": list(arr.shape),
                      "tokens": [int(x) for x in np.asarray(arr).ravel(order="C")]})

    p = os.path.join(out_dir, "tokens_u2_v1.npy")
    np.save(p, u2)
    rec("tokens_u2_v1.npy", "np.save, format 1.0", u2)
    p = os.path.join(out_dir, "tokens_u4_v2.npy")
    with open(p, "wb") as f:
        npf.write_array(f, u4, version=(2, 0))
    rec("tokens_u4_v2.npy", "write_array version (2, 0)", u4)
    p = os.path.join(out_dir, "tokens_i8_v3.npy")
    with open(p, "wb") as f:
        npf.write_array(f, i8, version=(3, 0))
    rec("tokens_i8_v3.npy", "write_array version (3, 0)", i8)
    p = os.path.join(out_dir, "tokens_u4_memmap.npy")
    mm = npf.open_memmap(p, mode="w+", dtype=np.uint32, shape=(n_tokens,))
    mm[:] = u4
    mm.flush()
    del mm
    rec("tokens_u4_memmap.npy", "open_memmap w+ (format 1.0)", u4)
    p = os.path.join(out_dir, "tokens_u2_legacy16.npy")
    legacy_16(p, u2)
    rec("tokens_u2_legacy16.npy", "legacy header padded to 16 bytes", u2)
    t = 100
    rows = u2[: (n_tokens // t) * t].reshape(-1, t)
    np.save(os.path.join(out_dir, "rows_u2_2d.npy"), rows)
    rec("rows_u2_2d.npy", "2-D (rows, T), C order", rows)
    be = u2.astype(">u2")
    np.save(os.path.join(out_dir, "tokens_u2_bigendian.npy"), be)
    rec("tokens_u2_bigendian.npy", "big-endian >u2", be)
    fo = np.asfortranarray(rows)
    np.save(os.path.join(out_dir, "rows_u2_fortran.npy"), fo)
    rec("rows_u2_fortran.npy", "2-D Fortran order (data on disk is column-major)", fo)
    return {"format": "npy", "writer": f"numpy {np.__version__} numpy.lib.format", "files": files}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--tokens", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=6)
    a = ap.parse_args()
    emit(write(a.out_dir, a.tokens, a.seed))


if __name__ == "__main__":
    main()
