"""The choices the library accepts, in one place and without importing torch: the configs check
against them, and the command line builds its option choices from them."""

PE_OPTIONS = ("sinespe", "convspe", "ape", "sinusoidal", "axial", "none")
SPE_OPTIONS = ("sinespe", "convspe")
ABSOLUTE_PE_OPTIONS = ("ape", "sinusoidal", "axial")  # limited to max_len positions
ATTENTION_OPTIONS = ("favor", "softmax")

MODEL_PRESETS = {  # model sizes by name: ModelConfig.preset(name, vocab_size=…)
    "tiny": dict(n_layers=2, d_model=64, n_heads=4, d_ff=128, n_realizations=16, n_features=32,
                 n_sines=3, kernel_size=16, chunk_size=64, short_conv=4),
    "small": dict(n_layers=6, d_model=256, n_heads=8, d_ff=1024, n_realizations=64, n_features=64,
                  # chunk 64: faster training than 128 on CPU (benchmarks/train_throughput.py)
                  n_sines=5, kernel_size=64, chunk_size=64, short_conv=4),
    "paper": dict(n_layers=24, d_model=512, n_heads=8, d_ff=2048, n_realizations=64, n_features=128,
                  n_sines=5, kernel_size=128, short_conv=4),
}
PRESETS = tuple(MODEL_PRESETS)

TRAIN_PRECISIONS = ("auto", "fp32", "bf16")  # autocast in training (auto: measured, device.pick_dtype)
STEP_PRECISIONS = ("auto", "fp16", "bf16", "fp32")  # the generation step's weights (sampling.auto_step_dtype)
