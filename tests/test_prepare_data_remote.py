"""prepare_data with remote sources and outputs: http(s) downloads (a local server), gs:// (fake-gcs-server) and
s3:// (a real S3-compatible server)."""

from __future__ import annotations

import hashlib
import http.server
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from components.common import filesystem, storage, stores
from components.common.dataset import DatasetError, open_dataset
from components.prepare_data.config import PrepareDataConfig
from components.prepare_data.prepare import prepare_data
from components.prepare_data.safe_io import SourceError
from tests import builders

REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture
def archive(tmp_path):
    return builders.write_python_archive(tmp_path / "cifar-10-python.tar.gz", builders.official_data(per_batch=10))


@pytest.fixture
def http_server(tmp_path, archive):
    """Serves `archive` on 127.0.0.1 and counts the requests."""
    requests = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(archive.parent), **kwargs)

        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *_args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{archive.name}", requests
    server.shutdown()
    server.server_close()


def test_url_download_is_verified_cached_and_reused(tmp_path, archive, http_server, isolated_cache):
    url, requests = http_server
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()

    first = prepare_data(PrepareDataConfig(output=str(tmp_path / "a"), source=url, source_sha256=digest))
    second = prepare_data(PrepareDataConfig(output=str(tmp_path / "b"), source=url, source_sha256=digest))

    assert len(requests) == 1, "the second run should use the cached, verified download"
    assert first.manifest.source["uri"] == url and first.manifest.source["sha256"] == digest
    assert second.manifest_sha256 == first.manifest_sha256
    assert list((isolated_cache / "cifar10-pipeline" / "downloads").iterdir())


def test_url_download_with_wrong_checksum_is_refused_and_not_cached(tmp_path, http_server, isolated_cache):
    url, _requests = http_server
    with pytest.raises(SourceError, match=rf"{url}: SHA-256 is [0-9a-f]{{64}}, expected f{{64}}"):
        prepare_data(PrepareDataConfig(output=str(tmp_path / "out"), source=url, source_sha256="f" * 64))
    assert not list((isolated_cache / "cifar10-pipeline" / "downloads").glob("*.tar.gz"))
    assert not (tmp_path / "out").exists()


def test_a_page_served_where_the_archive_should_be_is_named_by_its_url(tmp_path, archive, http_server, isolated_cache):
    """A proxy's login page or a server's error page with status 200: the message names the URL given (not the
    download's cache file) and says what came instead of the archive."""
    url, _requests = http_server
    page = archive.parent / "login.tar.gz"
    page.write_text("<!DOCTYPE html><html><body>Sign in</body></html>")
    page_url = url.rsplit("/", 1)[0] + "/" + page.name
    with pytest.raises(SourceError, match=rf"^{page_url}: not a tar archive but an HTML or XML page \(a login"):
        prepare_data(PrepareDataConfig(output=str(tmp_path / "out"), source=page_url))
    assert not (tmp_path / "out").exists()


