"""parasim's hardware backend: replay a Schedule with torch.distributed, measure it,
and calibrate the model from microbenchmarks.

Runs under torchrun (``python -m hardware.replay``, ``python -m hardware.calibrate``)
on NCCL GPUs or on gloo CPU processes, or is launched on one machine by
``parasim replay`` / ``parasim calibrate``. Needs the ``hardware`` extra (torch).
"""

__all__: list[str] = []
