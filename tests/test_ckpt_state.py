"""The checkpoint benchmark's state: exact sizes, FSDP-style dim-0 shards, reproducible contents, verification."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from opbench.ckpt.runner import bandwidth_mibps
from opbench.ckpt.state import (
    ShardedState,
    StateSpec,
    TensorSpec,
    deterministic_tensor,
    model_state_spec,
    shard_range,
    synthetic_state_spec,
    tensor_seed,
    with_num_layers,
)
from opbench.core.errors import UsageError, describe_os_error
from opbench.models import load_model_configs, select_models
from opbench.models.params import parameter_shapes

CPU = torch.device("cpu")


@given(dim0=st.integers(0, 300), world=st.integers(1, 16))
def test_shard_range_matches_torch_chunk_and_dtensor(dim0, world):
    chunks = torch.arange(dim0).chunk(world) if dim0 else []
    for rank in range(world):
        start, length = shard_range(dim0, rank, world)
        if rank < len(chunks):
            assert (start, length) == (int(chunks[rank][0]) if length else start, len(chunks[rank]))
        else:
            assert length == 0
    assert sum(shard_range(dim0, r, world)[1] for r in range(world)) == dim0


@settings(max_examples=40, deadline=None)
@given(mib=st.floats(0.001, 2048), dtype=st.sampled_from(["bf16", "fp32"]))
def test_size_mb_state_is_exact_and_made_of_layers(mib, dtype):
    elt = 2 if dtype == "bf16" else 4
    total = int(mib * 2**20) // elt * elt
    spec = synthetic_state_spec(total, dtype)
    assert spec.total_bytes == total
    if total >= 4 * 2**20:  # big enough for whole decoder layers: realistic 2-D projections dominate
        assert any(t.key.endswith("mlp.down_proj.weight") for t in spec.tensors)
        two_d = sum(t.nbytes for t in spec.tensors if len(t.shape) == 2)
        assert two_d / total > 0.99


def test_model_state_has_params_master_weights_and_adam_moments():
    cfg = with_num_layers(select_models(load_model_configs(), "Llama2_7B")[0], 1)
    params = parameter_shapes(cfg)
    n = sum(math.prod(p.shape) for p in params)
    spec = model_state_spec(cfg, "adam", "bf16")
    assert spec.master_weights and spec.num_layers == 1
    assert len(spec.tensors) == 4 * len(params)
    assert spec.total_bytes == n * (2 + 4 + 4 + 4)
    keys = {t.key for t in spec.tensors}
    assert "model.model.layers.0.mlp.down_proj.weight" in keys
    assert "optim.state.model.layers.0.mlp.down_proj.weight.exp_avg_sq" in keys
    sgd = model_state_spec(cfg, "sgd", "fp32")  # fp32 params: no separate master copy
    assert not sgd.master_weights and sgd.total_bytes == n * (4 + 4)
    with pytest.raises(UsageError, match="optimizer"):
        model_state_spec(cfg, "lion", "bf16")


def test_world_shards_add_up_to_the_whole_state():
    spec = synthetic_state_spec(3 * 2**20 + 6, "bf16")
    for world in (1, 2, 3, 8):
        assert sum(spec.local_bytes(r, world) for r in range(world)) == spec.total_bytes


def test_contents_are_reproducible_per_key_and_rank():
    a = deterministic_tensor((7, 5), "bf16", tensor_seed("w", 0), CPU)
    b = deterministic_tensor((7, 5), "bf16", tensor_seed("w", 0), CPU)
    c = deterministic_tensor((7, 5), "bf16", tensor_seed("w", 1), CPU)
    assert a.dtype == torch.bfloat16 and torch.equal(a, b) and not torch.equal(a, c)
    assert a.abs().max() <= 1


def test_verify_catches_one_flipped_bit_a_missing_tensor_and_a_wrong_shape():
    spec = StateSpec("t", (TensorSpec("a", (6, 4), "fp32"), TensorSpec("b", (3,), "bf16")))
    state = ShardedState.build(spec, 1, 2, CPU)
    assert state.tensors["a"].shape == (3, 4) and state.tensors["b"].shape == (1,)
    good = {k: v.clone() for k, v in state.tensors.items()}
    assert state.verify(good) == []
    flipped = dict(good, a=good["a"].clone())
    flipped["a"].view(torch.int32)[2, 3] ^= 1
    assert "contents differ" in state.verify(flipped)[0]
    assert "missing" in state.verify({"a": good["a"]})[0]
    assert "loaded as" in state.verify(dict(good, b=torch.zeros(2, dtype=torch.bfloat16)))[0]
    state.scramble()
    assert len(state.verify(state.tensors)) == 2
    state.regenerate()
    assert state.verify(state.tensors) == []


def test_bandwidth_is_mib_per_second_and_empty_without_data():
    assert bandwidth_mibps(3 * 2**20, 1.5) == 2.0
    assert bandwidth_mibps(None, 1.0) is None and bandwidth_mibps(10, 0.0) is None


def test_disk_full_reads_as_disk_full():
    import errno

    assert describe_os_error(OSError(errno.ENOSPC, "No space left on device", "/x/y")).startswith("disk full")


class _NoRanks:
    def barrier(self) -> None:
        pass


class _SlowAsync:
    """An async method whose background write takes 0.3 s."""

    name, async_type = "fake_async", "thread"

    def save(self, state, storage, path, opts):
        import threading
        from concurrent.futures import Future

        from opbench.ckpt.methods import PendingSave

        fut: Future = Future()
        threading.Timer(0.3, fut.set_result, args=(None,)).start()
        return PendingSave(fut)


@pytest.mark.parametrize("interval, overlapped", [(0.0, False), (0.05, True), (0.8, False)])
def test_async_total_time_is_when_the_save_finished_and_overlap_sets_accurate(interval, overlapped):
    from opbench.ckpt.methods import SaveOptions
    from opbench.ckpt.runner import Case, _save_once
    from opbench.ckpt.storage import Storage

    state = ShardedState.build(StateSpec("t", (TensorSpec("a", (2, 2), "fp32"),)), 0, 1, CPU)
    case = Case(0, Storage("/tmp"), _SlowAsync(), 1)
    block, total, over, phases = _save_once(_NoRanks(), state, case, "/tmp/x", SaveOptions(), interval)
    assert block < 0.25 and 0.29 < total < 0.7  # not the 0.8 s of simulated training
    assert over is overlapped and phases is None  # no DCP writer inside: no phases


def test_phases_partition_the_save():
    """Phases from a save's marks add up to end - start; sync saves (no staging mark) have no staging phase."""
    from opbench.ckpt.methods import SaveMarks
    from opbench.ckpt.runner import save_phases

    assert save_phases(10.0, SaveMarks(stage_end=10.5, write_start=10.7, write_end=11.6), 12.0) == pytest.approx(
        {"staging": 0.5, "planning": 0.2, "writing": 0.9, "finishing": 0.4}
    )
    sync = save_phases(10.0, SaveMarks(write_start=10.1, write_end=10.9), 11.0)
    assert sync is not None and sync["staging"] is None
    assert sum(v for v in sync.values() if v is not None) == pytest.approx(1.0)
    assert save_phases(10.0, None, 11.0) is None and save_phases(10.0, SaveMarks(), 11.0) is None


