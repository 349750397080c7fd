"""Batch prediction with a promoted model: components/predict/predict.py."""