def test_a_download_cut_short_of_its_content_length_is_refused_and_not_cached(tmp_path, archive, isolated_cache):
    """A server (or proxy) that closes the connection early: the body is shorter than its Content-Length."""
    content = archive.read_bytes()

    class CutShort(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content[: len(content) // 2])
            self.close_connection = True

        def log_message(self, *_args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CutShort)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/{archive.name}"
    try:
        with pytest.raises(SourceError, match=rf"could not download {url}: the body ended after [\d,]+ of the "
                                              rf"{len(content):,} bytes its Content-Length announced"):  # fmt: skip
            prepare_data(PrepareDataConfig(output=str(tmp_path / "out"), source=url))
    finally:
        server.shutdown()
        server.server_close()
    assert not list((isolated_cache / "cifar10-pipeline" / "downloads").glob("*.tar.gz"))
    assert not (tmp_path / "out").exists()


def test_object_store_source_and_output_round_trip(tmp_path, archive, object_store):
    storage.publisher_for(f"{object_store}/raw").publish("cifar-10-python.tar.gz", archive.read_bytes())
    source = f"{object_store}/raw/cifar-10-python.tar.gz"
    output = f"{object_store}/datasets/cifar10"

    result = prepare_data(PrepareDataConfig(output=output, source=source))
    local = prepare_data(PrepareDataConfig(output=str(tmp_path / "local"), source=str(archive)))

    names = storage.publisher_for(output).list()
    shards = sorted(shard.path for split in result.manifest.splits.values() for shard in split.shards)
    assert names == sorted(["manifest.json", "statistics.json", *shards])
    assert result.manifest.splits == local.manifest.splits, "remote and local outputs hold the same shards"
    verified = open_dataset(output)
    official = builders.official_data(per_batch=10)
    parsed = builders.read_records(verified.files["eval"])
    assert len(parsed) == 10
    for example_id, (image, _label) in parsed.items():
        assert (image == official.image_hwc(example_id)).all()

    again = prepare_data(PrepareDataConfig(output=output, source=source))
    assert again.reused


def test_remote_dataset_with_a_tampered_shard_fails_verification(archive, object_store):
    output = f"{object_store}/datasets/cifar10"
    result = prepare_data(PrepareDataConfig(output=output, source=str(archive)))
    publisher = storage.publisher_for(output)
    shard = result.manifest.splits["validation"].shards[0].path
    content = bytearray(publisher.read(shard))
    content[100] ^= 1
    publisher.publish(shard, bytes(content))
    with pytest.raises(DatasetError, match=rf"{shard}: SHA-256 .* does not match"):
        open_dataset(output)


@pytest.mark.parametrize("backend", ["gs", "s3", "local"])
def test_compare_and_swap_publish_refuses_a_lost_race_and_accepts_identical_bytes(request, tmp_path, backend):
    if backend == "local":
        root = str(tmp_path / "p")
    else:
        root = f"{backend}://{request.getfixturevalue('gcs_bucket' if backend == 'gs' else 's3_bucket')}/p"
    writer, other = storage.publisher_for(root), storage.publisher_for(root)
    _content, seen = writer.read_versioned("manifest.json")
    assert seen == stores.ABSENT
    other.publish("manifest.json", b"one", expected_version=seen)  # the other writer wins the race
    writer.publish("manifest.json", b"one", expected_version=seen)  # same bytes: fine
    with pytest.raises(filesystem.PublishConflictError, match=r"p/manifest.json was changed by another writer"):
        writer.publish("manifest.json", b"two", expected_version=seen)
    content, current = writer.read_versioned("manifest.json")
    assert content == b"one"
    writer.publish("manifest.json", b"two", expected_version=current)  # replacing the version it saw: fine
    assert other.read("manifest.json") == b"two"


def publish_concurrently(sources: list[str], output: str) -> tuple[list[int], list[str]]:
    """Start one CLI publisher per source at once; return their exit codes and outputs."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "components.prepare_data", "--source", source, "--output", output, "--force"],
            cwd=REPOSITORY,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for source in sources
    ]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    return [process.returncode for process in processes], outputs


def test_two_concurrent_publishers_of_the_same_remote_output_both_succeed_with_one_valid_dataset(
    archive, coordinated_store
):
    output = f"{coordinated_store}/datasets/concurrent"
    codes, outputs = publish_concurrently([str(archive), str(archive)], output)
    assert codes == [0, 0], outputs
    verified = open_dataset(output)
    assert verified.manifest.splits["train"].num_examples == 40
    assert [name for name in storage.publisher_for(output).list() if "tmp" in name or name.endswith(".part")] == []


def test_concurrent_publishers_of_different_data_never_leave_a_manifest_that_does_not_verify(
    tmp_path, archive, coordinated_store
):
    other = builders.write_python_archive(tmp_path / "other.tar.gz", builders.official_data(per_batch=10, seed=9))
    output = f"{coordinated_store}/datasets/contested"
    codes, outputs = publish_concurrently([str(archive), str(other)], output)
    assert 0 in codes, outputs
    for code, text in zip(codes, outputs, strict=True):
        if code:
            assert "another writer" in text, text
    # Whichever publisher won, the published manifest describes exactly the shards that are there.
    verified = open_dataset(output)
    digests = {hashlib.sha256(path.read_bytes()).hexdigest() for path in (archive, other)}
    assert verified.manifest.source["sha256"] in digests


@pytest.mark.parametrize("same_data", [True, False], ids=["same-data", "different-data"])
def test_publishers_racing_on_the_manifest_after_writing_their_shards(tmp_path, archive, coordinated_store, same_data):
    """Both publishers have written every shard before either writes the manifest: the worst interleaving."""
    other = builders.write_python_archive(tmp_path / "other.tar.gz", builders.official_data(per_batch=10, seed=9))
    sources = [archive, archive if same_data else other]
    output = f"{coordinated_store}/datasets/raced"
    barrier = threading.Barrier(2, timeout=60)
    publisher_class = type(storage.publisher_for(output))
    original_swap = publisher_class.swap_document

    def publish_after_both_wrote_shards(self, name, data, expected_version):
        if name == "manifest.json":
            barrier.wait()
        return original_swap(self, name, data, expected_version)

    outcomes = [None, None]

    def run(index):
        try:
            outcomes[index] = prepare_data(PrepareDataConfig(output=output, source=str(sources[index])))
        except filesystem.PublishConflictError as error:
            outcomes[index] = error

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(publisher_class, "swap_document", publish_after_both_wrote_shards)
        threads = [threading.Thread(target=run, args=(index,)) for index in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)

    failures = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
    assert len(failures) == (0 if same_data else 1), outcomes
    for failure in failures:
        assert "manifest.json was changed by another writer" in str(failure)
    verified = open_dataset(output)
    winner = next(outcome for outcome in outcomes if not isinstance(outcome, Exception))
    assert verified.manifest_sha256 == winner.manifest_sha256
    listed = {shard.path for split in verified.manifest.splits.values() for shard in split.shards}
    assert set(storage.publisher_for(output).list()) == listed | {"manifest.json", "statistics.json"}


def test_a_presigned_urls_signature_is_never_stored_in_the_published_dataset(tmp_path, http_server, isolated_cache):
    """A presigned URL carries its credentials in its query: the download uses it whole, the manifest and the
    statistics name it without them, and a cluster run refuses it (the run's parameters are readable by everyone
    who may see the run)."""
    from pipeline import commands
    from pipeline.training_pipeline import cifar10_pipeline

    url, _requests = http_server
    signed = f"{url}?X-Amz-Signature=0123456789abcdef0123&X-Amz-Credential=AKIA-SECRET"
    prepare_data(PrepareDataConfig(output=str(tmp_path / "out"), source=signed))
    for path in (tmp_path / "out").rglob("*.json"):
        text = path.read_text()
        assert "X-Amz-Signature" not in text and "AKIA-SECRET" not in text, path
    assert f'"uri": "{url}?..."' in (tmp_path / "out" / "manifest.json").read_text()
    assert commands.main(cifar10_pipeline, ["run", "--host", "http://127.0.0.1:9", "--source", signed]) == 2