def _counting_stager(made: list, events: list | None = None):
    """opbench's ReusableStager, counting its stagings and recording open/close."""
    from opbench.ckpt.methods import ReusableStager

    class CountingStager(ReusableStager):
        def __init__(self, device, pin_memory):
            super().__init__(device, pin_memory)
            self.staged, self.n = 0, len(made)
            made.append(self)
            if events is not None:
                events.append(f"open {self.n}")

        def stage(self, state_dict):
            self.staged += 1
            return super().stage(state_dict)

        def close(self):
            if events is not None:
                events.append(f"close {self.n}")
            super().close()

    return CountingStager


def test_one_stager_stages_the_same_dtensor_state_again_and_again_into_the_same_buffers():
    """Issue 23: on a GPU, dcp_async failed with ``KeyError: <class 'type'>`` because torch 2.11's DefaultStager
    empties its deep-copy table after each staging, so a reused stager cannot stage twice. This is the GPU's code
    path with pinning off: the real state dict (DTensors over a gloo mesh), staged three times by one stager,
    each copy equal to the state at that moment and in the buffers of the first staging (allocated once)."""
    from opbench.ckpt.methods import DcpAsync, ReusableStager
    from opbench.core import dist

    ranks = dist.Ranks.join(dist.single(), "cpu", 60)
    method = DcpAsync()
    try:
        state = ShardedState.build(
            StateSpec("s", (TensorSpec("a", (8, 4), "fp32"), TensorSpec("b", (6,), "bf16"))), 0, 1, CPU
        )
        stager = method._stager_for_state(state)
        assert isinstance(stager, ReusableStager) and not stager.pinned
        assert method.staging(CPU) == "host memory (pageable)"
        pointers = None
        for round_ in range(3):
            state.tensors["a"].fill_(round_)
            staged = stager.stage(state.dcp_state_dict())
            assert set(staged) == {"a", "b"}
            local = {k: v.to_local() for k, v in staged.items()}
            assert torch.equal(local["a"], torch.full((8, 4), float(round_))) and torch.equal(
                local["b"], state.tensors["b"]
            )
            assert all(local[k].data_ptr() != state.tensors[k].data_ptr() for k in local)  # a copy, not a view
            ptrs = {k: v.data_ptr() for k, v in local.items()}
            assert pointers is None or ptrs == pointers
            pointers = ptrs
    finally:
        method.close_stager()
        ranks.stop()


