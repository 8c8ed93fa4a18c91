"""FLOP counting on the meta device and the dense peak table."""

from __future__ import annotations

import pytest

import traintel
from traintel import callbacks
from traintel._host.flops import FlopCount, measure_flops, peak_flops_for, transformer_flops_per_token

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional


class Block(nn.Module):  # type: ignore[misc]
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(dim, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, seq, dim)
        x = x + self.out(attention)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyLM(nn.Module):  # type: ignore[misc]
    def __init__(self, vocab: int = 100, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_transformer_count_is_6n_plus_attention_exactly() -> None:
    batch, seq, dim, layers = 2, 16, 64, 2
    model = TinyLM(dim=dim, layers=layers)
    ids = torch.randint(0, 100, (batch, seq))
    count = measure_flops(model, ids)
    # N = parameters of the matmuls (embedding lookups and norms are not FLOPs of a matmul)
    n = sum(
        p.numel() for name, p in model.named_parameters() if p.dim() == 2 and not name.startswith("embed")
    )
    tokens = batch * seq
    attention = 12 * layers * dim * seq * tokens  # QK^T and AV, forward + backward
    assert count.model_flops == 6 * n * tokens + attention
    assert count.executed_flops == count.model_flops  # no recomputation in this model
    assert count.samples == batch
    assert count.model_flops_per_sample == (6 * n * tokens + attention) / batch
    assert transformer_flops_per_token(n, layers, dim, seq) * tokens == count.model_flops
    # the trap the meta device avoids: on CPU tensors the counter misses SDPA's FLOPs
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        model(ids)
    assert count.forward - counter.get_total_flops() == 4 * layers * dim * seq * tokens


def test_real_model_is_untouched_and_wrappers_unwrapped() -> None:
    model = TinyLM()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()

    class Wrapper(nn.Module):  # type: ignore[misc]  # like DDP: the model is .module
        def __init__(self, module: nn.Module) -> None:
            super().__init__()
            self.module = module

    count = measure_flops(Wrapper(model), torch.randint(0, 100, (3, 8)))
    assert count.samples == 3 and count.forward > 0
    assert not model.training  # mode restored
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_recomputation_shows_up_as_hfu_not_mfu() -> None:
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(TinyLM):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False)
            return self.head(x)

    plain = measure_flops(TinyLM(), torch.randint(0, 100, (2, 16)))
    recomputed = measure_flops(Checkpointed(), torch.randint(0, 100, (2, 16)))
    assert recomputed.model_flops == plain.model_flops
    assert recomputed.executed_flops > plain.executed_flops  # the blocks' forward ran twice


def test_apply_flops_feeds_mfu_and_hfu(pipeline: object) -> None:
    count = FlopCount(forward=100, backward=300, samples=2)  # executed 400, model 300
    traintel.apply_flops(count)
    config = traintel.get_telemetry().config
    assert config.resolve().flops_per_sample == 150
    assert config.resolve().executed_flops_per_sample == 200
    assert config.resolve().flops_method == "counter"


#: Every row of the peak table, by a device name as torch reports it (CUDA, or ROCm through
#: torch.cuda): the dense figure of one column, and the row it must land on.
ROWS = [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5e12, "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "bf16", 756.5e12, "NVIDIA H100 PCIe"),
    ("NVIDIA H100 NVL", "fp8", 1670.5e12, "NVIDIA H100 NVL"),
    ("NVIDIA H200", "bf16", 989.5e12, "NVIDIA H200"),
    ("NVIDIA H200 NVL", "bf16", 835.5e12, "NVIDIA H200 NVL"),
    ("NVIDIA GH200 480GB", "bf16", 989.5e12, "NVIDIA H200"),
    ("NVIDIA H800", "bf16", 989.5e12, "NVIDIA H800"),
    ("NVIDIA H800 PCIe", "bf16", 756.5e12, "NVIDIA H800 PCIe"),
    ("NVIDIA H20", "bf16", 148e12, "NVIDIA H20"),
    ("NVIDIA B200", "bf16", 2.25e15, "NVIDIA B200"),
    ("NVIDIA GB200", "bf16", 2.5e15, "NVIDIA GB200"),
    ("NVIDIA B300 SXM6 AC", "bf16", 2.25e15, "NVIDIA B300"),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312e12, "NVIDIA A100"),
    ("NVIDIA A100 80GB PCIe", "tf32", 156e12, "NVIDIA A100"),
    ("NVIDIA A10G", "bf16", 125e12, "NVIDIA A10G"),
    ("NVIDIA A10", "fp16", 125e12, "NVIDIA A10"),
    ("NVIDIA L4", "bf16", 121e12, "NVIDIA L4"),
    ("NVIDIA L40S", "bf16", 362.05e12, "NVIDIA L40S"),
    ("NVIDIA L40", "bf16", 181.05e12, "NVIDIA L40"),
    ("Tesla V100S-PCIE-32GB", "fp16", 130e12, "NVIDIA V100S PCIe"),
    ("Tesla V100-PCIE-16GB", "fp16", 112e12, "NVIDIA V100 PCIe"),
    ("Tesla V100-SXM2-32GB", "fp16", 125e12, "NVIDIA V100 SXM2"),
    ("Tesla T4", "fp16", 65e12, "NVIDIA T4"),
    ("AMD Instinct MI300X", "bf16", 1307.4e12, "AMD Instinct MI300X"),
    ("AMD Instinct MI325X", "fp8", 2614.9e12, "AMD Instinct MI325X"),
    ("AMD Instinct MI355X", "bf16", 2516.6e12, "AMD Instinct MI355X"),
]


