"""The Kubeflow pipeline: its definition (pipeline.py), the compiled pipeline.yaml, and the make commands."""
