"""One writer at a time for a gs:// or s3:// model directory, across machines: a lease object in the store.

The lease (`.writer-lease.json`: holder, a token, when it was last renewed) is created with create-if-absent and
renewed every `RENEW_SECONDS` with a compare-and-swap on its version, by a thread, while the writer lives. A
second writer that finds a lease watches it: a renewal means its holder is alive, and the newcomer fails naming
it; a lease nobody renews for `LEASE_SECONDS` (its holder was killed) is taken over. A writer whose lease was
taken over stops at its next push. The lease ends (is removed) when the writer ends normally or by SIGTERM.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid

from components.common import storage
from components.common.model_directory import CheckpointError

logger = logging.getLogger(__name__)

WRITER_LEASE = ".writer-lease.json"
LEASE_SECONDS = 90.0  # a lease not renewed for this long belongs to a dead writer
RENEW_SECONDS = 20.0
POLL_SECONDS = 2.0


def _parse(content: bytes | None) -> dict | None:
    try:
        lease = json.loads(content) if content else None
    except ValueError:
        return None
    fields_ok = isinstance(lease, dict) and isinstance(lease.get("renewed_at"), int | float)
    return lease if fields_ok and isinstance(lease.get("token"), str) else None


class WriterLease:
    def __init__(self, uri: str, holder: str):
        self.uri = uri
        self.holder = holder
        self.token = uuid.uuid4().hex
        self.lost = False
        self._publisher = storage.publisher_for(uri)
        self._version: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _record(self) -> bytes:
        return json.dumps({"holder": self.holder, "token": self.token, "renewed_at": time.time()}).encode()

    def acquire(self) -> None:
        """Take the lease, waiting out one that nobody renews; CheckpointError when its holder is alive."""
        watched: tuple[str, float] | None = None  # (version seen, when first seen)
        while True:
            content, version = self._publisher.read_versioned(WRITER_LEASE)
            lease = _parse(content)
            if content is not None and lease is not None and lease["token"] != self.token:
                age = time.time() - lease["renewed_at"]
                if watched is not None and watched[0] != version:
                    raise CheckpointError(
                        f"model_dir: {self.uri} is being written by {lease.get('holder', 'another writer')} (it "
                        "renewed its lease just now); a model directory has one writer at a time (wait for it to "
                        "end, stop it, or give another --model-dir)"
                    )
                if watched is None:
                    watched = (version, time.monotonic())
                    if age < LEASE_SECONDS:
                        logger.warning(
                            "%s has a writer lease of %s, renewed %.0f s ago: watching up to %.0f s whether it is "
                            "alive", self.uri, lease.get("holder"), max(age, 0.0), LEASE_SECONDS - max(age, 0.0),
                        )  # fmt: skip
                if age < LEASE_SECONDS and time.monotonic() - watched[1] < LEASE_SECONDS:
                    time.sleep(POLL_SECONDS)
                    continue
                logger.warning("taking over the writer lease of %s (not renewed for %.0f s)", lease.get("holder"), age)
            try:
                self._publisher.publish(WRITER_LEASE, self._record(), expected_version=version)
            except storage.PublishConflictError:
                continue  # another writer moved first: look again
            self._version = self._publisher.version(WRITER_LEASE)
            break
        self._renewer = threading.Thread(target=self._renew, name="writer-lease", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            try:
                self._publisher.publish(WRITER_LEASE, self._record(), expected_version=self._version)
                self._version = self._publisher.version(WRITER_LEASE)
            except storage.PublishConflictError:
                self.lost = True
                logger.error("%s: another writer took over this model directory's lease", self.uri)
                return
            except Exception as error:  # a store that is briefly unreachable: try again at the next renewal
                logger.warning("%s: could not renew the writer lease (%s)", self.uri, error)

    def check(self) -> None:
        if self.lost:
            raise CheckpointError(f"model_dir: {self.uri}: another writer took over; this one stops")

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        if self.lost or self._version is None:
            return
        lease = _parse(self._publisher.read(WRITER_LEASE))
        if lease is not None and lease["token"] == self.token:
            self._publisher.withdraw(WRITER_LEASE)
        self._version = None
