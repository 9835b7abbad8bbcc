"""Device choice: GPU only when one really works; never a silent CPU fallback for ``gpu``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from worker.errors import ConfigurationError

DeviceKind = Literal["gpu", "cpu"]
RequestedDevice = Literal["gpu", "cpu", "auto"]


class DeviceUnavailableError(ConfigurationError):
    """The requested device cannot be used; the message says what to do about it."""


@dataclass(frozen=True)
class DeviceChoice:
    """Where inference runs: ``kind``, the ``paddle.set_device`` string, why it was chosen, a display name."""

    kind: DeviceKind
    paddle_device: str
    reason: str
    name: str


class DeviceProbe(Protocol):
    """What ``choose_device`` needs to know about the machine's CUDA devices."""

    def compiled_with_cuda(self) -> bool: ...

    def cuda_device_count(self) -> int: ...

    def device_name(self, index: int) -> str: ...

    def try_allocate(self, index: int) -> str | None:
        """Run a tiny tensor op on GPU ``index``; return an error message, or None if it worked."""
        ...


class PaddleDeviceProbe:
    """The real probe, asking the installed Paddle build."""

    def compiled_with_cuda(self) -> bool:
        import paddle

        return bool(paddle.device.is_compiled_with_cuda())

    def cuda_device_count(self) -> int:
        import paddle

        try:
            return int(paddle.device.cuda.device_count())
        except Exception:  # noqa: BLE001 - a broken driver shows up here; treat as no device
            return 0

    def device_name(self, index: int) -> str:
        import paddle

        try:
            return str(paddle.device.cuda.get_device_name(index))
        except Exception:  # noqa: BLE001
            return f"gpu:{index}"

    def try_allocate(self, index: int) -> str | None:
        import paddle

        try:
            x = paddle.to_tensor([1.0, 2.0], place=paddle.CUDAPlace(index))
            total = float((x * 2.0).sum().numpy())
        except Exception as exc:  # noqa: BLE001 - any failure means the GPU is unusable
            return f"{type(exc).__name__}: {exc}".strip()
        if total != 6.0:
            return f"a test computation on gpu:{index} returned {total}, expected 6.0"
        return None


def _gpu_problem(probe: DeviceProbe) -> tuple[str | None, str]:
    """Return (problem, device name); problem is None when gpu:0 works."""
    if not probe.compiled_with_cuda():
        return "this Paddle build has no CUDA support (paddlepaddle CPU wheel)", ""
    count = probe.cuda_device_count()
    if count <= 0:
        return (
            "Paddle has CUDA support but sees no CUDA device (driver missing or CUDA_VISIBLE_DEVICES empty?)",
            "",
        )
    name = probe.device_name(0)
    error = probe.try_allocate(0)
    if error is not None:
        return f"a test tensor op on gpu:0 ({name}) failed: {error}", name
    return None, name


def choose_device(requested: RequestedDevice, probe: DeviceProbe | None = None) -> DeviceChoice:
    """Pick the inference device.

    ``cpu`` always gives CPU. ``gpu`` gives gpu:0 if it works, else raises DeviceUnavailableError with a
    remedy. ``auto`` gives gpu:0 if it works, else CPU, and the reason says why.
    """
    if requested not in ("gpu", "cpu", "auto"):
        raise ValueError(f"device must be one of gpu, cpu, auto; got {requested!r}")
    if requested == "cpu":
        return DeviceChoice(
            kind="cpu", paddle_device="cpu", reason="SENTIMENT_DEVICE=cpu requested", name="cpu"
        )
    probe = probe if probe is not None else PaddleDeviceProbe()
    problem, name = _gpu_problem(probe)
    if problem is None:
        reason = (
            "SENTIMENT_DEVICE=gpu requested and gpu:0 works"
            if requested == "gpu"
            else ("auto: a working CUDA device was found")
        )
        return DeviceChoice(kind="gpu", paddle_device="gpu:0", reason=reason, name=name or "gpu:0")
    if requested == "gpu":
        remedy = (
            "install paddlepaddle-gpu matching your CUDA, or set SENTIMENT_DEVICE=cpu"
            if not probe.compiled_with_cuda()
            else "check the NVIDIA driver and CUDA_VISIBLE_DEVICES, or set SENTIMENT_DEVICE=cpu"
        )
        raise DeviceUnavailableError(f"SENTIMENT_DEVICE=gpu but {problem}: {remedy}")
    return DeviceChoice(
        kind="cpu", paddle_device="cpu", reason=f"auto: using CPU because {problem}", name="cpu"
    )


def activate(choice: DeviceChoice) -> None:
    """Make ``choice`` Paddle's current device (``paddle.set_device``)."""
    import paddle

    paddle.set_device(choice.paddle_device)
