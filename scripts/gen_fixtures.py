#!/usr/bin/env python3
"""Writes the golden .npy files in tests/fixtures with numpy itself.

Run by hand (needs numpy); the outputs are committed. The Rust tests compare shufflefs's
.npy encoder with these files byte for byte, so any drift from numpy's header rules shows.
"""
import pathlib

import numpy as np

out = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"
out.mkdir(parents=True, exist_ok=True)
np.save(out / "step_u4_4x6.npy", (np.arange(24, dtype="<u4") * 7).reshape(4, 6))
np.save(out / "step_u1_3x5.npy", np.arange(15, dtype="|u1").reshape(3, 5))
np.save(out / "step_i8_2x3.npy", np.array([[-1, 2, -3], [4, -5, 6]], dtype="<i8"))
np.save(out / "tokens_u2_1d.npy", np.arange(1000, dtype="<u2"))
tc = np.zeros(5, dtype=[("token", "<u4"), ("concept", "<u2")])
tc["token"] = np.arange(5) * 3
tc["concept"] = np.arange(5) + 100
np.save(out / "structured_tc_1d.npy", tc)
print(f"wrote fixtures to {out} with numpy {np.__version__}")
