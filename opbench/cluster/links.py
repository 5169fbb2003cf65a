"""Link peaks the collective and pair results are set against (docs/cluster.md, "Link table", with sources).

Every figure is per GPU and per direction, in GB/s (10^9 bytes/s), the unit nccl-tests' busbw uses:

- intra: a GPU's aggregate scale-up bandwidth to its peers (what a well-run intra-node all_reduce's busbw
  approaches); ``pair``: to ONE peer (the ceiling of a GPU-pair measurement). On NVSwitch systems the two are the
  same; on MI300X/MI325X's fully connected xGMI mesh a peer is one link of seven.
- inter: the node's network rate divided by its GPUs, read from ``/sys/class/infiniband/*/ports/*/rate``
  (InfiniBand and RoCE NICs both appear there) when the platform has it, else unknown unless
  ``--link-peak-gbs inter=…`` says.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass

from opbench.core.errors import UsageError
from opbench.core.peaks import by_part


@dataclass(frozen=True)
class Link:
    name: str
    intra_gbs: float  # aggregate to all peers, per direction
    pair_gbs: float  # to one peer, per direction
    source: str


# Matched in order against the lower-cased device name (as core.device.PEAKS is).
LINKS: list[tuple[str, Link]] = [
    # AMD Instinct MI300X / MI325X: 7 xGMI (Infinity Fabric) links of 64 GB/s per direction to the 7 peers,
    # 896 GB/s aggregate bidirectional (AMD MI300X and MI325X data sheets).
    (
        r"mi325|mi300",
        Link("xGMI (Infinity Fabric), 7 × 64 GB/s", 448.0, 64.0, "AMD Instinct MI300X/MI325X data sheets"),
    ),
    # NVIDIA H100/H200 SXM: NVLink 4, 18 links, 900 GB/s bidirectional per GPU through NVSwitch (data sheets).
    (
        r"h100.*pcie",
        Link("PCIe Gen5 x16 (no NVLink bridge assumed)", 64.0, 64.0, "PCIe 5.0 x16: 64 GB/s per direction"),
    ),
    (r"h100.*nvl|h200.*nvl", Link("NVLink bridge", 300.0, 300.0, "NVIDIA H100 NVL / H200 NVL data sheets: 600 GB/s")),
    (r"h100|h200", Link("NVLink 4 via NVSwitch, 18 links", 450.0, 450.0, "NVIDIA H100/H200 SXM data sheets: 900 GB/s")),
    # AMD Instinct MI350X / MI355X: 7 Infinity Fabric links of 76.8 GB/s per direction (153.6 bidirectional),
    # 1,075.2 GB/s aggregate bidirectional (CDNA 4 architecture).
    (
        r"mi35",
        Link("xGMI (Infinity Fabric), 7 × 76.8 GB/s", 537.6, 76.8, "AMD Instinct MI350X/MI355X: 1,075.2 GB/s"),
    ),
    # NVIDIA B200 / GB200 and B300 / GB300: NVLink 5, 1.8 TB/s bidirectional per GPU through NVSwitch (HGX B200 /
    # B300, GB200 / GB300 NVL72).
    (
        r"b[23]00",
        Link("NVLink 5 via NVSwitch, 18 links", 900.0, 900.0, "NVIDIA HGX B200/B300, GB200/GB300 NVL72: 1.8 TB/s"),
    ),
    (
        r"a100.*pcie",
        Link("PCIe Gen4 x16 (no NVLink bridge assumed)", 32.0, 32.0, "PCIe 4.0 x16: 32 GB/s per direction"),
    ),
    (r"a100", Link("NVLink 3 via NVSwitch, 12 links", 300.0, 300.0, "NVIDIA A100 SXM data sheet: 600 GB/s")),
]


def intra_link(device_name: str) -> Link | None:
    return by_part(LINKS, device_name, None)


# A GPU's link to its host's memory, per direction, GB/s (what activation offloading copies over). Grace superchips
# join CPU and GPU by NVLink-C2C: 900 GB/s bidirectional (NVIDIA GH200 data sheet: one GPU; GB200/GB300 data
# sheets: per superchip of one Grace and two GPUs, so 225 per GPU and direction, an estimate of how the two share
# it). Every other part reaches its host over PCIe: Gen5 x16, 64 GB/s per direction (the A100's Gen4, 32).
HOST_LINKS: list[tuple[str, Link]] = [
    (r"gh200", Link("NVLink-C2C", 450.0, 450.0, "NVIDIA GH200 data sheet: 900 GB/s bidirectional")),
    (
        r"gb[23]00",
        Link("NVLink-C2C (one Grace, two GPUs)", 225.0, 225.0, "NVIDIA GB200/GB300 data sheets: 900 GB/s a superchip"),
    ),
    (r"a100", Link("PCIe Gen4 x16", 32.0, 32.0, "PCIe 4.0 x16: 32 GB/s per direction")),
    (r"", Link("PCIe Gen5 x16", 64.0, 64.0, "PCIe 5.0 x16: 64 GB/s per direction")),
]


# A GPU's share of the network, GB/s per direction, where the node design is not one 400 Gb/s NIC a GPU (50 GB/s:
# DGX H100/H200/B200, GB200 NVL72's ConnectX-7, the MI300X/MI325X/MI355X platforms): Blackwell Ultra's designs give
# each GPU an 800 Gb/s ConnectX-8 SuperNIC (NVIDIA GB300 NVL72 data sheet: 72 of them for 72 GPUs; HGX B300: 8).
NIC_GBS: list[tuple[str, float]] = [(r"b300", 100.0)]  # also matches GB300
DEFAULT_NIC_GBS = 50.0


def nic_gbs_of(device_name: str | None) -> float:
    """The part's network per GPU and direction (NIC_GBS), what --nic-gbs defaults to."""
    return by_part(NIC_GBS, device_name, DEFAULT_NIC_GBS)


