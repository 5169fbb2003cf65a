"""The collectives, one small table row each: buffers, the call, and the values a checked call must produce.

Like nccl-tests' per-collective files, a row only says what differs: how big the send/receive buffers are
(and how the in-place variant aliases them, as nccl-tests' in-place offsets do), which single-tensor
torch.distributed call runs it, and what every received element must be after the check fill. Sizes,
counts and bandwidth factors come from ``opbench.core.collectives``; timing and reporting live in ``bench``.

Check values are small integers, exact in every dtype down to fp8, so a check compares exactly:
- data-moving collectives send ``h(rank, i) = (5·rank + i) mod M + 1`` — a wrong source rank or offset shows;
- reductions send a one-hot pattern: element g is ``v(g) = (g // n) mod 3 + 1`` on rank ``g mod n`` and 0
  elsewhere, so the sum stays ≤ 3 on any number of ranks, and a lost or doubled contribution shows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

CHUNK = 1 << 24  # elements filled/checked per step, so a check never needs 8 bytes of index per element at once


@dataclass(frozen=True)
class Ctx:
    """What a collective call needs: its group (global ranks in group order), this rank's place in it, and
    the per-rank NCCL ``count``."""

    group: Any  # ProcessGroup, or None for the default group
    ranks: tuple[int, ...]
    rank: int  # index of this process in ``ranks``
    count: int
    dtype: torch.dtype
    device: torch.device
    redop: str = "sum"
    root: int = 0  # index in ``ranks``
    pattern: str = "ring"  # send_recv: "ring" | "pingpong"
    splits: tuple[tuple[int, ...], ...] | None = None  # all_to_all_v: elements group rank i sends group rank j

    @property
    def n(self) -> int:
        return len(self.ranks)

    def send_splits(self) -> list[int]:
        assert self.splits is not None
        return list(self.splits[self.rank])

    def recv_splits(self) -> list[int]:
        assert self.splits is not None
        return [row[self.rank] for row in self.splits]


@dataclass
class Buffers:
    send: torch.Tensor  # what this rank contributes (a view into ``recv`` for in-place variants)
    recv: torch.Tensor  # what this rank ends up with


@dataclass(frozen=True)
class CommOp:
    name: str
    variants: tuple[bool, ...]  # in-place flags the torch API allows
    reduces: bool
    alloc: Callable[[Ctx, bool], Buffers]
    bind: Callable[[Ctx, Buffers], Callable[[], Any]]  # -> the call, ready to repeat
    expected: Callable[[Ctx, torch.Tensor], torch.Tensor]  # recv element index -> value (float32)


# -- check values -----------------------------------------------------------------------------------------
def _modulus(dtype: torch.dtype) -> int:
    return 7 if dtype.itemsize == 1 and dtype.is_floating_point else 127  # fp8 e5m2 is exact to 8


def tagged(ctx: Ctx, rank: int | torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return ((5 * rank + idx) % _modulus(ctx.dtype) + 1).float()


def _onehot_value(ctx: Ctx, g: torch.Tensor) -> torch.Tensor:
    return ((g // ctx.n) % 3 + 1).float()


def reduce_input(ctx: Ctx, g: torch.Tensor) -> torch.Tensor:
    return torch.where(g % ctx.n == ctx.rank, _onehot_value(ctx, g), torch.zeros((), device=g.device))


def reduce_expected(ctx: Ctx, g: torch.Tensor) -> torch.Tensor:
    v = _onehot_value(ctx, g)
    if ctx.redop == "avg":
        return v / ctx.n
    if ctx.redop in ("prod", "min") and ctx.n > 1:
        return torch.zeros_like(v)  # every other rank contributes 0
    return v  # sum, max


def input_values(op: CommOp, ctx: Ctx, idx: torch.Tensor) -> torch.Tensor:
    return reduce_input(ctx, idx) if op.reduces else tagged(ctx, ctx.rank, idx)


def tolerance(ctx: Ctx, expected: torch.Tensor) -> torch.Tensor | float:
    """Exact everywhere except avg, which divides by n (NCCL rounds; integer types truncate)."""
    if ctx.redop != "avg":
        return 0.0
    if not ctx.dtype.is_floating_point:
        return 1.0
    return 2 * torch.finfo(ctx.dtype).eps * expected.abs()


# -- the table -------------------------------------------------------------------------------------------
REDOPS = {"sum": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN", "avg": "AVG"}


def reduce_op(name: str) -> dist.ReduceOp:
    return getattr(dist.ReduceOp, REDOPS[name])


def _zeros(ctx: Ctx, numel: int) -> torch.Tensor:
    return torch.zeros(numel, dtype=ctx.dtype, device=ctx.device)


def _own_chunk(ctx: Ctx, big: torch.Tensor) -> torch.Tensor:
    return big[ctx.rank * ctx.count : (ctx.rank + 1) * ctx.count]


def _single(ctx: Ctx, inplace: bool) -> Buffers:
    buf = _zeros(ctx, ctx.count)
    return Buffers(buf, buf)


def _gather_buffers(ctx: Ctx, inplace: bool) -> Buffers:
    out = _zeros(ctx, ctx.n * ctx.count)
    return Buffers(_own_chunk(ctx, out) if inplace else _zeros(ctx, ctx.count), out)


def _scatter_buffers(ctx: Ctx, inplace: bool) -> Buffers:
    inp = _zeros(ctx, ctx.n * ctx.count)
    return Buffers(inp, _own_chunk(ctx, inp) if inplace else _zeros(ctx, ctx.count))


def _pair(ctx: Ctx, numel: int) -> Buffers:
    return Buffers(_zeros(ctx, numel), _zeros(ctx, numel))


def _alltoallv_buffers(ctx: Ctx, inplace: bool) -> Buffers:
    return Buffers(_zeros(ctx, sum(ctx.send_splits())), _zeros(ctx, sum(ctx.recv_splits())))


def _bind_alltoallv(ctx: Ctx, b: Buffers) -> Callable[[], Any]:
    return partial(
        dist.all_to_all_single,
        b.recv,
        b.send,
        output_split_sizes=ctx.recv_splits(),
        input_split_sizes=ctx.send_splits(),
        group=ctx.group,
    )


def alltoallv_expected(ctx: Ctx, i: torch.Tensor) -> torch.Tensor:
    """Receive element ``i`` comes from the source rank whose block of the receive buffer holds it, at the offset
    of this rank's block in that source's send buffer (nccl-tests' ``AlltoAllvInitData`` expected buffer)."""
    assert ctx.splits is not None
    recv = torch.tensor(ctx.recv_splits(), device=i.device)
    starts = torch.cumsum(recv, 0) - recv  # where each source's block starts in this rank's receive buffer
    src = torch.bucketize(i, torch.cumsum(recv, 0), right=True)  # the block holding element i
    before_me = torch.tensor([sum(row[: ctx.rank]) for row in ctx.splits], device=i.device)  # in each source's send
    return tagged(ctx, src, before_me[src] + i - starts[src])


# torch 2.13 names first; the *_tensor names are what older clusters' torch has.
def all_gather_fn() -> Callable[..., Any]:
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter_fn() -> Callable[..., Any]:
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def sendrecv_peers(ctx: Ctx) -> tuple[int, int]:
    """(send-to, receive-from) as indices in the group: the ring rank→rank+1, or the partner in a ping-pong pair."""
    if ctx.pattern == "pingpong":
        return ctx.rank ^ 1, ctx.rank ^ 1
    return (ctx.rank + 1) % ctx.n, (ctx.rank - 1) % ctx.n


def _bind_send_recv(ctx: Ctx, b: Buffers) -> Callable[[], None]:
    to, frm = sendrecv_peers(ctx)
    if ctx.pattern == "pingpong":  # even ranks serve, odd ranks return: one iteration is one round trip
        send: Callable[[], Any] = partial(dist.send, b.send, ctx.ranks[to], group=ctx.group)
        recv: Callable[[], Any] = partial(dist.recv, b.recv, ctx.ranks[frm], group=ctx.group)
        first, second = (send, recv) if ctx.rank % 2 == 0 else (recv, send)

        def pingpong() -> None:
            first()
            second()

        return pingpong
    ops = [
        dist.P2POp(dist.isend, b.send, ctx.ranks[to], ctx.group),
        dist.P2POp(dist.irecv, b.recv, ctx.ranks[frm], ctx.group),
    ]

    def ring() -> None:
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return ring


# ``bind`` returns the call itself (a functools.partial straight into torch.distributed where possible), so
# the timed loop adds no Python layers of its own between iterations.
OPS: dict[str, CommOp] = {
    op.name: op
    for op in (
        CommOp(
            "all_reduce",
            (True,),
            True,
            _single,
            lambda c, b: partial(dist.all_reduce, b.recv, op=reduce_op(c.redop), group=c.group),
            reduce_expected,
        ),
        CommOp(
            "all_gather",
            (False, True),
            False,
            _gather_buffers,
            lambda c, b: partial(all_gather_fn(), b.recv, b.send, group=c.group),
            lambda c, i: tagged(c, i // c.count, i % c.count),
        ),
        CommOp(
            "reduce_scatter",
            (False, True),
            True,
            _scatter_buffers,
            lambda c, b: partial(_reduce_scatter_fn(), b.recv, b.send, op=reduce_op(c.redop), group=c.group),
            lambda c, i: reduce_expected(c, c.rank * c.count + i),
        ),
        CommOp(
            "all_to_all",
            (False,),
            False,
            lambda c, ip: _pair(c, c.n * c.count),
            lambda c, b: partial(dist.all_to_all_single, b.recv, b.send, group=c.group),
            lambda c, i: tagged(c, i // c.count, c.rank * c.count + i % c.count),
        ),
        CommOp("all_to_all_v", (False,), False, _alltoallv_buffers, _bind_alltoallv, alltoallv_expected),
        CommOp(
            "send_recv",
            (False,),
            False,
            lambda c, ip: _pair(c, c.count),
            _bind_send_recv,
            lambda c, i: tagged(c, sendrecv_peers(c)[1], i),
        ),
        CommOp(
            "broadcast",
            (True,),
            False,
            _single,
            lambda c, b: partial(dist.broadcast, b.recv, c.ranks[c.root], group=c.group),
            lambda c, i: tagged(c, c.root, i),
        ),
    )
}


# -- fill and verify ---------------------------------------------------------------------------------------
def _chunks(numel: int):
    for start in range(0, numel, CHUNK):
        yield start, min(numel, start + CHUNK)


def fill_for_check(op: CommOp, ctx: Ctx, bufs: Buffers) -> None:
    """Receive buffer to zeros, then this rank's check values into its send buffer (which may alias it)."""
    bufs.recv.zero_()
    for s, e in _chunks(bufs.send.numel()):
        idx = torch.arange(s, e, device=ctx.device)
        bufs.send[s:e].copy_(input_values(op, ctx, idx).to(ctx.dtype))


def corrupt(bufs: Buffers) -> None:
    """Test hook: add 1 to this rank's first send element, as a bad link or kernel would."""
    first = bufs.send[:1]
    first.copy_((first.float() + 1).to(first.dtype))


def count_wrong(op: CommOp, ctx: Ctx, bufs: Buffers) -> int:
    """Received elements that differ from what the collective must produce."""
    wrong = 0
    for s, e in _chunks(bufs.recv.numel()):
        expected = op.expected(ctx, torch.arange(s, e, device=ctx.device))
        diff = (bufs.recv[s:e].float() - expected).abs()
        wrong += int((diff > tolerance(ctx, expected)).sum())
    return wrong
