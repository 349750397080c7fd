"""The training recipes behind `--preset`: values that apply wherever a configuration gives none.

- `fast`: airbench94 (Jordan 2024, "94% on CIFAR-10 in 3.29 Seconds on a Single GPU", arXiv 2404.00498;
  github.com/KellerJordan/cifar10-airbench), ported from PyTorch to this stage's options.
- `estimator`: the CIFAR-10 estimator example's ResNet recipe, which is what TrainConfig's defaults already are.
"""

from __future__ import annotations

# airbench94 (Jordan 2024, arXiv 2404.00498; github.com/KellerJordan/cifar10-airbench), ported from PyTorch:
# - its loss is a sum over the batch with lr 11.5 / (1024 (1 + 1 / (1 - 0.85))); ours is the batch mean, so the
#   same steps take lr 11.5 / 7.667 = 1.5 at batch 1024 (and scale with the batch, as airbench's does);
# - its weight decay 0.0153 x 1024 / 7850.67 per step enters the gradient as wd / lr; ours is L2 on the kernels
#   whose gradient is multiplied by our lr, so wd = 0.0019957 / 1.5 = 0.00133 (batch norm biases are not decayed);
# - PyTorch batch-norm momentum 1 - 0.6 is Keras momentum 0.6; the batch-norm biases learn 64x faster.
FAST = {
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
# The CIFAR-10 estimator example's ResNet recipe: this config's own defaults, named.
ESTIMATOR: dict = {}
PRESETS = {"fast": FAST, "estimator": ESTIMATOR}
LENGTH_FIELDS = ("train_steps", "epochs")  # a length given by hand replaces the preset's, whichever it is
