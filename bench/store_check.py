"""Benchmark: what the object store's conditional-write check costs, against what it protects.

The check (`object_stores.conditional_write_problem`: 3 PUTs, 6 concurrent creates, 2 deletes on probe objects) runs
once per process and bucket before the first conditional write. It is timed against one conditional publish of a
4 KB object (the smallest thing a stage writes) and against publishing a prepare_data shard of 5,000 CIFAR images
(15 MB), on a local S3 server (moto) started here, rounds alternating. Prints the medians and the ratios.

    .venv/bin/python bench/store_check.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
import uuid
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from components.common import object_stores, storage, stores  # noqa: E402


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    arguments = parser.parse_args()
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x")
    object_stores.reset_clients()
    object_stores.s3_client().create_bucket(Bucket="bench")
    publisher = storage.publisher_for("s3://bench/prefix")
    small, shard = os.urandom(4096), os.urandom(5000 * 3072)
    timings: dict[str, list[float]] = {"check": [], "small publish": [], "shard publish": []}
    try:
        for round_index in range(arguments.rounds):
            steps = [
                ("check", lambda: object_stores.conditional_write_problem(publisher)),
                ("small publish", lambda: publisher.publish(f"s/{uuid.uuid4().hex}", small, stores.ABSENT)),
                ("shard publish", lambda: publisher.publish(f"b/{uuid.uuid4().hex}", shard, stores.ABSENT)),
            ]
            for name, step in steps if round_index % 2 == 0 else reversed(steps):
                started = time.perf_counter()
                step()
                timings[name].append(time.perf_counter() - started)
    finally:
        server.stop()
    medians = {name: statistics.median(values) for name, values in timings.items()}
    for name, value in medians.items():
        print(f"{name:>14}: median {value * 1000:7.1f} ms over {arguments.rounds} rounds")
    small_ratio = medians["check"] / medians["small publish"]
    shard_ratio = medians["check"] / medians["shard publish"]
    print(f"the check costs {small_ratio:.1f} small publishes, {shard_ratio:.2f} of one 5,000-image shard's publish")


if __name__ == "__main__":
    main()
