from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from worker.model.device import DeviceUnavailableError, PaddleDeviceProbe, choose_device


@dataclass
class FakeProbe:
    """A scripted DeviceProbe; ``allocate_error`` is returned by try_allocate."""

    cuda: bool
    count: int
    allocate_error: str | None = None
    name: str = "Fake GPU 24GB"
    allocate_calls: int = 0

    def compiled_with_cuda(self) -> bool:
        return self.cuda

    def cuda_device_count(self) -> int:
        return self.count

    def device_name(self, index: int) -> str:
        return self.name

    def try_allocate(self, index: int) -> str | None:
        self.allocate_calls += 1
        return self.allocate_error


def no_cuda_build() -> FakeProbe:
    return FakeProbe(cuda=False, count=0)


def cuda_build_no_devices() -> FakeProbe:
    return FakeProbe(cuda=True, count=0)


def cuda_device_failing_allocation() -> FakeProbe:
    return FakeProbe(cuda=True, count=1, allocate_error="OSError: CUDA error 100: no CUDA-capable device")


def working_gpu() -> FakeProbe:
    return FakeProbe(cuda=True, count=2)


def test_cpu_request_never_probes() -> None:
    probe = working_gpu()
    choice = choose_device("cpu", probe)
    assert (choice.kind, choice.paddle_device) == ("cpu", "cpu")
    assert probe.allocate_calls == 0


@pytest.mark.parametrize(
    ("probe", "said"),
    [
        (no_cuda_build, ["no CUDA support", "paddlepaddle-gpu", "SENTIMENT_DEVICE=cpu"]),
        (cuda_build_no_devices, ["sees no CUDA device", "SENTIMENT_DEVICE=cpu"]),
        (cuda_device_failing_allocation, ["CUDA error 100", "Fake GPU 24GB"]),
    ],
    ids=[
        "without_cuda_build_says_install_gpu_wheel",
        "with_no_visible_device",
        "with_failing_device_driver_error",
    ],
)
def test_a_gpu_request_that_cannot_be_served_says_why(
    probe: Callable[[], FakeProbe], said: list[str]
) -> None:
    with pytest.raises(DeviceUnavailableError) as info:
        choose_device("gpu", probe())
    assert [part for part in said if part not in str(info.value)] == []


def test_gpu_request_with_working_gpu() -> None:
    choice = choose_device("gpu", working_gpu())
    assert (choice.kind, choice.paddle_device, choice.name) == ("gpu", "gpu:0", "Fake GPU 24GB")


@pytest.mark.parametrize(
    ("probe", "why"),
    [
        (no_cuda_build(), "no CUDA support"),
        (cuda_build_no_devices(), "sees no CUDA device"),
        (cuda_device_failing_allocation(), "CUDA error 100"),
    ],
)
def test_auto_falls_back_to_cpu_and_says_why(probe: FakeProbe, why: str) -> None:
    choice = choose_device("auto", probe)
    assert (choice.kind, choice.paddle_device) == ("cpu", "cpu")
    assert why in choice.reason


def test_auto_prefers_working_gpu() -> None:
    choice = choose_device("auto", working_gpu())
    assert choice.kind == "gpu"
    assert "auto" in choice.reason


def test_unknown_request_is_rejected() -> None:
    with pytest.raises(ValueError, match="gpu, cpu, auto"):
        choose_device("tpu", working_gpu())  # type: ignore[arg-type]


def test_real_gpu_request_raises_without_cuda_build() -> None:
    """On the CPU wheel (dev machines, CI) ``gpu`` must fail loudly and ``auto`` must pick CPU."""
    probe = PaddleDeviceProbe()
    if probe.compiled_with_cuda():  # a GPU host: then a working device must be chosen by auto
        works = probe.cuda_device_count() > 0 and probe.try_allocate(0) is None
        assert choose_device("auto").kind == ("gpu" if works else "cpu")
        return
    with pytest.raises(DeviceUnavailableError, match="paddlepaddle-gpu"):
        choose_device("gpu")
    choice = choose_device("auto")
    assert choice.kind == "cpu"
    assert "no CUDA support" in choice.reason