def test_a_reused_async_stager_is_kept_per_state_staged_before_timing_and_unwrapped(tmp_path, monkeypatch):
    """dcp_async stages through one ReusableStager per state and case, on a CPU as on a GPU (pinned there), over
    two cases on one state: prepare() stages the real state after the warm-up and before timing (else the first
    timed save allocates and pins the whole state), the case's saves reuse that stager, each save gives it its own
    stage back (else the timing wrappers nest, one more per save), and the case's end frees it."""
    from opbench.ckpt import methods
    from opbench.ckpt.methods import DcpAsync
    from opbench.ckpt.runner import Case, RunOptions, run_case, warm_up_state
    from opbench.ckpt.storage import Storage
    from opbench.core import dist

    made: list = []
    monkeypatch.setattr(methods, "ReusableStager", _counting_stager(made))
    method = DcpAsync()
    ranks = dist.Ranks.join(dist.single(), "cpu", 60)
    try:
        tiny = warm_up_state(ranks)
        state = ShardedState.build(StateSpec("s", (TensorSpec("a", (64, 256), "fp32"),)), 0, 1, ranks.device)
        run = RunOptions(iterations=3, sync_files=False)
        for name in ("c1", "c2"):
            case = Case(0, Storage(str(tmp_path / "data")), method, 1)
            result = run_case(ranks, state, case, str(tmp_path / "data" / name), run, tiny)
            assert not result.problems and len(result.phases) == 3
            assert all(p is not None and p["staging"] is not None for p in result.phases)
        # per case: the warm-up's stager (its one save), then the state's, staged by prepare and each of 3 saves
        assert [s.staged for s in made] == [1, 1 + 3, 1, 1 + 3]
        assert all("stage" not in vars(s) for s in made)
        assert method._stager is None  # freed when each case ended: the staged copy does not outlive its case
    finally:
        method.close_stager()
        ranks.stop()


def test_a_state_s_pinned_stager_is_closed_before_the_next_state_is_built(tmp_path, monkeypatch):
    """With two states (--size-mb 1,2) a stager holds its state — on a GPU its tensors and a pinned host copy —
    until closed; it must be closed when its case ends, not kept while later cases or the next state run."""
    from opbench.ckpt import methods
    from opbench.ckpt.__main__ import main

    events: list[str] = []
    monkeypatch.setattr(methods, "ReusableStager", _counting_stager([], events))
    args = ["--size-mb", "1,2", "--methods", "dcp_async", "--no-raw", "--iterations", "1", "--device", "cpu"]
    args += ["--storage", str(tmp_path / "data"), "--report-dir-path", str(tmp_path / "out")]
    assert main(args) == 0
    # per state: the warm-up's tiny state's stager, closed when prepare() opens the state's, closed at the case's end
    assert events == ["open 0", "close 0", "open 1", "close 1", "open 2", "close 2", "open 3", "close 3"], events
