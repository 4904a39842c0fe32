"""Which preset a device is: the name a GPU reports (``torch.cuda.get_device_name``, a
profiler trace's ``deviceProperties``) matched to the preset of its datasheet figures,
whose peak FLOP/s a measured efficiency is a fraction of."""

from __future__ import annotations

__all__ = ["DEVICE_PRESETS", "CPU_PRESET", "preset_of_device"]

#: Device name fragment -> preset; checked in order (GB200 before B200).
DEVICE_PRESETS = {
    "GB200": "gb200-nvl72",
    "B200": "dgx-b200",
    "H200": "hgx-h200",
    "H100": "dgx-h100",
    "A100": "dgx-a100",
}
#: The preset of a CPU run's ranks.
CPU_PRESET = "cpu-localhost"


def preset_of_device(name: str) -> str | None:
    """The preset whose GPU ``name`` is (None for a device no preset describes)."""
    return next((preset for key, preset in DEVICE_PRESETS.items() if key in name), None)