def host_link(device_name: str) -> Link:
    """The GPU's link to its host (HOST_LINKS): NVLink-C2C on Grace superchips, else PCIe."""
    low = device_name.lower()
    return next(link for pattern, link in HOST_LINKS if re.search(pattern, low))


_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec")


def nic_gbs(root: str = "/sys/class/infiniband") -> tuple[float, int]:
    """(total network rate of this node in GB/s per direction, number of active ports) from sysfs; (0, 0) when
    there is none. ``rate`` reads e.g. "400 Gb/sec (4X NDR)"; ports whose ``state`` is not ACTIVE are left out."""
    total, ports = 0.0, 0
    for rate_path in sorted(glob.glob(f"{root}/*/ports/*/rate")):
        try:
            with open(rate_path, encoding="ascii", errors="replace") as fh:
                m = _RATE.match(fh.read())
            with open(rate_path.rsplit("/", 1)[0] + "/state", encoding="ascii", errors="replace") as fh:
                active = "ACTIVE" in fh.read()
        except OSError:
            continue
        if m and active:
            total += float(m.group(1)) / 8
            ports += 1
    return total, ports


@dataclass(frozen=True)
class LinkPeaks:
    """The peaks one run uses; None where unknown (the pct column stays empty rather than guessed)."""

    intra: float | None = None
    pair: float | None = None
    inter: float | None = None
    source: str = ""

    def for_scope(self, scope: str) -> float | None:
        return {"intra": self.intra, "inter": self.inter, "world": self.inter, "gpu": self.pair}.get(scope)


def parse_override(text: str) -> dict[str, float]:
    """``--link-peak-gbs intra=450,inter=50`` (a bare number sets all three)."""
    out: dict[str, float] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        key, _, value = item.rpartition("=")
        keys = [key] if key else ["intra", "pair", "inter"]
        for k in keys:
            if k not in ("intra", "pair", "inter"):
                raise UsageError(
                    f"'{item}': expected intra=GBS, pair=GBS, inter=GBS or one number", field="--link-peak-gbs"
                )
        try:
            gbs = float(value)
        except ValueError:
            raise UsageError(f"'{item}': {value!r} is not a number", field="--link-peak-gbs") from None
        if not gbs > 0 or gbs == float("inf"):
            raise UsageError(f"'{item}': must be a positive number of GB/s", field="--link-peak-gbs")
        out.update({k: gbs for k in keys})
    return out


def link_peaks(device_name: str, gpus_per_node: int, override: dict[str, float] | None = None) -> LinkPeaks:
    """This node's peaks: the table for the GPU, sysfs for the network, the user's override over both."""
    link = intra_link(device_name)
    total, ports = nic_gbs()
    inter = total / max(1, gpus_per_node) if total else None
    sources = [f"{link.name} ({link.source})"] if link else []
    if total:
        sources.append(f"{ports} network port(s), {total * 8:g} Gb/s in all (/sys/class/infiniband)")
    peaks = LinkPeaks(link.intra_gbs if link else None, link.pair_gbs if link else None, inter, "; ".join(sources))
    if override:
        peaks = LinkPeaks(
            override.get("intra", peaks.intra),
            override.get("pair", peaks.pair),
            override.get("inter", peaks.inter),
            "; ".join([*sources, "--link-peak-gbs " + ",".join(f"{k}={v:g}" for k, v in override.items())]),
        )
    return peaks
