"""The per-rank placement decision (phalanx.runtime.placement.plan): a pure function of the
flags and of the machine (local rank, ranks, CUDA devices, cores), so every GPU layout is
checked here without a GPU. The CLI's one-line errors are checked in tests/e2e."""

import pytest

from phalanx.errors import ConfigError
from phalanx.parallel.registry import STRATEGIES, spec
from phalanx.runtime.placement import (
    NCCL_WITH_HOST,
    DeviceSupport,
    data_fits,
    parse_device,
    plan,
)

PS = spec("asp").device


def test_cpu_threads_share_the_cores():
    p = plan("cpu", compute_rank=1, compute_ranks=4, processes=4, cores=16)
    assert (p.device, p.backend, p.threads) == ("cpu", "gloo", 4)
    assert not (p.shares_gpu or p.host_staging or p.data_on_device or p.is_cuda)
    assert plan("cpu", processes=3, cores=2).threads == 1  # never 0
    assert plan("cpu", processes=8, cores=16, worker_threads=3).threads == 3  # override


@pytest.mark.parametrize("rank", range(4))
def test_ranks_sharing_one_gpu_use_gloo_through_host_buffers(rank):
    p = plan("cuda", compute_rank=rank, compute_ranks=4, processes=4, device_count=1,
             cores=16)
    assert p.device == "cuda:0" and p.shares_gpu
    assert p.backend == "gloo" and p.host_staging
    assert p.threads == 4


def test_one_gpu_per_rank_uses_nccl_without_staging():
    ps = [plan("cuda", compute_rank=r, compute_ranks=2, processes=2, device_count=4)
          for r in range(2)]
    assert [p.device for p in ps] == ["cuda:0", "cuda:1"]
    assert all(p.backend == NCCL_WITH_HOST and p.uses_nccl and not p.host_staging
               and not p.shares_gpu for p in ps)


def test_more_ranks_than_gpus_wrap_around_and_share():
    ps = [plan("cuda", compute_rank=r, compute_ranks=3, processes=3, device_count=2)
          for r in range(3)]
    assert [p.device for p in ps] == ["cuda:0", "cuda:1", "cuda:0"]
    assert all(p.shares_gpu and p.backend == "gloo" and p.host_staging for p in ps)


def test_a_named_gpu_pins_every_rank():
    p = plan("cuda:1", compute_rank=0, compute_ranks=2, processes=2, device_count=2)
    assert p.device == "cuda:1" and p.shares_gpu and not p.uses_nccl
    solo = plan("cuda:1", compute_ranks=1, device_count=2)
    assert solo.device == "cuda:1" and not solo.shares_gpu


def test_forcing_gloo_on_distinct_gpus_stages_through_host():
    p = plan("cuda", "gloo", compute_rank=1, compute_ranks=2, processes=2, device_count=2)
    assert p.device == "cuda:1" and p.backend == "gloo" and p.host_staging


def test_parameter_server_shards_stay_on_cpu_and_ps_never_uses_nccl():
    server = plan("cuda", on_cpu=True, compute_ranks=2, processes=3, device_count=2,
                  strategy_support=PS)
    assert server.device == "cpu" and not server.host_staging
    worker = plan("cuda", compute_rank=1, compute_ranks=2, processes=3, device_count=2,
                  strategy_support=PS)
    assert worker.device == "cuda:1" and worker.backend == "gloo" and worker.host_staging
    with pytest.raises(ConfigError, match="--backend nccl: this strategy's traffic needs gloo"):
        plan("cuda", "nccl", compute_ranks=2, device_count=2, strategy_support=PS)


def test_errors_name_the_flag():
    with pytest.raises(ConfigError, match=r"^--device cuda: no CUDA device"):
        plan("cuda", device_count=0)
    with pytest.raises(ConfigError, match=r"^--device cuda:7: this machine has 1 CUDA "
                                          r"device\(s\), cuda:0..cuda:0$"):
        plan("cuda:7", device_count=1)
    with pytest.raises(ConfigError, match=r"^--backend nccl: 2 ranks would share a GPU"):
        plan("cuda", "nccl", compute_ranks=2, device_count=1)
    with pytest.raises(ConfigError, match=r"^--backend nccl: needs --device cuda"):
        plan("cpu", "nccl")
    with pytest.raises(ConfigError, match=r"^--data-on-device yes: needs --device cuda"):
        plan("cpu", data_on_device="yes")
    with pytest.raises(ConfigError, match=r"^--backend: 'mpi' is not one of"):
        plan("cpu", "mpi")
    for bad in ("gpu", "cuda:", "cuda:x", "cpu:0"):
        with pytest.raises(ConfigError, match=r"^--device: .* is not one of cpu, cuda, cuda:K"):
            parse_device(bad)


def test_data_on_device():
    kw = dict(compute_ranks=2, device_count=1)
    assert plan("cuda", **kw, data_fits=True).data_on_device
    assert not plan("cuda", **kw, data_fits=False).data_on_device
    assert plan("cuda", data_on_device="yes", **kw, data_fits=False).data_on_device
    assert not plan("cuda", data_on_device="no", **kw, data_fits=True).data_on_device
    # 188 MB of Fashion-MNIST on an 80 GB GPU shared by 15 ranks fits; by 200 it does not
    assert data_fits(188 << 20, 80 << 30, 15) and not data_fits(188 << 20, 80 << 30, 200)


def test_every_strategy_declares_its_device_support():
    for name in STRATEGIES:
        s = spec(name).device
        assert s.cuda or s.reason, name  # a CUDA path, or one line saying why not
    assert not spec("sandblaster").device.cuda
    assert DeviceSupport().nccl


def test_tensor_parallel_gpu_ranks_are_refused_over_gloo_and_placed_over_nccl():
    # DTensor's collectives take the GPU tensors themselves: over gloo a rank died of
    # SIGSEGV (the GPU check, 2026-11-27), so ranks sharing a GPU or told --backend gloo
    # are refused in one line, before any process starts (check_run calls plan)
    tp = spec("tensor").device
    assert tp.gloo_gpu and all(not spec(n).device.gloo_gpu for n in STRATEGIES if n != "tensor")
    with pytest.raises(ConfigError, match=r"^--device cuda: .*2 ranks would share a GPU: "
                                          r"tensor parallel's DTensor"):
        plan("cuda", compute_ranks=2, processes=2, device_count=1, strategy_support=tp)
    with pytest.raises(ConfigError, match=r"^--device cuda: .*--backend gloo was asked for"):
        plan("cuda", "gloo", compute_ranks=2, processes=2, device_count=2, strategy_support=tp)
    ps = [plan("cuda", compute_rank=r, compute_ranks=2, processes=2, device_count=2,
               strategy_support=tp) for r in range(2)]
    assert [(p.device, p.uses_nccl, p.host_staging) for p in ps] == [
        ("cuda:0", True, False), ("cuda:1", True, False)]
    assert plan("cpu", compute_ranks=2, processes=2, strategy_support=tp).backend == "gloo"
    # the other strategies stage through host buffers on a shared GPU, as before
    assert plan("cuda", compute_ranks=2, processes=2, device_count=1,
                strategy_support=spec("sync").device).host_staging
