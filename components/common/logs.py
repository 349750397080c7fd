"""Logging set-up shared by every stage's entry point."""

from __future__ import annotations

import logging
import os

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str = "INFO") -> None:
    """Configure the root logger once, to stderr, and quieten TensorFlow's C++ start-up chatter."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(level=getattr(logging, level.upper()), format=LOG_FORMAT, force=True)
    for noisy in ("urllib3", "google", "absl", "h5py"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
