"""The training recipes behind `--preset`: values that apply wherever a configuration gives none.

- `airbench94`: airbench94 (Jordan 2024, "94% on CIFAR-10 in 3.29 Seconds on a Single GPU", arXiv 2404.00498;
  github.com/KellerJordan/cifar10-airbench), ported from PyTorch to this stage's options.
- `airbench94_muon`: its Muon successor (airbench94_muon.py: 94.01% in 8 epochs).
- `cifar10_speedrun`: the 2025 CIFAR-10 speedrun record's changes to airbench94_muon (hiverge/cifar10-speedrun:
  94.01% in 7.59 epochs), in 7 epochs.
- `fast`: whichever reaches airbench94's accuracy on the JPEG copy here soonest (bench/accuracy.py): the Muon
  recipe from 2026-11-23, `cifar10_speedrun` since 2026-11-26.
- `estimator`: the CIFAR-10 estimator example's ResNet recipe, which is what TrainConfig's defaults already are.
"""

from __future__ import annotations

# airbench94 (Jordan 2024, arXiv 2404.00498; github.com/KellerJordan/cifar10-airbench), ported from PyTorch:
# - its loss is a sum over the batch with lr 11.5 / (1024 (1 + 1 / (1 - 0.85))); ours is the batch mean, so the
#   same steps take lr 11.5 / 7.667 = 1.5 at batch 1024 (and scale with the batch, as airbench's does);
# - its weight decay 0.0153 x 1024 / 7850.67 per step enters the gradient as wd / lr; ours is L2 on the kernels
#   whose gradient is multiplied by our lr, so wd = 0.0019957 / 1.5 = 0.00133 (batch norm biases are not decayed);
# - PyTorch batch-norm momentum 1 - 0.6 is Keras momentum 0.6; the batch-norm biases learn 64x faster.
AIRBENCH94 = {
    "model": "airbench",
    "width_multiplier": 1.0,
    "batch_norm_decay": 0.6,
    "batch_norm_epsilon": 1e-12,
    "label_smoothing": 0.2,
    "batch_size": 1024,
    "in_memory": True,
    "augmentation": "airbench",
    "translate": 2,
    "epochs": 9.9,
    "optimizer": "sgd",
    "learning_rate": 1.5,
    "learning_rate_batch_size": 1024,
    "schedule": "triangular",
    "triangle_start": 0.2,
    "triangle_peak": 0.23,
    "triangle_end": 0.07,
    "momentum": 0.85,
    "nesterov": True,
    "weight_decay": 0.00133,
    "gradient_multipliers": ("bn[12]/beta$=64",),
    "lookahead_every_steps": 5,
    "lookahead_start_epochs": 3.0,
    "lookahead_decay": 0.95,
    "lookahead_decay_power": 3.0,
    "test_time_augmentation": "mirror_translate",
}
# airbench94_muon (Jordan et al. 2024, github.com/KellerJordan/cifar10-airbench, airbench94_muon.py), ported:
# - Muon (momentum 0.6, Nesterov, 3 Newton-Schulz steps, rate 0.24 falling linearly) for the convolution kernels;
#   Nesterov SGD (momentum 0.85) for the rest: the batch-norm offsets and the whitening bias at 0.053, the head at
#   0.67, on a summed loss. Ours is the batch mean, so those rates x 2000: 106 at batch 2000, the head's 0.67 / 0.053
#   = 12.64 times that (a gradient multiplier, which scales the rate and not the decay);
# - its weight decay 2e-6 x 2000 / rate enters each SGD group's gradient, so every group decays by 0.004 x the rate
#   schedule per step; ours adds weight_decay x w to the gradient after the multipliers, so 0.004 / 106 = 3.774e-5,
#   on the biases too (PyTorch decays them);
# - the whitening bias trains for the first 3 epochs, its rate falling to zero over them;
# - batch 2000, 8 epochs, label smoothing 0.2, batch-norm momentum 0.6 (no learned scale), no lookahead; the head
#   initialised to unit standard deviation, logits / 256 (model airbench_muon); 6-view test-time augmentation.
AIRBENCH94_MUON = {
    "model": "airbench_muon",
    "width_multiplier": 1.0,
    "batch_norm_decay": 0.6,
    "batch_norm_epsilon": 1e-12,
    "label_smoothing": 0.2,
    "batch_size": 2000,
    "in_memory": True,
    "augmentation": "airbench",
    "translate": 2,
    "epochs": 8.0,
    "optimizer": "muon",
    "learning_rate": 106.0,
    "learning_rate_batch_size": 2000,
    "schedule": "linear",
    "momentum": 0.85,
    "nesterov": True,
    "weight_decay": 3.774e-5,
    "weight_decay_biases": True,
    "gradient_multipliers": ("^head/kernel$=12.64",),
    "muon_learning_rate": 0.24,
    "muon_momentum": 0.6,
    "newton_schulz_steps": 3,
    "whitening_bias_epochs": 3.0,
    "test_time_augmentation": "mirror_translate",
}
# The 2025 CIFAR-10 speedrun record (hiverge/cifar10-speedrun, cifar10_speedrun.py: 94.01% in 7.59 epochs) changed
# airbench94_muon's values and added a colour jitter; ported the same way (summed-loss rates x the batch):
# - batch 1536; the batch-norm offsets and the whitening bias at 0.0573 x 1536 = 88.01, the head 0.5415 / 0.0573
#   = 9.45 times that; Nesterov SGD momentum 0.825; weight decay 1.0418e-6 x 1536 / 88.01 = 1.818e-5;
# - Muon at 0.205, momentum 0.655 (3 Newton-Schulz steps);
# - batch-norm momentum 0.5566, label smoothing 0.09, the whitening bias trained for its first 0.19 epochs;
# - 7 epochs (the record's 7.59 on the original images); bfloat16 where the hardware has it (the record's float16).
# Left out, measured: its colour jitter (`--brightness 0.1399 --contrast 0.1308`), which cost accuracy on the JPEG
# copy here (docs/benchmarks.md). Left out, unmeasured: SiLU in the groups (faster on its GPU, slightly less
# accurate), the Muon update's periodic instead of per-step renormalisation and its decaying target magnitude (which
# the next normalisation cancels), and test-time augmentation of only the least confident quarter (faster; the full
# 6 views are at least as accurate).
CIFAR10_SPEEDRUN = {
    **AIRBENCH94_MUON,
    "batch_size": 1536,
    "learning_rate": 88.01,
    "learning_rate_batch_size": 1536,
    "gradient_multipliers": ("^head/kernel$=9.45",),
    "weight_decay": 1.818e-5,
    "momentum": 0.825,
    "muon_learning_rate": 0.205,
    "muon_momentum": 0.655,
    "batch_norm_decay": 0.5566,
    "label_smoothing": 0.09,
    "whitening_bias_epochs": 0.19,
    "epochs": 7.0,
    "precision": "auto",
}
# The CIFAR-10 estimator example's ResNet recipe: this config's own defaults, named.
ESTIMATOR: dict = {}
FAST = CIFAR10_SPEEDRUN  # 90.72% on the JPEG copy in 7 epochs, airbench94_muon's in 8 (docs/benchmarks.md)
PRESETS = {
    "fast": FAST,
    "airbench94": AIRBENCH94,
    "airbench94_muon": AIRBENCH94_MUON,
    "cifar10_speedrun": CIFAR10_SPEEDRUN,
    "estimator": ESTIMATOR,
}
LENGTH_FIELDS = ("train_steps", "epochs")  # a length given by hand replaces the preset's, whichever it is