@pytest.mark.parametrize(("name", "dtype", "peak", "source"), ROWS)
def test_dense_peaks_and_substring_traps(name: str, dtype: str, peak: float, source: str) -> None:
    found = peak_flops_for(name, dtype)
    assert found.peak_flops == peak
    assert found.source == f"table: {source} {dtype} dense"


def test_every_row_of_the_table_is_pinned() -> None:
    from traintel._host.flops import _PEAKS

    assert {row[1] for row in _PEAKS} == {source for *_, source in ROWS}


def test_every_row_is_dense_bf16_or_fp16_twice_fp8_and_fp32_below_tf32() -> None:
    """A sparse figure copied by mistake breaks the ratios dense tensor cores keep."""
    from traintel._host.flops import _PEAKS

    for _, name, peaks in _PEAKS:
        half = peaks.get("bf16", peaks["fp16"])
        if "fp8" in peaks:
            assert peaks["fp8"] == pytest.approx(2 * half, rel=0.02), name  # L40S: 733 vs 2 x 362.05
        if "tf32" in peaks:
            assert peaks["tf32"] == pytest.approx(half / 2, rel=0.03), name
        assert peaks["fp32"] < half, name


def test_unknown_device_or_dtype_has_no_peak() -> None:
    assert peak_flops_for("Radeon 9000", "bf16").peak_flops is None
    assert "not in the peak FLOP/s table: set TRAINTEL_PEAK_FLOPS" in (
        peak_flops_for("Radeon 9000", "bf16").reason or ""
    )
    missing = peak_flops_for("NVIDIA A100-SXM4-40GB", "fp8")
    assert missing.peak_flops is None and missing.reason == (
        "NVIDIA A100 has no fp8 peak in the table: set TRAINTEL_PEAK_FLOPS"
    )


def test_mfu_from_the_counter_on_a_real_model(pipeline: object) -> None:
    """measure_flops -> apply_flops -> exact MFU and HFU in the window event."""
    from tests.conftest import Pipeline

    assert isinstance(pipeline, Pipeline)
    model = TinyLM()
    batch = torch.randint(0, 100, (4, 16))
    count = measure_flops(model, batch)
    traintel.configure(
        tracer_provider=pipeline.tracer_provider, meter_provider=pipeline.meter_provider,
        log_every_n_iterations=2, peak_flops=1e9, global_batch_size=4,
    )  # fmt: skip
    traintel.apply_flops(count)
    t0 = 1_700_000_000_000
    callbacks.on_train_start(start_time_msec=t0)
    for i in range(2):
        callbacks.on_training_single_iteration_start(start_time_msec=t0 + 1000 * i)
        loss = model(batch).float().mean()  # a real step in between, timed by the callbacks' clock
        loss.backward()
        callbacks.on_training_single_iteration_end(finish_time_msec=t0 + 1000 * (i + 1))
    callbacks.on_train_end(finish_time_msec=t0 + 2000)
    (update,) = [e for e in pipeline.one("training_loop").events if e.name == "training_metrics_update"]
    attributes = update.attributes or {}
    per_second = count.model_flops_per_sample * 4  # 4 samples per 1 s step
    assert attributes["ml.training.window.flops_per_second_per_device"] == pytest.approx(
        per_second, rel=1e-12
    )
    assert attributes["ml.training.window.mfu"] == pytest.approx(per_second / 1e9, rel=1e-12)
    assert attributes["ml.training.window.hfu"] == pytest.approx(
        per_second / 1e9 * count.executed_flops / count.model_flops, rel=1e-12
    )
    assert attributes["ml.training.mfu.flops_method"] == "counter"
    assert attributes["ml.training.mfu.denominator_peak_flops"] == 1e9


def test_a_loss_with_real_targets_is_told_to_pass_them_and_targets_work() -> None:
    """A loss that captures CPU labels cannot run against the meta output: the error blames the
    loss and says what to do; ``targets=`` moves the labels to meta with the rest."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    batch, labels = torch.randn(5, 8), torch.randint(0, 4, (5,))
    with pytest.raises(RuntimeError, match=r"loss_fn failed .* pass them as targets=") as error:
        measure_flops(model, batch, lambda out: torch.nn.functional.cross_entropy(out, labels))
    assert "the model does not run" not in str(error.value)
    count = measure_flops(model, batch, torch.nn.functional.cross_entropy, targets=labels)
    plain = measure_flops(model, batch)
    # Forward: 2·5·8·16 + 2·5·16·4 = 1,920 FLOPs; backward twice that (input and weight grads,
    # less the first layer's input grad: 2·5·16·4·2 + 2·5·8·16 = 2,560).
    assert (count.forward, count.backward) == (plain.forward, plain.backward) == (1920, 2560)
    assert count.samples == 5
