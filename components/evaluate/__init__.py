"""The evaluate stage: checkpoint evaluation, metrics in KFP and TensorBoard, the promotion gate, export."""
