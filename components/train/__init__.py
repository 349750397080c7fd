"""The train stage: synchronous data-parallel training of a ResNet on one or many workers."""
