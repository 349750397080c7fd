"""The hyperparameter sweep: an Optuna study whose trials the train stage trains (docs/sweep.md)."""
