"""One GPU's clocks, temperature, power and throttle reasons, through NVML (``nvidia-ml-py``) or AMD SMI
(``amdsmi``) when installed — both optional extras. Without them, or on a CPU, every field stays empty and
``error`` says why: telemetry never fails a run. No torch import; the caller passes the device's identity.

Throttle reasons are NVML's documented ``nvmlClocksEventReason*`` bits (``nvmlClocksThrottleReason*`` before
NVML 12). A GPU is *flagged* when a reason that costs performance without being the normal operating point is
set: hardware slowdown, thermal slowdown (software or hardware) or power-brake. Hitting the software power cap
is how a loaded H100 normally runs, so it is reported but not flagged. AMD SMI's throttle status is a
vendor-specific bit field; it is reported as a number and flagged when non-zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# NVML clock event / throttle reason bits (nvml.h).
NVML_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
FLAGGED = {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "amd_throttle"}


@dataclass
class Reading:
    source: str = ""  # "nvml" | "amdsmi" | ""
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def flagged(self) -> list[str]:
        return [r for r in self.throttle if r.split("=")[0] in FLAGGED]

    def as_row(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "sm_clock_mhz": self.sm_clock_mhz,
            "mem_clock_mhz": self.mem_clock_mhz,
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
            "power_limit_w": self.power_limit_w,
            "throttle": ";".join(self.throttle),
            "throttle_flagged": ";".join(self.flagged),
            "error": self.error or None,
        }


def decode_nvml_reasons(bits: int) -> list[str]:
    names = [name for bit, name in NVML_REASONS.items() if bits & bit]
    unknown = bits & ~sum(NVML_REASONS)
    return names + ([f"other=0x{unknown:x}"] if unknown else [])


def _nvml(uuid: str, pci_bus_id: str, index: int | None) -> Reading:
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    try:
        handle = None
        if uuid:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        elif pci_bus_id:
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
        elif index is not None:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        if handle is None:
            return Reading("nvml", error="no way to find this GPU in NVML (no UUID, bus id or index)")
        r = Reading("nvml")
        r.sm_clock_mhz = float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        r.mem_clock_mhz = float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM))
        r.temperature_c = float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
        r.power_w = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        r.power_limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)  # NVML 12+; older name below
        reasons = reasons or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        r.throttle = decode_nvml_reasons(int(reasons(handle)))
        return r
    finally:
        pynvml.nvmlShutdown()


def _amdsmi(pci_bus_id: str) -> Reading:
    import amdsmi

    amdsmi.amdsmi_init()
    try:
        handles = amdsmi.amdsmi_get_processor_handles()
        want = pci_bus_id.lower()
        handle = next((h for h in handles if amdsmi.amdsmi_get_gpu_device_bdf(h).lower() == want), None)
        if handle is None:
            return Reading("amdsmi", error=f"no GPU with bus id {pci_bus_id} in AMD SMI")
        r = Reading("amdsmi")
        r.sm_clock_mhz = float(amdsmi.amdsmi_get_clock_info(handle, amdsmi.AmdSmiClkType.GFX)["clk"])
        r.mem_clock_mhz = float(amdsmi.amdsmi_get_clock_info(handle, amdsmi.AmdSmiClkType.MEM)["clk"])
        r.temperature_c = float(
            amdsmi.amdsmi_get_temp_metric(
                handle, amdsmi.AmdSmiTemperatureType.HOTSPOT, amdsmi.AmdSmiTemperatureMetric.CURRENT
            )
        )
        power = amdsmi.amdsmi_get_power_info(handle)
        r.power_w = float(power.get("current_socket_power") or power.get("average_socket_power") or 0) or None
        limit = power.get("power_limit")
        r.power_limit_w = float(limit) / (1e6 if limit and float(limit) > 1e5 else 1) if limit else None  # µW or W
        try:
            status = amdsmi.amdsmi_get_gpu_metrics_info(handle).get("throttle_status")
        except Exception:  # noqa: BLE001 - older amdsmi / firmware: no metrics table
            status = None
        if isinstance(status, int) and status:
            r.throttle = [f"amd_throttle=0x{status:x}"]
        return r
    finally:
        amdsmi.amdsmi_shut_down()


def read(kind: str, uuid: str = "", pci_bus_id: str = "", index: int | None = None) -> Reading:
    """This GPU's reading; ``kind`` is core.device's device kind ("cuda" | "rocm" | "cpu")."""
    if kind == "cpu":
        return Reading(error="no GPU")
    module = "pynvml" if kind == "cuda" else "amdsmi"
    try:
        return _nvml(uuid, pci_bus_id, index) if kind == "cuda" else _amdsmi(pci_bus_id)
    except ImportError:
        how = "pip install 'opbench[nvml]'" if kind == "cuda" else "pip install /opt/rocm/share/amd_smi"
        return Reading(error=f"{module} is not installed ({how})")
    except Exception as exc:  # noqa: BLE001 - a driver/library refusal leaves empty cells, never a failed run
        return Reading(
            module.replace("pynvml", "nvml"), error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        )
