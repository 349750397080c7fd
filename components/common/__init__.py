"""What the stages share: configuration, datasets and records, storage, the model directory, logging."""
