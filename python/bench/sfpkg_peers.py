"""Rows of the shufflefs Python package for the peer harness (../shared/bench-peers).

run_peers.sh copies the harness, puts this file beside it and has bench_peers.py call
``register(globals())``; each peer follows the harness's contract (a function of ``ctx``
yielding ``(B, T)`` arrays, ``ctx.mark("imported")`` after the imports, ``ctx.mark("ready")``
once the first read can start).

- ``pkg_mount``: ``shufflefs.Mount`` over $SHUFFLEFS_MOUNT (world 1) / $SHUFFLEFS_MOUNT_W8,
  ``iter_steps(buffers=2)`` (a ring of two arrays: the harness is done with a batch before
  it asks for the next).
- ``pkg_mount_fresh``: the same with a fresh array per step.
- ``pkg_inproc``: ``shufflefs.Dataset`` over $SHUFFLEFS_DATASET (the raw shards packed
  ``--in-place``) in this process, no FUSE, same plan as the mounts; compare with
  ``numpy_pread`` (the same windows' bytes, os.preadv per window).
"""

import os


def _mount(ctx):
    var = "SHUFFLEFS_MOUNT" if ctx.world == 1 else f"SHUFFLEFS_MOUNT_W{ctx.world}"
    return os.environ[var]


def peer_pkg_mount(ctx, buffers=2):
    import shufflefs

    ctx.mark("imported")
    m = shufflefs.Mount(_mount(ctx))
    it = m.iter_steps(rank=ctx.rank, stop=(1, 0), buffers=buffers)
    ctx.mark("ready")
    for batch in it:
        yield batch.data


def peer_pkg_mount_fresh(ctx):
    return peer_pkg_mount(ctx, buffers=None)


def peer_pkg_inproc(ctx):
    import shufflefs

    ctx.mark("imported")
    d = shufflefs.Dataset(
        os.environ["SHUFFLEFS_DATASET"],
        window=ctx.T,
        batch_size=ctx.B,
        ranks=ctx.world,
        seed=ctx.seed,
    )
    it = d.iter_steps(rank=ctx.rank, stop=(1, 0), buffers=2)
    ctx.mark("ready")
    for batch in it:
        yield batch.data


def register(ns):
    """Adds the peers to the harness module's namespace ``ns``."""
    peers = {
        "pkg_mount": peer_pkg_mount,
        "pkg_mount_fresh": peer_pkg_mount_fresh,
        "pkg_inproc": peer_pkg_inproc,
    }
    ns["PEER_FNS"].update(peers)
    ns["ALL_PEERS"].extend(peers)
    files = ns["peer_files"]

    def peer_files(ddir, name, meta):
        # The package reads the raw shards (through the mount or in-process): warm those.
        return files(ddir, "shufflefs" if name in peers else name, meta)

    ns["peer_files"] = peer_files
