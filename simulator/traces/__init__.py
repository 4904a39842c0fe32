"""Real runs in: PyTorch profiler (Kineto) traces read, their kernels classified into
parasim's op kinds, and what they measured turned into a calibration profile
(``parasim calibrate --from-trace``) or set beside a prediction (``parasim compare``)."""
