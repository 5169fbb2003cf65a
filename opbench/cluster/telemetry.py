"""One GPU's clocks, temperature, power and throttle reasons, through NVML (``nvidia-ml-py``) or AMD SMI
(``amdsmi``) when installed — both optional extras. Without them, or on a CPU, every field stays empty and
``error`` says why: telemetry never fails a run. No torch import; the caller passes the device's identity.

Throttle reasons are NVML's documented ``nvmlClocksEventReason*`` bits (``nvmlClocksThrottleReason*`` before
NVML 12). A GPU is *flagged* when a reason that costs performance without being the normal operating point is
set: hardware slowdown, thermal slowdown (software or hardware) or power-brake. Hitting the software power cap
is how a loaded H100 normally runs, so it is reported but not flagged. AMD SMI's violation status (MI300 and
later, ``amdsmi_get_violation_status``) says which limit is active: a thermal one (PROCHOT, socket, voltage
regulator, HBM) is flagged, the package power cap (PPT) is reported like NVIDIA's power cap. Where it is missing,
the GPU metrics table's ``throttle_status`` (true/false, or a bit field on older firmware) is reported and flagged
when set. AMD SMI writes "N/A" (or UINT_MAX) for values a part does not report; those stay empty. Each metric is
read on its own: one the driver lacks leaves its cell empty, named in ``error``, and the others are kept.
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
# AMD SMI violation status (amdsmi_get_violation_status): active_* flag -> reported name.
AMD_VIOLATIONS = {
    "active_prochot_thrm": "prochot_thermal",
    "active_socket_thrm": "socket_thermal",
    "active_vr_thrm": "vr_thermal",
    "active_hbm_thrm": "hbm_thermal",
    "active_ppt_pwr": "ppt_power_cap",
    "active_gfx_clk_below_host_limit": "gfx_clock_below_host_limit",
}
FLAGGED = {
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "amd_throttle",
    "prochot_thermal",
    "socket_thermal",
    "vr_thermal",
    "hbm_thermal",
}


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


# What AMD SMI's structures hold for a value the part does not report (UINT16/32/64_MAX): its Python binding turns
# only 0xFFFF into "N/A", so MI200's unsupported current_socket_power read 4,294,967,295 W.
AMD_UNSUPPORTED = (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)


def _number(value: Any) -> float | None:
    """A reading as a float; None for AMD SMI's "N/A" or "not supported" values and anything that is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value in AMD_UNSUPPORTED:
        return None
    return float(value)


def _fields(r: Reading, reads: dict[str, Any]) -> Reading:
    """Each field of ``r`` read on its own: a metric the driver or part does not offer (an NVML call older drivers
    lack, an AMD sensor a part has not) leaves that cell empty and is named in ``error``, never the others."""
    missed = []
    for name, read_one in reads.items():
        try:
            setattr(r, name, read_one())
        except Exception as exc:  # noqa: BLE001 - a library refusal is one empty cell
            missed.append(f"{name}: {type(exc).__name__}: {' '.join(str(exc).split())[:80]}")
    r.error = "; ".join(missed)
    return r


def _nvml_handle(pynvml: Any, uuid: str, pci_bus_id: str, index: int | None) -> Any:
    """The GPU's NVML handle: by UUID (immune to CUDA_VISIBLE_DEVICES), else by PCI bus id — which also covers a
    MIG instance, whose UUID NVML's device lookup does not know (the bus id gives its parent GPU, the one whose
    clocks and power there are). By index only when neither is known: torch's index is not NVML's under
    CUDA_VISIBLE_DEVICES, and reading another GPU would be worse than an error."""
    tries = []
    if uuid:
        tries.append(
            lambda: pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        )
    if pci_bus_id:
        tries.append(lambda: pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id))
    if index is not None and not tries:  # torch's index is NVML's only without CUDA_VISIBLE_DEVICES: last resort
        tries.append(lambda: pynvml.nvmlDeviceGetHandleByIndex(index))
    for i, look_up in enumerate(tries):
        try:
            return look_up()
        except pynvml.NVMLError:
            if i == len(tries) - 1:
                raise
    return None


def _nvml(uuid: str, pci_bus_id: str, index: int | None) -> Reading:
    import pynvml  # nvidia-ml-py

    pynvml.nvmlInit()
    try:
        handle = _nvml_handle(pynvml, uuid, pci_bus_id, index)
        if handle is None:
            return Reading("nvml", error="no way to find this GPU in NVML (no UUID, bus id or index)")

        def throttle() -> list[str]:
            try:  # NVML 12+ (driver R535+); the binding has the name either way, an older driver not the symbol
                bits = pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
            except (AttributeError, pynvml.NVMLError):
                bits = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
            return decode_nvml_reasons(int(bits))

        return _fields(
            Reading("nvml"),
            {
                "sm_clock_mhz": lambda: float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                "mem_clock_mhz": lambda: float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
                "temperature_c": lambda: float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
                "power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                "power_limit_w": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
                "throttle": throttle,
            },
        )
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
        power: dict[str, Any] = {}

        def power_w() -> float | None:
            power.update(amdsmi.amdsmi_get_power_info(handle))
            watts = [_number(power.get(k)) for k in ("current_socket_power", "average_socket_power")]
            return next((w for w in watts if w), None)  # MI300X reports the current, older parts the average

        def power_limit_w() -> float | None:
            limit = _number(power.get("power_limit"))
            return limit / (1e6 if limit > 1e5 else 1) if limit else None  # µW (hwmon) or W

        return _fields(
            Reading("amdsmi"),
            {
                "sm_clock_mhz": lambda: _number(
                    amdsmi.amdsmi_get_clock_info(handle, amdsmi.AmdSmiClkType.GFX).get("clk")
                ),
                "mem_clock_mhz": lambda: _number(
                    amdsmi.amdsmi_get_clock_info(handle, amdsmi.AmdSmiClkType.MEM).get("clk")
                ),
                "temperature_c": lambda: _number(
                    amdsmi.amdsmi_get_temp_metric(
                        handle, amdsmi.AmdSmiTemperatureType.HOTSPOT, amdsmi.AmdSmiTemperatureMetric.CURRENT
                    )
                ),
                "power_w": power_w,
                "power_limit_w": power_limit_w,
                "throttle": lambda: _amd_throttle(amdsmi, handle),
            },
        )
    finally:
        amdsmi.amdsmi_shut_down()


def _amd_throttle(amdsmi: Any, handle: Any) -> list[str]:
    """Active limits from the violation status; else the metrics table's throttle_status; else nothing."""
    try:
        status = amdsmi.amdsmi_get_violation_status(handle)
    except Exception:  # noqa: BLE001 - older amdsmi (no such call) or a part without it
        status = None
    if isinstance(status, dict):
        return [name for key, name in AMD_VIOLATIONS.items() if status.get(key) is True]
    try:
        throttle = amdsmi.amdsmi_get_gpu_metrics_info(handle).get("throttle_status")
    except Exception:  # noqa: BLE001 - older amdsmi / firmware: no metrics table
        return []
    if throttle is True:
        return ["amd_throttle"]
    if isinstance(throttle, int) and not isinstance(throttle, bool) and throttle:
        return [f"amd_throttle=0x{throttle:x}"]
    return []


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
