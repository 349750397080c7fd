"""The train stage: synchronous data-parallel training (ResNet or the airbench network) on one or many workers."""
