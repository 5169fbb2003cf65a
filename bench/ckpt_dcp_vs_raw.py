"""How close does DCP's save come to the disk? DCP save bandwidth vs a raw sequential write + fsync of the same
bytes to the same directory, interleaved so both see the same machine load.

    python bench/ckpt_dcp_vs_raw.py --size-mb 512 --repeats 5 --dir /nvme/tmp [--thread-count 1,4]

One process (world size 1); the state is opbench.ckpt's --size-mb state (fp32). Bandwidth = bytes / 2^20 / s,
bytes being what each method wrote (DCP's files include its .metadata). Prints medians with p10/p90 and the
DCP/raw ratio of medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import torch

from opbench.ckpt.methods import Dcp, SaveOptions, TorchSave
from opbench.ckpt.runner import bandwidth_mibps
from opbench.ckpt.state import ShardedState, synthetic_state_spec
from opbench.ckpt.storage import Storage, folder_size
from opbench.core.cli import csv_list, positive_int
from opbench.core.dist import Ranks, single
from opbench.core.results import summary_table
from opbench.core.timing import Stats


def raw_write(state: ShardedState, path: str) -> None:
    """Every tensor's bytes, in order, to one file with plain sequential writes, then fsync."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "raw.bin"), "wb", buffering=0) as fh:
        for t in state.tensors.values():
            fh.write(memoryview(t.contiguous().view(-1).view(torch.uint8).numpy()))
        os.fsync(fh.fileno())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mb", type=float, default=512)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--thread-count", type=csv_list(positive_int), default=[1])
    p.add_argument("--dir", default=None, help="directory on the disk to test (default: the system temp dir)")
    args = p.parse_args()

    root = tempfile.mkdtemp(prefix="opbench_dcp_vs_raw_", dir=args.dir)
    storage = Storage(root)
    ranks = Ranks.join(single(), "cpu", 1800.0)
    try:
        state = ShardedState.build(synthetic_state_spec(int(args.size_mb * 2**20), "fp32"), 0, 1, ranks.device)
        state.dcp_state_dict()
        contenders = {
            "raw write+fsync": lambda path: raw_write(state, path),
            "torch_save": lambda path: TorchSave().save(state, storage, path, SaveOptions()).wait(),
        }
        for tc in args.thread_count:
            contenders[f"dcp t{tc}"] = (
                lambda tc: lambda path: Dcp().save(state, storage, path, SaveOptions(thread_count=tc)).wait()
            )(tc)
        for save in contenders.values():  # untimed warm-up of each
            save(os.path.join(root, "warmup"))
            shutil.rmtree(os.path.join(root, "warmup"))
        samples: dict[str, list[float]] = {name: [] for name in contenders}
        sizes: dict[str, int] = {}
        for i in range(args.repeats):
            for name, save in contenders.items():
                path = os.path.join(root, f"{name.replace(' ', '_')}_{i}")
                start = time.perf_counter()
                save(path)
                seconds = time.perf_counter() - start
                sizes[name] = folder_size(storage, path)
                samples[name].append(bandwidth_mibps(sizes[name], seconds))
                shutil.rmtree(path)
        raw = Stats.from_samples(samples["raw write+fsync"]).median
        rows = []
        for name, values in samples.items():
            s = Stats.from_samples(values)
            rows.append(
                dict(
                    method=name,
                    bytes=sizes[name],
                    MiB_per_s=s.median,
                    p10=s.p10,
                    p90=s.p90,
                    repeats=s.iters,
                    vs_raw=s.median / raw,
                )
            )
        print(f"{args.size_mb:g} MiB state, {args.repeats} interleaved repeats, dir {root}")
        print(summary_table(rows, list(rows[0]), floatfmt=".3g"))
    finally:
        ranks.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
